package placement

import (
	"context"
	"errors"
	"slices"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// errNotAdopted: a published plan no longer fits the group or the ledger.
var errNotAdopted = errors.New("published plan does not fit")

// AdoptPlan restores the plan a previous decider published for group key
// (namespace/name; v1alpha1.GroupPlan in state Planned), so that a
// scheduler taking over mid-group binds the group's remaining pods where
// the plan put them and shows the same plan: the slots no bound member
// took, when there are exactly as many as the group still needs, on nodes
// the ledger knows, with their GPUs free. Otherwise nothing changes and the
// group is planned again at its next try (its bound pods keep it to their
// domain). It says whether the plan was adopted.
func (u Upkeep) AdoptPlan(ctx context.Context, key, domain, level string, slots []v1alpha1.GroupPlanSlot) bool {
	x := u.x
	err := x.ledger.PlanGroup(key, func(v ledger.View, g ledger.GroupView) ([]ledger.Slot, string, string, error) {
		if len(g.Pending) == 0 {
			return nil, "", "", errNotAdopted
		}
		pr, err := requestOf(g.Pending[0], g.Pending[0].Created, x.now())
		if err != nil || pr.Count == 0 {
			return nil, "", "", errNotAdopted
		}
		size := pr.groupSpec.Size
		if pr.native {
			spec, ok, err := v.NativeGroup(key)
			if !ok || err != nil {
				return nil, "", "", errNotAdopted
			}
			size, pr.groupSpec = spec.Size, spec
		}
		pending := make([]string, len(g.Pending))
		for i, m := range g.Pending {
			pending[i] = m.Key.Name
		}
		e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
		aff := v.Affinity(pr.job)
		var out []ledger.Slot
		for _, sl := range slots {
			if sl.Pod != "" && !slices.Contains(pending, sl.Pod) {
				continue // its pod is bound
			}
			n := v.Node(sl.Node)
			if n == nil || n.Graph() == nil || len(sl.GPUs) != pr.Count {
				return nil, "", "", errNotAdopted
			}
			m := topology.MaskOf(sl.GPUs...)
			if !m.Intersect(n.Free()).Equal(m) {
				return nil, "", "", errNotAdopted
			}
			vd := e.allocate(n, m, false)
			if !vd.ok || !topology.MaskOf(vd.res.GPUs...).Equal(m) {
				return nil, "", "", errNotAdopted
			}
			merit, _ := e.merit(n, vd, aff, soloCohort(n, vd))
			p := pr.placementOf(sl.Node, vd, merit)
			p.Group, p.Domain = key, domain
			out = append(out, ledger.Slot{Node: sl.Node, Choice: ledger.Choice{UUIDs: uuidsOf(n, vd.res.GPUs), Placement: p}})
		}
		if len(out) != size-len(g.Bound) {
			return nil, "", "", errNotAdopted
		}
		return out, domain, level, nil
	})
	return err == nil
}
