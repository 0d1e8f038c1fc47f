//go:build integration

package ecosystem

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/kubectlplugin"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

// GPUs published as NVIDIA's DRA driver publishes them (docs/dra.md): one
// ResourceSlice per node, pool named after the node, a device gpu-<i> per
// GPU with its uuid, index, productName, pciBusID and the standard
// resource.kubernetes.io/pcieRoot; the DeviceClass gpu.nvidia.com selects
// the driver's devices.
const (
	gpuDriver = configv1alpha1.DefaultDRADriver
	nsDRA     = "dra"
)

// publishGPUs creates the tests' namespace (not opted in to the webhook),
// the DeviceClass and each node's ResourceSlice of machine f's GPUs.
func publishGPUs(t *testing.T, e *env, f machine.Fixture, nodes ...string) {
	t.Helper()
	ctx := harness.Context(t)
	if err := e.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsDRA}}); err != nil {
		t.Fatal(err)
	}
	if err := e.cp.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nsDRA, Name: "default"}}); err != nil {
		t.Fatal(err)
	}
	cs := e.cp.Clientset.ResourceV1()
	createDeviceClass(t, e, gpuDriver, gpuDriver)
	str := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: &s} }
	for _, n := range nodes {
		var devices []resourcev1.Device
		for i, g := range f.Graph(n).GPUs() {
			devices = append(devices, resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"uuid":                            str(g.UUID),
				"index":                           {IntValue: ptr.To(int64(i))},
				"productName":                     str(g.Model),
				"pciBusID":                        str(g.PCIBusID),
				"resource.kubernetes.io/pcieRoot": str(fmt.Sprintf("pci0000:%02x", i/2)),
			}})
		}
		slice := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: n + "-gpus"}, Spec: resourcev1.ResourceSliceSpec{
			Driver: gpuDriver, NodeName: &n, Pool: resourcev1.ResourcePool{Name: n, ResourceSliceCount: 1}, Devices: devices,
		}}
		if _, err := cs.ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ResourceSlice: %v", err)
		}
	}
}

// gpuClaimPod creates a ResourceClaim for gpus GPUs of class gpu.nvidia.com
// and pod name using it, on node (nodeSelector; "": any), for scheduler,
// changed by each of edit before it is created.
func gpuClaimPod(t *testing.T, e *env, name, scheduler, node string, gpus int, annotations map[string]string, edit ...func(*corev1.Pod)) {
	t.Helper()
	ctx := harness.Context(t)
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpus", Namespace: nsDRA}, Spec: resourcev1.ResourceClaimSpec{
		Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: gpuDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: int64(gpus)}}}},
	}}
	if _, err := e.cp.Clientset.ResourceV1().ResourceClaims(nsDRA).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ResourceClaim: %v", err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsDRA, Name: name, Annotations: annotations}, Spec: corev1.PodSpec{
		SchedulerName: scheduler,
		Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
		ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: &claim.Name}},
	}}
	if node != "" {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	for _, fn := range edit {
		fn(p)
	}
	if err := e.cp.Client.Create(ctx, p); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
}

// allocatedIndices waits for pod name to be bound and returns the GPU
// indices its claim was allocated (the devices' names, gpu-<i>).
func allocatedIndices(t *testing.T, e *env, name string) []int {
	t.Helper()
	ctx := harness.Context(t)
	var out []int
	harness.Poll(t, time.Minute, "pod "+name+" bound with its claim allocated", func() (bool, string) {
		p, err := e.cp.Clientset.CoreV1().Pods(nsDRA).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		c, err := e.cp.Clientset.ResourceV1().ResourceClaims(nsDRA).Get(ctx, name+"-gpus", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName == "" || c.Status.Allocation == nil {
			return false, fmt.Sprintf("node %q, allocation %v, conditions %v", p.Spec.NodeName, c.Status.Allocation, p.Status.Conditions)
		}
		out = out[:0]
		for _, r := range c.Status.Allocation.Devices.Results {
			i, err := strconv.Atoi(r.Device[len("gpu-"):])
			if err != nil || r.Driver != gpuDriver || r.Pool != p.Spec.NodeName {
				return false, fmt.Sprintf("unexpected result %+v", r)
			}
			out = append(out, i)
		}
		slices.Sort(out)
		return true, ""
	})
	return out
}

// TestDRAClaimGetsAnNVLinkQuad: DGX-1 V100 nodes whose GPUs a DRA driver
// publishes (no nvidia.com/gpu), each with GPUs 0 and 1 allocated to a
// claim that plain kube-scheduler placed. A 4-GPU claim pod placed by
// plain kube-scheduler gets the first four free devices, 2-5, across both
// NVLink quads; the same pod placed by gputopo-scheduler gets 4-7, a
// quad whose GPUs all talk over NVLink, allocated by upstream's
// DynamicResources over gputopo's view. Plugin mode: in extender mode the
// devices are upstream's choice (docs/dra.md).
func TestDRAClaimGetsAnNVLinkQuad(t *testing.T) {
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	nodes := []string{"dgx1-a", "dgx1-b"}
	e := newEnv(t, localcluster.ModePlugin, envOptions{
		nodes: func(t *testing.T, e *env) {
			for _, n := range nodes {
				e.addDRANode(t, n, f)
			}
		},
		start: func(*env, *testing.T) {},
	})
	ctx := harness.Context(t)
	publishGPUs(t, e, f, nodes...)
	e.cp.StartScheduler(t, nil) // plain kube-scheduler: default-scheduler
	for _, n := range nodes {
		gpuClaimPod(t, e, "filler-"+n, corev1.DefaultSchedulerName, n, 2, nil)
		if got := allocatedIndices(t, e, "filler-"+n); !slices.Equal(got, []int{0, 1}) {
			t.Fatalf("filler on %s got GPUs %v, want 0 and 1 (first fit)", n, got)
		}
	}
	harness.WaitCore(t, e.sched, func(g map[string]float64) bool { return g["held"] == 4 })

	model := map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}
	gpuClaimPod(t, e, "plain", corev1.DefaultSchedulerName, nodes[0], 4, model)
	plain := allocatedIndices(t, e, "plain")
	gpuClaimPod(t, e, "gputopo", v1alpha1.DefaultSchedulerName, nodes[1], 4, model)
	mine := allocatedIndices(t, e, "gputopo")

	quad := func(set []int) bool {
		return slices.Equal(set, []int{0, 1, 2, 3}) || slices.Equal(set, []int{4, 5, 6, 7})
	}
	if !slices.Equal(plain, []int{2, 3, 4, 5}) {
		t.Errorf("plain kube-scheduler's claim got GPUs %v, want 2-5 (first fit)", plain)
	}
	if !quad(mine) {
		t.Errorf("gputopo's claim got GPUs %v, want an NVLink quad (4-7)", mine)
	}
	g := f.Graph(nodes[1])
	for _, set := range [][]int{mine} {
		for i := range set {
			for j := range set[:i] {
				if g.Link(set[j], set[i]).NVLinks == 0 {
					t.Errorf("GPUs %d and %d of gputopo's set %v are not NVLink-connected", set[j], set[i], set)
				}
			}
		}
	}
	// The ledger holds what the claims allocated: the fillers' 4 GPUs and
	// the two 4-GPU claims.
	harness.WaitCore(t, e.sched, func(g map[string]float64) bool { return g["held"] == 12 })
	p, err := e.cp.Clientset.CoreV1().Pods(nsDRA).Get(ctx, "gputopo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	assigned := harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs)
	for _, i := range mine {
		if !slices.Contains(assigned, g.GPUs()[i].UUID) {
			t.Errorf("pod's assigned-gpus %v lacks GPU %d (%s) of its claim", assigned, i, g.GPUs()[i].UUID)
		}
	}
}

// TestDRAGroupOfClaimPodsInOneLeaf: a group of 2 pods, each asking 8
// GPUs through its own ResourceClaim, required inside one leaf, on three
// DGX-1 V100 nodes a DRA driver serves, one alone under its leaf: both
// pods are bound under the leaf of two nodes, each claim allocated the 8
// GPUs of its pod's node, and the ledger holds the 16. Plugin mode.
func TestDRAGroupOfClaimPodsInOneLeaf(t *testing.T) {
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	leafOf := map[string]string{"solo": "leaf-1", "x": "leaf-2", "y": "leaf-2"}
	var nodes []string
	e := newEnv(t, localcluster.ModePlugin, envOptions{
		nodes: func(t *testing.T, e *env) {
			for _, n := range []string{"solo", "x", "y"} {
				e.addDRANode(t, n, f)
				nodes = append(nodes, n)
			}
		},
		start: func(*env, *testing.T) {},
	})
	ctx := harness.Context(t)
	for _, n := range nodes {
		node, err := e.cp.Clientset.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		node.Labels[leafLabel] = leafOf[n]
		node.Labels[spineLabel] = "s"
		if _, err := e.cp.Clientset.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	publishGPUs(t, e, f, nodes...)
	group := map[string]string{v1alpha1.AnnotationGroup: "pair", v1alpha1.AnnotationGroupSize: "2", v1alpha1.AnnotationGroupRequiredTopology: "leaf"}
	for i := range 2 {
		gpuClaimPod(t, e, fmt.Sprintf("pair-%d", i), v1alpha1.DefaultSchedulerName, "", 8, group)
	}
	seen := map[string]bool{}
	for i := range 2 {
		name := fmt.Sprintf("pair-%d", i)
		got := allocatedIndices(t, e, name)
		p, err := e.cp.Clientset.CoreV1().Pods(nsDRA).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if leafOf[p.Spec.NodeName] != "leaf-2" || seen[p.Spec.NodeName] || len(got) != 8 {
			t.Errorf("pod %s on %s (%s) with GPUs %v; want each pod on its own node of leaf-2 with all 8", name, p.Spec.NodeName, leafOf[p.Spec.NodeName], got)
		}
		seen[p.Spec.NodeName] = true
	}
	harness.WaitCore(t, e.sched, func(g map[string]float64) bool { return g["held"] == 16 })
}

// TestDRAClaimPodPreemptsForAnNVLinkQuad: a DGX-1 V100 node a DRA driver
// serves, its GPUs held by four low-priority 2-GPU claim pods, one per
// NVLink pair. A high-priority 4-GPU claim pod that requires NVLink
// between all its GPUs preempts exactly the two pods of one quad, and
// its claim is allocated that quad once theirs are deallocated; the
// other two pods keep their GPUs. Plugin mode: upstream's
// DynamicResources alone never preempts for a claim (docs/dra.md).
func TestDRAClaimPodPreemptsForAnNVLinkQuad(t *testing.T) {
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, localcluster.ModePlugin, envOptions{
		nodes: func(t *testing.T, e *env) { e.addDRANode(t, "dgx1", f) },
		start: func(*env, *testing.T) {},
		// Deallocates the claims of the pods preemption deletes.
		controllers: []string{"resourceclaim-controller"},
	})
	ctx := harness.Context(t)
	publishGPUs(t, e, f, "dgx1")
	for name, value := range map[string]int32{"low": 10, "high": 1000} {
		if _, err := e.cp.Clientset.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	priority := func(class string) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.PriorityClassName = class
			p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0) // no kubelet: victims go at once
		}
	}
	held := map[string][]int{}
	for i := range 4 {
		name := fmt.Sprintf("low-%d", i)
		gpuClaimPod(t, e, name, v1alpha1.DefaultSchedulerName, "", 2, nil, priority("low"))
		held[name] = allocatedIndices(t, e, name)
	}
	harness.WaitCore(t, e.sched, func(g map[string]float64) bool { return g["held"] == 8 })

	model := map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}
	gpuClaimPod(t, e, "high", v1alpha1.DefaultSchedulerName, "", 4, model, priority("high"))
	got := allocatedIndices(t, e, "high")
	if !slices.Equal(got, []int{0, 1, 2, 3}) && !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Fatalf("high-priority claim got GPUs %v; want an NVLink quad", got)
	}
	for name, gpus := range held {
		_, err := e.cp.Clientset.CoreV1().Pods(nsDRA).Get(ctx, name, metav1.GetOptions{})
		evicted := apierrors.IsNotFound(err)
		if err != nil && !evicted {
			t.Fatal(err)
		}
		inQuad := slices.ContainsFunc(gpus, func(i int) bool { return slices.Contains(got, i) })
		if evicted != inQuad {
			t.Errorf("pod %s on GPUs %v evicted=%v; want evicted exactly when its GPUs are in the preemptor's quad %v", name, gpus, evicted, got)
		}
	}
	harness.WaitCore(t, e.sched, func(g map[string]float64) bool { return g["held"] == 8 && g["reserved"] == 0 })

	// kubectl gputopo shows the claim pods' GPUs with their claims.
	snap, err := kubectlplugin.Load(ctx, e.cp.Config, kubectlplugin.ConfigFrom{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.ClaimsUnread != "" {
		t.Fatal(snap.ClaimsUnread)
	}
	shown := 0
	for _, r := range snap.PodRows() {
		if r.Name == "high" {
			shown++
			if !slices.Equal(r.GPUs, got) || !slices.Equal(r.Claims, []string{nsDRA + "/high-gpus"}) {
				t.Errorf("kubectl gputopo pods shows the preemptor with GPUs %v and claims %v; want %v and its claim", r.GPUs, r.Claims, got)
			}
		}
	}
	if sum := snap.NodeSummaries(); shown != 1 || len(sum) != 1 || sum[0].Free != 0 {
		t.Errorf("kubectl gputopo: preemptor shown %d times, nodes %+v; want it once and no GPU free", shown, sum)
	}
}

// TestDRAExtenderChoosesTheNodeByTopology: extender mode, kube-scheduler
// calling the extender for every pod of the profile (the chart's
// scheduler.extenderForClaimPods). Two DGX-1 V100 nodes a DRA driver
// serves, each with four GPUs free: a's are 2-5, across both NVLink
// quads; b's are 4-7, a quad. A 4-GPU claim pod that requires NVLink
// goes to b, where upstream's first fit takes the quad; a claim pod
// pinned to a stays Pending with gputopo's reason; the extender's ledger
// holds what every claim allocated.
func TestDRAExtenderChoosesTheNodeByTopology(t *testing.T) {
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, localcluster.ModeExtender, envOptions{
		nodes: func(t *testing.T, e *env) {
			e.addDRANode(t, "a", f)
			e.addDRANode(t, "b", f)
		},
		start:       func(*env, *testing.T) {},
		controllers: []string{"resourceclaim-controller"},
		configure: func(c *schedconfigv1.KubeSchedulerConfiguration) {
			c.Extenders[0].ManagedResources = nil // as scheduler.extenderForClaimPods renders it
		},
	})
	ctx := harness.Context(t)
	publishGPUs(t, e, f, "a", "b")
	e.cp.StartScheduler(t, nil) // plain kube-scheduler places the fillers, first fit
	for _, fill := range []struct {
		name, node string
		gpus       int
		want       []int
	}{
		{"fill-a0", "a", 2, []int{0, 1}}, {"fill-a1", "a", 4, []int{2, 3, 4, 5}}, {"fill-a2", "a", 2, []int{6, 7}},
		{"fill-b", "b", 4, []int{0, 1, 2, 3}},
	} {
		gpuClaimPod(t, e, fill.name, corev1.DefaultSchedulerName, fill.node, fill.gpus, nil, func(p *corev1.Pod) { p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0) })
		if got := allocatedIndices(t, e, fill.name); !slices.Equal(got, fill.want) {
			t.Fatalf("filler %s got GPUs %v, want %v (first fit)", fill.name, got, fill.want)
		}
	}
	if err := e.cp.Clientset.CoreV1().Pods(nsDRA).Delete(ctx, "fill-a1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	harness.Poll(t, time.Minute, "the extender's ledger to free a's GPUs 2-5", func() (bool, string) {
		h := e.held(t)
		return h == 8, fmt.Sprintf("held %d", h)
	})

	model := map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}
	gpuClaimPod(t, e, "model", v1alpha1.DefaultSchedulerName, "", 4, model)
	got := allocatedIndices(t, e, "model")
	p, err := e.cp.Clientset.CoreV1().Pods(nsDRA).Get(ctx, "model", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "b" || !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Errorf("model claim pod on %s with GPUs %v; want b's NVLink quad 4-7", p.Spec.NodeName, got)
	}
	gpuClaimPod(t, e, "pinned", v1alpha1.DefaultSchedulerName, "a", 4, model)
	podReason(t, e, "pinned", "NVLink")
	harness.Poll(t, time.Minute, "the extender's ledger to hold the model pod's claim", func() (bool, string) {
		h := e.held(t)
		return h == 12, fmt.Sprintf("held %d", h)
	})
}

// TestDRAWebhookRoutesClaimPods: in a namespace opted in to gputopo's
// webhook, a pod that states the model intent and asks for 4 GPUs
// through a ResourceClaimTemplate, with no schedulerName, gets the
// requirement the policy table gives 4 model-parallel GPUs and
// gputopo's scheduler, and its generated claim is allocated an NVLink
// quad on a DGX-1 V100 node whose GPUs 0 and 1 are taken. Plugin mode.
func TestDRAWebhookRoutesClaimPods(t *testing.T) {
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, localcluster.ModePlugin, envOptions{
		nodes:       func(t *testing.T, e *env) { e.addDRANode(t, "dgx1", f) },
		start:       func(*env, *testing.T) {},
		controllers: []string{"resourceclaim-controller"}, // claims from templates
	})
	ctx := harness.Context(t)
	publishGPUs(t, e, f, "dgx1")
	e.cp.StartScheduler(t, nil)
	gpuClaimPod(t, e, "filler", corev1.DefaultSchedulerName, "dgx1", 2, nil)
	if got := allocatedIndices(t, e, "filler"); !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("filler got GPUs %v, want 0 and 1 (first fit)", got)
	}
	tmpl := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "four-gpus", Namespace: nsTeam}, Spec: resourcev1.ResourceClaimTemplateSpec{
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: gpuDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 4}}}}}}}
	if _, err := e.cp.Clientset.ResourceV1().ResourceClaimTemplates(nsTeam).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsTeam, Name: "model", Annotations: map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel)}},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: &tmpl.Name}}}}
	if err := e.cp.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	want := configv1alpha1.DefaultWebhookConfiguration().PolicyTable.For(v1alpha1.ParallelismModel).Requirement(4).String()
	if p.Spec.SchedulerName != v1alpha1.DefaultSchedulerName || p.Annotations[v1alpha1.AnnotationRequirement] != want {
		t.Fatalf("admitted claim pod: schedulerName %q, requirement %q; want %s and %s", p.Spec.SchedulerName, p.Annotations[v1alpha1.AnnotationRequirement], v1alpha1.DefaultSchedulerName, want)
	}
	var got []int
	harness.Poll(t, time.Minute, "the pod's generated claim allocated", func() (bool, string) {
		bound, err := e.cp.Clientset.CoreV1().Pods(nsTeam).Get(ctx, "model", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if len(bound.Status.ResourceClaimStatuses) == 0 || bound.Status.ResourceClaimStatuses[0].ResourceClaimName == nil || bound.Spec.NodeName == "" {
			return false, fmt.Sprintf("node %q, claim statuses %v", bound.Spec.NodeName, bound.Status.ResourceClaimStatuses)
		}
		c, err := e.cp.Clientset.ResourceV1().ResourceClaims(nsTeam).Get(ctx, *bound.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil || c.Status.Allocation == nil {
			return false, fmt.Sprintf("claim %v, err %v", c.Status.Allocation, err)
		}
		got = got[:0]
		for _, r := range c.Status.Allocation.Devices.Results {
			i, _ := strconv.Atoi(strings.TrimPrefix(r.Device, "gpu-"))
			got = append(got, i)
		}
		slices.Sort(got)
		return true, ""
	})
	if !slices.Equal(got, []int{4, 5, 6, 7}) {
		t.Errorf("the routed claim pod got GPUs %v; want the free NVLink quad 4-7", got)
	}
}

// podReason waits for pod name to be refused and returns its
// PodScheduled message.
func podReason(t *testing.T, e *env, name, want string) string {
	t.Helper()
	ctx := harness.Context(t)
	var msg string
	harness.Poll(t, time.Minute, "pod "+name+" refused with "+want, func() (bool, string) {
		p, err := e.cp.Clientset.CoreV1().Pods(nsDRA).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s bound to %s; want it refused", name, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				msg = c.Message
			}
		}
		return strings.Contains(msg, want), msg
	})
	return msg
}

// TestDRANodesBesideDevicePluginNodes: one cluster with a node whose GPUs
// the device plugin serves, a node whose GPUs a DRA driver serves, and a
// DRA node whose ResourceSlice lists a GPU its NodeGPUTopology does not.
// A device-plugin pod and a claim pod each go to the node served their
// way, never sharing a GPU; a claim pod pinned to the node with the
// foreign UUID stays Pending; a claim whose selector allows no set that
// meets the pod's requirement stays Pending saying so; one whose selector
// allows GPUs 6 and 7 gets them. Plugin mode.
func TestDRANodesBesideDevicePluginNodes(t *testing.T) {
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, localcluster.ModePlugin, envOptions{
		nodes: func(t *testing.T, e *env) {
			e.addNode(t, "plugin", f, map[string]string{})
			e.addDRANode(t, "dra", f)
			e.addDRANode(t, "liar", f)
			e.addDRANode(t, "sel", f)
			e.addDRANode(t, "hi", f)
		},
		start: func(*env, *testing.T) {},
	})
	ctx := harness.Context(t)
	publishGPUs(t, e, f, "dra", "liar", "sel", "hi")
	// The liar's slice lists a GPU of another machine.
	s, err := e.cp.Clientset.ResourceV1().ResourceSlices().Get(ctx, "liar-gpus", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	foreign := "GPU-00000000-dead-beef-0000-000000000000"
	s.Spec.Devices[7].Attributes["uuid"] = resourcev1.DeviceAttribute{StringValue: &foreign}
	if _, err := e.cp.Clientset.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	dp := harness.GPUPod(nsDRA, "device-plugin", 8)
	dp.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	if err := e.cp.Client.Create(ctx, dp); err != nil {
		t.Fatal(err)
	}
	gpuClaimPod(t, e, "claim", v1alpha1.DefaultSchedulerName, "dra", 8, nil)
	got := allocatedIndices(t, e, "claim")
	claimPod, err := e.cp.Clientset.CoreV1().Pods(nsDRA).Get(ctx, "claim", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claimPod.Spec.NodeName != "dra" || len(got) != 8 {
		t.Errorf("claim pod on %s with GPUs %v; want the DRA node's 8", claimPod.Spec.NodeName, got)
	}
	p, err := e.cp.WaitForPod(ctx, nsDRA, "device-plugin", time.Minute, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "plugin" {
		t.Errorf("device-plugin pod on %s; want the device plugin's node", p.Spec.NodeName)
	}
	mine := harness.PodGPUs(t, claimPod, v1alpha1.AnnotationAssignedGPUs)
	for _, u := range harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs) {
		if slices.Contains(mine, u) {
			t.Errorf("GPU %s issued to both pods", u)
		}
	}

	harness.WaitCore(t, e.sched, func(g map[string]float64) bool { return g["nodes_untrusted"] == 1 })
	gpuClaimPod(t, e, "on-liar", v1alpha1.DefaultSchedulerName, "liar", 1, nil)
	podReason(t, e, "on-liar", "[GPUTopology]")

	// A claim whose selector allows GPUs 0, 1, 4 and 5 only, for a 4-GPU
	// pod that requires NVLink between all its GPUs: no set of them
	// does, and the pod stays Pending saying so, holding nothing.
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "picky-gpus", Namespace: nsDRA}, Spec: resourcev1.ResourceClaimSpec{
		Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: gpuDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 4,
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.nvidia.com"].index in [0, 1, 4, 5]`}}}}}}},
	}}
	if _, err := e.cp.Clientset.ResourceV1().ResourceClaims(nsDRA).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	picky := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsDRA, Name: "picky", Annotations: map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}},
		Spec: corev1.PodSpec{SchedulerName: v1alpha1.DefaultSchedulerName, NodeSelector: map[string]string{corev1.LabelHostname: "sel"},
			Containers:     []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: &claim.Name}}}}
	if err := e.cp.Client.Create(ctx, picky); err != nil {
		t.Fatal(err)
	}
	podReason(t, e, "picky", "pod's ResourceClaims' selectors allow GPUs [0 1 4 5] of this node; no free set of them meets the request")

	// A claim whose selector allows GPUs 6 and 7 only gets them: gputopo
	// chooses the best set the selector allows.
	twoHigh := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "high-gpus", Namespace: nsDRA}, Spec: resourcev1.ResourceClaimSpec{
		Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: gpuDriver, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2,
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.nvidia.com"].index >= 6`}}}}}}},
	}}
	if _, err := e.cp.Clientset.ResourceV1().ResourceClaims(nsDRA).Create(ctx, twoHigh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	high := picky.DeepCopy()
	high.ResourceVersion, high.UID = "", ""
	high.Name, high.Spec.NodeSelector = "high", map[string]string{corev1.LabelHostname: "hi"}
	high.Spec.ResourceClaims[0].ResourceClaimName = &twoHigh.Name
	if err := e.cp.Client.Create(ctx, high); err != nil {
		t.Fatal(err)
	}
	if got := allocatedIndices(t, e, "high"); !slices.Equal(got, []int{6, 7}) {
		t.Errorf("claim allowing GPUs 6 and 7 got %v", got)
	}
	harness.WaitCore(t, e.sched, func(g map[string]float64) bool { return g["held"] == 18 && g["reserved"] == 0 }) // the three bound pods'
}
