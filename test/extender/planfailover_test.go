//go:build integration

package extender_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

// TestNewDeciderKeepsTheGroupsPublishedPlan, plugin build: a group of two
// 8-GPU pods on two nodes is planned, and one pod is bound; the other asks
// more CPU than any node has, so kube-scheduler's own filter keeps it
// Pending and the group stays planned, half bound. The plan is published
// (GroupPlan, Planned: one slot bound, one open). The decider is killed
// (SIGKILL, its Lease not released); the next one takes the Lease over,
// adopts the published plan and keeps showing it; once the pod is
// recreated schedulable, it is bound to the plan's open slot.
func TestNewDeciderKeepsTheGroupsPublishedPlan(t *testing.T) {
	e := newEnv(t, 2)
	ctx := harness.Context(t)
	if err := localcluster.GrantExtenderRole(ctx, e.cp.Client, harness.SchedulerUser); err != nil {
		t.Fatal(err)
	}
	first := e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin})
	harness.WaitCore(t, first, localcluster.TotalGPUs(len(e.nodes)*gpusPerNode))
	group := groupPods("g", 2, gpusPerNode, "")
	group[1].Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1000")}
	createAll(t, e, group)
	var open v1alpha1.GroupPlanSlot
	harness.Poll(t, time.Minute, "g-0 bound and the half-bound plan published", func() (bool, string) {
		if _, bound := groupNodes(t, e, "g"); bound != 1 {
			return false, fmt.Sprintf("%d of the group bound", bound)
		}
		o := &v1alpha1.GroupPlan{}
		if err := e.cp.Client.Get(ctx, types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "g"}, o); err != nil {
			return false, err.Error()
		}
		if o.Spec.State != v1alpha1.GroupPlanned || len(o.Spec.Slots) != 2 {
			return false, fmt.Sprintf("published %+v", o.Spec)
		}
		for _, s := range o.Spec.Slots {
			if s.Pod != "g-0" {
				open = s // unclaimed, or claimed by the g-1 that cannot bind
			}
		}
		return open.Node != "", fmt.Sprintf("published %+v", o.Spec)
	})
	first.Kill()
	second := e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin})
	harness.Poll(t, time.Minute, "the new decider to adopt the published plan", func() (bool, string) {
		return second.LogContains(`"plan published by the previous decider" logger="GPUTopology" group="default/g" adopted=true`), second.Tail(5)
	})
	// Several publishing rounds later it still shows the same plan (a
	// decider that did not hold it would delete it).
	time.Sleep(3 * time.Second)
	o := &v1alpha1.GroupPlan{}
	if err := e.cp.Client.Get(ctx, types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: "g"}, o); err != nil {
		t.Fatalf("the plan is no longer published after the takeover: %v", err)
	}
	if !slices.ContainsFunc(o.Spec.Slots, func(s v1alpha1.GroupPlanSlot) bool {
		return s.Node == open.Node && slices.Equal(s.GPUs, open.GPUs)
	}) {
		t.Fatalf("published after the takeover: %+v; want the open slot %+v kept", o.Spec, open)
	}
	deletePods(t, e, group[1:])
	again := groupPods("g", 2, gpusPerNode, "")[1]
	harness.Poll(t, 30*time.Second, "the old g-1 gone", func() (bool, string) {
		_, err := e.cp.Clientset.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "g-1", metav1.GetOptions{})
		return err != nil, "still there"
	})
	createAll(t, e, []*corev1.Pod{again})
	harness.Poll(t, time.Minute, "the group bound whole", func() (bool, string) {
		nodes, bound := groupNodes(t, e, "g")
		return bound == 2, fmt.Sprintf("%d bound on %v; %s", bound, nodes, second.Tail(5))
	})
	p, err := e.cp.Clientset.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, "g-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != open.Node || !slices.Equal(gpuIndices(t, p), open.GPUs) {
		t.Errorf("g-1 bound to %s GPUs %v; want the adopted slot %s %v", p.Spec.NodeName, gpuIndices(t, p), open.Node, open.GPUs)
	}
	waitGroupPlan(t, e, "g", "")
}
