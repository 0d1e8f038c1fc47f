package schedplugin

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	clusterrt "github.com/gputopo/gputopo/placement/cluster"
)

// claimsOnly is a SharedDRAManager that knows claims only.
type claimsOnly struct {
	fwk.SharedDRAManager
	claims map[string]*resourceapi.ResourceClaim
}

func (m claimsOnly) ResourceClaims() fwk.ResourceClaimTracker {
	return claimTracker{claims: m.claims}
}

// claimTracker answers Get; the rest of the interface is not used.
type claimTracker struct {
	fwk.ResourceClaimTracker
	claims map[string]*resourceapi.ResourceClaim
}

func (c claimTracker) Get(namespace, name string) (*resourceapi.ResourceClaim, error) {
	if rc, ok := c.claims[namespace+"/"+name]; ok {
		return rc, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, name)
}

func gpuClaim(name string, requests ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}}}
}

func exact(name, class string, count int64, mode resourceapi.DeviceAllocationMode) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: count, AllocationMode: mode}}
}

func claimingPod(claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: c, ResourceClaimName: ptr.To(c)})
	}
	return p
}

// A pod's GPUs through claims are the exact counts of its requests of a
// served class, in claims not allocated yet; other classes, admin access
// and allocated claims count nothing, and make the claims ask for more
// than GPUs (as a claim not created yet does); all-devices and firstAvailable
// requests of a served class are refused with the claim and the fix.
func TestClaimGPUs(t *testing.T) {
	cfg := configv1alpha1.DefaultExtenderConfiguration().DRA
	allocated := gpuClaim("done", exact("gpus", cfg.DeviceClasses[0], 4, resourceapi.DeviceAllocationModeExactCount))
	allocated.Status.Allocation = &resourceapi.AllocationResult{}
	admin := exact("debug", cfg.DeviceClasses[0], 8, resourceapi.DeviceAllocationModeExactCount)
	admin.Exactly.AdminAccess = ptr.To(true)
	tied := gpuClaim("tied", exact("c", cfg.DeviceClasses[0], 2, ""))
	tied.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To[resourceapi.FullyQualifiedName]("resource.kubernetes.io/pcieRoot")}}
	m := claimsOnly{claims: map[string]*resourceapi.ResourceClaim{
		"ns/two":   gpuClaim("two", exact("a", cfg.DeviceClasses[0], 2, resourceapi.DeviceAllocationModeExactCount), exact("nic", "nic.example.com", 1, "")),
		"ns/one":   gpuClaim("one", exact("b", cfg.DeviceClasses[0], 0, "")),
		"ns/done":  allocated,
		"ns/tied":  tied,
		"ns/admin": gpuClaim("admin", admin),
		"ns/all":   gpuClaim("all", exact("every", cfg.DeviceClasses[0], 0, resourceapi.DeviceAllocationModeAll)),
		"ns/first": gpuClaim("first", resourceapi.DeviceRequest{Name: "pick", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "big", DeviceClassName: cfg.DeviceClasses[0], Count: 8}}}),
	}}
	for _, tc := range []struct {
		claims []string
		want   int
		only   bool
		err    string
	}{
		{[]string{"two", "one"}, 3, false, ""},
		{[]string{"one"}, 1, true, ""},
		{[]string{"one", "admin"}, 1, false, ""},
		{[]string{"one", "done"}, 1, false, ""},
		{[]string{"tied"}, 2, false, ""},
		{[]string{"one", "missing"}, 1, false, ""},
		{[]string{"done", "admin"}, 0, false, ""},
		{[]string{"missing"}, 0, false, ""},
		{[]string{"two", "all"}, 0, false, `ResourceClaim ns/all request "every" asks all devices of class gpu.nvidia.com: gputopo chooses GPUs for an exact count; set allocationMode: ExactCount and count`},
		{[]string{"first"}, 0, false, `ResourceClaim ns/first request "pick" lists class gpu.nvidia.com among firstAvailable`},
	} {
		got, only, err := claimGPUs(claimingPod(tc.claims...), m, cfg)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("claims %v: err %v, want %q", tc.claims, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want || only != tc.only {
			t.Errorf("claims %v: %d GPUs, only GPUs %v, err %v; want %d, %v", tc.claims, got, only, err, tc.want, tc.only)
		}
	}
}

// The view lists, for the node gputopo chose GPUs on, only those devices
// of the driver (by UUID); nodes where the pod does not fit offer none of
// them; other drivers' slices and devices without a node are listed as
// they are, and the listed objects are copies.
func TestDeviceViewRestrictsTheDriversDevices(t *testing.T) {
	node := func(n string) *string { return &n }
	dev := func(i int, uuid string) resourceapi.Device {
		d := resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i)}
		if uuid != "" {
			d.Attributes = map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"uuid": {StringValue: ptr.To(uuid)}}
		}
		return d
	}
	a := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "a-gpus"}, Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: node("a"),
		Devices: []resourceapi.Device{dev(0, "GPU-a0"), dev(1, "GPU-a1"), dev(2, "GPU-a2"), dev(3, "")}}}
	b := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "b-gpus"}, Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.nvidia.com", NodeName: node("b"),
		Devices: []resourceapi.Device{dev(0, "GPU-b0")}}}
	nic := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "a-nics"}, Spec: resourceapi.ResourceSliceSpec{Driver: "nic.example.com", NodeName: node("a"),
		Devices: []resourceapi.Device{dev(0, "")}}}
	cfg := configv1alpha1.DefaultExtenderConfiguration().DRA
	asked := map[string]int{}
	cur := &viewCycle{driver: cfg.Driver, uuid: clusterrt.UUIDReader(cfg), choice: func(n string) []string {
		asked[n]++
		if n == "a" {
			return []string{"GPU-a2", "GPU-a0"}
		}
		return nil
	}}
	out := restrict([]*resourceapi.ResourceSlice{a, b, nic}, cur)
	names := func(s *resourceapi.ResourceSlice) (n []string) {
		for _, d := range s.Spec.Devices {
			n = append(n, d.Name)
		}
		return n
	}
	if got := strings.Join(names(out[0]), ","); got != "gpu-0,gpu-2" {
		t.Errorf("node a offers %s, want gputopo's gpu-0,gpu-2", got)
	}
	if got := names(out[1]); len(got) != 0 {
		t.Errorf("node b, where the pod does not fit, offers %v", got)
	}
	if out[2] != nic {
		t.Errorf("another driver's slice was changed")
	}
	if len(a.Spec.Devices) != 4 {
		t.Errorf("the lister's own slice was changed: %d devices", len(a.Spec.Devices))
	}
	if asked["a"] != 1 || asked["b"] != 1 {
		t.Errorf("choices asked %v, want once per node", asked)
	}
}

// draObjects is a SharedDRAManager over claims, classes and slices.
type draObjects struct {
	claimsOnly
	classes map[string]*resourceapi.DeviceClass
	slices  []*resourceapi.ResourceSlice
}

func (m draObjects) DeviceClasses() fwk.DeviceClassLister { return classLister(m.classes) }
func (m draObjects) ResourceSlices() fwk.ResourceSliceLister {
	return sliceLister(m.slices)
}

type classLister map[string]*resourceapi.DeviceClass

func (c classLister) List() ([]*resourceapi.DeviceClass, error) { return nil, nil }
func (c classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if dc, ok := c[name]; ok {
		return dc, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Group: "resource.k8s.io", Resource: "deviceclasses"}, name)
}

type sliceLister []*resourceapi.ResourceSlice

func (s sliceLister) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) { return s, nil }

// The GPUs a claim's selectors allow on a node are those every CEL
// selector of its served request and of its class matches, as upstream
// evaluates them; a request that narrows nothing, or a pod with two
// served requests, leaves the choice unrestricted.
func TestClaimSelectedEvaluatesTheSelectors(t *testing.T) {
	cfg := configv1alpha1.DefaultExtenderConfiguration().DRA
	var devices []resourceapi.Device
	for i := range 8 {
		devices = append(devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"uuid": {StringValue: ptr.To(fmt.Sprintf("GPU-%d", i))}, "index": {IntValue: ptr.To(int64(i))}}})
	}
	a := "a"
	sel := func(expr string) []resourceapi.DeviceSelector {
		return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
	}
	high := exact("gpus", cfg.DeviceClasses[0], 4, "")
	high.Exactly.Selectors = sel(`device.attributes["gpu.nvidia.com"].index >= 4`)
	m := draObjects{
		claimsOnly: claimsOnly{claims: map[string]*resourceapi.ResourceClaim{
			"ns/high":  gpuClaim("high", high),
			"ns/plain": gpuClaim("plain", exact("gpus", cfg.DeviceClasses[0], 4, "")),
		}},
		classes: map[string]*resourceapi.DeviceClass{cfg.DeviceClasses[0]: {Spec: resourceapi.DeviceClassSpec{Selectors: sel(`device.attributes["gpu.nvidia.com"].index != 7`)}}},
		slices:  []*resourceapi.ResourceSlice{{Spec: resourceapi.ResourceSliceSpec{Driver: cfg.Driver, NodeName: &a, Devices: devices}}},
	}
	f := claimSelected(context.Background(), claimingPod("high"), m, cfg)
	if f == nil {
		t.Fatal("selectors that narrow the devices gave no restriction")
	}
	got, ok := f("a")
	if !ok || strings.Join(got, ",") != "GPU-4,GPU-5,GPU-6" {
		t.Errorf("allowed on a: %v (%v), want GPU-4..6 (the request's index >= 4 and the class's index != 7)", got, ok)
	}
	if got, ok := f("b"); !ok || len(got) != 0 {
		t.Errorf("allowed on a node without the driver's slices: %v (%v), want none", got, ok)
	}
	m.classes = nil
	if f := claimSelected(context.Background(), claimingPod("plain"), m, cfg); f != nil {
		t.Error("a request and class without selectors restricted the choice")
	}
	if f := claimSelected(context.Background(), claimingPod("high", "plain"), m, cfg); f != nil {
		t.Error("two served requests restricted the choice; each is left to upstream")
	}
}
