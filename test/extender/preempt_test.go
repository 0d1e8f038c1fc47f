//go:build integration

package extender_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/test/harness"
)

// priorityClasses creates low (100), high (1000) and high-never (1000,
// preemptionPolicy Never).
func priorityClasses(t *testing.T, e *env) {
	t.Helper()
	for _, pc := range []schedulingv1.PriorityClass{
		{ObjectMeta: metav1.ObjectMeta{Name: "low"}, Value: 100},
		{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000},
		{ObjectMeta: metav1.ObjectMeta{Name: "high-never"}, Value: 1000, PreemptionPolicy: ptr.To(corev1.PreemptNever)},
	} {
		if _, err := e.cp.Clientset.SchedulingV1().PriorityClasses().Create(harness.Context(t), &pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// withPriority sets pod's PriorityClass.
func withPriority(p *corev1.Pod, class string) *corev1.Pod {
	p.Spec.PriorityClassName = class
	return p
}

// fillLow binds one low-priority 1-GPU pod to every GPU of every node, and
// returns their names.
func fillLow(t *testing.T, e *env) []string {
	t.Helper()
	var pods []*corev1.Pod
	var names []string
	for i := range len(e.nodes) * gpusPerNode {
		p := withPriority(gpuPod(fmt.Sprintf("low-%d", i), 1, ""), "low")
		pods = append(pods, p)
		names = append(names, p.Name)
	}
	createAll(t, e, pods)
	harness.Poll(t, 2*time.Minute, "every GPU held by a low-priority pod", func() (bool, string) {
		n := boundGPUs(listPods(t, e))
		return n == len(pods), fmt.Sprintf("%d of %d bound", n, len(pods))
	})
	return names
}

// fillLowInLeaves creates the PriorityClasses, labels the nodes into
// leaves and fills every GPU with a low-priority pod (fillLow); it returns
// their names and the node each is bound to.
func fillLowInLeaves(t *testing.T, e *env) ([]string, map[string]string) {
	t.Helper()
	priorityClasses(t, e)
	labelLeaves(t, e)
	low := fillLow(t, e)
	nodeOf := map[string]string{}
	for _, p := range listPods(t, e) {
		nodeOf[p.Name] = p.Spec.NodeName
	}
	return low, nodeOf
}

// gpuIndices are the fixture indices of the GPUs assigned to p.
func gpuIndices(t *testing.T, p *corev1.Pod) []int {
	t.Helper()
	uuids, err := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	g := mustFixture(t).Graph(p.Spec.NodeName)
	var out []int
	for _, u := range uuids {
		i, ok := g.IndexOf(u)
		if !ok {
			t.Fatalf("pod %s holds %s, not a GPU of %s", p.Name, u, p.Spec.NodeName)
		}
		out = append(out, i)
	}
	slices.Sort(out)
	return out
}

// TestPreemptionFreesAnNVLinkQuad: DGX-1 V100 nodes full of low-priority
// 1-GPU pods, so both NVLink-connected quads of every node are in use. A
// high-priority 4-GPU model-parallel pod evicts at most 4 pods, all on one
// node, in one round, and is bound on a freed NVLink-connected quad. A
// low-priority pod never evicts the high one, and a high-priority pod with
// preemptionPolicy Never evicts nothing. Both modes.
func TestPreemptionFreesAnNVLinkQuad(t *testing.T) {
	eachMode(t, 2, testPreemptionFreesAnNVLinkQuad)
}

func testPreemptionFreesAnNVLinkQuad(t *testing.T, e *env, s system) {
	priorityClasses(t, e)
	low := fillLow(t, e)

	never := withPriority(gpuPod("never", 1, ""), "high-never")
	createAll(t, e, []*corev1.Pod{never})
	harness.Poll(t, time.Minute, "the preemptionPolicy Never pod to be found unschedulable", func() (bool, string) {
		for _, p := range listPods(t, e) {
			if p.Name == "never" {
				m := scheduledFalseMessage(&p)
				return m != "", "no PodScheduled=False yet"
			}
		}
		return false, "pod missing"
	})
	deletePods(t, e, []*corev1.Pod{never})
	nodeOf := map[string]string{}
	for _, p := range listPods(t, e) {
		nodeOf[p.Name] = p.Spec.NodeName
	}
	for _, name := range low {
		if nodeOf[name] == "" {
			t.Fatalf("low-priority pod %s gone or unbound after the preemptionPolicy Never pod was refused", name)
		}
	}

	high := withPriority(gpuPod("high", 4, modelParallel), "high")
	start := time.Now()
	createAll(t, e, []*corev1.Pod{high})
	bound := waitBound(t, e, s, "high")
	// The victims have no grace period: they are gone as soon as they
	// are evicted, and the pod is bound within 10 s of it.
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("high-priority pod bound %s after it was created, want within 10 s", d.Round(10*time.Millisecond))
	}

	left := map[string]bool{}
	for _, p := range listPods(t, e) {
		left[p.Name] = true
	}
	evicted := map[string]int{}
	var gone []string
	for _, name := range low {
		if !left[name] {
			gone = append(gone, name)
		}
	}
	if len(gone) == 0 || len(gone) > 4 {
		t.Fatalf("%d low-priority pods evicted (%v), want 1 to 4", len(gone), gone)
	}
	// The evictions were on the node the pod went to; kube-scheduler's
	// events name each victim.
	evs, err := e.cp.Clientset.CoreV1().Events(metav1.NamespaceDefault).List(harness.Context(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if ev.Reason == "Preempted" {
			evicted[ev.InvolvedObject.Name]++
		}
	}
	for _, name := range gone {
		if nodeOf[name] != bound.Spec.NodeName {
			t.Errorf("low-priority pod %s evicted on %s; the high-priority pod went to %s", name, nodeOf[name], bound.Spec.NodeName)
		}
		if evicted[name] == 0 {
			t.Errorf("low-priority pod %s is gone without a Preempted event", name)
		}
	}
	// gputopo's event on the pod names each victim whose GPUs it got, and
	// those GPUs.
	harness.Poll(t, 30*time.Second, "the PreemptionFreedGPUs event", func() (bool, string) {
		evs, err := e.cp.Clientset.CoreV1().Events(metav1.NamespaceDefault).List(harness.Context(t), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range evs.Items {
			if ev.InvolvedObject.Name != "high" || ev.Reason != placement.ReasonPreemptionFreedGPUs {
				continue
			}
			for _, name := range gone {
				if !strings.Contains(ev.Message, "default/"+name+" (GPUs ") {
					return false, fmt.Sprintf("event %q does not name victim %s", ev.Message, name)
				}
			}
			return strings.Contains(ev.Message, "node "+bound.Spec.NodeName+": "), ev.Message
		}
		return false, "no PreemptionFreedGPUs event on the pod\n" + s.tail()
	})
	idx := gpuIndices(t, &bound)
	if !slices.Equal(idx, []int{0, 1, 2, 3}) && !slices.Equal(idx, []int{4, 5, 6, 7}) {
		t.Errorf("high-priority pod on %s GPUs %v, want an NVLink-connected quad (0-3 or 4-7)", bound.Spec.NodeName, idx)
	}
	if !strings.Contains(bound.Annotations[v1alpha1.AnnotationPlacement], "nvlink") {
		t.Errorf("placement %s, want an NVLink tier", bound.Annotations[v1alpha1.AnnotationPlacement])
	}
	auditPods(t, listPods(t, e))

	// Low never preempts high: a low-priority 4-GPU pod waits.
	late := withPriority(gpuPod("late-low", 4, ""), "low")
	createAll(t, e, []*corev1.Pod{late})
	harness.Poll(t, time.Minute, "the late low-priority pod found unschedulable", func() (bool, string) {
		for _, p := range listPods(t, e) {
			if p.Name == "late-low" {
				return scheduledFalseMessage(&p) != "", "no PodScheduled=False yet"
			}
		}
		return false, "pod missing"
	})
	time.Sleep(2 * time.Second)
	for _, p := range listPods(t, e) {
		if p.Name == "high" && p.DeletionTimestamp != nil {
			t.Error("a low-priority pod evicted the high-priority one")
		}
	}
}

// TestPreemptionEmptiesOneNodeAndHonoursPDBs: two nodes full of
// low-priority 1-GPU pods, those on dgx-0 covered by a
// PodDisruptionBudget that allows no disruption. A high-priority 8-GPU pod
// evicts the 8 pods of dgx-1 (kube-scheduler prefers victims whose
// eviction violates no budget) and nothing on dgx-0. Both modes.
func TestPreemptionEmptiesOneNodeAndHonoursPDBs(t *testing.T) {
	eachMode(t, 2, testPreemptionEmptiesOneNode)
}

func testPreemptionEmptiesOneNode(t *testing.T, e *env, s system) {
	priorityClasses(t, e)
	labelLeaves(t, e) // kubernetes.io/hostname, for pinning
	protectApp(t, e)
	var pods []*corev1.Pod
	for i := range 2 * gpusPerNode {
		node := e.nodes[i/gpusPerNode]
		p := withPriority(pinned(fmt.Sprintf("low-%d", i), 1, node), "low")
		if node == "dgx-0" {
			p.Labels = map[string]string{"app": "protected"}
		}
		pods = append(pods, p)
	}
	createAll(t, e, pods)
	harness.Poll(t, 2*time.Minute, "every GPU held by a low-priority pod", func() (bool, string) {
		n := boundGPUs(listPods(t, e))
		return n == len(pods), fmt.Sprintf("%d of %d bound", n, len(pods))
	})
	createAll(t, e, []*corev1.Pod{withPriority(gpuPod("high", 8, ""), "high")})
	harness.Poll(t, time.Minute, "the high-priority pod bound on dgx-1", func() (bool, string) {
		for _, p := range listPods(t, e) {
			if p.Name == "high" {
				return p.Spec.NodeName != "", "unbound; " + s.tail()
			}
		}
		return false, "missing"
	})
	byNode := map[string]int{}
	var highNode string
	for _, p := range listPods(t, e) {
		if p.Name == "high" {
			highNode = p.Spec.NodeName
			continue
		}
		byNode[p.Spec.NodeName]++
	}
	if highNode != "dgx-1" || byNode["dgx-0"] != gpusPerNode || byNode["dgx-1"] != 0 {
		t.Errorf("high-priority pod on %s; low-priority pods left per node %v; want it on dgx-1, dgx-1's 8 evicted and dgx-0's 8 (PDB-protected) kept", highNode, byNode)
	}
	auditPods(t, listPods(t, e))
}

// protectApp creates the PodDisruptionBudget "protected": no disruption
// of pods labelled app=protected.
func protectApp(t *testing.T, e *env) {
	t.Helper()
	zero := intstr.FromInt32(0)
	if _, err := e.cp.Clientset.PolicyV1().PodDisruptionBudgets(metav1.NamespaceDefault).Create(harness.Context(t), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "protected"},
		Spec:       policyv1.PodDisruptionBudgetSpec{MaxUnavailable: &zero, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "protected"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitBound waits up to a minute until pod name is bound, and returns it.
func waitBound(t *testing.T, e *env, s system, name string) corev1.Pod {
	t.Helper()
	var bound corev1.Pod
	harness.Poll(t, time.Minute, name+" bound", func() (bool, string) {
		for _, p := range listPods(t, e) {
			if p.Name == name && p.Spec.NodeName != "" {
				bound = p
				return true, ""
			}
		}
		return false, s.tail()
	})
	return bound
}

// TestPreemptionSparesPDBProtectedPods: two DGX-1 V100s full of
// low-priority 1-GPU pods; a PodDisruptionBudget that allows no
// disruption covers half of them: two pods in each NVLink quad of dgx-0,
// the whole first quad of dgx-1. A high-priority 4-GPU model-parallel pod
// evicts the unprotected quad of dgx-1 and no protected pod: kube-scheduler
// prefers the node whose victims breach no budget, and in extender mode
// the preempt verb counts the budgets of the victims it chooses. Both
// modes.
func TestPreemptionSparesPDBProtectedPods(t *testing.T) {
	eachMode(t, 2, testPreemptionSparesPDBProtectedPods)
}

func testPreemptionSparesPDBProtectedPods(t *testing.T, e *env, s system) {
	ctx := harness.Context(t)
	priorityClasses(t, e)
	labelLeaves(t, e) // kubernetes.io/hostname, for pinning
	var pods []*corev1.Pod
	for i := range 2 * gpusPerNode {
		pods = append(pods, withPriority(pinned(fmt.Sprintf("low-%d", i), 1, e.nodes[i/gpusPerNode]), "low"))
	}
	createAll(t, e, pods)
	harness.Poll(t, 2*time.Minute, "every GPU held by a low-priority pod", func() (bool, string) {
		n := boundGPUs(listPods(t, e))
		return n == len(pods), fmt.Sprintf("%d of %d bound", n, len(pods))
	})
	// Protect pods by the GPU they were given.
	cover := map[string][]int{e.nodes[0]: {0, 1, 4, 5}, e.nodes[1]: {0, 1, 2, 3}}
	protected := map[string]bool{}
	for _, p := range listPods(t, e) {
		idx := gpuIndices(t, &p)
		if len(idx) != 1 || !slices.Contains(cover[p.Spec.NodeName], idx[0]) {
			continue
		}
		protected[p.Name] = true
		patch := []byte(`{"metadata":{"labels":{"app":"protected"}}}`)
		if _, err := e.cp.Clientset.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if len(protected) != gpusPerNode {
		t.Fatalf("%d pods protected, want %d", len(protected), gpusPerNode)
	}
	protectApp(t, e)
	// The informers have seen the labels and the budget.
	time.Sleep(2 * time.Second)
	createAll(t, e, []*corev1.Pod{withPriority(gpuPod("high", 4, modelParallel), "high")})
	bound := waitBound(t, e, s, "high")
	left := map[string]bool{}
	for _, p := range listPods(t, e) {
		left[p.Name] = true
	}
	var gone []string
	for _, p := range pods {
		if !left[p.Name] {
			gone = append(gone, p.Name)
			if protected[p.Name] {
				t.Errorf("PDB-protected pod %s evicted", p.Name)
			}
		}
	}
	idx := gpuIndices(t, &bound)
	if bound.Spec.NodeName != e.nodes[1] || !slices.Equal(idx, []int{4, 5, 6, 7}) || len(gone) != 4 {
		t.Errorf("high-priority pod on %s GPUs %v after evicting %v; want dgx-1's unprotected quad 4-7, 4 pods evicted", bound.Spec.NodeName, idx, gone)
	}
	auditPods(t, listPods(t, e))
}

// TestGroupPreemptsWholeInOneDomain: six nodes (leaf a: dgx-0..3, leaf b:
// dgx-4, dgx-5) full of low-priority 1-GPU pods, and a high-priority group
// of 2 pods × 8 GPUs that requires one leaf. The group's pods evict the 16
// pods of the two nodes of one leaf and nothing else, and the group is
// bound whole there. Both modes.
func TestGroupPreemptsWholeInOneDomain(t *testing.T) {
	eachMode(t, 6, testGroupPreemptsWholeInOneDomain)
}

func testGroupPreemptsWholeInOneDomain(t *testing.T, e *env, s system) {
	low, nodeOf := fillLowInLeaves(t, e)
	group := groupPods("train", 2, 8, "leaf")
	for _, p := range group {
		withPriority(p, "high")
	}
	start := time.Now()
	createAll(t, e, group)
	waitBound := func() (bool, string) {
		nodes, bound := groupNodes(t, e, "train")
		return bound == 2, fmt.Sprintf("%d bound on %v; %s", bound, nodes, s.tail())
	}
	harness.Poll(t, 2*time.Minute, "the group bound whole", waitBound)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("group bound %s after it was created (its victims have no grace period), want within 10 s", d.Round(10*time.Millisecond))
	}
	nodes, _ := groupNodes(t, e, "train")
	evicted := evictedPerNode(t, e, low, nodeOf)
	want := map[string]int{nodes[0]: gpusPerNode, nodes[1]: gpusPerNode}
	if !cmp.Equal(evicted, want) {
		t.Errorf("evictions per node %v; the group is on %v; want the 8 pods of each of its two nodes and none elsewhere", evicted, nodes)
	}
	leafOf := func(n string) string {
		if n < "dgx-4" {
			return "a"
		}
		return "b"
	}
	if leafOf(nodes[0]) != leafOf(nodes[1]) {
		t.Errorf("group on %v: two leaves", nodes)
	}
	auditPods(t, listPods(t, e))
}

// TestKubernetesPodGroupPreemptsWholeInPluginMode: a high-priority
// Kubernetes PodGroup (gang minCount 2, one leaf) of 2 pods × 8 GPUs on
// nodes full of low-priority 1-GPU pods goes through kube-scheduler's
// pod-group cycle and its preemption, with gputopo's PreFilterExtensions
// and Filter: it is bound whole on two nodes of one leaf, and only those
// nodes' pods are evicted.
func TestKubernetesPodGroupPreemptsWholeInPluginMode(t *testing.T) {
	e, s := podGroupPlugin(t, localcluster.GenericWorkloadGates)
	ctx := harness.Context(t)
	low, nodeOf := fillLowInLeaves(t, e)
	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "default"},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy:      schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 2}},
			SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: leafLabel}}},
			// A PodGroup's pods must have its priority.
			PriorityClassName: "high",
		},
	}
	if _, err := e.cp.Clientset.SchedulingV1beta1().PodGroups("default").Create(ctx, pg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PodGroup: %v", err)
	}
	var pods []*corev1.Pod
	for i := range 2 {
		p := withPriority(gpuPod(fmt.Sprintf("train-%d", i), 8, ""), "high")
		p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("train")}
		pods = append(pods, p)
	}
	createAll(t, e, pods)
	var nodes []string
	harness.Poll(t, 2*time.Minute, "the PodGroup bound whole", func() (bool, string) {
		nodes = nodes[:0]
		var msgs []string
		for _, p := range listPods(t, e) {
			if p.Spec.SchedulingGroup == nil {
				continue
			}
			if p.Spec.NodeName != "" {
				nodes = append(nodes, p.Spec.NodeName)
			}
			msgs = append(msgs, scheduledFalseMessage(&p))
		}
		return len(nodes) == 2, fmt.Sprintf("bound on %v; messages %q\n%s", nodes, msgs, s.tail())
	})
	sort.Strings(nodes)
	evicted := evictedPerNode(t, e, low, nodeOf)
	if want := map[string]int{nodes[0]: gpusPerNode, nodes[1]: gpusPerNode}; !cmp.Equal(evicted, want) {
		t.Errorf("evictions per node %v; the group is on %v; want the 8 pods of each of its two nodes and none elsewhere", evicted, nodes)
	}
	if (nodes[0] < "dgx-4") != (nodes[1] < "dgx-4") {
		t.Errorf("PodGroup on %v: two leaves", nodes)
	}
	auditPods(t, listPods(t, e))
}

// evictedPerNode counts, per node, the pods of low (on the nodes nodeOf
// says) that are gone.
func evictedPerNode(t *testing.T, e *env, low []string, nodeOf map[string]string) map[string]int {
	t.Helper()
	left := map[string]bool{}
	for _, p := range listPods(t, e) {
		left[p.Name] = true
	}
	evicted := map[string]int{}
	for _, name := range low {
		if !left[name] {
			evicted[nodeOf[name]]++
		}
	}
	return evicted
}
