package placement

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// Slices (docs/groups.md, "Slices"): a group cut into slices of
// spec.SliceSize pods is placed whole inside one domain at its group
// level, as any group, and each slice inside one domain at its slice
// level. The planner tries the group's domains as for a group without
// slices (tightest level first, best fit within it); inside one, it places
// the slices one by one, each in the best-fitting domain that still holds
// it at the tightest slice level allowed (several slices may share a
// domain that holds them), and keeps the first group domain where every
// slice found one. Inside a slice's domain the nodes and GPUs are chosen
// as for a whole group (fill).

// sliceLevels are a sliced group's slice levels: the tightest tried and
// the loosest allowed; an error when the spec names a level the
// configuration does not know or a slice level wider than the group's.
func (x *Core) sliceLevels(spec v1alpha1.GroupSpec, group string) (pref, req int, err error) {
	levels := x.cfg.Fabric.Levels
	req, ok := configv1alpha1.FabricLevelIndex(levels, spec.SliceRequired)
	if !ok {
		return 0, 0, &GroupWait{Group: group, Unresolvable: true, Msg: fmt.Sprintf("group %s: %s %q is not a level of the scheduler's fabric.levels (levels: %s)", group, v1alpha1.AnnotationSliceRequiredTopology, spec.SliceRequired, levelNames(levels))}
	}
	index := func(name string) (int, bool) { return configv1alpha1.FabricLevelIndex(levels, name) }
	if ferr := v1alpha1.CheckSliceLevels(field.NewPath("metadata", "annotations"), spec, index); ferr != nil {
		return 0, 0, &GroupWait{Group: group, Unresolvable: true, Msg: fmt.Sprintf("group %s: %s", group, ferr.Error())}
	}
	if spec.SlicePreferred != "" {
		if i, ok := index(spec.SlicePreferred); ok {
			pref = min(i, req)
		}
	}
	return pref, req, nil
}

// groupSlice is one slice of a plan being made.
type groupSlice struct {
	index int
	// need is how many of its pods are still to place; domain the slice
	// level domain its bound pods lie in ("" when none is bound).
	need   int
	domain string
	bound  int
}

// sliceNeeds are the slices of pr's group still to place, from its bound
// members: a bound pod counts in the slice it names, else in a slice
// whose domain at slice level lvl holds it (a new one when none has
// room).
func sliceNeeds(v ledger.View, spec v1alpha1.GroupSpec, g ledger.GroupView, lvl, top int) ([]*groupSlice, error) {
	out := make([]*groupSlice, spec.Slices())
	for i := range out {
		out[i] = &groupSlice{index: i}
	}
	var loose []string // domains of bound pods that name no slice
	for _, m := range g.BoundPods {
		d := domainKey(v.Node(m.Node), m.Node, lvl, top)
		j, err := m.Slice(spec)
		if err != nil {
			return nil, err
		}
		if j < 0 {
			loose = append(loose, d)
			continue
		}
		s := out[j]
		s.bound++
		if s.domain == "" {
			s.domain = d
		}
	}
	slices.Sort(loose)
	for _, d := range loose {
		i := slices.IndexFunc(out, func(s *groupSlice) bool { return s.domain == d && s.bound < spec.SliceSize })
		if i < 0 {
			i = slices.IndexFunc(out, func(s *groupSlice) bool { return s.bound == 0 })
		}
		if i < 0 {
			break // more bound pods than the group's size
		}
		out[i].bound++
		out[i].domain = d
	}
	for _, s := range out {
		s.need = max(spec.SliceSize-s.bound, 0)
	}
	return out, nil
}

// domainKey is node n's (named name) domain at fabric level lvl, as
// domainsAt names it.
func domainKey(n *ledger.Node, name string, lvl, top int) string {
	switch {
	case lvl == top:
		return "cluster"
	case n != nil && n.Domain(lvl) != "":
		return n.Domain(lvl)
	}
	return "node=" + name
}

// fillSlices places the slices in d, a domain at group level lvl: every
// slice with pods to place in one domain at a slice level from spref to
// sreq. It returns the slots, in the order of g.Pending where members
// name their slice, or why a slice found no domain.
func (x *Core) fillSlices(e *evaluator, v ledger.View, pr Request, g ledger.GroupView, d domain, need int, parts []*groupSlice, spref, sreq, top int) ([]ledger.Slot, string) {
	levels := x.cfg.Fabric.Levels
	taken := map[*groupNode]int{} // sets taken by the slices placed so far
	rest := func(keep func(gn *groupNode) bool) []*groupNode {
		var out []*groupNode
		for _, gn := range d.nodes {
			if k := taken[gn]; k < len(gn.sets) && keep(gn) {
				used := 0
				for _, s := range gn.sets[:k] {
					used += len(s.GPUs)
				}
				part := &groupNode{n: gn.n, sets: gn.sets[k:], origin: gn, taken: gn.taken + used}
				if gn.costs != nil {
					part.costs = gn.costs[k:]
				}
				out = append(out, part)
			}
		}
		return out
	}
	// Slices whose pods are bound somewhere first: their domain is fixed.
	// Then those with more pods nominated (nominatedIn): they keep the
	// domain their preemption evicts in before another slice, cheaper
	// there now that some victims are gone, takes it.
	order := slices.Clone(parts)
	nominated := map[int]int{}
	for _, m := range g.Pending {
		if j, err := m.Slice(pr.groupSpec); err == nil && j >= 0 && m.Nominated != "" {
			nominated[j]++
		}
	}
	slices.SortStableFunc(order, func(a, b *groupSlice) int {
		return cmp.Or(cmp.Compare(boolInt(a.domain == ""), boolInt(b.domain == "")), cmp.Compare(nominated[b.index], nominated[a.index]))
	})
	bySlice := map[int][]ledger.Slot{}
	for _, s := range order {
		if s.need == 0 {
			continue
		}
		var in domain
		var at int
		found := false
		if s.domain != "" {
			nodes := rest(func(gn *groupNode) bool { return domainKey(gn.n, gn.n.Name(), sreq, top) == s.domain })
			doms := domainsAt(nodes, sreq, top, nil, v)
			if len(doms) == 0 || doms[0].slots < s.need {
				have := 0
				if len(doms) > 0 {
					have = doms[0].slots
				}
				return nil, fmt.Sprintf("slice %d has %d pods bound in %s, which has room for %d of its %d others", s.index, s.bound, s.domain, have, s.need)
			}
			in, at, found = doms[0], sreq, true
		}
		roomiest := 0
		for lvl := spref; !found && lvl <= sreq; lvl++ {
			nodes := rest(func(*groupNode) bool { return true })
			doms := domainsAt(nodes, lvl, top, nil, v)
			anc := ancestorsFree(nodes, lvl, top)
			best := -1
			costs := make([]int, len(doms))
			noms := make([]int, len(doms))
			for i, c := range doms {
				costs[i] = evictions(c, s.need)
				noms[i] = nominatedIn(c, g, pr.groupSpec, s.index)
			}
			// The domain most of the slice's pods are nominated to, then
			// the one that evicts least, then the tightest fit.
			better := func(i, j int) bool {
				if noms[i] != noms[j] {
					return noms[i] > noms[j]
				}
				if costs[i] != costs[j] {
					return costs[i] < costs[j]
				}
				return fitsTighter(doms[i], doms[j], anc)
			}
			for i, c := range doms {
				roomiest = max(roomiest, c.slots)
				if c.slots >= s.need && (best < 0 || better(i, best)) {
					best = i
				}
			}
			if best >= 0 {
				in, at, found = doms[best], lvl, true
			}
		}
		if !found {
			return nil, fmt.Sprintf("slice %d (%d pods) found no %s domain with room for it in %s; the roomiest left holds %d", s.index, s.need, levelName(levels, sreq), d.name, roomiest)
		}
		for _, sl := range x.fill(e, v, pr, in, at, s.need) {
			sl.Slice = s.index
			sl.Choice.Placement.Domain = d.name
			sl.Choice.Placement.Slice, sl.Choice.Placement.SliceDomain = s.index, in.name
			bySlice[s.index] = append(bySlice[s.index], sl)
		}
		for _, gn := range in.nodes {
			taken[gn.origin] += countOn(bySlice[s.index], gn.n.Name())
		}
	}
	return slotsForPending(pr, g, bySlice, need), ""
}

// nominatedIn is how many of g's pending pods of slice index are
// nominated to a node of d: the slice's preemption evicted there for them.
// A slice goes where most of its pods are nominated, before any domain
// that would evict less. Its preemption plan is made again for each of
// its pods while their victims leave one by one, and every eviction makes
// its domain cheaper, so by cost alone the slices would swap domains
// midway, some pods of each nominated in both. kube-scheduler counts a
// nominated pod against every pod of no higher priority on its node, the
// group's others included: a plan that puts a slice's slots on nodes the
// other slice's pods are nominated to leaves pods waiting on each other.
func nominatedIn(d domain, g ledger.GroupView, spec v1alpha1.GroupSpec, index int) int {
	k := 0
	for _, m := range g.Pending {
		if m.Nominated == "" {
			continue
		}
		if j, err := m.Slice(spec); err != nil || j != index && j >= 0 {
			continue
		}
		if slices.ContainsFunc(d.nodes, func(gn *groupNode) bool { return gn.n.Name() == m.Nominated }) {
			k++
		}
	}
	return k
}

// countOn is how many of slots lie on node.
func countOn(slots []ledger.Slot, node string) int {
	k := 0
	for _, s := range slots {
		if s.Node == node {
			k++
		}
	}
	return k
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// slotsForPending orders the slices' slots as the group's pending pods
// claim them: a pod that names its slice gets one of its slice's, the
// others the slots left, in the order of g.Pending (GroupPreemption.Slot
// matches pods to slots by that order); need slots in all.
func slotsForPending(pr Request, g ledger.GroupView, bySlice map[int][]ledger.Slot, need int) []ledger.Slot {
	at := make([]*ledger.Slot, len(g.Pending))
	take := func(j int) *ledger.Slot {
		if len(bySlice[j]) == 0 {
			return nil
		}
		s := bySlice[j][0]
		bySlice[j] = bySlice[j][1:]
		return &s
	}
	// A pod nominated to a node (its preemption made room there) takes
	// the slot there when its slice has one.
	for i, m := range g.Pending {
		if m.Nominated == "" {
			continue
		}
		j, err := m.Slice(pr.groupSpec)
		if err != nil {
			continue
		}
		for _, k := range sliceKeys(bySlice, j) {
			if at[i] != nil {
				break
			}
			if n := slices.IndexFunc(bySlice[k], func(s ledger.Slot) bool { return s.Node == m.Nominated }); n >= 0 {
				s := bySlice[k][n]
				bySlice[k] = slices.Delete(bySlice[k], n, n+1)
				at[i] = &s
			}
		}
	}
	for i, m := range g.Pending {
		if j, err := m.Slice(pr.groupSpec); err == nil && j >= 0 && at[i] == nil {
			at[i] = take(j)
		}
	}
	keys := sliceKeys(bySlice, -1)
	for i := range at {
		for _, j := range keys {
			if at[i] != nil {
				break
			}
			if j2, _ := g.Pending[i].Slice(pr.groupSpec); j2 < 0 {
				at[i] = take(j)
			}
		}
	}
	var out []ledger.Slot
	for _, s := range at {
		if s != nil && len(out) < need {
			out = append(out, *s)
		}
	}
	for _, j := range keys {
		for _, s := range bySlice[j] {
			if len(out) < need {
				out = append(out, s)
			}
		}
	}
	return out
}

// sliceKeys are the slices a pod of slice j (-1: it names none) may take
// a slot of: j, else every slice of bySlice.
func sliceKeys(bySlice map[int][]ledger.Slot, j int) []int {
	if j >= 0 {
		return []int{j}
	}
	keys := make([]int, 0, len(bySlice))
	for k := range bySlice {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// slicesWord describes a sliced group's shape for messages.
func slicesWord(spec v1alpha1.GroupSpec, gpus int, level string) string {
	if spec.Slices() == 1 {
		return fmt.Sprintf("1 slice of %d pods × %d GPUs inside one %s domain", spec.SliceSize, gpus, level)
	}
	return fmt.Sprintf("%d slices of %d pods × %d GPUs, each inside one %s domain", spec.Slices(), spec.SliceSize, gpus, level)
}

// planSliced is planGroup for a group cut into slices (pref and req its
// group levels).
func (x *Core) planSliced(ctx context.Context, v ledger.View, pr Request, g ledger.GroupView, need int, candidates []string, over map[string]*WhatIf, pref, req int) ([]ledger.Slot, string, string, error) {
	spec := pr.groupSpec
	levels := x.cfg.Fabric.Levels
	top := len(levels)
	spref, sreq, err := x.sliceLevels(spec, pr.group)
	if err != nil {
		return nil, "", "", err
	}
	for _, m := range g.Pending {
		if _, err := m.Slice(spec); err != nil {
			return nil, "", "", &GroupWait{Group: pr.group, Unresolvable: true, Msg: err.Error()}
		}
	}
	parts, err := sliceNeeds(v, spec, g, sreq, top)
	if err != nil {
		return nil, "", "", &GroupWait{Group: pr.group, Unresolvable: true, Msg: err.Error()}
	}
	e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
	nodes := x.groupNodes(e, v, pr, need, candidates, over)
	// Why it does not fit: a slice's miss in the roomiest group domain
	// tried, else the roomiest group domain at the required level.
	miss, missSlots, room := "", -1, -1
	for lvl := pref; lvl <= req; lvl++ {
		doms := domainsAt(nodes, lvl, top, g.Bound, v)
		anc := ancestorsFree(nodes, lvl, top)
		doms = slices.DeleteFunc(doms, func(d domain) bool {
			if lvl == req {
				room = max(room, d.slots)
			}
			return d.slots < need
		})
		slices.SortFunc(doms, func(a, b domain) int {
			if fitsTighter(a, b, anc) {
				return -1
			}
			if fitsTighter(b, a, anc) {
				return 1
			}
			return 0
		})
		for _, d := range doms {
			slots, m := x.fillSlices(e, v, pr, g, d, need, parts, spref, sreq, top)
			if m == "" {
				return slots, d.name, levelName(levels, lvl), nil
			}
			if d.slots > missSlots {
				miss, missSlots = m, d.slots
			}
		}
	}
	where := "the cluster"
	if req < top {
		where = "one " + levelName(levels, req) + " domain"
	}
	shape := slicesWord(spec, pr.Count, levelName(levels, sreq))
	if len(g.Bound) == 0 {
		if most := x.pristineSlots(v, pr, spec.SliceSize, sreq, top); most < spec.SliceSize {
			return nil, "", "", &GroupWait{Group: pr.group, Unresolvable: true, Msg: fmt.Sprintf("group %s needs %s; no %s domain holds a slice even with every GPU free (the largest holds %d of its %d pods): lower %s or %s", pr.group, shape, levelName(levels, sreq), most, spec.SliceSize, v1alpha1.AnnotationSliceSize, v1alpha1.AnnotationSliceRequiredTopology)}
		}
		if most := x.pristineSlots(v, pr, need, req, top); most < need {
			return nil, "", "", &GroupWait{Group: pr.group, Unresolvable: true, Msg: fmt.Sprintf("group %s needs %d pods × %d GPUs in %s; none holds that many even with every GPU free (the largest holds %d): lower group-required-topology or the group's size", pr.group, need, pr.Count, where, most)}
		}
	}
	why := miss
	if why == "" {
		why = fmt.Sprintf("the largest free holds %d of its %d pods", max(room, 0), need)
	}
	return nil, "", "", &GroupWait{Group: pr.group, Msg: fmt.Sprintf("group %s needs %s, all in %s: %s", pr.group, shape, where, why)}
}

// evictions is how many GPUs not free now the cheapest need sets of d
// take (0 outside a sliced group's what-if for preemption).
func evictions(d domain, need int) int {
	var all []int
	for _, gn := range d.nodes {
		all = append(all, gn.costs...)
	}
	if len(all) == 0 {
		return 0
	}
	slices.Sort(all)
	c := 0
	for _, k := range all[:min(need, len(all))] {
		c += k
	}
	return c
}
