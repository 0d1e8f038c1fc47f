//go:build integration

package nodeagent_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/test/kubelet"
	"github.com/gputopo/gputopo/topology/machine"
)

const (
	nodeName  = "gpu-node-1"
	namespace = "train"
	agentUser = "system:serviceaccount:gputopo-system:gputopo-nodeagent"
)

var (
	rbacClusterRole = rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gputopo-nodeagent"}, Rules: nodeagent.RBACRules()}
	rbacBinding     = rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "gputopo-nodeagent"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "gputopo-nodeagent"},
		Subjects:   []rbacv1.Subject{{Kind: "User", APIGroup: "rbac.authorization.k8s.io", Name: agentUser}},
	}
)

// env is one control plane, one kubelet and one agent.
type env struct {
	cp    *harness.ControlPlane
	k     *kubelet.Kubelet
	sim   *nvmlsim.Simulator
	agent *nodeagent.Agent
	pr    *nodeagent.PodResourcesClient
}

func setup(t *testing.T) *env {
	t.Helper()
	return setupWithStrategies(t, nil)
}

func (e *env) waitAllocatable(t *testing.T, want int64) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		node := &corev1.Node{}
		if err := e.cp.Client.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
			return false, nil
		}
		q := node.Status.Allocatable[corev1.ResourceName(v1alpha1.ResourceGPU)]
		return q.Value() == want, nil
	})
	if err != nil {
		t.Fatalf("node %s never had %d allocatable %s: %v", nodeName, want, v1alpha1.ResourceGPU, err)
	}
}

// bindPod creates a GPU pod and binds it with the plan in the Binding's
// annotations, as the extender does.
func (e *env) bindPod(t *testing.T, name string, gpus int, assigned []string) {
	t.Helper()
	e.createPod(t, name, gpus)
	e.bind(t, name, assigned)
}

func (e *env) createPod(t *testing.T, name string, gpus int) {
	t.Helper()
	pod := harness.GPUPod(namespace, name, gpus)
	no := false
	pod.Spec.AutomountServiceAccountToken = &no
	if err := e.cp.Client.Create(context.Background(), pod); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
}

func (e *env) bind(t *testing.T, name string, assigned []string) {
	t.Helper()
	ctx := context.Background()
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
			Annotations: map[string]string{v1alpha1.AnnotationAssignedGPUs: v1alpha1.FormatGPUList(assigned)}},
		Target: corev1.ObjectReference{Kind: "Node", Name: nodeName},
	}
	if err := e.cp.Clientset.CoreV1().Pods(namespace).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatalf("bind pod %s: %v", name, err)
	}
}

func (e *env) waitRunning(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	pod, err := e.cp.WaitForPod(context.Background(), namespace, name, 90*time.Second, func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// visible is the NVIDIA_VISIBLE_DEVICES the runtime received for the pod's
// container, sorted.
func (e *env) visible(t *testing.T, name string) []string {
	t.Helper()
	cs := e.k.Runtime.ContainersOf(namespace, name)
	if len(cs) == 0 {
		t.Fatalf("runtime never created a container for %s/%s", namespace, name)
	}
	return kubelet.EnvList(cs[len(cs)-1].Env[v1alpha1.EnvVisibleDevices])
}

// podResources is what kubelet's PodResources API says the pod holds.
func (e *env) podResources(t *testing.T, name string) []string {
	t.Helper()
	list, err := e.pr.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range list {
		if p.Namespace != namespace || p.Name != name {
			continue
		}
		for _, c := range p.Containers {
			for _, d := range c.Devices {
				if d.ResourceName == v1alpha1.ResourceGPU {
					ids = append(ids, d.DeviceIds...)
				}
			}
		}
	}
	return v1alpha1.SortedGPUList(ids)
}

func (e *env) waitAllocated(t *testing.T, name string, want []string) {
	t.Helper()
	if _, err := e.cp.WaitForPod(context.Background(), namespace, name, 30*time.Second, func(p *corev1.Pod) bool {
		return p.Annotations[v1alpha1.AnnotationAllocatedGPUs] == v1alpha1.FormatGPUList(want)
	}); err != nil {
		t.Fatalf("pod %s never got %s=%s: %v", name, v1alpha1.AnnotationAllocatedGPUs, v1alpha1.FormatGPUList(want), err)
	}
}

func (e *env) driftEvents(t *testing.T, name string) int {
	t.Helper()
	list, err := e.cp.Clientset.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ev := range list.Items {
		if ev.InvolvedObject.Name == name && ev.Reason == nodeagent.ReasonAssignmentDrift {
			n++
		}
	}
	return n
}

func uuids(sim *nvmlsim.Simulator, idx ...int) []string {
	all := sim.UUIDs()
	out := make([]string, len(idx))
	for i, x := range idx {
		out[i] = all[x]
	}
	return out
}

func TestNodeAgentWithRealKubelet(t *testing.T) {
	e := setup(t)
	ctx := context.Background()

	t.Run("publishes the node's topology", func(t *testing.T) {
		obj := &v1alpha1.NodeGPUTopology{}
		if err := e.cp.Client.Get(ctx, client.ObjectKey{Name: nodeName}, obj); err != nil {
			t.Fatal(err)
		}
		f, _ := machine.FixtureByName("dgx-a100")
		if obj.Status.TopologyHash != f.Graph(nodeName).Hash() || len(obj.Status.GPUs) != 8 {
			t.Errorf("NodeGPUTopology: hash %q with %d GPUs, want the dgx-a100 hash %q with 8", obj.Status.TopologyHash, len(obj.Status.GPUs), f.Graph(nodeName).Hash())
		}
		if len(obj.OwnerReferences) != 1 || obj.OwnerReferences[0].Kind != "Node" {
			t.Errorf("owner references %v, want the Node", obj.OwnerReferences)
		}
	})

	planned := uuids(e.sim, 5, 6)
	t.Run("the container sees exactly the assigned GPUs", func(t *testing.T) {
		e.bindPod(t, "two-gpus", 2, planned)
		e.waitRunning(t, "two-gpus")
		want := v1alpha1.SortedGPUList(planned)
		if diff := slices.Compare(want, e.visible(t, "two-gpus")); diff != 0 {
			t.Errorf("%s in the container: %v, want the plan %v", v1alpha1.EnvVisibleDevices, e.visible(t, "two-gpus"), want)
		}
		if got := e.podResources(t, "two-gpus"); !slices.Equal(want, got) {
			t.Errorf("PodResources devices: %v, want %v", got, want)
		}
		e.waitAllocated(t, "two-gpus", want)
		if n := e.driftEvents(t, "two-gpus"); n != 0 {
			t.Errorf("%d drift events for a pod that got its plan, want 0", n)
		}
	})

	t.Run("after a kubelet restart the agent re-registers and pods keep their GPUs", func(t *testing.T) {
		before := e.agent.Plugin.Registrations()
		e.k.Restart(t)
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
			return e.agent.Plugin.Registrations() > before, nil
		}); err != nil {
			t.Fatalf("agent did not re-register after the kubelet restart (registrations %d)", e.agent.Plugin.Registrations())
		}
		e.waitAllocatable(t, 8)
		e.waitRunning(t, "two-gpus")
		// The new kubelet lists its pods once it has synced them.
		var got []string
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			got = e.podResources(t, "two-gpus")
			return slices.Equal(v1alpha1.SortedGPUList(planned), got), nil
		}); err != nil {
			t.Errorf("PodResources devices of the running pod after restart: %v, want %v", got, v1alpha1.SortedGPUList(planned))
		}
		if got := e.visible(t, "two-gpus"); !slices.Equal(v1alpha1.SortedGPUList(planned), got) {
			t.Errorf("%s of two-gpus after restart: %v, want %v", v1alpha1.EnvVisibleDevices, got, v1alpha1.SortedGPUList(planned))
		}
		// A new pod is admitted through the re-registered plugin.
		next := uuids(e.sim, 0)
		e.bindPod(t, "after-restart", 1, next)
		e.waitRunning(t, "after-restart")
		if got := e.visible(t, "after-restart"); !slices.Equal(v1alpha1.SortedGPUList(next), got) {
			t.Errorf("%s after restart: %v, want %v", v1alpha1.EnvVisibleDevices, got, v1alpha1.SortedGPUList(next))
		}
	})

	t.Run("two same-size pods admitted together each get their plan", func(t *testing.T) {
		// kubelet is down while both are bound, so it admits them in one
		// batch, in creation order: pair-a first although it was bound
		// last. GPUs 1,2,3,4,7 are free; the plans take four of them.
		plans := map[string][]string{"pair-a": uuids(e.sim, 4, 7), "pair-b": uuids(e.sim, 2, 3)}
		e.k.Stop()
		e.createPod(t, "pair-a", 2)
		time.Sleep(1100 * time.Millisecond) // distinct creation seconds
		e.createPod(t, "pair-b", 2)
		e.bind(t, "pair-b", plans["pair-b"])
		time.Sleep(1100 * time.Millisecond) // distinct bind seconds, in the other order
		e.bind(t, "pair-a", plans["pair-a"])
		time.Sleep(1100 * time.Millisecond) // bound before kubelet starts, to the second
		e.k.StartAgain(t)
		e.waitRunning(t, "pair-a")
		e.waitRunning(t, "pair-b")
		a, b := e.visible(t, "pair-a"), e.visible(t, "pair-b")
		if len(a) != 2 || len(b) != 2 {
			t.Fatalf("visible devices: pair-a %v, pair-b %v; want 2 each", a, b)
		}
		for _, id := range a {
			if slices.Contains(b, id) {
				t.Errorf("GPU %s is in both pair-a %v and pair-b %v", id, a, b)
			}
		}
		for name, got := range map[string][]string{"pair-a": a, "pair-b": b} {
			e.waitAllocated(t, name, got)
			// The device plugin API does not say which pod a
			// GetPreferredAllocation is for; kubelet's PodResources lists
			// each pod of the batch only once kubelet takes it in, which
			// tells the agent which one it is admitting.
			if want := v1alpha1.SortedGPUList(plans[name]); !slices.Equal(want, got) {
				t.Errorf("%s: allocated %v instead of its plan %v", name, got, want)
			}
		}
		// The reconciler raises drift within a pass of the record: none
		// may appear in the next 3s, so this wait must run out.
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Second, true, func(context.Context) (bool, error) {
			for name := range plans {
				if e.driftEvents(t, name) != 0 {
					return true, nil
				}
			}
			return false, nil
		})
		if !wait.Interrupted(err) {
			for name := range plans {
				if n := e.driftEvents(t, name); n != 0 {
					t.Errorf("%s: %d drift events", name, n)
				}
			}
		}
	})

	t.Run("a plan kubelet cannot follow is recorded as drift", func(t *testing.T) {
		// GPUs 5 and 6 belong to two-gpus: a plan naming them (an extender
		// bug) cannot be honoured; kubelet takes the free ones.
		e.bindPod(t, "stale-plan", 1, uuids(e.sim, 5))
		e.waitRunning(t, "stale-plan")
		got := e.visible(t, "stale-plan")
		if len(got) != 1 || got[0] == uuids(e.sim, 5)[0] {
			t.Fatalf("stale-plan sees %v; want one GPU that is not two-gpus' GPU 5", got)
		}
		e.waitAllocated(t, "stale-plan", got)
		e.waitDrift(t, "stale-plan")
	})
}

func (e *env) waitDrift(t *testing.T, name string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return e.driftEvents(t, name) == 1, nil
	}); err != nil {
		t.Errorf("pod %s: want exactly one %s event, got %d", name, nodeagent.ReasonAssignmentDrift, e.driftEvents(t, name))
	}
}
