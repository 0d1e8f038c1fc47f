//go:build integration

package extender_test

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

const leafLabel = "network.topology.nvidia.com/leaf"

// labelLeaves puts nodes dgx-0..3 under leaf a and the rest under leaf b.
func labelLeaves(t *testing.T, e *env) {
	t.Helper()
	ctx := harness.Context(t)
	for i, name := range e.nodes {
		n, err := e.cp.Clientset.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		leaf := "b"
		if i < 4 {
			leaf = "a"
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[leafLabel] = leaf
		n.Labels["kubernetes.io/hostname"] = name
		if _, err := e.cp.Clientset.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// groupPods are the size pods of group name, gpus GPUs each, whose whole
// group must fit in one domain of level required.
func groupPods(name string, size int, gpus int64, required string) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range size {
		p := gpuPod(fmt.Sprintf("%s-%d", name, i), gpus, "")
		p.Annotations = map[string]string{v1alpha1.AnnotationGroup: name, v1alpha1.AnnotationGroupSize: fmt.Sprint(size)}
		if required != "" {
			p.Annotations[v1alpha1.AnnotationGroupRequiredTopology] = required
		}
		pods = append(pods, p)
	}
	return pods
}

// pinned is a pod pinned to node through a nodeSelector.
func pinned(name string, gpus int64, node string) *corev1.Pod {
	p := gpuPod(name, gpus, "")
	p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	return p
}

// groupNodes are the nodes of the pods of group name, and how many of its
// pods are bound.
func groupNodes(t *testing.T, e *env, name string) (nodes []string, bound int) {
	t.Helper()
	for _, p := range listPods(t, e) {
		if p.Annotations[v1alpha1.AnnotationGroup] != name || p.Spec.NodeName == "" {
			continue
		}
		bound++
		nodes = append(nodes, p.Spec.NodeName)
	}
	sort.Strings(nodes)
	return nodes, bound
}

func deletePods(t *testing.T, e *env, pods []*corev1.Pod) {
	t.Helper()
	ctx := harness.Context(t)
	for _, p := range pods {
		if err := e.cp.Clientset.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitGroupBound waits until every pod of group name is bound, inside leaf
// a (dgx-0..3), one pod per node.
func waitGroupBound(t *testing.T, e *env, name string, size int) {
	t.Helper()
	harness.Poll(t, 2*time.Minute, "group "+name+" bound", func() (bool, string) {
		nodes, bound := groupNodes(t, e, name)
		return bound == size, fmt.Sprintf("%d of %d bound, on %v", bound, size, nodes)
	})
	nodes, _ := groupNodes(t, e, name)
	seen := map[string]bool{}
	for _, n := range nodes {
		if n > "dgx-3" || seen[n] {
			t.Errorf("group %s on %v: want one pod on each of leaf a's nodes dgx-0..3", name, nodes)
			break
		}
		seen[n] = true
	}
}

// TestGroupIsPlacedAllOrNothingInOneDomain: on six 8-GPU nodes, four under
// leaf a and two under leaf b, a 4-pod x 8-GPU group that must stay in one
// leaf cannot fit while one of leaf a's nodes is busy: it holds nothing,
// and a 1-GPU pod is scheduled past it. When the node frees, all four pods
// are bound inside leaf a. A second such group waits for the first and
// finishes in turn once the first is gone; a group deleted while part of
// it was bound frees every GPU; a group whose required level no domain
// can meet gets an event that says so. Both modes.
func TestGroupIsPlacedAllOrNothingInOneDomain(t *testing.T) {
	eachMode(t, 6, testGroupIsPlacedAllOrNothingInOneDomain)
}

func testGroupIsPlacedAllOrNothingInOneDomain(t *testing.T, e *env, s system) {
	ctx := harness.Context(t)
	labelLeaves(t, e)
	busy := pinned("busy", 8, "dgx-0")
	createAll(t, e, []*corev1.Pod{busy})
	harness.Poll(t, time.Minute, "busy pod bound", func() (bool, string) {
		g := s.gauges(t)
		return g["held"]+g["reserved"] == 8, fmtGauges(g)
	})

	first := groupPods("first", 4, 8, "leaf")
	createAll(t, e, first)
	harness.Poll(t, time.Minute, "the group's pods to say why they wait", func() (bool, string) {
		var msgs []string
		for _, p := range listPods(t, e) {
			if p.Annotations[v1alpha1.AnnotationGroup] == "first" {
				msgs = append(msgs, scheduledFalseMessage(&p))
			}
		}
		want := "group default/first needs 4 pods × 8 GPUs in one leaf domain; the largest free holds 3"
		ok := len(msgs) == 4
		for _, m := range msgs {
			ok = ok && strings.Contains(m, want)
		}
		return ok, fmt.Sprintf("messages %q", msgs)
	})
	// Nothing held for it: a 1-GPU pod is placed past it, and the ledger
	// holds the busy pod's 8 GPUs and that one.
	one := pinned("one", 1, "dgx-4")
	createAll(t, e, []*corev1.Pod{one})
	harness.Poll(t, time.Minute, "the 1-GPU pod bound past the waiting group", func() (bool, string) {
		g := s.gauges(t)
		_, bound := groupNodes(t, e, "first")
		return g["held"]+g["reserved"] == 9 && bound == 0, fmtGauges(g) + fmt.Sprintf(" group pods bound %d", bound)
	})

	// A second group competes for the same leaf.
	second := groupPods("second", 4, 8, "leaf")
	createAll(t, e, second)
	deletePods(t, e, []*corev1.Pod{busy})
	// Whichever group is planned first gets leaf a whole; the other waits.
	var done, waiting string
	harness.Poll(t, 2*time.Minute, "one group bound whole", func() (bool, string) {
		_, a := groupNodes(t, e, "first")
		_, b := groupNodes(t, e, "second")
		switch {
		case a == 4 && b == 0:
			done, waiting = "first", "second"
		case b == 4 && a == 0:
			done, waiting = "second", "first"
		}
		return done != "", fmt.Sprintf("first %d, second %d bound", a, b)
	})
	waitGroupBound(t, e, done, 4)
	if _, b := groupNodes(t, e, waiting); b != 0 {
		t.Fatalf("group %s has %d pods bound while %s holds leaf a", waiting, b, done)
	}
	// The first group finishes: the other follows, whole.
	if done == "first" {
		deletePods(t, e, first)
	} else {
		deletePods(t, e, second)
	}
	waitGroupBound(t, e, waiting, 4)
	if waiting == "first" {
		deletePods(t, e, first)
	} else {
		deletePods(t, e, second)
	}
	deletePods(t, e, []*corev1.Pod{one})

	// A group of three where one pod can never be scheduled (its
	// nodeSelector matches no node): two are bound and the third's GPUs
	// stay planned for it. Deleting the group frees every GPU.
	partial := groupPods("partial", 3, 8, "")
	partial[2].Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "no-such-node"}
	createAll(t, e, partial)
	harness.Poll(t, 2*time.Minute, "two of the group's pods bound", func() (bool, string) {
		nodes, bound := groupNodes(t, e, "partial")
		return bound == 2, fmt.Sprintf("%d bound on %v; %s", bound, nodes, fmtGauges(s.gauges(t)))
	})
	deletePods(t, e, partial)
	harness.Poll(t, time.Minute, "every GPU free after the group was deleted", func() (bool, string) {
		g := s.gauges(t)
		return g["free"] == float64(len(e.nodes)*gpusPerNode) && g["reserved"] == 0, fmtGauges(g)
	})

	// Required level no domain can meet: 2 x 8 GPUs in one NVLink domain
	// (these nodes are in none, so each is alone).
	never := groupPods("never", 2, 8, "nvlink")
	createAll(t, e, never)
	harness.Poll(t, time.Minute, "an event that says the level cannot be met", func() (bool, string) {
		evs, err := e.cp.Clientset.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=never-0"})
		if err != nil {
			return false, err.Error()
		}
		var msgs []string
		for _, ev := range evs.Items {
			if ev.Reason == "FailedScheduling" && strings.Contains(ev.Message, "group default/never needs 2 pods × 8 GPUs in one nvlink domain; none holds that many even with every GPU free (the largest holds 1)") {
				return true, ""
			}
			msgs = append(msgs, ev.Message)
		}
		return false, fmt.Sprintf("events %q", msgs)
	})
}

// TestKubernetesPodGroupIsPlacedWholeInPluginMode: with Kubernetes'
// PodGroup API served (GenericWorkload), pods that name a gang PodGroup
// (minCount 4, topology constraint: the leaf label) are one group for
// gputopo inside kube-scheduler's own pod-group cycle: it holds nothing
// while leaf a has 3 free nodes, a 1-GPU pod is scheduled past it, and
// once the busy node frees all four are bound inside leaf a.
//
// It runs with the scheduler's plain pod-group cycle, and with
// TopologyAwareWorkloadScheduling, where the cycle tries the placement
// gputopo generates (GeneratePlacements) and scores (ScorePlacement).
func TestKubernetesPodGroupIsPlacedWholeInPluginMode(t *testing.T) {
	for _, gates := range []string{localcluster.GenericWorkloadGates, localcluster.GenericWorkloadGates + ",TopologyAwareWorkloadScheduling=true"} {
		t.Run(gates, func(t *testing.T) { testKubernetesPodGroup(t, gates) })
	}
}

func testKubernetesPodGroup(t *testing.T, gates string) {
	e, s := podGroupPlugin(t, gates)
	ctx := harness.Context(t)
	labelLeaves(t, e)
	busy := pinned("busy", 8, "dgx-0")
	createAll(t, e, []*corev1.Pod{busy})

	pg := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "default"},
		Spec: schedulingv1beta1.PodGroupSpec{
			SchedulingPolicy:      schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 4}},
			SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: leafLabel}}},
		},
	}
	if _, err := e.cp.Clientset.SchedulingV1beta1().PodGroups("default").Create(ctx, pg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PodGroup: %v", err)
	}
	var pods []*corev1.Pod
	for i := range 4 {
		p := gpuPod(fmt.Sprintf("train-%d", i), 8, "")
		p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("train")}
		pods = append(pods, p)
	}
	createAll(t, e, pods)
	// kube-scheduler's pod-group cycle stops at the first pod gputopo
	// refuses: that pod carries gputopo's reason, the others the gang's
	// ("minCount (4) cannot be satisfied: ...").
	harness.Poll(t, time.Minute, "the PodGroup's pods to say why they wait", func() (bool, string) {
		var msgs []string
		var gputopo, bound int
		for _, p := range listPods(t, e) {
			if p.Spec.SchedulingGroup == nil {
				continue
			}
			if p.Spec.NodeName != "" {
				bound++
			}
			m := scheduledFalseMessage(&p)
			msgs = append(msgs, m)
			if strings.Contains(m, "gputopo: group default/train needs 4 pods × 8 GPUs in one leaf domain; the largest free holds 3") {
				gputopo++
			}
		}
		return gputopo >= 1 && bound == 0 && len(msgs) == 4, fmt.Sprintf("%d bound; messages %q", bound, msgs)
	})
	one := pinned("one", 1, "dgx-4")
	createAll(t, e, []*corev1.Pod{one})
	harness.Poll(t, time.Minute, "the 1-GPU pod bound past the waiting group", func() (bool, string) {
		g := s.gauges(t)
		return g["held"]+g["reserved"] == 9, fmtGauges(g)
	})
	deletePods(t, e, []*corev1.Pod{busy})
	harness.Poll(t, 2*time.Minute, "the PodGroup bound whole in leaf a", func() (bool, string) {
		var nodes []string
		for _, p := range listPods(t, e) {
			if p.Spec.SchedulingGroup != nil && p.Spec.NodeName != "" {
				nodes = append(nodes, p.Spec.NodeName)
			}
		}
		sort.Strings(nodes)
		return len(nodes) == 4 && strings.Join(nodes, ",") == "dgx-0,dgx-1,dgx-2,dgx-3", fmt.Sprintf("bound on %v", nodes)
	})
}

// podGroupPlugin starts six nodes on an apiserver serving the Workload and
// PodGroup API and the plugin build with gates, its core ready. The
// apiserver keeps a PodGroup's schedulingConstraints only with the
// topology gate; the scheduler runs its plain pod-group cycle unless gates
// say otherwise.
func podGroupPlugin(t *testing.T, gates string) (*env, *pluginSystem) {
	t.Helper()
	args := localcluster.GenericWorkloadAPIServerArgs()
	args["feature-gates"] = []string{localcluster.GenericWorkloadGates + ",TopologyAwareWorkloadScheduling=true"}
	e := newEnvWith(t, 6, harness.Options{APIServerArgs: args})
	if err := localcluster.GrantExtenderRole(harness.Context(t), e.cp.Client, harness.SchedulerUser); err != nil {
		t.Fatal(err)
	}
	s := &pluginSystem{e: e, sched: e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin, FeatureGates: gates})}
	harness.WaitCore(t, s.sched, localcluster.TotalGPUs(len(e.nodes)*gpusPerNode))
	return e, s
}
