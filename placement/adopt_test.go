package placement

import (
	"context"
	"slices"
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// published is what a decider publishes for x's plan of group key.
func published(t *testing.T, x *Core, key string) (ledger.Held, []v1alpha1.GroupPlanSlot) {
	t.Helper()
	for _, h := range x.ledger.Report().Held() {
		if h.Group == key && h.Planned {
			var out []v1alpha1.GroupPlanSlot
			for _, s := range h.Slots {
				out = append(out, v1alpha1.GroupPlanSlot{Node: s.Node, GPUs: s.GPUs, UUIDs: s.UUIDs, Pod: s.Pod})
			}
			return h, out
		}
	}
	t.Fatalf("no plan for %s in %+v", key, x.ledger.Report().Held())
	return ledger.Held{}, nil
}

// A scheduler that takes over mid-group adopts the plan the previous one
// published: the slot its bound pod took is left out, the other is held as
// before, and the group's last pod is bound there. A plan whose GPUs were
// taken since is not adopted (the group is planned again).
func TestTakeOverAdoptsThePublishedPlan(t *testing.T) {
	a, names := groupCore(t, "hgx-h100", 4, func(i int) string { return []string{"a", "a", "b", "b"}[i] })
	g0, g1 := groupPod("g", 0, 2, 8, nil), groupPod("g", 1, 2, 8, nil)
	a.ledger.UpsertPod(g1)
	if n, ans := place(t, a, names, g0); n == "" {
		t.Fatalf("g-0 not placed: %s", anyReason(ans))
	}
	held, slots := published(t, a, "ml/g")
	var bound, open v1alpha1.GroupPlanSlot
	for _, s := range slots {
		if s.Pod == "g-0" {
			bound = s
		} else {
			open = s
		}
	}
	if bound.Node == "" || open.Node == "" {
		t.Fatalf("published slots %+v: want one claimed by g-0 and one open", slots)
	}

	// The next decider knows g-0 bound where the plan put it.
	b, _ := groupCore(t, "hgx-h100", 4, func(i int) string { return []string{"a", "a", "b", "b"}[i] })
	done := g0.DeepCopy()
	done.Spec.NodeName = bound.Node
	done.Annotations[v1alpha1.AnnotationAssignedGPUs] = v1alpha1.FormatGPUList(bound.UUIDs)
	b.ledger.UpsertPod(done)
	b.ledger.UpsertPod(g1)
	if !b.Upkeep().AdoptPlan(context.Background(), "ml/g", held.Domain, held.Level, slots) {
		t.Fatal("the published plan was not adopted")
	}
	hb, got := published(t, b, "ml/g")
	if len(got) != 1 || got[0].Node != open.Node || !slices.Equal(got[0].GPUs, open.GPUs) || hb.Domain != held.Domain {
		t.Errorf("adopted plan %+v in %s; want the open slot %+v in %s", got, hb.Domain, open, held.Domain)
	}
	if n, ans := place(t, b, names, g1); n != open.Node {
		t.Errorf("g-1 placed on %q (%s); want the adopted slot's %s", n, anyReason(ans), open.Node)
	}

	// Its GPUs taken since: not adopted.
	c, _ := groupCore(t, "hgx-h100", 4, func(i int) string { return []string{"a", "a", "b", "b"}[i] })
	c.ledger.UpsertPod(done)
	c.ledger.UpsertPod(g1)
	squatter := gpuPod("squatter", 1, map[string]string{v1alpha1.AnnotationAssignedGPUs: open.UUIDs[0]})
	squatter.Spec.NodeName = open.Node
	c.ledger.UpsertPod(squatter)
	if c.Upkeep().AdoptPlan(context.Background(), "ml/g", held.Domain, held.Level, slots) {
		t.Error("a plan whose GPUs are taken was adopted")
	}
}
