//go:build integration

package integration

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/test/harness"
)

// The harness's promise: real etcd, kube-apiserver and kube-scheduler from
// bin/, wired so that a GPU pod gets bound. If the scheduler never binds, the
// harness is broken and every suite above it would fail for the wrong reason.
func TestRealSchedulerBindsGPUPod(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)
	cp.CreateGPUNode(t, "gpu-node-1", 8, nil)
	cp.StartScheduler(t, nil)

	pod := harness.GPUPod("default", "smoke", 2)
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	got, err := cp.WaitForPod(ctx, "default", "smoke", time.Minute, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	if err != nil {
		t.Fatalf("kube-scheduler never bound the GPU pod: %v", err)
	}
	if got.Spec.NodeName != "gpu-node-1" {
		t.Fatalf("pod bound to %q, want gpu-node-1", got.Spec.NodeName)
	}
}
