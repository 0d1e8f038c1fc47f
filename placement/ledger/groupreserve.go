package ledger

import (
	"slices"
	"sort"
	"time"

	"github.com/gputopo/gputopo/topology"
)

// Group reservations (docs/groups.md, "A group that waits"): a group that
// has waited too long keeps the GPUs of one plan, made as if the pods
// holding them had finished, from pods of its priority or lower that come
// after it. Nothing is held for the group: its pods are not placed until
// every one of them fits, and the GPUs still held are only kept once
// their pods go. A reservation lives on the group: it ends when the group
// is planned or has no pod left, or when the core ends it.

// NodeReservation is what one group keeps on one node.
type NodeReservation struct {
	Group    string
	Priority int32
	// GPUs are the node's GPUs the group's plan takes, free or not.
	GPUs topology.Mask
	// Start is when the GPUs the group waits for are free at the latest,
	// by the activeDeadlineSeconds of the pods holding them; zero when a
	// pod among them does not say.
	Start time.Time
	// Since is when the group's reservation was first made.
	Since time.Time
}

// groupReservation is a group's reservation: its plan's GPUs by node.
type groupReservation struct {
	priority      int32
	since, made   time.Time
	domain, level string
	nodes         map[string]topology.Mask
}

// ReservedAgainst is the GPUs of n that a pod of priority prio in group
// ("" for none) that is gone by ends (zero: it does not say) must leave
// alone: those kept for other groups of the same or higher priority,
// unless the pod is gone before the group can start (backfill).
func (n *Node) ReservedAgainst(prio int32, group string, ends time.Time) topology.Mask {
	var m topology.Mask
	for _, r := range n.reservedFor {
		if r.Priority >= prio && r.Group != group && (ends.IsZero() || r.Start.IsZero() || ends.After(r.Start)) {
			m = m.Union(r.GPUs)
		}
	}
	return m
}

// Reservations is what the node keeps for waiting groups, nil for none.
func (n *Node) Reservations() []NodeReservation { return n.reservedFor }

// GroupReservation is a group's reservation as reports show it.
type GroupReservation struct {
	Group    string
	Priority int32
	// Since is when it was first made, Age how long ago; Made when it
	// was last made again.
	Since, Made   time.Time
	Age           time.Duration
	Domain, Level string
	// GPUs counts the GPUs kept; Free those of them free now.
	GPUs, Free int
	Nodes      []string
}

// KeepForGroup keeps gpus (by node) for group key, a group of priority
// prio whose plan lies in domain at level and can start by start (zero:
// unknown): pods of its priority or lower leave them alone (what is kept
// is a "group reservation" in the configuration's and the metrics'
// words). It replaces what the group had kept, keeping when it began. It
// does nothing for a group that is planned or has no pod; it says
// whether the GPUs are kept.
func (l *Ledger) KeepForGroup(key string, prio int32, domain, level string, start time.Time, gpus map[string]topology.Mask) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.groups[key]
	if g == nil || g.plan != nil {
		return false
	}
	since := l.now()
	if g.reserve != nil {
		since = g.reserve.since
		l.unreserveLocked(key, g)
	}
	r := &groupReservation{priority: prio, since: since, made: l.now(), domain: domain, level: level, nodes: map[string]topology.Mask{}}
	for name, m := range gpus {
		n := l.nodes[name]
		if n == nil || m.Empty() {
			continue
		}
		r.nodes[name] = m
		// A new slice: views taken before keep theirs.
		l.changedLocked(n)
		n.reservedFor = append(slices.Clone(n.reservedFor), NodeReservation{Group: key, Priority: prio, GPUs: m, Start: start, Since: since})
	}
	g.reserve = r
	return true
}

// EndKeep gives back what group key kept.
func (l *Ledger) EndKeep(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.groups[key]; g != nil && g.reserve != nil {
		l.endReservationLocked(key, g)
		g.reserve = nil
	}
}

// endReservationLocked takes group key's reservation off its nodes and,
// when it kept GPUs, tells OnUsable: pods refused for them may fit now.
func (l *Ledger) endReservationLocked(key string, g *group) {
	if g.reserve != nil && len(g.reserve.nodes) > 0 && l.onUsable != nil {
		defer l.onUsable()
	}
	l.unreserveLocked(key, g)
}

// unreserveLocked takes group key's reservation off its nodes.
func (l *Ledger) unreserveLocked(key string, g *group) {
	r := g.reserve
	if r == nil {
		return
	}
	for name := range r.nodes {
		n := l.nodes[name]
		if n == nil {
			continue
		}
		out := make([]NodeReservation, 0, len(n.reservedFor))
		for _, nr := range n.reservedFor {
			if nr.Group != key {
				out = append(out, nr)
			}
		}
		if len(out) == 0 {
			out = nil
		}
		l.changedLocked(n)
		n.reservedFor = out
	}
	r.nodes = nil
}

// Reservation is group key's reservation, ok false when it has none in
// place.
func (v View) Reservation(key string) (GroupReservation, bool) {
	g := v.l.groups[key]
	if g == nil || g.reserve == nil {
		return GroupReservation{}, false
	}
	return v.l.reservationLocked(key, g.reserve), true
}

// ReservedGPUs counts the GPUs kept for every group but except.
func (v View) ReservedGPUs(except string) int {
	total := 0
	for key, g := range v.l.groups {
		if key == except || g.reserve == nil {
			continue
		}
		for _, m := range g.reserve.nodes {
			total += m.Count()
		}
	}
	return total
}

// GroupReservations lists the reservations in place, by group.
func (r Report) GroupReservations() []GroupReservation {
	l := r.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []GroupReservation
	for key, g := range l.groups {
		if g.reserve != nil {
			out = append(out, l.reservationLocked(key, g.reserve))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

func (l *Ledger) reservationLocked(key string, r *groupReservation) GroupReservation {
	out := GroupReservation{Group: key, Priority: r.priority, Since: r.since, Made: r.made, Age: l.now().Sub(r.since), Domain: r.domain, Level: r.level}
	for name, m := range r.nodes {
		out.Nodes = append(out.Nodes, name)
		out.GPUs += m.Count()
		if n := l.nodes[name]; n != nil {
			out.Free += m.Intersect(n.freeMask).Count()
		}
	}
	sort.Strings(out.Nodes)
	return out
}
