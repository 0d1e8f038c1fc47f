//go:build integration

package extender_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/test/harness"
)

// TestPreemptionFreesAQuadOnRandomFills, both modes: one DGX-1 V100
// (NVLink quads 0-3 and 4-7) is filled with eight 1-GPU pods of eight
// priorities in a random order, then one to three of them end, each quad
// keeping at least one. A high-priority 4-GPU model-parallel pod then
// preempts, in one round, exactly the pods on one quad and is bound there;
// by the documented rule (docs/extender.md "The victim rule":
// kube-scheduler's, the more important pods given back first) the quad
// freed is the one without the most important pod. GPUTOPO_PREEMPT_FILLS
// sets the number of fills (3 by default; the acceptance run uses 30).
func TestPreemptionFreesAQuadOnRandomFills(t *testing.T) {
	fills := 3
	if v := os.Getenv("GPUTOPO_PREEMPT_FILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("GPUTOPO_PREEMPT_FILLS=%q: want a positive integer", v)
		}
		fills = n
	}
	eachMode(t, 1, func(t *testing.T, e *env, s system) { testPreemptionOnRandomFills(t, e, s, fills) })
}

func testPreemptionOnRandomFills(t *testing.T, e *env, s system, fills int) {
	ctx := harness.Context(t)
	labelLeaves(t, e)
	node := e.nodes[0]
	for i := 1; i <= gpusPerNode; i++ {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("low-%d", i)}, Value: int32(10 * i)}
		if _, err := e.cp.Clientset.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.cp.Clientset.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(64, 1))
	for fill := range fills {
		var pods []*corev1.Pod
		for i, prio := range rng.Perm(gpusPerNode) {
			pods = append(pods, withPriority(pinned(fmt.Sprintf("f%d-%d", fill, i), 1, node), fmt.Sprintf("low-%d", prio+1)))
		}
		createAll(t, e, pods)
		harness.Poll(t, time.Minute, fmt.Sprintf("fill %d bound", fill), func() (bool, string) {
			n := boundGPUs(listPods(t, e))
			return n == gpusPerNode, fmt.Sprintf("%d bound", n)
		})
		gpuOf, prioOf := map[string]int{}, map[string]int32{}
		for _, p := range listPods(t, e) {
			gpuOf[p.Name], prioOf[p.Name] = gpuIndices(t, &p)[0], *p.Spec.Priority
		}
		// End one to three pods, each quad keeping one at least.
		var ended []*corev1.Pod
		for _, i := range rng.Perm(gpusPerNode)[:1+rng.IntN(3)] {
			ended = append(ended, pods[i])
		}
		left := [2]int{}
		for _, p := range pods {
			if !slices.Contains(ended, p) {
				left[gpuOf[p.Name]/4]++
			}
		}
		if left[0] == 0 || left[1] == 0 {
			ended = ended[:1]
		}
		deletePods(t, e, ended)
		harness.Poll(t, time.Minute, "the ended pods gone", func() (bool, string) {
			n := len(listPods(t, e))
			return n == gpusPerNode-len(ended), fmt.Sprintf("%d pods", n)
		})
		var most string
		for _, p := range listPods(t, e) {
			if most == "" || prioOf[p.Name] > prioOf[most] {
				most = p.Name
			}
		}
		high := withPriority(gpuPod(fmt.Sprintf("high-%d", fill), 4, modelParallel), "high")
		createAll(t, e, []*corev1.Pod{high})
		bound := waitBound(t, e, s, high.Name)
		quad := gpuIndices(t, &bound)
		if !slices.Equal(quad, []int{0, 1, 2, 3}) && !slices.Equal(quad, []int{4, 5, 6, 7}) {
			t.Fatalf("fill %d: high-priority pod on GPUs %v, want an NVLink quad", fill, quad)
		}
		present := map[string]bool{}
		for _, p := range listPods(t, e) {
			present[p.Name] = true
		}
		for _, p := range pods {
			if slices.Contains(ended, p) {
				continue
			}
			inQuad := slices.Contains(quad, gpuOf[p.Name])
			switch {
			case inQuad && present[p.Name]:
				t.Errorf("fill %d: %s still holds GPU %d of the quad the pod got", fill, p.Name, gpuOf[p.Name])
			case !inQuad && !present[p.Name]:
				t.Errorf("fill %d: %s (GPU %d) evicted in vain: the pod got quad %v", fill, p.Name, gpuOf[p.Name], quad)
			}
		}
		if !present[most] {
			t.Errorf("fill %d: the most important pod %s (priority %d, GPU %d) evicted; the rule gives it back first", fill, most, prioOf[most], gpuOf[most])
		}
		// One round: every victim got exactly one Preempted event.
		evs, err := e.cp.Clientset.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		preempted := map[string]int{}
		for _, ev := range evs.Items {
			if ev.Reason == "Preempted" {
				preempted[ev.InvolvedObject.Name]++
			}
		}
		for name, n := range preempted {
			if n > 1 || present[name] {
				t.Errorf("fill %d: %s preempted %d times (still there: %v)", fill, name, n, present[name])
			}
		}
		var all []*corev1.Pod
		for _, p := range listPods(t, e) {
			all = append(all, &p)
		}
		deletePods(t, e, all)
		if err := e.cp.Clientset.CoreV1().Events(metav1.NamespaceDefault).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		harness.Poll(t, time.Minute, "the node empty", func() (bool, string) {
			n := len(listPods(t, e))
			return n == 0, fmt.Sprintf("%d pods", n)
		})
	}
}
