package placement

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/placement/ledger"
)

// GroupPreemption is where a group that fits nowhere now would be placed
// whole if lower-priority pods were evicted: the group's plan made on
// every node with its evictable pods gone, and the pods holding the GPUs
// that plan takes.
type GroupPreemption struct {
	Group, Domain, Level string
	// Slots are the plan's places, one per pending pod of the group, in
	// the order of the pods' names (Slot).
	Slots []string
	// Victims are the pods to evict on each of the plan's nodes: those
	// whose GPUs the plan's sets take there (and, on such a node, those
	// holding GPUs of unknown identity).
	Victims map[string][]types.UID
	// pending are the group's pending pods, by name, matching Slots.
	pending []types.UID
}

// Slot is the node the plan keeps for pod uid, "" when it has none.
func (g *GroupPreemption) Slot(uid types.UID) string {
	if g == nil {
		return ""
	}
	if i := slices.Index(g.pending, uid); i >= 0 && i < len(g.Slots) {
		return g.Slots[i]
	}
	return ""
}

// PlanGroupPreemption plans pr's group (its pods of priority priority) as
// if every pod of lower priority that holds GPUs were gone, on candidates
// (nil: every node), and names the victims that plan needs. nil when pr is
// not in a group of more than one, the group is planned already, or no
// eviction lets it fit: then no pod is evicted for it. It changes
// nothing in the ledger: kube-scheduler's preemption (the plugin's
// Filter, the extender's preempt verb) evicts, one node per pod, and the
// group is planned as usual once the GPUs are free.
func (x *Core) PlanGroupPreemption(ctx context.Context, pr Request, priority int32, candidates []string) *GroupPreemption {
	if pr.group == "" || pr.Count == 0 || x.resolveGroup(&pr) != nil || pr.groupSpec.Size < 2 {
		return nil
	}
	var out *GroupPreemption
	x.ledger.Read(func(v ledger.View) {
		g, ok := v.Group(pr.group)
		if !ok || g.Planned {
			return
		}
		need := pr.groupSpec.Size - len(g.Bound)
		if need <= 0 {
			return
		}
		over := map[string]*WhatIf{}
		evictable := map[string][]ledger.Holder{}
		v.EachNode(func(n *ledger.Node) {
			for _, h := range v.Holders(n) {
				if h.Reserved || h.Priority >= priority {
					continue
				}
				w := over[n.Name()]
				if w == nil {
					w = &WhatIf{}
					over[n.Name()] = w
				}
				w.Remove(h.UID)
				evictable[n.Name()] = append(evictable[n.Name()], h)
			}
		})
		if len(over) == 0 {
			return
		}
		slots, domain, level, err := x.planGroup(ctx, v, pr, g, need, candidates, over)
		if err != nil {
			return
		}
		out = &GroupPreemption{Group: pr.group, Domain: domain, Level: level, Victims: map[string][]types.UID{}}
		taken := map[string]map[string]bool{}
		for _, s := range slots {
			out.Slots = append(out.Slots, s.Node)
			if taken[s.Node] == nil {
				taken[s.Node] = map[string]bool{}
			}
			for _, u := range s.Choice.UUIDs {
				taken[s.Node][u] = true
			}
		}
		for node, gpus := range taken {
			for _, h := range evictable[node] {
				if h.Unknown > 0 || slices.ContainsFunc(h.UUIDs, func(u string) bool { return gpus[u] }) {
					out.Victims[node] = append(out.Victims[node], h.UID)
				}
			}
		}
		for _, m := range g.Pending {
			out.pending = append(out.pending, m.UID)
		}
	})
	return out
}
