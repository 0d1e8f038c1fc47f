package localcluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
)

// CreateGPUNode creates a Node with gpus nvidia.com/gpu, as kubelet would
// report it, and clears what a bare control plane leaves in the way: with no
// node lifecycle controller the not-ready taint added at creation would stay
// forever, and the Ready condition would never be set. gpus < 0 creates a
// node that advertises no nvidia.com/gpu: one whose GPUs a DRA driver
// publishes instead.
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
		corev1.ResourceCPU:    resource.MustParse("128"),
		corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	if gpus >= 0 {
		capacity[corev1.ResourceName(v1alpha1.ResourceGPU)] = *resource.NewQuantity(int64(gpus), resource.DecimalSI)
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

// ExtenderRoleName is the ClusterRole GrantExtenderRole creates: the
// extender's RBAC (extender.RBACRules), as the chart's.
const ExtenderRoleName = "gputopo-extender"

// GrantExtenderRole binds the extender's ClusterRole (created when
// missing) to user, as the chart binds it to the scheduler's service
// account in plugin mode: the GPUTopology plugin's core reads and binds
// what the extender would.
func GrantExtenderRole(ctx context.Context, c client.Client, user string) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ExtenderRoleName}, Rules: extender.RBACRules()}
	if err := c.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ClusterRole %s: %w", role.Name, err)
	}
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ExtenderRoleName + "-for-" + strings.NewReplacer(":", "-").Replace(user)},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ExtenderRoleName},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if err := c.Create(ctx, b); err != nil {
		return fmt.Errorf("create ClusterRoleBinding %s: %w", b.Name, err)
	}
	return nil
}
