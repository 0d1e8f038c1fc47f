package harness

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// CreateGPUNode creates a Node with gpus nvidia.com/gpu and clears what a
// bare control plane leaves in the way: with no node lifecycle controller
// the not-ready taint added at creation would stay forever, and the Ready
// condition would never be set.
func (cp *ControlPlane) CreateGPUNode(t testing.TB, name string, gpus int, labels map[string]string) *corev1.Node {
	t.Helper()
	ctx := context.Background()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	for k, v := range labels {
		node.Labels[k] = v
	}
	if err := cp.Client.Create(ctx, node); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return false, err
		}
		node.Spec.Taints = nil
		if err := cp.Client.Update(ctx, node); err != nil {
			return false, client.IgnoreNotFound(nil) // conflict: retry
		}
		return true, nil
	}); err != nil {
		t.Fatalf("clear taints of node %s: %v", name, err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:                        resource.MustParse("64"),
		corev1.ResourceMemory:                     resource.MustParse("512Gi"),
		corev1.ResourcePods:                       resource.MustParse("110"),
		corev1.ResourceName(v1alpha1.ResourceGPU): *resource.NewQuantity(int64(gpus), resource.DecimalSI),
	}
	node.Status.Capacity = capacity
	node.Status.Allocatable = capacity
	node.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}
	if err := cp.Client.Status().Update(ctx, node); err != nil {
		t.Fatalf("set status of node %s: %v", name, err)
	}
	return node
}

// GPUPod returns a pod (not created) that requests gpus nvidia.com/gpu in
// one container.
func GPUPod(namespace, name string, gpus int) *corev1.Pod {
	q := *resource.NewQuantity(int64(gpus), resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:  "main",
				Image: "registry.example/train:1",
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceName(v1alpha1.ResourceGPU): q},
					Limits:   corev1.ResourceList{corev1.ResourceName(v1alpha1.ResourceGPU): q},
				},
			}},
		},
	}
}

// WaitForPod polls the pod until cond holds or timeout passes; the error
// says what the pod looked like last.
func (cp *ControlPlane) WaitForPod(ctx context.Context, namespace, name string, timeout time.Duration, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, pod); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cond(pod), nil
	})
	if err != nil {
		return pod, fmt.Errorf("pod %s/%s: %w (nodeName=%q phase=%s conditions=%v)", namespace, name, err, pod.Spec.NodeName, pod.Status.Phase, pod.Status.Conditions)
	}
	return pod, nil
}
