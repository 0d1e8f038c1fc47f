package placement

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// fillV100 binds one 1-GPU pod of priority 100 to every GPU of node (a
// DGX-1 V100, NVLink quads 0-3 and 4-7) and returns the pods by GPU.
func fillV100(t *testing.T, x *Core, node string) []*corev1.Pod {
	t.Helper()
	feedMachine(t, x, node, "dgx1-v100", 8)
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	g := f.Graph(node)
	prio := int32(100)
	var pods []*corev1.Pod
	for i := range g.Len() {
		p := gpuPod(fmt.Sprintf("%s-%d", node, i), 1, map[string]string{v1alpha1.AnnotationAssignedGPUs: g.GPU(i).UUID})
		p.Spec.NodeName, p.Spec.Priority = node, &prio
		x.ledger.UpsertPod(p)
		pods = append(pods, p)
	}
	return pods
}

func keysOf(pods []*corev1.Pod) map[types.NamespacedName]bool {
	out := map[types.NamespacedName]bool{}
	for _, p := range pods {
		out[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = true
	}
	return out
}

// A PodDisruptionBudget protects half of a full DGX-1's pods, two in each
// NVLink quad of one node and the whole first quad of the other. Victims
// gives back the protected pods first, as kube-scheduler's preemption
// does: where every quad holds protected pods it evicts two of them and
// says so (2 violations), so that kube-scheduler prefers the node whose
// free quad costs none; there it evicts the unprotected quad.
func TestVictimsGiveBackPDBProtectedPodsFirstAndCountTheRest(t *testing.T) {
	x := offlineCore(t)
	a, b := fillV100(t, x, "a"), fillV100(t, x, "b")
	covered := keysOf([]*corev1.Pod{a[0], a[1], a[4], a[5], b[0], b[1], b[2], b[3]})
	protected := func(pods []types.NamespacedName) []bool {
		out := make([]bool, len(pods))
		for i, k := range pods {
			out[i] = covered[k]
		}
		return out
	}
	high := modelPod("high", 4)
	prio := int32(1000)
	high.Spec.Priority = &prio
	x.ledger.UpsertPod(high)
	pr := request(t, x, high)

	victims, violations, ok := x.Preemption().Victims(context.Background(), pr, prio, "b", nil, 0, protected)
	want := []types.UID{b[4].UID, b[5].UID, b[6].UID, b[7].UID}
	slices.Sort(victims)
	if !ok || violations != 0 || !slices.Equal(victims, want) {
		t.Errorf("node b: victims %v, %d violations, ok %v; want the unprotected quad %v, none", victims, violations, ok, want)
	}
	victims, violations, ok = x.Preemption().Victims(context.Background(), pr, prio, "a", nil, 0, protected)
	if !ok || len(victims) != 4 || violations != 2 {
		t.Errorf("node a: victims %v, %d violations, ok %v; want a quad, 2 of its pods protected", victims, violations, ok)
	}
	// Without budgets the same node gives back the more important pods
	// first (the earlier, by name here: none started), one quad evicted.
	victims, violations, _ = x.Preemption().Victims(context.Background(), pr, prio, "a", nil, 0, nil)
	if len(victims) != 4 || violations != 0 {
		t.Errorf("node a without budgets: victims %v, %d violations; want a quad, none", victims, violations)
	}
	// Victims without GPUs kube-scheduler chose keep its count, one at
	// most each.
	_, violations, _ = x.Preemption().Victims(context.Background(), pr, prio, "b", []types.UID{"cpu-only"}, 3, protected)
	if violations != 1 {
		t.Errorf("one CPU victim with kube-scheduler's 3 violations: %d, want 1", violations)
	}
}

// A pod nominated to a node whose victims kube-scheduler is evicting
// (their DisruptionTarget condition is seen, their deletes are not yet)
// passes filter there: kube-scheduler's next try of the pod comes before
// the ledger sees the deletes, and a failed filter would preempt again
// elsewhere. Pods of other nodes, of the pod's own priority, or not being
// evicted, still count.
func TestNominatedPodSeesItsVictimsGone(t *testing.T) {
	x := offlineCore(t)
	a := fillV100(t, x, "a")
	fillV100(t, x, "b")
	high := modelPod("high", 4)
	prio := int32(1000)
	high.Spec.Priority = &prio
	high.Status.NominatedNodeName = "a"
	x.ledger.UpsertPod(high)
	filter := func() FilterAnswer {
		t.Helper()
		ans, err := x.Filter(context.Background(), request(t, x, high), []string{"a", "b"})
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	if ans := filter(); len(ans.Passed) != 0 {
		t.Fatalf("before any eviction: passed %v, want none", ans.Passed)
	}
	for _, p := range a[4:] {
		going := p.DeepCopy()
		going.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: corev1.PodReasonPreemptionByScheduler}}
		x.ledger.UpsertPod(going)
	}
	if ans := filter(); !slices.Equal(ans.Passed, []string{"a"}) {
		t.Fatalf("victims on a being evicted: passed %v, want a alone (%v)", ans.Passed, ans.Failed)
	}
	// Bind still decides on the ledger: the victims hold their GPUs
	// until their deletes are seen.
	if res := x.Reserve(context.Background(), request(t, x, high), "a"); res.Err == nil {
		t.Error("reserved on a while its victims still hold their GPUs")
	}
	for _, p := range a[4:] {
		gone(x, p)
	}
	if res := x.Reserve(context.Background(), request(t, x, high), "a"); res.Err != nil {
		t.Errorf("reserve once the victims are gone: %v", res.Err)
	}
}
