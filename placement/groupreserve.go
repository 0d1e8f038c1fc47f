package placement

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
	"k8s.io/klog/v2"
)

// A group that waits (docs/groups.md): a group is placed only when every
// one of its pods fits, so on a busy cluster the GPUs it needs may keep
// going to smaller pods that come after it. Once it has waited
// fabric.reserveAfter, each time it is tried and does not fit the core
// keeps for it the GPUs of the slots that would fit it soonest (the
// fewest GPUs still held), in one domain of its allowed levels: pods of
// the same or lower priority are not given those GPUs (their filter and
// score see them as taken), while every other GPU is placed as usual.
// Nothing is held for the group: it is placed as usual once it fits. At
// most fabric.reserveMaxPercent of the cluster's GPUs are kept at once;
// a reservation ends when the group is planned or gone, or after
// fabric.reserveMaxDuration.

// ReserveRefresh is how often a group's reservation is made again at
// most (the group's pods are tried one after the other, and finding the
// soonest slots reads every node), and how often the cluster runtime looks
// for waiting groups to keep GPUs for (KeepForWaitingGroups).
const ReserveRefresh = 10 * time.Second

// reserveSlot is one place a waiting group's pod could take: a GPU set on
// a node, how many of its GPUs are still held, and when they are free at
// the latest (the zero time: now; never: a pod holding them does not say).
type reserveSlot struct {
	node  string
	gpus  topology.Mask
	held  int
	ready time.Time
}

// never stands for "a pod holding the GPUs does not say when it ends".
var never = time.Unix(1<<62, 0)

// keepForGroup is called when pr's group was tried and does not fit:
// from fabric.reserveAfter after the pod was created until
// reserveMaxDuration later, it keeps GPUs for the group (see above); then
// it ends the group's reservation for good. The window is the pod's own,
// so a new decider (failover) keeps the same one.
func (x *Core) keepForGroup(ctx context.Context, pr Request, candidates []string) {
	f := &x.cfg.Fabric
	after := f.ReserveAfter.Duration
	now := x.now()
	if after <= 0 || pr.created.IsZero() || now.Sub(pr.created) < after {
		return
	}
	until := pr.created.Add(after + f.ReserveMaxDuration.Duration)
	var (
		keep          map[string]topology.Mask
		domain, level string
		start         time.Time
		act           = reserveKeep // leave it as it is
		refused       string        // why the bound refused a reservation
	)
	x.ledger.Read(func(v ledger.View) {
		r, had := v.Reservation(pr.group)
		if !now.Before(until) {
			if had {
				act = reserveExpire
			}
			return
		}
		if had && now.Sub(r.Made) < ReserveRefresh {
			return // each member is filtered in turn: plan once for all of them
		}
		act = reserveEnd
		g, need, ok := waitingGroup(v, pr)
		if !ok || len(g.Pending)+len(g.Bound) < pr.groupSpec.Size {
			return
		}
		keep, domain, level, start = x.soonestSlots(ctx, v, pr, g, need, candidates)
		if keep == nil || !start.IsZero() && start.After(until) {
			return // nothing to keep, or it would run out before the GPUs are free
		}
		total, kept := 0, 0
		v.EachNode(func(n *ledger.Node) { total += n.Size() })
		for _, m := range keep {
			kept += m.Count()
		}
		others := v.ReservedGPUs(pr.group)
		if limit := int64(total) * int64(*f.ReserveMaxPercent) / 100; int64(others+kept) <= limit {
			act = reserveMake
		} else {
			refused = fmt.Sprintf("group %s has waited more than fabric.reserveAfter (%s) for room, but keeping the %d GPUs it needs would take the GPUs kept for waiting groups to %d of the cluster's %d, over fabric.reserveMaxPercent (%d%%): it waits without a reservation, and smaller pods may keep taking the GPUs it needs",
				pr.group, after, kept, others+kept, total, *f.ReserveMaxPercent)
		}
	})
	log := klog.FromContext(ctx)
	switch act {
	case reserveExpire:
		x.ledger.EndKeep(pr.group)
		log.V(2).Info("group reservation ran out", "group", pr.group, "reserveAfter", after, "reserveMaxDuration", f.ReserveMaxDuration.Duration)
	case reserveMake:
		if x.ledger.KeepForGroup(pr.group, pr.priority, domain, level, start, keep) {
			log.V(4).Info("GPUs kept for a waiting group", "group", pr.group, "domain", domain, "level", level, "nodes", len(keep), "start", start)
		}
	case reserveEnd:
		x.ledger.EndKeep(pr.group)
		log.V(4).Info("no GPUs kept for a waiting group", "group", pr.group, "found", keep != nil)
		if refused != "" {
			x.tellRefused(ctx, pr, refused)
		}
	}
}

// ReasonGroupReservationRefused is the reason of the Warning Event a
// waiting group's pod gets when fabric.reserveMaxPercent refuses the group
// a reservation.
const ReasonGroupReservationRefused = "GroupReservationRefused"

// refusalRepeat is how often a group is told again that the bound refuses
// it a reservation.
const refusalRepeat = 10 * time.Minute

// tellRefused logs msg and gives pr's pod a Warning Event with it, at
// most once per group per refusalRepeat.
func (x *Core) tellRefused(ctx context.Context, pr Request, msg string) {
	now := x.now()
	if last, ok := x.refusedTold.Load(pr.group); ok && now.Sub(last.(time.Time)) < refusalRepeat {
		return
	}
	x.refusedTold.Store(pr.group, now)
	klog.FromContext(ctx).V(2).Info("group refused a reservation by fabric.reserveMaxPercent", "group", pr.group, "pod", pr.Key)
	if x.recorder == nil || !x.Leading() {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pr.Key.Namespace, Name: pr.Key.Name, UID: pr.UID}
	x.recorder.Event(ref, corev1.EventTypeWarning, ReasonGroupReservationRefused, msg)
}

// KeepForWaitingGroups keeps GPUs for every group that has waited
// fabric.reserveAfter and does not fit now, over the nodes its pods' own
// rules allow, as trying one of its pods would (keepForGroup). In extender
// mode kube-scheduler asks about a pod only when its own filters pass some
// node: on a cluster where every node is short of a group pod's GPUs it
// never does, and the group would never get its reservation. The cluster
// runtime calls this on a timer while its core decides; the plugin build
// gets there from PreFilter as well.
func (u Upkeep) KeepForWaitingGroups(ctx context.Context) {
	x := u.x
	if x.cfg.Fabric.ReserveAfter.Duration <= 0 || x.deciderRefusal() != "" {
		return
	}
	after, now := x.cfg.Fabric.ReserveAfter.Duration, x.now()
	var oldest []*ledger.PodInfo
	x.ledger.Read(func(v ledger.View) {
		v.Waiting(func(g ledger.GroupView) {
			if len(g.Bound) > 0 {
				return // it keeps to its bound pods' domain: planned, not kept for
			}
			first := g.Pending[0]
			for _, m := range g.Pending[1:] {
				if m.Created.Before(first.Created) {
					first = m
				}
			}
			if now.Sub(first.Created) >= after {
				oldest = append(oldest, first)
			}
		})
	})
	for _, info := range oldest {
		pod, err := x.api.Pod(ctx, info.Key, info.UID)
		if err != nil {
			continue
		}
		pr, err := ParseRequest(pod, x.cfg.GPUResource(), now)
		if err != nil || pr.Count == 0 || x.resolveGroup(&pr) != nil || pr.groupSpec.Size < 2 {
			continue
		}
		rules := NodeRulesOf(pod)
		var allowed []string
		fits := false
		x.ledger.Read(func(v ledger.View) {
			v.EachNode(func(n *ledger.Node) {
				if o := n.Object(); o != nil {
					if why, err := rules.Excludes(ctx, o); err == nil && why == "" {
						allowed = append(allowed, n.Name())
					}
				}
			})
			if g, need, ok := waitingGroup(v, pr); ok {
				_, _, _, err := x.planGroup(ctx, v, pr, g, need, allowed, nil)
				fits = err == nil
			}
		})
		if !fits {
			x.keepForGroup(ctx, pr, allowed)
		}
	}
}

// What keepForGroup does with a group's reservation.
const (
	reserveKeep   = iota // leave it as it is
	reserveMake          // make it (again)
	reserveEnd           // end it: nothing to keep now, or over the bound
	reserveExpire        // end it for good: it ran out
)

// soonestSlots finds, at the group's allowed fabric levels, the domain
// whose best need slots are free soonest (by the activeDeadlineSeconds of
// the pods holding them), then have the fewest GPUs still held; the
// tighter level among equals. On each node the slots come from its free
// GPUs first, then from the GPUs its pods free, in the order they end. It
// returns the slots' GPUs by node and when they are all free at the
// latest (zero: unknown), nil when no domain could hold the group even
// with every pod gone.
func (x *Core) soonestSlots(ctx context.Context, v ledger.View, pr Request, g ledger.GroupView, need int, candidates []string) (map[string]topology.Mask, string, string, time.Time) {
	levels := x.cfg.Fabric.Levels
	top := len(levels)
	req, pref := top, 0
	if spec := pr.groupSpec; spec.Required != "" {
		i, ok := configv1alpha1.FabricLevelIndex(levels, spec.Required)
		if !ok {
			return nil, "", "", time.Time{}
		}
		req = i
	}
	if len(g.Bound) > 0 {
		return nil, "", "", time.Time{} // a group with pods bound keeps to their domain; it is planned, not kept for
	}
	var only map[string]bool
	if candidates != nil {
		only = make(map[string]bool, len(candidates))
		for _, c := range candidates {
			only[c] = true
		}
	}
	e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
	var nodes []*ledger.Node
	slotsOf := map[string][]reserveSlot{}
	v.Nodes(func(n *ledger.Node) {
		if only != nil && !only[n.Name()] || n.State(e.window) != ledger.TopoFresh || n.UnknownHeld() > 0 || n.Graph() == nil {
			return
		}
		if out := x.nodeSlots(e, v, n, pr, need); len(out) > 0 {
			nodes = append(nodes, n)
			slotsOf[n.Name()] = out
		}
	})
	type pick struct {
		slots []reserveSlot
		start time.Time
		held  int
		name  string
		lvl   int
	}
	better := func(a, b *pick) bool {
		if !a.start.Equal(b.start) {
			return a.start.Before(b.start)
		}
		return a.held < b.held
	}
	// A sliced group keeps each slice's slots inside one domain at its
	// slice level (soonestSlices).
	sliced := pr.groupSpec.Slices() > 0
	var sliceOf func(node string) string
	if sliced {
		_, sreq, err := x.sliceLevels(pr.groupSpec, pr.group)
		if err != nil {
			return nil, "", "", time.Time{}
		}
		byName := map[string]*ledger.Node{}
		for _, n := range nodes {
			byName[n.Name()] = n
		}
		sliceOf = func(node string) string { return domainKey(byName[node], node, sreq, top) }
	}
	var best *pick
	for lvl := pref; lvl <= req; lvl++ {
		byDomain := map[string][]reserveSlot{}
		for _, n := range nodes {
			d := "cluster"
			if lvl < top {
				if d = n.Domain(lvl); d == "" {
					d = "node=" + n.Name()
				}
			}
			byDomain[d] = append(byDomain[d], slotsOf[n.Name()]...)
		}
		for _, d := range slices.Sorted(maps.Keys(byDomain)) {
			s := byDomain[d]
			if len(s) < need {
				continue
			}
			soonestFirst(s)
			chosen := s[:need]
			if sliced {
				if chosen = soonestSlices(s, pr.groupSpec.Slices(), pr.groupSpec.SliceSize, sliceOf); chosen == nil {
					continue
				}
			}
			p := &pick{slots: chosen, name: d, lvl: lvl}
			for _, sl := range p.slots {
				p.held += sl.held
				if sl.ready.After(p.start) {
					p.start = sl.ready
				}
			}
			if best == nil || better(p, best) {
				best = p
			}
		}
	}
	if best == nil {
		return nil, "", "", time.Time{}
	}
	keep := map[string]topology.Mask{}
	for _, sl := range best.slots {
		keep[sl.node] = keep[sl.node].Union(sl.gpus)
	}
	start := best.start
	if start.Equal(never) {
		start = time.Time{}
	} else if start.IsZero() {
		start = e.now
	}
	return keep, best.name, levelName(levels, best.lvl), start
}

// nodeSlots are up to need slots for pr's group on n, soonest first: sets
// of the GPUs free for it now, then, pod by pod in the order they end (the
// pods that do not say last, together), sets of those and the GPUs their
// pods free.
func (x *Core) nodeSlots(e *evaluator, v ledger.View, n *ledger.Node, pr Request, need int) []reserveSlot {
	treq := topology.Request{Count: pr.Count, Requirement: pr.req}
	free := e.freeFor(n)
	kept := topology.Mask{}
	if len(n.Reservations()) > 0 {
		kept = n.ReservedAgainst(pr.priority, pr.group, time.Time{})
	}
	type release struct {
		at   time.Time
		gpus topology.Mask
	}
	var rel []release
	for _, h := range v.Holders(n) {
		at := h.Ends
		if at.IsZero() || h.Reserved {
			at = never
		}
		var m topology.Mask
		for _, u := range h.UUIDs {
			if i, ok := n.Graph().IndexOf(u); ok {
				m = m.With(i)
			}
		}
		rel = append(rel, release{at: at, gpus: m.Minus(kept)})
	}
	sort.SliceStable(rel, func(i, j int) bool { return rel[i].at.Before(rel[j].at) })
	avail := free
	var at time.Time // zero: now
	var out []reserveSlot
	for len(out) < need {
		res, err := e.alloc.Allocate(n.Graph(), avail, treq)
		if err == nil {
			set := topology.MaskOf(res.GPUs...)
			out = append(out, reserveSlot{node: n.Name(), gpus: set, held: set.Minus(free).Count(), ready: at})
			avail = avail.Minus(set)
			continue
		}
		if len(rel) == 0 {
			break
		}
		at = rel[0].at
		for len(rel) > 0 && rel[0].at.Equal(at) {
			avail = avail.Union(rel[0].gpus.Intersect(n.Graph().Healthy()))
			rel = rel[1:]
		}
	}
	return out
}

// soonestFirst orders slots by when they are free, then by the GPUs
// still held.
func soonestFirst(s []reserveSlot) {
	sort.SliceStable(s, func(i, j int) bool {
		if !s[i].ready.Equal(s[j].ready) {
			return s[i].ready.Before(s[j].ready)
		}
		return s[i].held < s[j].held
	})
}

// soonestSlices picks, from slots (soonest first), k slices of size slots
// each inside one slice-level domain (sliceOf a slot's node): slice by
// slice, the domain whose next size slots are free soonest, then hold the
// fewest GPUs; nil when the slots cannot hold k slices.
func soonestSlices(slots []reserveSlot, k, size int, sliceOf func(node string) string) []reserveSlot {
	by := map[string][]reserveSlot{}
	for _, s := range slots {
		d := sliceOf(s.node)
		by[d] = append(by[d], s)
	}
	keys := slices.Sorted(maps.Keys(by))
	var out []reserveSlot
	for range k {
		best, bestReady, bestHeld := "", time.Time{}, 0
		for _, d := range keys {
			s := by[d]
			if len(s) < size {
				continue
			}
			ready, held := time.Time{}, 0
			for _, sl := range s[:size] {
				held += sl.held
				if sl.ready.After(ready) {
					ready = sl.ready
				}
			}
			if best == "" || ready.Before(bestReady) || ready.Equal(bestReady) && held < bestHeld {
				best, bestReady, bestHeld = d, ready, held
			}
		}
		if best == "" {
			return nil
		}
		out = append(out, by[best][:size]...)
		by[best] = by[best][size:]
	}
	return out
}
