package placement

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology/machine"
)

var groupEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// groupCore is an offline core fed nodes of fixture fx, node i labelled
// into leaf leafOf(i) (no label for "").
func groupCore(t *testing.T, fx string, n int, leafOf func(i int) string) (*Core, []string) {
	t.Helper()
	return fabricCore(t, fx, n, func(i int) map[string]string {
		if l := leafOf(i); l != "" {
			return map[string]string{"network.topology.nvidia.com/leaf": l}
		}
		return nil
	})
}

// offlineCore is an offline core with the default configuration, no
// topology age check, and its clock at groupEpoch.
func offlineCore(t *testing.T) *Core {
	t.Helper()
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.TopologyMaxAge = &metav1.Duration{Duration: -1}
	x, err := New(Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	x.setClock(func() time.Time { return groupEpoch })
	return x
}

// fabricCore is an offline core fed nodes of fixture fx, node i carrying
// labelsOf(i).
func fabricCore(t *testing.T, fx string, n int, labelsOf func(i int) map[string]string) (*Core, []string) {
	t.Helper()
	x := offlineCore(t)
	return x, feedNodes(t, x, fx, n, labelsOf)
}

// feedNodes feeds x n nodes of fixture fx, node i carrying labelsOf(i),
// and returns their names.
func feedNodes(t *testing.T, x *Core, fx string, n int, labelsOf func(i int) map[string]string) []string {
	t.Helper()
	now := groupEpoch
	f, err := machine.FixtureByName(fx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range n {
		name := fmt.Sprintf("node-%d", i)
		names = append(names, name)
		g := f.Graph(name)
		gpus := corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(int64(g.Len()), resource.DecimalSI)}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}},
			Status: corev1.NodeStatus{Capacity: gpus, Allocatable: gpus}}
		for k, v := range labelsOf(i) {
			node.Labels[k] = v
		}
		x.ledger.UpsertNode(node)
		st := g.Status()
		st.ObservedTime = metav1.NewTime(now)
		x.ledger.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: st})
	}
	return names
}

// groupPod is member i of group name (size members) asking gpus GPUs.
func groupPod(name string, i, size, gpus int, extra map[string]string) *corev1.Pod {
	ann := map[string]string{v1alpha1.AnnotationGroup: name, v1alpha1.AnnotationGroupSize: fmt.Sprint(size),
		v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}
	for k, v := range extra {
		ann[k] = v
	}
	return gpuPod(fmt.Sprintf("%s-%d", name, i), gpus, ann)
}

func gpuPod(name string, gpus int, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: types.UID("uid-" + name), Annotations: ann, CreationTimestamp: metav1.NewTime(groupEpoch)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(int64(gpus), resource.DecimalSI)}}}}},
	}
}

// place filters, reserves and confirms pod p as kube-scheduler and bind
// would; it returns the node, or "" and filter's reasons.
func place(t *testing.T, x *Core, names []string, p *corev1.Pod) (string, FilterAnswer) {
	t.Helper()
	n, ans, _ := placeP(t, x, names, p)
	return n, ans
}

// placeP is place, also returning the placement recorded.
func placeP(t *testing.T, x *Core, names []string, p *corev1.Pod) (string, FilterAnswer, v1alpha1.Placement) {
	t.Helper()
	x.ledger.UpsertPod(p)
	pr := request(t, x, p)
	ans, err := x.Filter(context.Background(), pr, names)
	if err != nil {
		t.Fatal(err)
	}
	if len(ans.Passed) == 0 {
		return "", ans, v1alpha1.Placement{}
	}
	scores, top := x.Score(context.Background(), pr, ans.Passed, true, nil)
	_ = scores
	res := x.Reserve(context.Background(), pr, top.Node)
	if res.Err != nil {
		t.Fatalf("reserve %s on %s: %v", p.Name, top.Node, res.Err)
	}
	x.ledger.Confirm(p.UID, top.Node, res.UUIDs)
	bound := p.DeepCopy()
	bound.Spec.NodeName = top.Node
	bound.Annotations[v1alpha1.AnnotationAssignedGPUs] = v1alpha1.FormatGPUList(res.UUIDs)
	bound.Annotations[v1alpha1.AnnotationPlacement] = res.Placement.String()
	x.ledger.UpsertPod(bound)
	return top.Node, ans, res.Placement
}

func anyReason(a FilterAnswer) string {
	for _, r := range a.Failed {
		return r
	}
	for _, r := range a.Unresolvable {
		return r
	}
	return ""
}

func TestGroupIsPlacedWholeInTheTightestDomainThatHoldsIt(t *testing.T) {
	// Leaf a: nodes 0-1, leaf b: nodes 2-5. A 3 x 8 GPU group fits only
	// leaf b; a 2 x 8 group best-fits leaf a (keeping b whole).
	leaf := func(i int) string {
		if i < 2 {
			return "a"
		}
		return "b"
	}
	x, names := groupCore(t, "dgx-a100", 6, leaf)
	var nodes []string
	var big, small []*corev1.Pod
	for i := range 3 {
		big = append(big, groupPod("big", i, 3, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"}))
		x.ledger.UpsertPod(big[i])
	}
	for i := range 2 {
		small = append(small, groupPod("small", i, 2, 8, nil))
		x.ledger.UpsertPod(small[i])
	}
	for i := range 3 {
		n, ans := place(t, x, names, big[i])
		if n == "" {
			t.Fatalf("big-%d not placed: %s", i, anyReason(ans))
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		if n < "node-2" {
			t.Errorf("big group spans %v: want leaf b only", nodes)
		}
	}
	for i := range 2 {
		n, ans := place(t, x, names, small[i])
		if n == "" {
			t.Fatalf("small-%d not placed: %s", i, anyReason(ans))
		}
		if n >= "node-2" && n != "node-5" {
			t.Errorf("small-%d on %s: want leaf a's nodes or the one free node of b", i, n)
		}
	}
}

func TestGroupThatCannotFitHoldsNothingAndSaysWhy(t *testing.T) {
	x, names := groupCore(t, "dgx-a100", 3, func(int) string { return "a" })
	// 4 x 8 GPUs in a leaf of 3 nodes: never fits.
	var last FilterAnswer
	for i := range 4 {
		p := groupPod("llm", i, 4, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
		n, ans := place(t, x, names, p)
		if n != "" {
			t.Fatalf("llm-%d placed on %s although the group cannot fit", i, n)
		}
		last = ans
	}
	// It could not fit even with every GPU free: unresolvable, in words.
	want := "group ml/llm needs 4 pods × 8 GPUs in one leaf domain; none holds that many even with every GPU free (the largest holds 3)"
	if len(last.Failed) != 0 || len(last.Unresolvable) != len(names) {
		t.Errorf("answer %+v; want every node unresolvable", last)
	}
	if r := anyReason(last); !strings.Contains(r, want) {
		t.Errorf("reason %q, want %q", r, want)
	}
	if p := x.ledger.Report().GroupPlans(); len(p) != 0 {
		t.Errorf("plans held: %+v", p)
	}
	// A 1-GPU pod is placed past it: nothing is held.
	if n, ans := place(t, x, names, gpuPod("one", 1, map[string]string{})); n == "" {
		t.Fatalf("1-GPU pod not placed: %s", anyReason(ans))
	}
	// A group that fits the leaf once GPUs free (3 x 8 on the 3 nodes, one
	// of which "one" uses) waits, resolvable, with what is free now.
	var now FilterAnswer
	for i := range 3 {
		p := groupPod("three", i, 3, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
		if n, ans := place(t, x, names, p); n != "" {
			t.Fatalf("three-%d placed on %s although a node is in use", i, n)
		} else {
			now = ans
		}
	}
	want = "group ml/three needs 3 pods × 8 GPUs in one leaf domain; the largest free holds 2"
	if len(now.Unresolvable) != 0 || !strings.Contains(anyReason(now), want) {
		t.Errorf("answer %+v; want every node failed with %q", now, want)
	}
}

func TestGroupWaitsForItsPodsAndIsFreedWhenAMemberGoes(t *testing.T) {
	x, names := groupCore(t, "hgx-h100", 4, func(int) string { return "a" })
	p0 := groupPod("g", 0, 3, 8, nil)
	if n, ans := place(t, x, names, p0); n != "" || !strings.Contains(anyReason(ans), "waits for its pods: 1 of 3 exist") {
		t.Fatalf("first pod: node %q reason %q", n, anyReason(ans))
	}
	p1, p2 := groupPod("g", 1, 3, 8, nil), groupPod("g", 2, 3, 8, nil)
	x.ledger.UpsertPod(p1)
	x.ledger.UpsertPod(p2)
	n0, ans := place(t, x, names, p0)
	if n0 == "" {
		t.Fatalf("planned group's pod refused: %s", anyReason(ans))
	}
	plans := x.ledger.Report().GroupPlans()
	if len(plans) != 1 || len(plans[0].Nodes) != 3 {
		t.Fatalf("plans %+v, want one of 3 slots", plans)
	}
	// The plan holds 24 GPUs: a 16-GPU pair of pods of another group
	// cannot have them, an 8-GPU pod fits the fourth node.
	if _, ans := place(t, x, names, groupPod("other", 0, 2, 8, nil)); len(ans.Passed) != 0 {
		t.Fatalf("other group passed on %v while the plan holds 3 of 4 nodes", ans.Passed)
	}
	// A member is deleted before it was bound: the plan goes, its GPUs free.
	x.ledger.DeletePod(types.NamespacedName{Namespace: p1.Namespace, Name: p1.Name}, p1.UID)
	if p := x.ledger.Report().GroupPlans(); len(p) != 0 {
		t.Fatalf("plan kept after a member was deleted: %+v", p)
	}
	free := 0
	x.ledger.Read(func(v ledgerView) {
		v.Nodes(func(n *ledgerNode) { free += n.Free().Count() })
	})
	if free != 24 {
		t.Errorf("free GPUs after the member went: %d, want 24 (the bound pod keeps its 8)", free)
	}
}

func TestGroupAcrossLeavesFillsAsFewLeavesAsItCan(t *testing.T) {
	// Eight nodes under one spine, the even ones in leaf a, the odd ones
	// in leaf b: 6 x 8 GPUs fit no leaf, so the spine; they take one leaf
	// whole and two nodes of the other, not three of each.
	x, names := fabricCore(t, "hgx-h100", 8, func(i int) map[string]string {
		return map[string]string{"network.topology.nvidia.com/leaf": []string{"a", "b"}[i%2], "network.topology.nvidia.com/spine": "s"}
	})
	var pods []*corev1.Pod
	for i := range 6 {
		pods = append(pods, groupPod("wide", i, 6, 8, nil))
		x.ledger.UpsertPod(pods[i])
	}
	perLeaf := map[int]int{}
	for _, p := range pods {
		n, ans := place(t, x, names, p)
		if n == "" {
			t.Fatalf("%s not placed: %s", p.Name, anyReason(ans))
		}
		var i int
		fmt.Sscanf(n, "node-%d", &i)
		perLeaf[i%2]++
	}
	if perLeaf[0] != 4 && perLeaf[1] != 4 {
		t.Errorf("pods per leaf %v: want one leaf taken whole (4) and 2 in the other", perLeaf)
	}
}

func TestGroupTieGoesToTheFullerEnclosingDomain(t *testing.T) {
	// Every node is empty: a 2 x 4 group fits any one node. Node 3 is
	// alone in leaf a; nodes 0-2 share leaf b. The group goes to node 3,
	// keeping leaf b's three nodes whole.
	x, names := groupCore(t, "hgx-h100", 4, func(i int) string {
		if i == 3 {
			return "a"
		}
		return "b"
	})
	pods := []*corev1.Pod{groupPod("pair", 0, 2, 4, nil), groupPod("pair", 1, 2, 4, nil)}
	for _, p := range pods {
		x.ledger.UpsertPod(p)
	}
	for _, p := range pods {
		if n, ans := place(t, x, names, p); n != "node-3" {
			t.Errorf("%s on %q (%s), want node-3", p.Name, n, anyReason(ans))
		}
	}
}

type (
	ledgerView = ledger.View
	ledgerNode = ledger.Node
)

func TestKubernetesPodGroupIsAGroup(t *testing.T) {
	x, names := groupCore(t, "hgx-h100", 3, func(int) string { return "a" })
	var pods []*corev1.Pod
	for i := range 2 {
		p := gpuPod(fmt.Sprintf("w-%d", i), 8, map[string]string{})
		p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptrTo("train")}
		pods = append(pods, p)
		x.ledger.UpsertPod(p)
	}
	if n, ans := place(t, x, names, pods[0]); n != "" || !strings.Contains(anyReason(ans), "PodGroup ml/train") {
		t.Fatalf("before the PodGroup exists: node %q reason %q", n, anyReason(ans))
	}
	x.ledger.UpsertPodGroup(&schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml"},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy:      schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}},
			SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: "network.topology.nvidia.com/leaf"}}},
		},
	})
	for _, p := range pods {
		n, ans := place(t, x, names, p)
		if n == "" {
			t.Fatalf("%s not placed: %s", p.Name, anyReason(ans))
		}
	}
	if plans := x.ledger.Report().GroupPlans(); len(plans) != 0 {
		t.Errorf("plan left after every pod was bound: %+v", plans)
	}
	// Annotations and a PodGroup at once: refused, naming both.
	both := groupPod("two", 0, 2, 8, nil)
	both.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptrTo("train")}
	if _, err := ParseRequest(both, v1alpha1.ResourceGPU, x.Now()); err == nil || !strings.Contains(err.Error(), "name two groups") {
		t.Errorf("pod with both groups: err %v", err)
	}
}

func ptrTo[T any](v T) *T { return &v }

// The framework's pod-group cycle reserves a group's pods, unreserves
// them, then reserves the chosen placement's again: the slot comes back.
func TestGroupPodReservedAgainAfterUnreserveGetsItsSlot(t *testing.T) {
	x, _ := groupCore(t, "hgx-h100", 2, func(int) string { return "a" })
	pods := []*corev1.Pod{groupPod("g", 0, 2, 8, nil), groupPod("g", 1, 2, 8, nil)}
	var prs []Request
	var nodes []string
	for _, p := range pods {
		x.ledger.UpsertPod(p)
	}
	for _, p := range pods {
		pr := request(t, x, p)
		slot, err := x.slot(context.Background(), pr, nil)
		if err != nil || slot == nil {
			t.Fatalf("%s: slot %v err %v", p.Name, slot, err)
		}
		if res := x.Reserve(context.Background(), pr, slot.Node); res.Err != nil {
			t.Fatal(res.Err)
		}
		prs, nodes = append(prs, pr), append(nodes, slot.Node)
	}
	for _, pr := range prs {
		x.Unreserve(pr.UID)
	}
	if plans := x.ledger.Report().GroupPlans(); len(plans) != 1 || plans[0].Claimed != 0 {
		t.Fatalf("after unreserve: plans %+v, want the plan kept with its slots unclaimed", plans)
	}
	for i, pr := range prs {
		if res := x.Reserve(context.Background(), pr, nodes[i]); res.Err != nil {
			t.Fatalf("reserve again on %s: %v", nodes[i], res.Err)
		}
	}
}

// A tenant in another namespace naming the same group joins nothing: a
// group is namespace/name.
func TestGroupOfAnotherNamespaceIsAnotherGroup(t *testing.T) {
	x, names := groupCore(t, "hgx-h100", 2, func(int) string { return "a" })
	mine := []*corev1.Pod{groupPod("llm", 0, 2, 8, nil), groupPod("llm", 1, 2, 8, nil)}
	intruder := groupPod("llm", 9, 2, 1, nil)
	intruder.Namespace, intruder.UID = "tenant", "uid-intruder"
	x.ledger.UpsertPod(intruder)
	for _, p := range mine {
		x.ledger.UpsertPod(p)
	}
	for _, p := range mine {
		if n, ans := place(t, x, names, p); n == "" {
			t.Fatalf("%s not placed with a same-named group in another namespace: %s", p.Name, anyReason(ans))
		}
	}
	if n, ans := place(t, x, names, intruder); n != "" || !strings.Contains(anyReason(ans), "group tenant/llm waits for its pods: 1 of 2 exist") {
		t.Errorf("intruder: node %q reason %q; want it alone in tenant/llm", n, anyReason(ans))
	}
}

// TestGroupPlannedAroundAMemberWhoseBindIsInFlight: a group's pod sent to
// a node outside any plan (a preemption's what-if plan placed it) has its
// GPUs reserved there while its bind is in flight. The rest of the group
// is planned around it, inside its domain, as around a bound member: the
// group required in one leaf does not end split across leaves.
func TestGroupPlannedAroundAMemberWhoseBindIsInFlight(t *testing.T) {
	x, names := groupCore(t, "dgx-a100", 4, func(i int) string { return []string{"a", "a", "b", "b"}[i] })
	var prs []Request
	for i := range 2 {
		p := groupPod("train", i, 2, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
		x.ledger.UpsertPod(p)
		prs = append(prs, request(t, x, p))
	}
	if res := x.Reserve(context.Background(), prs[0], "node-2"); res.Err != nil {
		t.Fatalf("reserve train-0 on node-2: %v", res.Err)
	}
	ans, err := x.Filter(context.Background(), prs[1], names)
	if err != nil {
		t.Fatal(err)
	}
	if len(ans.Passed) != 1 || ans.Passed[0] != "node-3" {
		t.Errorf("train-1 may go to %v; want node-3 only, the other node of train-0's leaf (%s)", ans.Passed, anyReason(ans))
	}
}

// TestGroupPodLeavesTheNodeAnotherIsNominatedTo: a group's pod that
// claims its place in the plan leaves the node another pending pod of the
// group is nominated to (kube-scheduler would refuse it there while that
// nomination stands), which that pod then takes.
func TestGroupPodLeavesTheNodeAnotherIsNominatedTo(t *testing.T) {
	run := func(nominate string) []string {
		x, names := cliqueCore(t, 1)
		var pods []*corev1.Pod
		for i := range 3 {
			pods = append(pods, groupPod("trio", i, 3, 4, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "nvlink"}))
		}
		pods[2].Status.NominatedNodeName = nominate
		nodes, why, _ := placeAll(t, x, names, pods)
		for i, n := range nodes {
			if n == "" {
				t.Fatalf("trio-%d not placed: %s", i, why)
			}
		}
		return nodes
	}
	first := run("")[0]
	nodes := run(first)
	if nodes[2] != first {
		t.Errorf("trio-2, nominated to %s, placed on %s", first, nodes[2])
	}
	if nodes[0] == first || nodes[1] == first {
		t.Errorf("placed on %v: trio-0 or trio-1 took %s, which trio-2 is nominated to", nodes, first)
	}
}
