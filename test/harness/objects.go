package harness

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/topology/machine"
)

// CreateGPUNode creates a Ready Node with gpus nvidia.com/gpu and no
// taints (see localcluster.CreateGPUNode).
func (cp *ControlPlane) CreateGPUNode(t testing.TB, name string, gpus int, labels map[string]string) *corev1.Node {
	t.Helper()
	node, err := localcluster.CreateGPUNode(context.Background(), cp.Client, name, gpus, labels)
	if err != nil {
		t.Fatal(err)
	}
	return node
}

// GPUPod returns a pod (not created) that requests gpus nvidia.com/gpu in
// one container.
func GPUPod(namespace, name string, gpus int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       localcluster.GPUPodSpec(gpus),
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

// PublishTopology creates the NodeGPUTopology of node name with a fixture's
// machine, observed now, as the node agent publishes it.
func (cp *ControlPlane) PublishTopology(t testing.TB, name string, f machine.Fixture) {
	t.Helper()
	ctx := context.Background()
	obj := &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cp.Client.Create(ctx, obj); err != nil {
		t.Fatalf("create NodeGPUTopology %s: %v", name, err)
	}
	obj.Status = f.Graph(name).Status()
	obj.Status.ObservedTime = metav1.Now()
	if err := cp.Client.Status().Update(ctx, obj); err != nil {
		t.Fatalf("update NodeGPUTopology status %s: %v", name, err)
	}
}

// PodGPUs is the sorted GPU list in the pod's annotation key
// (assigned-gpus, allocated-gpus); a malformed list fails the test.
func PodGPUs(t testing.TB, p *corev1.Pod, key string) []string {
	t.Helper()
	l, err := v1alpha1.ParseGPUList(key, p.Annotations[key])
	if err != nil {
		t.Fatalf("pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return v1alpha1.SortedGPUList(l)
}
