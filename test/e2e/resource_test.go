//go:build integration

package e2e

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
)

// TestRenamedGPUResource: with every component configured for another GPU
// resource name (the chart's gpuResourceName), a pod that asks for that
// resource is routed by the webhook, placed by the extender with its exact
// GPUs, allocated by the node agent through kubelet, and recorded; a pod
// asking for nvidia.com/gpu on such a cluster is none of gputopo's
// business and is left alone.
func TestRenamedGPUResource(t *testing.T) {
	const resource corev1.ResourceName = "example.com/gpu"
	e := setupWith(t, resource)

	p := e.gpuPod(nsTeam, "renamed", 2)
	p.Annotations = map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel)}
	e.create(t, p)
	got := e.getPod(t, p.Namespace, p.Name)
	if got.Spec.SchedulerName != v1alpha1.DefaultSchedulerName || got.Annotations[v1alpha1.AnnotationRequirement] == "" {
		t.Fatalf("webhook did not route the pod asking for %s: schedulerName %q, requirement %q", resource, got.Spec.SchedulerName, got.Annotations[v1alpha1.AnnotationRequirement])
	}
	got = e.waitPod(t, p, 2*time.Minute, "the pod to run with its GPUs recorded", func(p *corev1.Pod) bool {
		return isRunning(p) && p.Annotations[v1alpha1.AnnotationAllocatedGPUs] != ""
	})
	assigned := harness.PodGPUs(t, got, v1alpha1.AnnotationAssignedGPUs)
	allocated := harness.PodGPUs(t, got, v1alpha1.AnnotationAllocatedGPUs)
	if len(assigned) != 2 || !slices.Equal(sorted(assigned), allocated) {
		t.Fatalf("assigned-gpus %v, allocated-gpus %v; want the same 2 GPUs", assigned, allocated)
	}
	if vis, ok := e.visible(got); !ok || !slices.Equal(vis, allocated) {
		t.Fatalf("container sees %v (created: %v); want exactly %v", vis, ok, allocated)
	}
	if c := e.ext.Core().Report().Counts(); c.Held != 2 || c.Free != nodeGPUs-2 {
		t.Fatalf("extender ledger %s; want 2 held, %d free", c, nodeGPUs-2)
	}
	t.Logf("pod %s asking for %s: node %s, assigned %v, allocated %v, container sees %v",
		p.Name, resource, got.Spec.NodeName, assigned, allocated, allocated)

	// nvidia.com/gpu is not this cluster's GPU resource: the webhook leaves
	// the pod to the default scheduler.
	other := gpuPod(nsTeam, "other-resource", 1)
	e.create(t, other)
	if got := e.getPod(t, other.Namespace, other.Name); got.Spec.SchedulerName == v1alpha1.DefaultSchedulerName {
		t.Errorf("a pod asking for %s was routed to %s on a cluster whose GPU resource is %s", v1alpha1.ResourceGPU, v1alpha1.DefaultSchedulerName, resource)
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}
