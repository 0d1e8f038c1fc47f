package placement

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology/machine"
)

// fillNode binds one 1-GPU pod of priority prio to every GPU of node (a
// DGX A100) and returns their UIDs.
func fillNode(t *testing.T, x *Core, node string, prio int32) []types.UID {
	t.Helper()
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	g := f.Graph(node)
	var uids []types.UID
	for i := range g.Len() {
		p := gpuPod(fmt.Sprintf("%s-%d", node, i), 1, map[string]string{v1alpha1.AnnotationAssignedGPUs: g.GPU(i).UUID})
		p.Spec.NodeName, p.Spec.Priority = node, &prio
		x.ledger.UpsertPod(p)
		uids = append(uids, p.UID)
	}
	return uids
}

// TestGroupPreemptionChoosesOneDomainAndItsVictims: four full DGX A100s,
// two per leaf; one node of leaf b runs pods of higher priority than the
// group's. A group of 2 × 8 GPUs that requires one leaf plans on leaf a,
// with the 16 pods there as its victims, one node per pod; nothing in the
// ledger changes. A group whose priority does not exceed the pods', or
// that no eviction could place, gets no plan.
func TestGroupPreemptionChoosesOneDomainAndItsVictims(t *testing.T) {
	x, names := groupCore(t, "dgx-a100", 4, func(i int) string { return []string{"a", "a", "b", "b"}[i] })
	victims := map[string][]types.UID{}
	for i, name := range names {
		prio := int32(100)
		if i == 2 {
			prio = 5000
		}
		victims[name] = fillNode(t, x, name, prio)
	}
	before := x.ledger.Report().Holdings()
	var prs []Request
	for i := range 2 {
		p := groupPod("train", i, 2, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
		x.ledger.UpsertPod(p)
		prs = append(prs, request(t, x, p))
	}
	gp := x.Preemption().PlanGroup(context.Background(), prs[0], 1000, nil)
	if gp == nil {
		t.Fatal("no plan for a group of priority 1000 over pods of priority 100")
	}
	if gp.Domain != "network.topology.nvidia.com/leaf=a" || !slices.Equal(gp.Slots, []string{"node-0", "node-1"}) {
		t.Errorf("plan in %s on %v, want leaf a on node-0 and node-1", gp.Domain, gp.Slots)
	}
	for _, node := range []string{"node-0", "node-1"} {
		got := slices.Clone(gp.Victims[node])
		slices.Sort(got)
		want := slices.Clone(victims[node])
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("victims on %s: %v, want its 8 pods %v", node, got, want)
		}
	}
	if len(gp.Victims) != 2 {
		t.Errorf("victims on %d nodes, want 2: %v", len(gp.Victims), gp.Victims)
	}
	if a, b := gp.Slot(prs[0].UID), gp.Slot(prs[1].UID); a == "" || b == "" || a == b {
		t.Errorf("the group's pods' places %q and %q, want one node each", a, b)
	}
	if got := x.ledger.Report().Holdings(); !slices.EqualFunc(got, before, func(a, b ledger.Holding) bool {
		return a.PodUID == b.PodUID && a.Node == b.Node && slices.Equal(a.GPUs, b.GPUs)
	}) {
		t.Error("planning a preemption changed the ledger's holdings")
	}
	if gp := x.Preemption().PlanGroup(context.Background(), prs[0], 100, nil); gp != nil {
		t.Errorf("priority 100 over pods of priority 100: plan %+v, want none", gp)
	}
	// Three pods of 8 GPUs in one leaf: no leaf has three nodes.
	x2, names2 := groupCore(t, "dgx-a100", 4, func(i int) string { return []string{"a", "a", "b", "b"}[i] })
	for _, name := range names2 {
		fillNode(t, x2, name, 100)
	}
	p := groupPod("big", 0, 3, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
	x2.ledger.UpsertPod(p)
	for i := 1; i < 3; i++ {
		x2.ledger.UpsertPod(groupPod("big", i, 3, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"}))
	}
	if gp := x2.Preemption().PlanGroup(context.Background(), request(t, x2, p), 1000, nil); gp != nil {
		t.Errorf("3 × 8 GPUs in one leaf of two nodes: plan %+v, want none (no preemption in vain)", gp)
	}
}

// TestGroupPreemptionDisruptsTheFewestJobs: two leaves whose pods are all
// evictable; leaf a runs 16 one-GPU jobs, leaf b the 16 pods of one
// group. A group of 2 × 8 GPUs in one leaf preempts in leaf b: one job
// disrupted rather than 16, although the planner alone would take leaf a.
func TestGroupPreemptionDisruptsTheFewestJobs(t *testing.T) {
	x, names := groupCore(t, "dgx-a100", 4, func(i int) string { return []string{"a", "a", "b", "b"}[i] })
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	prio := int32(100)
	for n, name := range names {
		g := f.Graph(name)
		for i := range g.Len() {
			ann := map[string]string{v1alpha1.AnnotationAssignedGPUs: g.GPU(i).UUID}
			if n >= 2 {
				ann[v1alpha1.AnnotationGroup], ann[v1alpha1.AnnotationGroupSize] = "old", "16"
			}
			p := gpuPod(fmt.Sprintf("%s-%d", name, i), 1, ann)
			p.Spec.NodeName, p.Spec.Priority = name, &prio
			x.ledger.UpsertPod(p)
		}
	}
	var first Request
	for i := range 2 {
		p := groupPod("train", i, 2, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
		x.ledger.UpsertPod(p)
		if i == 0 {
			first = request(t, x, p)
		}
	}
	gp := x.Preemption().PlanGroup(context.Background(), first, 1000, nil)
	if gp == nil || gp.Domain != "network.topology.nvidia.com/leaf=b" {
		t.Fatalf("plan %+v, want leaf b, where one group is disrupted instead of 16 jobs", gp)
	}
}
