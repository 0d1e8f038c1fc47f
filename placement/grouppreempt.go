package placement

import (
	"context"
	"maps"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
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
func (p Preemption) PlanGroup(ctx context.Context, pr Request, priority int32, candidates []string) *GroupPreemption {
	x := p.x
	kept := x.keptPreemption(pr.group, candidates)
	gp := x.planWaitingGroup(pr, func(v ledger.View, g ledger.GroupView, need int) *GroupPreemption {
		g = kept.nominate(g)
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
			return nil
		}
		// The plan its pods already evict for, while it still holds the
		// group: its victims leave one by one, each making its domains
		// cheaper, and a plan made afresh for each pod would move the
		// group (or swap its slices) midway, evicting in both places.
		if kept != nil {
			if slots, domain, level, err := x.planGroup(ctx, v, pr, g, need, kept.nodes, over); err == nil {
				gp, _ := victimsOf(slots, evictable)
				gp.Group, gp.Domain, gp.Level = pr.group, domain, level
				return gp
			}
		}
		// The planner's own plan (its tightest, best-fitting domain),
		// then one plan per domain of the group's required level; the
		// cheapest kept: fewest jobs disrupted (a group counts once:
		// evicting one of its pods stops it), then fewest victims, then
		// the lowest priorities. Among equals the planner's choice stands.
		var best *GroupPreemption
		var bestCost preemptCost
		for _, cands := range append([][]string{candidates}, x.preemptionDomains(v, pr, candidates)...) {
			slots, domain, level, err := x.planGroup(ctx, v, pr, g, need, cands, over)
			if err != nil {
				continue
			}
			gp, cost := victimsOf(slots, evictable)
			gp.Group, gp.Domain, gp.Level = pr.group, domain, level
			if best == nil || cost.less(bestCost) {
				best, bestCost = gp, cost
			}
		}
		return best
	})
	x.keepPreemption(pr.group, gp)
	return gp
}

// preemptionKept is how long a group's preemption plan is kept for its
// other pods: their victims terminate within their grace period (30 s by
// default), and the group is planned once they are gone.
const preemptionKept = 5 * time.Minute

// keptPlan is a group's last preemption plan: its nodes, the node it kept
// for each pending pod, and when it was made.
type keptPlan struct {
	nodes []string
	slots map[types.UID]string
	at    time.Time
}

// nominate is g with each pending pod not nominated yet counted as
// nominated to the node k kept for it: kube-scheduler nominates it there
// once it has evicted, and the ledger may not have seen that yet. The
// ledger's members are not changed.
func (k *keptPlan) nominate(g ledger.GroupView) ledger.GroupView {
	if k == nil {
		return g
	}
	pending := make([]*ledger.PodInfo, len(g.Pending))
	for i, m := range g.Pending {
		pending[i] = m
		if n := k.slots[m.UID]; n != "" && m.Nominated == "" {
			c := *m
			c.Nominated = n
			pending[i] = &c
		}
	}
	g.Pending = pending
	return g
}

// keptPreemption is group's last preemption plan, nil when it has none of
// the last preemptionKept or one with a node outside candidates (nil:
// every node).
func (x *Core) keptPreemption(group string, candidates []string) *keptPlan {
	v, ok := x.preempting.Load(group)
	if !ok {
		return nil
	}
	kp := v.(*keptPlan)
	if x.now().Sub(kp.at) > preemptionKept {
		x.preempting.CompareAndDelete(group, v)
		return nil
	}
	if candidates != nil && slices.ContainsFunc(kp.nodes, func(n string) bool { return !slices.Contains(candidates, n) }) {
		return nil
	}
	return kp
}

// keepPreemption records gp as group's preemption plan, or forgets the
// group's plan when gp is nil (the group is planned, or no eviction lets
// it fit).
func (x *Core) keepPreemption(group string, gp *GroupPreemption) {
	if group == "" {
		return
	}
	if gp == nil {
		x.preempting.Delete(group)
		return
	}
	kp := &keptPlan{slots: make(map[types.UID]string, len(gp.pending)), at: x.now()}
	for i, uid := range gp.pending {
		if i < len(gp.Slots) {
			kp.slots[uid] = gp.Slots[i]
		}
	}
	kp.nodes = slices.Clone(gp.Slots)
	slices.Sort(kp.nodes)
	kp.nodes = slices.Compact(kp.nodes)
	x.preempting.Store(group, kp)
}

// preemptCost orders group preemption plans: jobs disrupted, victims,
// the sum of their priorities.
type preemptCost struct {
	jobs, victims int
	priority      int64
}

func (c preemptCost) less(o preemptCost) bool {
	if c.jobs != o.jobs {
		return c.jobs < o.jobs
	}
	if c.victims != o.victims {
		return c.victims < o.victims
	}
	return c.priority < o.priority
}

// victimsOf are the pods slots need evicted, of those evictable per node,
// and what evicting them costs.
func victimsOf(slots []ledger.Slot, evictable map[string][]ledger.Holder) (*GroupPreemption, preemptCost) {
	gp := &GroupPreemption{Victims: map[string][]types.UID{}}
	taken := map[string]map[string]bool{}
	for _, s := range slots {
		gp.Slots = append(gp.Slots, s.Node)
		if taken[s.Node] == nil {
			taken[s.Node] = map[string]bool{}
		}
		for _, u := range s.Choice.UUIDs {
			taken[s.Node][u] = true
		}
	}
	var cost preemptCost
	jobs := map[string]bool{}
	for node, gpus := range taken {
		for _, h := range evictable[node] {
			if h.Unknown > 0 || slices.ContainsFunc(h.UUIDs, func(u string) bool { return gpus[u] }) {
				gp.Victims[node] = append(gp.Victims[node], h.UID)
				cost.victims++
				cost.priority += int64(h.Priority)
				job := "pod:" + string(h.UID)
				if h.Group != "" {
					job = "group:" + h.Group
				}
				jobs[job] = true
			}
		}
	}
	cost.jobs = len(jobs)
	return gp, cost
}

// preemptionDomains are the candidate node sets group preemption also
// plans on: one per domain of the group's required fabric level (nodes
// without a domain there each alone), in domain order; none when the
// group requires no level.
func (x *Core) preemptionDomains(v ledger.View, pr Request, candidates []string) [][]string {
	lvl, ok := configv1alpha1.FabricLevelIndex(x.cfg.Fabric.Levels, pr.groupSpec.Required)
	if pr.groupSpec.Required == "" || !ok {
		return nil
	}
	var only map[string]bool
	if candidates != nil {
		only = make(map[string]bool, len(candidates))
		for _, c := range candidates {
			only[c] = true
		}
	}
	byDomain := map[string][]string{}
	v.Nodes(func(n *ledger.Node) {
		if only != nil && !only[n.Name()] {
			return
		}
		d := n.Domain(lvl)
		if d == "" {
			d = "node=" + n.Name()
		}
		byDomain[d] = append(byDomain[d], n.Name())
	})
	keys := slices.Sorted(maps.Keys(byDomain))
	out := make([][]string, len(keys))
	for i, k := range keys {
		out[i] = byDomain[k]
	}
	return out
}

// PlanGroupIf plans pr's group on the nodes as ws changes them (for the
// plugin build: the pods kube-scheduler's pod-group preemption took out
// of its snapshot to try), recording nothing: where its pods would go,
// nil when the group does not fit even so, is planned already, or pr is
// not in a group of more than one.
func (p Preemption) PlanGroupIf(ctx context.Context, pr Request, candidates []string, ws map[string]*WhatIf) *GroupPreemption {
	x := p.x
	return x.planWaitingGroup(pr, func(v ledger.View, g ledger.GroupView, need int) *GroupPreemption {
		slots, domain, level, err := x.planGroup(ctx, v, pr, g, need, candidates, ws)
		if err != nil {
			return nil
		}
		out := &GroupPreemption{Group: pr.group, Domain: domain, Level: level, Victims: map[string][]types.UID{}}
		for _, s := range slots {
			out.Slots = append(out.Slots, s.Node)
		}
		return out
	})
}

// planWaitingGroup runs plan on a read view of the ledger for pr's group
// when pr is in a group of more than one that still waits (waitingGroup),
// and records the group's pending pods on what plan returns (nil: no
// plan).
func (x *Core) planWaitingGroup(pr Request, plan func(v ledger.View, g ledger.GroupView, need int) *GroupPreemption) *GroupPreemption {
	if !x.inGroup(&pr) {
		return nil
	}
	var out *GroupPreemption
	x.ledger.Read(func(v ledger.View) {
		g, need, ok := waitingGroup(v, pr)
		if !ok {
			return
		}
		if out = plan(v, g, need); out == nil {
			return
		}
		for _, m := range g.Pending {
			out.pending = append(out.pending, m.UID)
		}
	})
	return out
}

// inGroup resolves pr's group and says whether pr is a GPU pod of a group
// of more than one.
func (x *Core) inGroup(pr *Request) bool {
	return pr.group != "" && pr.Count > 0 && x.resolveGroup(pr) == nil && pr.groupSpec.Size >= 2
}

// waitingGroup is pr's group as v has it, with how many of its pods still
// need a place; ok is false when the group is unseen, planned already, or
// has every pod it needs bound.
func waitingGroup(v ledger.View, pr Request) (g ledger.GroupView, need int, ok bool) {
	g, ok = v.Group(pr.group)
	if !ok || g.Planned {
		return g, 0, false
	}
	need = pr.groupSpec.Size - len(g.Bound)
	return g, need, need > 0
}
