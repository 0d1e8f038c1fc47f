package placement

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
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

// freeFor is the GPUs of n free for the evaluator's pod: free, less those
// kept for waiting groups that the pod must leave alone.
func (e *evaluator) freeFor(n *ledger.Node) topology.Mask {
	free := n.Free()
	if len(n.Reservations()) == 0 {
		return free
	}
	return free.Minus(n.ReservedAgainst(e.pr.priority, e.pr.group))
}

// keptForGroups is filter's verdict on n for a pod that would fit there
// but for the GPUs kept for waiting groups; the reason names them. It is
// made per node, not remembered: another node with the same free GPUs
// may keep none.
func (e *evaluator) keptForGroups(n *ledger.Node) *verdict {
	var groups []string
	for _, r := range n.Reservations() {
		if r.Priority >= e.pr.priority && r.Group != e.pr.group && !slices.Contains(groups, r.Group) {
			groups = append(groups, r.Group)
		}
	}
	kept := n.Free().Intersect(n.ReservedAgainst(e.pr.priority, e.pr.group))
	return &verdict{code: ReasonReserved, reason: fmt.Sprintf("GPUs %s are kept for group %s, which has waited longer for room (fabric.reserveAfter); pods of its priority or lower are placed on other GPUs",
		kept, strings.Join(groups, ", "))}
}

// reserveRefresh is how often a group's reservation is made again at
// most: the group's pods are tried one after the other, and finding the
// soonest slots reads every node.
const reserveRefresh = 10 * time.Second

// reserveSlot is one place a waiting group's pod could take: a GPU set on
// a node, and how many of its GPUs are still held.
type reserveSlot struct {
	node string
	gpus topology.Mask
	held int
}

// keepForGroup is called when pr's group was tried and does not fit: once
// the group has waited fabric.reserveAfter, it keeps GPUs for the group
// (see above), or ends the group's reservation when it ran out.
func (x *Core) keepForGroup(ctx context.Context, pr Request, candidates []string) {
	f := &x.cfg.Fabric
	after := f.ReserveAfter.Duration
	now := x.now()
	if after <= 0 || pr.created.IsZero() || now.Sub(pr.created) < after {
		return
	}
	var (
		keep          map[string]topology.Mask
		domain, level string
		act           = reserveKeep // leave it as it is
	)
	x.ledger.Read(func(v ledger.View) {
		if v.ReservationEnded(pr.group) {
			return
		}
		if r, ok := v.Reservation(pr.group); ok {
			if now.Sub(r.Since) >= f.ReserveMaxDuration.Duration {
				act = reserveExpire
				return
			}
			if now.Sub(r.Made) < reserveRefresh {
				return // each member is filtered in turn: plan once for all of them
			}
		}
		act = reserveEnd
		g, need, ok := waitingGroup(v, pr)
		if !ok || len(g.Pending)+len(g.Bound) < pr.groupSpec.Size {
			return
		}
		keep, domain, level = x.soonestSlots(ctx, v, pr, g, need, candidates)
		if keep == nil {
			return
		}
		total, kept := 0, 0
		v.EachNode(func(n *ledger.Node) { total += n.Size() })
		for _, m := range keep {
			kept += m.Count()
		}
		if limit := int64(total) * int64(*f.ReserveMaxPercent) / 100; int64(v.ReservedGPUs(pr.group)+kept) <= limit {
			act = reserveMake
		}
	})
	switch act {
	case reserveExpire:
		x.ledger.EndGroupReservation(pr.group, true)
	case reserveMake:
		x.ledger.ReserveForGroup(pr.group, pr.priority, domain, level, keep)
	case reserveEnd:
		x.ledger.EndGroupReservation(pr.group, false)
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
// whose best need slots have the fewest GPUs still held, counting every
// GPU as if its pod had finished; the tighter level among equals. It
// returns the slots' GPUs by node, nil when no domain could hold the
// group even so.
func (x *Core) soonestSlots(ctx context.Context, v ledger.View, pr Request, g ledger.GroupView, need int, candidates []string) (map[string]topology.Mask, string, string) {
	levels := x.cfg.Fabric.Levels
	top := len(levels)
	req, pref := top, 0
	if spec := pr.groupSpec; spec.Required != "" {
		i, ok := configv1alpha1.FabricLevelIndex(levels, spec.Required)
		if !ok {
			return nil, "", ""
		}
		req = i
	}
	if len(g.Bound) > 0 {
		return nil, "", "" // a group with pods bound keeps to their domain; it is planned, not kept for
	}
	var only map[string]bool
	if candidates != nil {
		only = make(map[string]bool, len(candidates))
		for _, c := range candidates {
			only[c] = true
		}
	}
	e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
	treq := topology.Request{Count: pr.Count, Requirement: pr.req}
	var nodes []*ledger.Node
	slotsOf := map[string][]reserveSlot{}
	v.Nodes(func(n *ledger.Node) {
		if only != nil && !only[n.Name()] || n.State(e.window) != ledger.TopoFresh || n.UnknownHeld() > 0 || n.Graph() == nil {
			return
		}
		free := e.freeFor(n)
		all := n.Graph().Healthy()
		if len(n.Reservations()) > 0 {
			all = all.Minus(n.ReservedAgainst(pr.priority, pr.group))
		}
		var out []reserveSlot
		for _, from := range []*topology.Mask{&free, &all} {
			for len(out) < need {
				res, err := e.alloc.Allocate(n.Graph(), *from, treq)
				if err != nil {
					break
				}
				set := topology.MaskOf(res.GPUs...)
				out = append(out, reserveSlot{node: n.Name(), gpus: set, held: set.Minus(free).Count()})
				free, all = free.Minus(set), all.Minus(set)
			}
		}
		if len(out) > 0 {
			nodes = append(nodes, n)
			slotsOf[n.Name()] = out
		}
	})
	type pick struct {
		slots []reserveSlot
		held  int
		name  string
		lvl   int
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
			sort.SliceStable(s, func(i, j int) bool { return s[i].held < s[j].held })
			p := &pick{slots: s[:need], name: d, lvl: lvl}
			for _, sl := range p.slots {
				p.held += sl.held
			}
			if best == nil || p.held < best.held {
				best = p
			}
		}
	}
	if best == nil {
		return nil, "", ""
	}
	keep := map[string]topology.Mask{}
	for _, sl := range best.slots {
		keep[sl.node] = keep[sl.node].Union(sl.gpus)
	}
	return keep, best.name, levelName(levels, best.lvl)
}
