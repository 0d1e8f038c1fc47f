//go:build integration

package ecosystem

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

// The DRA driver the test publishes devices for, as NVIDIA's driver
// publishes the channels of a GB200 ComputeDomain: one channel device per
// node in a pool named after the node.
const (
	channelDriver = "compute-domain.nvidia.com"
	channelClass  = "compute-domain-default-channel.nvidia.com"
)

// publishChannels creates the DeviceClass and one ResourceSlice per node,
// as the driver's kubelet plugin would.
func publishChannels(t *testing.T, e *env) {
	t.Helper()
	ctx := harness.Context(t)
	cs := e.cp.Clientset.ResourceV1()
	createDeviceClass(t, e, channelClass, channelDriver)
	for _, n := range e.nodes {
		slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: n + "-channels"}, Spec: resourcev1.ResourceSliceSpec{
			Driver: channelDriver, NodeName: &n,
			Pool:    resourcev1.ResourcePool{Name: n, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "channel-0"}},
		}}
		if _, err := cs.ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ResourceSlice: %v", err)
		}
	}
}

// createDeviceClass creates DeviceClass name selecting driver's devices.
func createDeviceClass(t *testing.T, e *env, name, driver string) {
	t.Helper()
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driver)}}},
	}}
	if _, err := e.cp.Clientset.ResourceV1().DeviceClasses().Create(harness.Context(t), class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass %s: %v", name, err)
	}
}

// claimPod is pod name asking gpus GPUs and its own ResourceClaim for one
// channel, created with it.
func claimPod(t *testing.T, e *env, name string, gpus int, annotations map[string]string) *corev1.Pod {
	t.Helper()
	ctx := harness.Context(t)
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name + "-channel", Namespace: nsTeam}, Spec: resourcev1.ResourceClaimSpec{
		Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "channel", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: channelClass}}}},
	}}
	if _, err := e.cp.Clientset.ResourceV1().ResourceClaims(nsTeam).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaim: %v", err)
	}
	p := harness.GPUPod(nsTeam, name, gpus)
	p.Annotations = annotations
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "channel", ResourceClaimName: &claim.Name}}
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "channel"}}
	if err := e.cp.Client.Create(ctx, p); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	return p
}

// TestClaimsBesideGPUs: pods that ask 4 GPUs and a ResourceClaim for a
// ComputeDomain-like channel (ResourceSlices published as a DRA driver
// would) are placed by gputopo and their claims allocated by
// kube-scheduler's DynamicResources on the same node; each pod's GPUs are
// exactly 4 of its node's. A group of 2 such pods is placed whole, inside
// one NVLink clique. Both modes.
func TestClaimsBesideGPUs(t *testing.T) { eachMode(t, testClaimsBesideGPUs) }

func testClaimsBesideGPUs(t *testing.T, e *env) {
	ctx := harness.Context(t)
	publishChannels(t, e)
	model := map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel)}
	var pods []*corev1.Pod
	for i := range 2 {
		pods = append(pods, claimPod(t, e, fmt.Sprintf("solo-%d", i), 4, model))
	}
	for i := range 2 {
		ann := map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel),
			v1alpha1.AnnotationGroup: "pair", v1alpha1.AnnotationGroupSize: "2", v1alpha1.AnnotationGroupRequiredTopology: "nvlink"}
		pods = append(pods, claimPod(t, e, fmt.Sprintf("pair-%d", i), 4, ann))
	}
	harness.Poll(t, 2*time.Minute, "the claim pods bound", func() (bool, string) {
		bound := 0
		var why []string
		for _, p := range pods {
			got, err := e.cp.Clientset.CoreV1().Pods(nsTeam).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if got.Spec.NodeName != "" {
				bound++
			} else {
				for _, c := range got.Status.Conditions {
					if c.Type == corev1.PodScheduled {
						why = append(why, c.Message)
					}
				}
			}
		}
		return bound == len(pods), fmt.Sprintf("%d of %d bound; %q", bound, len(pods), why)
	})
	f, err := machine.FixtureByName("gb200-nvl72-tray")
	if err != nil {
		t.Fatal(err)
	}
	cliques := map[string]bool{}
	for _, p := range pods {
		got, err := e.cp.Clientset.CoreV1().Pods(nsTeam).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node := got.Spec.NodeName
		uuids := harness.PodGPUs(t, got, v1alpha1.AnnotationAssignedGPUs)
		g := f.Graph(node)
		if len(uuids) != 4 {
			t.Errorf("pod %s on %s: assigned %v, want 4 GPUs", p.Name, node, uuids)
		}
		for _, u := range uuids {
			if _, ok := g.IndexOf(u); !ok {
				t.Errorf("pod %s on %s got GPU %s of another node", p.Name, node, u)
			}
		}
		claim, err := e.cp.Clientset.ResourceV1().ResourceClaims(nsTeam).Get(ctx, p.Name+"-channel", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a := claim.Status.Allocation
		if a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Pool != node || a.Devices.Results[0].Driver != channelDriver {
			t.Errorf("pod %s on %s: claim allocation %+v, want the channel of its node's pool", p.Name, node, a)
		}
		if strings.HasPrefix(p.Name, "pair-") {
			cliques[node[:len("rack-0")]] = true
		}
	}
	if len(cliques) != 1 {
		t.Errorf("group pair spans racks %v; want one NVLink clique", cliques)
	}
}

// TestClaimOnlySomeNodesCanAllocate: the channel driver publishes devices
// on rack 1 only. A group of 2 claim pods required in one NVLink clique is
// planned where its claims can be allocated (rack 1), not on a rack where
// DynamicResources would then refuse its slots. Both modes: the extender
// plans on the nodes kube-scheduler's filters (DynamicResources among
// them) passed; the plugin plans on the nodes upstream's allocator says
// can take the claims (schedplugin/claims.go).
func TestClaimOnlySomeNodesCanAllocate(t *testing.T) { eachMode(t, testClaimOnlySomeNodesCanAllocate) }

func testClaimOnlySomeNodesCanAllocate(t *testing.T, e *env) {
	ctx := harness.Context(t)
	all := e.nodes
	e.nodes = all[18:]
	publishChannels(t, e)
	e.nodes = all
	var pods []*corev1.Pod
	for i := range 2 {
		ann := map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel),
			v1alpha1.AnnotationGroup: "pair", v1alpha1.AnnotationGroupSize: "2", v1alpha1.AnnotationGroupRequiredTopology: "nvlink"}
		pods = append(pods, claimPod(t, e, fmt.Sprintf("pair-%d", i), 4, ann))
	}
	harness.Poll(t, time.Minute, "the group bound on rack 1", func() (bool, string) {
		var nodes, why []string
		for _, p := range pods {
			got, err := e.cp.Clientset.CoreV1().Pods(nsTeam).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			nodes = append(nodes, got.Spec.NodeName)
			for _, c := range got.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					why = append(why, c.Message)
				}
			}
		}
		ok := true
		for _, n := range nodes {
			ok = ok && strings.HasPrefix(n, "rack-1-")
		}
		return ok, fmt.Sprintf("on %v; %q", nodes, why)
	})
}

// TestGroupWhoseClaimsFitNoNode: a group of 2 pods whose claims ask a
// device class no driver publishes waits, holding nothing, with a reason
// that names the claims: kube-scheduler's DynamicResources words in
// extender mode (the extender sees only the nodes its filters passed),
// the plugin's in plugin mode (it plans the group on the nodes where the
// claims can be allocated: none).
func TestGroupWhoseClaimsFitNoNode(t *testing.T) { eachMode(t, testGroupWhoseClaimsFitNoNode) }

func testGroupWhoseClaimsFitNoNode(t *testing.T, e *env) {
	ctx := harness.Context(t)
	publishChannels(t, e)
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nowhere"}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "no-such-driver.example.com"`}}},
	}}
	if _, err := e.cp.Clientset.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var pods []*corev1.Pod
	for i := range 2 {
		name := fmt.Sprintf("lost-%d", i)
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name + "-dev", Namespace: nsTeam}, Spec: resourcev1.ResourceClaimSpec{
			Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "dev", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "nowhere"}}}},
		}}
		if _, err := e.cp.Clientset.ResourceV1().ResourceClaims(nsTeam).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := harness.GPUPod(nsTeam, name, 4)
		p.Annotations = map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel),
			v1alpha1.AnnotationGroup: "lost", v1alpha1.AnnotationGroupSize: "2"}
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "dev", ResourceClaimName: &claim.Name}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "dev"}}
		if err := e.cp.Client.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	want := "cannot allocate all claims"
	if e.ext == nil {
		want = "36 nodes were left out because the pod's ResourceClaims cannot be allocated there"
	}
	harness.Poll(t, time.Minute, "the group's pods to say their claims fit no node", func() (bool, string) {
		var msgs []string
		ok := true
		for _, p := range pods {
			got, err := e.cp.Clientset.CoreV1().Pods(nsTeam).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			m := ""
			for _, c := range got.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					m = c.Message
				}
			}
			msgs = append(msgs, m)
			ok = ok && got.Spec.NodeName == "" && strings.Contains(m, want)
		}
		return ok, fmt.Sprintf("%q", msgs)
	})
	if h := e.held(t); h != 0 {
		t.Errorf("%d GPUs held for a group that cannot be placed", h)
	}
}
