package ledger

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Groups: the pods of one job placed together, all or nothing. The ledger
// keeps each group's live members and, once the decision core has found
// room for all of them, its plan: one slot (a node and its exact GPUs) per
// pod not bound yet, held as reservations from the moment the plan is
// made. A member claims a slot when it is decided and binds to it; a slot
// given up before its pod is bound (Unreserve, a failed bind) goes back to
// the plan, not to the pool. The plan is dissolved, every slot not bound
// freed, when a member is deleted before it was bound, when its TTL
// passes (SweepGroups), or when the last slot is bound (then the members
// simply hold their GPUs).

// group is one group's live members and plan.
type group struct {
	members map[types.NamespacedName]*PodInfo
	plan    *plan
	// reserve is what the group keeps while it waits (groupreserve.go).
	reserve *groupReservation
}

// plan is a group's slots, made at since.
type plan struct {
	slots []*slot
	since time.Time
	// domain and level say where the plan lies, for the placement record
	// and `kubectl gputopo`.
	domain, level string
}

// slot is one pod's place in a plan: holder is the UID of the holding in
// the ledger (a synthetic one until a member claims it).
type slot struct {
	node   string
	holder types.UID
	claim  types.UID // the member that claimed it; "" while unclaimed
	// slice is the slice of a sliced group the slot belongs to.
	slice int
}

// ErrGroupUnseen is PlanGroup's error for a group none of whose pods the
// ledger has seen yet (the pod informer lags the scheduler).
var ErrGroupUnseen = errors.New("no pod of the group has reached the scheduler's cache yet")

// Slot is one pod's place as the core plans it.
type Slot struct {
	Node   string
	Choice Choice
	// Slice is the slot's slice in a sliced group: a pod that names its
	// slice (PodInfo.Slice) claims a slot of that slice only.
	Slice int
}

// GroupView is what the planner reads of a group.
type GroupView struct {
	// Key is namespace/name.
	Key string
	// Pending and Bound are the live members not bound and bound (their
	// nodes, for Bound); a member whose bind is in flight outside a plan
	// counts as bound on its node.
	Pending []*PodInfo
	Bound   []string
	// BoundPods are the bound members, in the order of Bound.
	BoundPods []*PodInfo
	// Planned says a plan is in place (its slots are held).
	Planned bool
}

// FabricLevels is how many fabric levels the ledger knows.
func (v View) FabricLevels() int { return len(v.l.fabric) }

// Domain is the node's domain at fabric level i ("" when it has none): the
// first of the level's labels the node carries; at level 0 the
// NodeGPUTopology's fabric clique when the node carries none of them.
func (n *Node) Domain(i int) string {
	if i < len(n.domains) && n.domains[i] != "" {
		return n.domains[i]
	}
	if i == 0 && n.clique != "" {
		return "clique=" + n.clique
	}
	return ""
}

// DomainFree sums the free GPUs of every node by its domain at each
// fabric level: out[i][d] is the free GPUs of domain d at level i. A node
// without a domain at a level counts in none there.
func (v View) DomainFree() []map[string]int {
	out := make([]map[string]int, len(v.l.fabric))
	for i := range out {
		out[i] = map[string]int{}
	}
	v.each(func(n *Node) {
		free := n.freeMask.Count()
		for i := range out {
			if d := n.Domain(i); d != "" {
				out[i][d] += free
			}
		}
	})
	return out
}

// setDomainsLocked reads a Node's fabric domains from its labels.
func (l *Ledger) setDomainsLocked(n *Node, labels map[string]string) {
	l.changedLocked(n)
	if len(l.fabric) == 0 {
		return
	}
	var d []string
	for i, keys := range l.fabric {
		for _, k := range keys {
			if v := labels[k]; v != "" {
				if d == nil {
					d = make([]string, len(l.fabric))
				}
				d[i] = k + "=" + v
				break
			}
		}
	}
	n.domains = l.domainSetLocked(d)
}

// maxDomainSets bounds the distinct domain lists the ledger shares; past
// it (a fleet labelled one domain per node) each node keeps its own.
const maxDomainSets = 1 << 16

// domainSetLocked returns the one copy of the domain list d that the
// nodes of one leaf share (nil stays nil: a node without fabric labels).
func (l *Ledger) domainSetLocked(d []string) []string {
	if d == nil {
		return nil
	}
	key := strings.Join(d, "\x00")
	if s, ok := l.domainSets[key]; ok {
		return s
	}
	if l.domainSets == nil {
		l.domainSets = make(map[string][]string)
	}
	if len(l.domainSets) < maxDomainSets {
		l.domainSets[key] = d
	}
	return d
}

// EachNode calls fn with every node the ledger knows, in no order.
func (v View) EachNode(fn func(n *Node)) { v.each(fn) }

// Nodes calls fn with every node the ledger knows, in name order.
func (v View) Nodes(fn func(n *Node)) {
	names := make([]string, 0, len(v.l.nodes))
	for name := range v.l.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if n := v.node(name); n != nil {
			fn(n)
		}
	}
}

func (l *Ledger) groupJoinLocked(info *PodInfo) {
	if info.Group == "" {
		return
	}
	g := l.groups[info.Group]
	if g == nil {
		g = &group{members: make(map[types.NamespacedName]*PodInfo)}
		l.groups[info.Group] = g
	}
	g.members[info.Key] = info
}

// groupLeaveLocked takes info out of its group; gone says the pod itself
// went (deleted, finished, recreated): a member gone before it was bound
// leaves the group incomplete, so its plan is dissolved.
func (l *Ledger) groupLeaveLocked(info *PodInfo, gone bool) {
	g := l.groups[info.Group]
	if info.Group == "" || g == nil {
		return
	}
	delete(g.members, info.Key)
	if gone && info.Node == "" && g.plan != nil {
		l.dissolveLocked(info.Group, g)
	}
	if len(g.members) == 0 {
		if g.plan != nil {
			l.dissolveLocked(info.Group, g)
		}
		l.endReservationLocked(info.Group, g)
		delete(l.groups, info.Group)
	}
}

// dissolveLocked frees every slot of g's plan whose pod is not bound.
func (l *Ledger) dissolveLocked(key string, g *group) {
	p := g.plan
	g.plan = nil
	for _, s := range p.slots {
		if h := l.holdings[s.holder]; h != nil && h.reserved && h.group == key {
			l.releaseLocked(s.holder)
		}
	}
}

// PlanGroup makes group key's plan unless it has one: plan sees the group
// and the ledger and returns one slot per pending member (or an error,
// returned as is, and nothing is held). The slots are held at once, each
// as a reservation of the group. choose runs under the read lock, so that
// the filters of the cycle go on while the planner works; the plan is
// recorded under the write lock only if the group is as choose saw it and
// every slot's GPUs are still free (else choose runs again, and after
// commitTries under the write lock, where nothing can change).
func (l *Ledger) PlanGroup(key string, choose func(v View, g GroupView) (slots []Slot, domain, level string, err error)) error {
	for range commitTries {
		l.mu.RLock()
		g := l.groups[key]
		if g == nil {
			l.mu.RUnlock()
			return ErrGroupUnseen
		}
		if g.plan != nil {
			l.mu.RUnlock()
			return nil
		}
		gv := l.groupViewLocked(key, g)
		slots, domain, level, err := choose(View{l: l}, gv)
		l.mu.RUnlock()
		if err != nil {
			return err
		}
		l.mu.Lock()
		g = l.groups[key]
		switch {
		case g == nil:
			l.mu.Unlock()
			return ErrGroupUnseen
		case g.plan != nil:
			l.mu.Unlock()
			return nil
		case sameGroup(gv, l.groupViewLocked(key, g)) && l.slotsFree(slots):
			l.recordPlanLocked(key, g, slots, domain, level)
			l.mu.Unlock()
			return nil
		}
		l.mu.Unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.groups[key]
	if g == nil {
		return ErrGroupUnseen
	}
	if g.plan != nil {
		return nil
	}
	gv := l.groupViewLocked(key, g)
	slots, domain, level, err := choose(View{l: l}, gv)
	if err != nil {
		return err
	}
	l.recordPlanLocked(key, g, slots, domain, level)
	return nil
}

// sameGroup says whether two views of a group have the same members in
// the same state.
func sameGroup(a, b GroupView) bool {
	return slices.Equal(a.Bound, b.Bound) && slices.EqualFunc(a.Pending, b.Pending, func(x, y *PodInfo) bool { return x.UID == y.UID })
}

// slotsFree says whether every slot's GPUs are free, no GPU in two slots.
func (l *Ledger) slotsFree(slots []Slot) bool {
	byNode := map[string][]string{}
	for _, s := range slots {
		byNode[s.Node] = append(byNode[s.Node], s.Choice.UUIDs...)
	}
	for node, uuids := range byNode {
		if !l.commitFree(node, "", uuids) {
			return false
		}
	}
	return true
}

// recordPlanLocked holds the slots of group key's plan.
func (l *Ledger) recordPlanLocked(key string, g *group, slots []Slot, domain, level string) {
	now := l.now()
	p := &plan{since: now, domain: domain, level: level}
	for i, s := range slots {
		holder := types.UID("group:" + key + "#" + strconv.Itoa(i))
		l.setHoldingLocked(&holding{uid: holder, pod: types.NamespacedName{Namespace: "", Name: key}, node: s.Node,
			uuids: s.Choice.UUIDs, reserved: true, since: now, placement: s.Choice.Placement, group: key})
		p.slots = append(p.slots, &slot{node: s.Node, holder: holder, slice: s.Slice})
	}
	g.plan = p
	l.endReservationLocked(key, g)
	g.reserve = nil
}

func (l *Ledger) groupViewLocked(key string, g *group) GroupView {
	gv := GroupView{Key: key, Planned: g.plan != nil}
	for _, m := range g.members {
		switch h := l.holdings[m.UID]; {
		case m.Node != "":
			gv.BoundPods = append(gv.BoundPods, m)
		case g.plan == nil && h != nil && h.reserved && h.group == "" && h.node != "":
			// A bind in flight outside any plan (a pod sent to its place
			// in a preemption's what-if plan): the pod is bound on
			// h.node next, so the rest of the group is planned around it
			// as around a bound member, not as if it were still to place.
			inFlight := *m
			inFlight.Node = h.node
			gv.BoundPods = append(gv.BoundPods, &inFlight)
		default:
			gv.Pending = append(gv.Pending, m)
		}
	}
	slices.SortFunc(gv.Pending, func(a, b *PodInfo) int {
		return strings.Compare(a.Key.Name, b.Key.Name)
	})
	slices.SortFunc(gv.BoundPods, func(a, b *PodInfo) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return strings.Compare(a.Key.Name, b.Key.Name)
	})
	for _, m := range gv.BoundPods {
		gv.Bound = append(gv.Bound, m.Node)
	}
	return gv
}

// Group is what the ledger knows of group key; ok is false when it has no
// live pods.
func (v View) Group(key string) (GroupView, bool) {
	g := v.l.groups[key]
	if g == nil {
		return GroupView{}, false
	}
	return v.l.groupViewLocked(key, g), true
}

// ClaimSlot gives pod uid a slot of its group's plan: the one it claimed
// before, else a free one, preferring one on prefer. The slot's GPUs
// become the pod's reservation (Reserve then hands them to it). A pod of
// slice slice (-1: it names none) claims a slot of its slice when the
// plan has any. Among the others it prefers a slot on a node no other
// pending member is nominated to: kube-scheduler counts a nominated pod
// against every pod of no higher priority on its node, the group's own
// included, so such a slot waits until that member is bound. ok is false
// when the group has no plan or no slot left.
func (l *Ledger) ClaimSlot(key string, uid types.UID, pod types.NamespacedName, prefer string, slice int) (node string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.groups[key]
	if g == nil || g.plan == nil {
		return "", false
	}
	if slice >= 0 && !slices.ContainsFunc(g.plan.slots, func(s *slot) bool { return s.slice == slice }) {
		slice = -1 // a plan without the pod's slice (one adopted from an older decider)
	}
	var others map[string]bool // nodes other pending members are nominated to
	for _, m := range g.members {
		if m.UID != uid && m.Node == "" && m.Nominated != "" {
			if others == nil {
				others = map[string]bool{}
			}
			others[m.Nominated] = true
		}
	}
	rank := func(s *slot) int {
		switch {
		case s.node == prefer:
			return 0
		case !others[s.node]:
			return 1
		}
		return 2
	}
	var free *slot
	for _, s := range g.plan.slots {
		if s.claim == uid {
			return s.node, true
		}
		if s.claim == "" && (slice < 0 || s.slice == slice) && (free == nil || rank(s) < rank(free)) {
			free = s
		}
	}
	if free == nil {
		return "", false
	}
	h := l.holdings[free.holder]
	if h == nil {
		return "", false
	}
	if old := l.holdings[uid]; old != nil && old.reserved {
		l.giveBackLocked(uid, old)
	}
	l.releaseLocked(free.holder)
	nh := *h
	nh.uid, nh.pod = uid, pod
	l.setHoldingLocked(&nh)
	free.holder, free.claim = uid, uid
	return free.node, true
}

// giveBackLocked returns a group member's unbound slot to its plan
// (renamed back to a synthetic holder) instead of freeing it; true when it
// did. The caller then must not release uid.
func (l *Ledger) giveBackLocked(uid types.UID, h *holding) bool {
	if h.group == "" || !h.reserved {
		return false
	}
	g := l.groups[h.group]
	if g == nil || g.plan == nil {
		return false
	}
	for i, s := range g.plan.slots {
		if s.claim != uid {
			continue
		}
		holder := types.UID("group:" + h.group + "#" + strconv.Itoa(i))
		l.releaseLocked(uid)
		nh := *h
		nh.uid, nh.pod = holder, types.NamespacedName{Name: h.group}
		l.setHoldingLocked(&nh)
		s.holder, s.claim = holder, ""
		return true
	}
	return false
}

// confirmGroupLocked notes that a member of group key is bound; the plan
// ends once every slot is.
func (l *Ledger) confirmGroupLocked(key string) {
	g := l.groups[key]
	if key == "" || g == nil || g.plan == nil {
		return
	}
	for _, s := range g.plan.slots {
		if hh := l.holdings[s.holder]; hh == nil || hh.reserved {
			return
		}
	}
	g.plan = nil
}

// SweepGroups dissolves the plans older than ttl that are not bound yet
// (pods that never came) and returns how many.
func (l *Ledger) SweepGroups(ttl time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	cutoff := l.now().Add(-ttl)
	var n int
	for key, g := range l.groups {
		if g.plan != nil && g.plan.since.Before(cutoff) {
			l.dissolveLocked(key, g)
			n++
		}
	}
	return n
}

// GroupPlan is a group's plan as reports show it.
type GroupPlan struct {
	Key, Domain, Level string
	Since              time.Time
	Nodes              []string
	Claimed            int
}

// GroupPlans lists the plans in place, by group.
func (r Report) GroupPlans() []GroupPlan {
	l := r.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []GroupPlan
	for key, g := range l.groups {
		if g.plan == nil {
			continue
		}
		gp := GroupPlan{Key: key, Domain: g.plan.domain, Level: g.plan.level, Since: g.plan.since}
		for _, s := range g.plan.slots {
			gp.Nodes = append(gp.Nodes, s.node)
			if s.claim != "" {
				gp.Claimed++
			}
		}
		out = append(out, gp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// UpsertPodGroup records a Kubernetes PodGroup (scheduling.k8s.io): a gang
// policy's minCount is the group's size (a basic policy: 1), and its first
// topology constraint's key the level the whole group must share. The
// PodGroup API has no slices: gputopo's slice annotations on the PodGroup
// object cut it into slices (docs/groups.md); when they are malformed the
// group's pods are refused with the error.
func (l *Ledger) UpsertPodGroup(pg *schedulingv1beta1.PodGroup) {
	spec := v1alpha1.GroupSpec{Name: pg.Name, Size: 1}
	if g := pg.Spec.SchedulingPolicy.Gang; g != nil && g.MinCount > 0 {
		spec.Size = int(g.MinCount)
	}
	if c := pg.Spec.SchedulingConstraints; c != nil && len(c.Topology) > 0 {
		spec.Required = c.Topology[0].Key
	}
	ng := nativeGroup{spec: spec}
	ann := map[string]string{v1alpha1.AnnotationGroup: pg.Name, v1alpha1.AnnotationGroupSize: strconv.Itoa(spec.Size)}
	if spec.Required != "" {
		ann[v1alpha1.AnnotationGroupRequiredTopology] = spec.Required
	}
	sliced := false
	for _, k := range []string{v1alpha1.AnnotationSliceSize, v1alpha1.AnnotationSliceRequiredTopology, v1alpha1.AnnotationSlicePreferredTopology} {
		if v, ok := pg.Annotations[k]; ok {
			ann[k], sliced = v, true
		}
	}
	if sliced {
		if s, _, errs := v1alpha1.ParseGroup(podGroupAnnotations, ann); len(errs) > 0 {
			ng.err = fmt.Errorf("PodGroup %s/%s: %w", pg.Namespace, pg.Name, errs.ToAggregate())
		} else {
			ng.spec = s
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.native == nil {
		l.native = make(map[string]nativeGroup)
	}
	l.native[pg.Namespace+"/"+pg.Name] = ng
}

// podGroupAnnotations is the path of a PodGroup's annotations, for errors.
var podGroupAnnotations = field.NewPath("metadata", "annotations")

// nativeGroup is a Kubernetes PodGroup's spec, or why it cannot be read.
type nativeGroup struct {
	spec v1alpha1.GroupSpec
	err  error
}

// DeletePodGroup forgets the Kubernetes PodGroup key.
func (l *Ledger) DeletePodGroup(key types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.native, key.Namespace+"/"+key.Name)
}

// NativeGroup is the spec of Kubernetes PodGroup key (namespace/name);
// ok is false when the ledger has not seen it; err says why its slice
// annotations cannot be read.
func (v View) NativeGroup(key string) (spec v1alpha1.GroupSpec, ok bool, err error) {
	ng, ok := v.l.native[key]
	return ng.spec, ok, ng.err
}

// Waiting calls fn with each group that has no plan and a pod not bound,
// in no particular order.
func (v View) Waiting(fn func(GroupView)) {
	for key, g := range v.l.groups {
		if g.plan != nil {
			continue
		}
		for _, m := range g.members {
			if m.Node == "" {
				fn(v.l.groupViewLocked(key, g))
				break
			}
		}
	}
}
