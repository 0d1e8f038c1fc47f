package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// Groups (docs/groups.md): a pod that belongs to a group of more than one
// pod is decided as part of it. The first member decided plans the whole
// group under the ledger's write lock: a fabric domain that holds every
// pod not bound yet, then each pod's node and exact GPUs in it. The plan
// is held at once, so no other pod takes its GPUs; a group that does not
// fit holds nothing and its pods are refused, in words, until it does.
// Each member then claims a slot and may go to its slot's node only.

// GroupWait is why a group's pod cannot be placed yet: the group waits
// for its pods, or no domain holds all of them. It is the pod's reason on
// every node.
type GroupWait struct {
	Group string
	// Msg is the reason, for a person (without ReasonPrefix).
	Msg string
	// Unresolvable: no change of GPU use can fix it (the group can never
	// fit at its required level, even with every GPU free).
	Unresolvable bool
}

func (w *GroupWait) Error() string { return w.Msg }

// GroupSlot is where a group's pod goes: the node of its slot.
type GroupSlot struct {
	Group, Node string
}

// OtherNodeReason is filter's reason for a node that is not the pod's
// slot.
func (s *GroupSlot) OtherNodeReason() string {
	return ReasonPrefix + "the pod's place in group " + s.Group + " is node " + s.Node + " (the group was planned as a whole)"
}

// slot claims pr's slot in its group's plan, planning the group first
// when it has none. It returns the slot's node; a *GroupWait when the
// group cannot be placed now; nil and no error for a pod that is not in a
// group of more than one. Filter calls it with its candidate nodes (those
// that passed kube-scheduler's own filters for the pod: the plan keeps to
// them); PreFilter with the nodes the pod's own rules allow.
func (x *Core) slot(ctx context.Context, pr Request, candidates []string) (*GroupSlot, error) {
	return x.groupSlot(ctx, pr, candidates, candidates)
}

// groupSlot is slot; a group that waits keeps GPUs on the nodes of
// reserveOver (nil: every node).
func (x *Core) groupSlot(ctx context.Context, pr Request, candidates, reserveOver []string) (*GroupSlot, error) {
	if pr.group == "" || pr.Count == 0 {
		return nil, nil
	}
	if err := x.resolveGroup(&pr); err != nil {
		return nil, err
	}
	if pr.groupSpec.Size < 2 {
		return nil, nil
	}
	if msg := x.deciderRefusal(); msg != "" {
		return nil, errors.New(msg)
	}
	prefer := pr.nominated
	if pr.pinned != "" {
		x.ledger.Read(func(v ledger.View) {
			if n := pinnedNode(v, pr.pinned); n != nil {
				prefer = n.Name()
			}
		})
	}
	if node, ok := x.ledger.ClaimSlot(pr.group, pr.UID, pr.Key, prefer, pr.slice()); ok {
		return &GroupSlot{Group: pr.group, Node: node}, nil
	}
	var complete bool
	err := x.ledger.PlanGroup(pr.group, func(v ledger.View, g ledger.GroupView) ([]ledger.Slot, string, string, error) {
		need := pr.groupSpec.Size - len(g.Bound)
		if need <= 0 {
			complete = true
			return nil, "", "", nil
		}
		return x.planGroup(ctx, v, pr, g, need, withNominated(candidates, g), nil)
	})
	if errors.Is(err, ledger.ErrGroupUnseen) {
		return nil, &GroupWait{Group: pr.group, Msg: fmt.Sprintf("group %s waits for its pods: %s", pr.group, err)}
	}
	if w := (*GroupWait)(nil); errors.As(err, &w) && !w.Unresolvable {
		x.keepForGroup(ctx, pr, reserveOver)
	}
	if err != nil {
		return nil, err
	}
	if complete {
		return nil, nil // every pod the group needs is bound; this one is an extra
	}
	if node, ok := x.ledger.ClaimSlot(pr.group, pr.UID, pr.Key, prefer, pr.slice()); ok {
		return &GroupSlot{Group: pr.group, Node: node}, nil
	}
	return nil, &GroupWait{Group: pr.group, Msg: fmt.Sprintf("group %s is placed and has no place left for this pod (it has more pods than its size %d)", pr.group, pr.groupSpec.Size)}
}

// withNominated adds to candidates (nil: every node) the nodes the
// group's pending pods are nominated to. kube-scheduler's filters count a
// pod nominated to a node against every other pod of lower or equal
// priority there, the group's other pods included, so in extender mode
// each pod of a group that preempted would otherwise see its own node
// only, and the group could never be planned.
func withNominated(candidates []string, g ledger.GroupView) []string {
	if candidates == nil {
		return nil
	}
	out := candidates
	for _, m := range g.Pending {
		if m.Nominated != "" && !slices.Contains(out, m.Nominated) {
			if len(out) == len(candidates) {
				out = slices.Clone(candidates)
			}
			out = append(out, m.Nominated)
		}
	}
	return out
}

// resolveGroup reads the spec of a pod's Kubernetes PodGroup from the
// ledger into pr; a PodGroup not seen yet is a *GroupWait.
func (x *Core) resolveGroup(pr *Request) error {
	if !pr.native {
		return nil
	}
	var ok bool
	var err error
	x.ledger.Read(func(v ledger.View) { pr.groupSpec, ok, err = v.NativeGroup(pr.group) })
	switch {
	case !ok:
		return &GroupWait{Group: pr.group, Msg: fmt.Sprintf("pod names PodGroup %s (spec.schedulingGroup.podGroupName), which the scheduler has not seen: create it, or check that the cluster serves scheduling.k8s.io/v1beta1 PodGroups", pr.group)}
	case err != nil:
		return &GroupWait{Group: pr.group, Unresolvable: true, Msg: err.Error()}
	}
	if _, err := ledger.SliceOf(pr.Key, pr.groupSpec, pr.indexes); err != nil {
		return &GroupWait{Group: pr.group, Unresolvable: true, Msg: err.Error()}
	}
	return nil
}

// domain is one fabric domain's nodes and what they can take of a group.
type domain struct {
	name  string
	nodes []*groupNode
	slots int // pods of the group the domain can take
	free  int // free GPUs in it
}

// groupNode is a node with the GPU sets the group's pods would take on it,
// best first.
type groupNode struct {
	n    *ledger.Node
	sets []topology.Result
	// For the part of a node left to a group's later slices: origin is
	// the whole node's groupNode, taken the GPUs earlier slices took.
	origin *groupNode
	taken  int
	// costs are, in a sliced group's what-if for preemption, the GPUs of
	// each set that are not free now (nil otherwise).
	costs []int
}

// cost is the GPUs the node's sets take that are not free now.
func (gn *groupNode) cost() int {
	c := 0
	for _, k := range gn.costs {
		c += k
	}
	return c
}

// free is how many of the node's GPUs are free for the group.
func (gn *groupNode) free() int { return gn.n.Free().Count() - gn.taken }

// planGroup finds the group's slots (need pods, each like pr) in the
// tightest fabric level allowed that holds them all, best fit within the
// level so that large domains stay whole for large groups.
//
// over, when not nil, changes nodes as preemption would (group
// preemption plans on the nodes with their evictable pods gone).
func (x *Core) planGroup(ctx context.Context, v ledger.View, pr Request, g ledger.GroupView, need int, candidates []string, over map[string]*WhatIf) ([]ledger.Slot, string, string, error) {
	spec := pr.groupSpec
	if have := len(g.Pending) + len(g.Bound); have < spec.Size {
		return nil, "", "", &GroupWait{Group: pr.group, Msg: fmt.Sprintf("group %s waits for its pods: %d of %d exist", pr.group, have, spec.Size)}
	}
	for _, m := range g.Pending {
		if m.GPUs != pr.Count {
			return nil, "", "", &GroupWait{Group: pr.group, Unresolvable: true, Msg: fmt.Sprintf("pods of group %s request different GPU counts (%s: %d, %s: %d); a group's pods must request the same number", pr.group, pr.Key.Name, pr.Count, m.Key.Name, m.GPUs)}
		}
	}
	levels := x.cfg.Fabric.Levels
	top := len(levels) // the whole cluster, as one domain
	req, pref := top, 0
	if spec.Required != "" {
		i, ok := configv1alpha1.FabricLevelIndex(levels, spec.Required)
		if !ok {
			return nil, "", "", &GroupWait{Group: pr.group, Unresolvable: true, Msg: fmt.Sprintf("group %s requires fabric level %q, which the scheduler's fabric.levels does not name (levels: %s)", pr.group, spec.Required, levelNames(levels))}
		}
		req = i
	}
	if spec.Preferred != "" {
		if i, ok := configv1alpha1.FabricLevelIndex(levels, spec.Preferred); ok {
			pref = i
		}
	}
	pref = min(pref, req)
	if pinnedGroup(g, need) {
		return x.planPinned(ctx, v, pr, g, req, top)
	}
	if spec.Slices() > 0 {
		return x.planSliced(ctx, v, pr, g, need, candidates, over, pref, req)
	}
	e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
	nodes := x.groupNodes(e, v, pr, need, candidates, over)
	// With every GPU free: can the required level ever hold the group?
	var largest domain
	for lvl := pref; lvl <= req; lvl++ {
		doms := domainsAt(nodes, lvl, top, g.Bound, v)
		anc := ancestorsFree(nodes, lvl, top)
		best := -1
		for i, d := range doms {
			if d.slots >= need && (best < 0 || fitsTighter(d, doms[best], anc)) {
				best = i
			}
			if lvl == req && d.slots > largest.slots {
				largest = d
			}
		}
		if best < 0 {
			continue
		}
		d := doms[best]
		slots := x.fill(e, v, pr, d, lvl, need)
		return slots, d.name, levelName(levels, lvl), nil
	}
	where := "the cluster"
	if req < top {
		where = "one " + levelName(levels, req) + " domain"
	}
	if len(g.Bound) == 0 {
		if most := x.pristineSlots(v, pr, need, req, top); most < need {
			return nil, "", "", &GroupWait{Group: pr.group, Unresolvable: true, Msg: fmt.Sprintf("group %s needs %d pods × %d GPUs in %s; none holds that many even with every GPU free (the largest holds %d): lower group-required-topology or the group's size", pr.group, need, pr.Count, where, most)}
		}
	}
	return nil, "", "", &GroupWait{Group: pr.group, Msg: fmt.Sprintf("group %s needs %d pods × %d GPUs in %s; the largest free holds %d", pr.group, need, pr.Count, where, largest.slots)}
}

// pristineSlots is how many of the group's pods (each like pr, at most
// need) the roomiest domain at fabric level lvl (top: the cluster) could
// take with every GPU of every node free and healthy: when it is below
// need, no change of GPU use can place the group. It counts every node the
// ledger knows, not only the request's candidates (in extender mode those
// are what kube-scheduler's filters passed for the GPUs free now), so it
// may say a group fits that node rules keep out, never the reverse. The
// allocator runs once per machine shape.
func (x *Core) pristineSlots(v ledger.View, pr Request, need, lvl, top int) int {
	req := topology.Request{Count: pr.Count, Requirement: pr.req}
	perShape := map[uint64]int{}
	perDomain := map[string]int{}
	most := 0
	v.EachNode(func(n *ledger.Node) {
		t := n.Topo()
		if t == nil {
			return
		}
		k, ok := perShape[t.ID()]
		if !ok {
			g := t.Pristine()
			free := g.All()
			for k < need {
				res, err := x.alloc.Allocate(g, free, req)
				if err != nil {
					break
				}
				k++
				free = free.Minus(topology.MaskOf(res.GPUs...))
			}
			perShape[t.ID()] = k
		}
		if k == 0 {
			return
		}
		d := "cluster"
		if lvl < top {
			if d = n.Domain(lvl); d == "" {
				d = "node=" + n.Name()
			}
		}
		perDomain[d] += k
		most = max(most, perDomain[d])
	})
	return min(most, need)
}

// ancestorsFree gives, for a domain at level lvl, the free GPUs of the
// domains that enclose it at each looser level below top (from nodes,
// the nodes that can take a pod; 0 at a level where it has none).
func ancestorsFree(nodes []*groupNode, lvl, top int) func(d domain) []int {
	free := make([]map[string]int, top)
	for l := lvl + 1; l < top; l++ {
		free[l] = map[string]int{}
		for _, gn := range nodes {
			if k := gn.n.Domain(l); k != "" {
				free[l][k] += gn.free()
			}
		}
	}
	return func(d domain) []int {
		var out []int
		for l := lvl + 1; l < top && len(d.nodes) > 0; l++ {
			// 0 where the domain has no enclosing domain at l (an
			// unlabelled level says nothing).
			out = append(out, free[l][d.nodes[0].n.Domain(l)])
		}
		return out
	}
}

// fitsTighter says whether domain a is a better fit than b: fewer free
// GPUs; among equals the one whose enclosing domains, from the tightest
// up, have fewer free GPUs (so that the group goes where GPUs are already
// in use and whole leaves and spines stay free for the groups that need
// them); then the name.
func fitsTighter(a, b domain, anc func(domain) []int) bool {
	if a.free != b.free {
		return a.free < b.free
	}
	if c := slices.Compare(anc(a), anc(b)); c != 0 {
		return c < 0
	}
	return a.name < b.name
}

// groupNodes are the nodes that could take at least one of the group's
// pods now, with the GPU sets need of them would take (best first).
func (x *Core) groupNodes(e *evaluator, v ledger.View, pr Request, need int, candidates []string, over map[string]*WhatIf) []*groupNode {
	var out []*groupNode
	req := topology.Request{Count: pr.Count, Requirement: pr.req}
	var only map[string]bool
	if candidates != nil {
		only = make(map[string]bool, len(candidates))
		for _, c := range candidates {
			only[c] = true
		}
	}
	v.Nodes(func(n *ledger.Node) {
		if only != nil && !only[n.Name()] {
			return
		}
		live := v.NodeFor(n.Name(), pr.UID)
		n = over[n.Name()].on(v, live)
		if vd := e.check(n); !vd.ok {
			return
		}
		gn := &groupNode{n: n}
		free := e.freeFor(n)
		if u := n.UnknownHeld(); u > 0 {
			return // GPUs held but not identified: not a node to plan exact GPUs on
		}
		// A sliced group's what-if weighs each set by the GPUs it takes
		// that are not free now (slices.go: each slice where it evicts
		// least).
		var liveFree topology.Mask
		costed := over != nil && pr.groupSpec.Slices() > 0
		if costed {
			liveFree = e.freeFor(live)
		}
		for len(gn.sets) < need {
			res, err := e.alloc.Allocate(n.Graph(), free, req)
			if err != nil {
				break
			}
			gn.sets = append(gn.sets, res)
			if costed {
				gn.costs = append(gn.costs, topology.MaskOf(res.GPUs...).Minus(liveFree).Count())
			}
			free = free.Minus(topology.MaskOf(res.GPUs...))
		}
		if len(gn.sets) > 0 {
			out = append(out, gn)
		}
	})
	return out
}

// domainsAt groups nodes into their domains at fabric level lvl (top: the
// whole cluster). A node without a domain at lvl is a domain of its own.
// With members already bound, only the domain that holds all of them is
// kept.
func domainsAt(nodes []*groupNode, lvl, top int, bound []string, v ledger.View) []domain {
	key := func(n *ledger.Node) string { return domainKey(n, n.Name(), lvl, top) }
	want := ""
	for i, b := range bound {
		bn := v.Node(b)
		if bn == nil {
			return nil
		}
		k := key(bn)
		if i > 0 && k != want {
			return nil
		}
		want = k
	}
	idx := map[string]int{}
	var out []domain
	for _, gn := range nodes {
		k := key(gn.n)
		if want != "" && k != want {
			continue
		}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, domain{name: k})
		}
		d := &out[i]
		d.nodes = append(d.nodes, gn)
		d.slots += len(gn.sets)
		d.free += gn.free()
	}
	return out
}

// fill picks need slots in d, a domain at fabric level lvl: one machine
// shape for every pod where one shape in d holds them all (the least
// capable such shape); below lvl as few domains as possible (descend);
// inside the tightest, the fullest nodes first, so that whole nodes stay
// free.
func (x *Core) fill(e *evaluator, v ledger.View, pr Request, d domain, lvl, need int) []ledger.Slot {
	nodes := d.nodes
	byShape := map[uint64]int{}
	for _, gn := range nodes {
		byShape[gn.n.Topo().ID()] += len(gn.sets)
	}
	shape, shapeCap := uint64(0), -1.0
	for id, slots := range byShape {
		if slots < need {
			continue
		}
		var lc float64
		for _, gn := range nodes {
			if gn.n.Topo().ID() == id {
				lc = gn.n.Topo().LogCapability()
				break
			}
		}
		if shapeCap < 0 || lc < shapeCap || lc == shapeCap && id < shape {
			shape, shapeCap = id, lc
		}
	}
	if shapeCap >= 0 {
		nodes = slices.DeleteFunc(slices.Clone(nodes), func(gn *groupNode) bool { return gn.n.Topo().ID() != shape })
	}
	sort.SliceStable(nodes, func(i, j int) bool {
		if ci, cj := nodes[i].cost(), nodes[j].cost(); ci != cj {
			return ci < cj // a sliced group's what-if: the fewest evictions first
		}
		fi, fj := nodes[i].free(), nodes[j].free()
		if fi != fj {
			return fi < fj
		}
		return nodes[i].n.Name() < nodes[j].n.Name()
	})
	nodes = descend(nodes, lvl, need)
	var out []ledger.Slot
	aff := v.Affinity(pr.job)
	for _, gn := range nodes {
		for _, res := range gn.sets {
			if len(out) == need {
				return out
			}
			vd := &verdict{ok: true, res: res}
			merit, _ := e.merit(gn.n, vd, aff, soloCohort(gn.n, vd))
			p := pr.placementOf(gn.n.Name(), vd, merit)
			p.Group, p.Domain = pr.group, d.name
			out = append(out, ledger.Slot{Node: gn.n.Name(), Choice: ledger.Choice{UUIDs: uuidsOf(gn.n, res.GPUs), Placement: p}})
		}
	}
	return out
}

// descend orders nodes (given fullest first) so that need slots taken in
// that order lie in as few domains below level lvl as possible, level by
// level: the smallest child domain that holds what is left, else the one
// that holds the most (and on); the domains the group does not need stay
// whole for the next group. A level at which the nodes are all in one
// domain, or none is in any, is passed over.
func descend(nodes []*groupNode, lvl, need int) []*groupNode {
	type child struct {
		nodes       []*groupNode
		slots, free int
	}
	for k := lvl - 1; k >= 0 && len(nodes) > 1; k-- {
		idx := map[string]int{}
		var kids []*child
		labelled := false
		for _, gn := range nodes {
			key := gn.n.Domain(k)
			if key != "" {
				labelled = true
			} else {
				key = "node=" + gn.n.Name()
			}
			i, ok := idx[key]
			if !ok {
				i = len(kids)
				idx[key] = i
				kids = append(kids, &child{})
			}
			c := kids[i]
			c.nodes = append(c.nodes, gn)
			c.slots += len(gn.sets)
			c.free += gn.free()
		}
		if !labelled || len(kids) == 1 {
			continue
		}
		out := make([]*groupNode, 0, len(nodes))
		for rest := need; rest > 0 && len(kids) > 0; {
			pick := -1
			for i, c := range kids {
				if c.slots >= rest && (pick < 0 || c.slots < kids[pick].slots || c.slots == kids[pick].slots && c.free < kids[pick].free) {
					pick = i
				}
			}
			if pick < 0 {
				pick = 0
				for i, c := range kids {
					if c.slots > kids[pick].slots || c.slots == kids[pick].slots && c.free < kids[pick].free {
						pick = i
					}
				}
			}
			c := kids[pick]
			take := min(rest, c.slots)
			out = append(out, descend(c.nodes, k, take)...)
			rest -= take
			kids = slices.Delete(kids, pick, pick+1)
		}
		for _, c := range kids {
			out = append(out, c.nodes...)
		}
		return out
	}
	return nodes
}
