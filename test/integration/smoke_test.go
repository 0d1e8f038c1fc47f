//go:build integration

package integration

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// A bare control plane turns no Job into pods; suites that need the real Job
// controller start kube-controller-manager through the harness.
func TestRealControllerManagerCreatesJobPods(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)
	cp.StartControllerManager(t, "job-controller")

	pod := harness.GPUPod("default", "unused", 1)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train"},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](2),
			Completions: ptr.To[int32](2),
			Template: corev1.PodTemplateSpec{
				Spec: pod.Spec,
			},
		},
	}
	job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	if err := cp.Client.Create(ctx, job); err != nil {
		t.Fatalf("create job: %v", err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := cp.Client.List(ctx, &pods, client.InNamespace("default"), client.MatchingLabels{"batch.kubernetes.io/job-name": "train"}); err != nil {
			return false, err
		}
		return len(pods.Items) == 2, nil
	})
	if err != nil {
		t.Fatalf("job controller did not create 2 pods: %v", err)
	}
}
