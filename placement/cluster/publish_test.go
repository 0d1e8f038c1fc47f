package cluster

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// A round publishes one GroupPlan per group held, in the group's
// namespace: a plan as Planned with its slots' GPUs and claims, a
// reservation as Kept; it replaces one whose spec changed, and deletes
// those of groups held no more, including one a previous decider left.
func TestPublishRoundWritesAndCleansUpGroupPlans(t *testing.T) {
	ctx := context.Background()
	since := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	stale := &v1alpha1.GroupPlan{}
	stale.Namespace, stale.Name = "ml", "gone"
	c := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(stale).Build()
	p := &publisher{c: c, last: map[types.NamespacedName]v1alpha1.GroupPlanSpec{{Namespace: "ml", Name: "gone"}: {}}}
	planned := ledger.Held{Group: "ml/llm", Planned: true, Since: since, Domain: "leaf-a", Level: "leaf",
		Slots: []ledger.HeldSlot{{Node: "n0", GPUs: []int{0, 1}, UUIDs: []string{"GPU-a", "GPU-b"}, Pod: "llm-0"}, {Node: "n1", GPUs: []int{4, 5}}}}
	kept := ledger.Held{Group: "ml/big", Since: since, Priority: 5, Slots: []ledger.HeldSlot{{Node: "n2", GPUs: []int{0, 1, 2, 3, 4, 5, 6, 7}}}}
	p.round(ctx, []ledger.Held{planned, kept}, "decider-1")
	get := func(name string) (*v1alpha1.GroupPlan, bool) {
		o := &v1alpha1.GroupPlan{}
		err := c.Get(ctx, types.NamespacedName{Namespace: "ml", Name: name}, o)
		return o, err == nil
	}
	if _, ok := get("gone"); ok {
		t.Error("a GroupPlan of a group held no more was kept")
	}
	o, ok := get("llm")
	if !ok || o.Spec.State != v1alpha1.GroupPlanned || o.Spec.Decider != "decider-1" || len(o.Spec.Slots) != 2 || o.Spec.Slots[0].Pod != "llm-0" || !o.Spec.Since.Time.Equal(since) {
		t.Errorf("planned group published as %+v (found %v)", o.Spec, ok)
	}
	if o, ok := get("big"); !ok || o.Spec.State != v1alpha1.GroupKept || o.Spec.Priority != 5 || len(o.Spec.Slots[0].GPUs) != 8 {
		t.Errorf("kept group published as %+v (found %v)", o.Spec, ok)
	}
	// The plan's second slot is claimed; the reservation ends.
	planned.Slots[1].Pod = "llm-1"
	p.round(ctx, []ledger.Held{planned}, "decider-1")
	if o, _ := get("llm"); o.Spec.Slots[1].Pod != "llm-1" {
		t.Errorf("claimed slot published as %+v", o.Spec.Slots[1])
	}
	if _, ok := get("big"); ok {
		t.Error("the ended reservation's GroupPlan was kept")
	}
	// The group is bound whole: nothing left.
	p.round(ctx, nil, "decider-1")
	if _, ok := get("llm"); ok {
		t.Error("the bound group's GroupPlan was kept")
	}
}
