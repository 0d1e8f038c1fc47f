package localcluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// CreateGPUNode creates a Node with gpus nvidia.com/gpu, as kubelet would
// report it, and clears what a bare control plane leaves in the way: with no
// node lifecycle controller the not-ready taint added at creation would stay
// forever, and the Ready condition would never be set.
func CreateGPUNode(ctx context.Context, c client.Client, name string, gpus int, labels map[string]string) (*corev1.Node, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}
	for k, v := range labels {
		node.Labels[k] = v
	}
	if err := c.Create(ctx, node); err != nil {
		return nil, fmt.Errorf("create node %s: %w", name, err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			return false, err
		}
		node.Spec.Taints = nil
		return c.Update(ctx, node) == nil, nil // a conflict retries
	}); err != nil {
		return nil, fmt.Errorf("clear taints of node %s: %w", name, err)
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:                        resource.MustParse("128"),
		corev1.ResourceMemory:                     resource.MustParse("1Ti"),
		corev1.ResourcePods:                       resource.MustParse("110"),
		corev1.ResourceName(v1alpha1.ResourceGPU): *resource.NewQuantity(int64(gpus), resource.DecimalSI),
	}
	node.Status.Capacity, node.Status.Allocatable = capacity, capacity
	node.Status.Conditions = []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
	}}
	if err := c.Status().Update(ctx, node); err != nil {
		return nil, fmt.Errorf("set status of node %s: %w", name, err)
	}
	return node, nil
}

// GPUPodSpec is a pod spec with one container that requests gpus
// nvidia.com/gpu and never restarts.
func GPUPodSpec(gpus int) corev1.PodSpec {
	q := *resource.NewQuantity(int64(gpus), resource.DecimalSI)
	return corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{
			Name:  "main",
			Image: "registry.example/train:1",
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceName(v1alpha1.ResourceGPU): q},
				Limits:   corev1.ResourceList{corev1.ResourceName(v1alpha1.ResourceGPU): q},
			},
		}},
	}
}
