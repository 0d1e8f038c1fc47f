package extender

import (
	"context"
	"strings"
	"testing"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement/cluster"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

const testAccel corev1.ResourceName = "example.com/accel"

// accelPod asks for n devices of testAccel (and none of nvidia.com/gpu).
func accelPod(name string, n string) *podBuilder {
	b := makePod(name)
	b.p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{testAccel: resource.MustParse(n)}
	return b
}

// TestConfiguredResourceName runs filter with resourceName set to another
// extended resource: the pod's demand, the Node's allocatable and the
// reasons all read the configured name.
func TestConfiguredResourceName(t *testing.T) {
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.ResourceName = string(testAccel)
	tests := []struct {
		name         string
		setup        func(x *Extender)
		pod          *corev1.Pod
		passed       []string
		unresolvable string
	}{{
		name:   "a pod asking for the configured resource is placed by topology",
		pod:    accelPod("p", "4").obj(),
		passed: []string{"a"},
	}, {
		name:         "more of the configured resource than the node has is unresolvable",
		pod:          accelPod("p", "9").obj(),
		unresolvable: "pod requests 9 GPUs; node has 8",
	}, {
		name:         "the Node's allocatable of the configured resource bounds the pod, named in the reason",
		setup:        func(x *Extender) { x.core.Feed().UpsertNode(nodeWith("a", testAccel, 2)) },
		pod:          accelPod("p", "4").obj(),
		unresolvable: "node advertises 2 example.com/accel",
	}, {
		name:         "a Node advertising only nvidia.com/gpu advertises none of the configured resource",
		setup:        func(x *Extender) { x.core.Feed().UpsertNode(gpuNode("a", 8)) },
		pod:          accelPod("p", "4").obj(),
		unresolvable: "node advertises 0 example.com/accel",
	}, {
		name:   "a pod asking only for nvidia.com/gpu asks for nothing managed and passes unchanged",
		setup:  func(x *Extender) { x.core.Feed().UpsertNode(nodeWith("a", testAccel, 0)) },
		pod:    makePod("p").gpus(4).obj(),
		passed: []string{"a"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, _ := newTestExtender(t, cfg)
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
			if tc.setup != nil {
				tc.setup(x)
			}
			res := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: tc.pod, NodeNames: &[]string{"a"}})
			if res.Error != "" {
				t.Fatalf("filter error: %s", res.Error)
			}
			if diff := cmp.Diff(tc.passed, *res.NodeNames, cmpEmptyStrings); diff != "" {
				t.Errorf("passed (-want +got):\n%s", diff)
			}
			if got := res.FailedAndUnresolvableNodes["a"]; !strings.Contains(got, tc.unresolvable) || (tc.unresolvable == "") != (got == "") {
				t.Errorf("unresolvable reason %q, want one containing %q", got, tc.unresolvable)
			}
		})
	}
}

// TestConfiguredResourceNameInLedger: bound pods count by the configured
// resource; a pod of nvidia.com/gpu only is not a GPU pod there.
func TestConfiguredResourceNameInLedger(t *testing.T) {
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.ResourceName = string(testAccel)
	x, _ := newTestExtender(t, cfg)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	x.core.Feed().UpsertPod(accelPod("unrecorded", "3").node("a").obj())
	x.core.Feed().UpsertPod(makePod("other-resource").gpus(2).node("a").obj())
	want := ledger.Counts{Total: 8, Free: 5, Held: 3}
	if diff := cmp.Diff(want, x.core.Report().Counts()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

// TestInvalidDemandIsAnError: a count that is negative, fractional or
// absurd never reads as 0 (the pod would pass every node) or as a huge
// number: filter and prioritize answer an error naming the field, and bind
// refuses.
func TestInvalidDemandIsAnError(t *testing.T) {
	tests := []struct {
		name, value, want string
	}{
		{"negative", "-2", `spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "-2": must not be negative`},
		{"fractional", "1500m", `spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "1500m": must be a whole number of devices`},
		{"huge", "100000", `spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "100k": must be at most 65536`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := makePod("p").obj()
			pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse(tc.value)}
			x, _ := newTestExtender(t, nil, pod)
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
			x.core.Feed().UpsertPod(pod)
			args := &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"a"}}
			if res := x.Filter(context.Background(), args); !strings.Contains(res.Error, tc.want) || !strings.HasPrefix(res.Error, "pod default/p: ") {
				t.Errorf("filter error %q, want one naming the pod and containing %q", res.Error, tc.want)
			}
			if _, err := x.Prioritize(context.Background(), args); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("prioritize error %v, want one containing %q", err, tc.want)
			}
			if c := x.core.Report().Counts(); c.Held != 0 || c.Reserved != 0 {
				t.Errorf("ledger %s: an unreadable demand must hold nothing", c)
			}
		})
	}
}

func TestStripPodKeepsWhatTheDemandReads(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	gpu := func(n string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse(n)}}
	}
	p := makePod("p").obj()
	p.Spec.Containers = []corev1.Container{
		{Name: "main", Image: "trainer", Resources: gpu("2"), Env: []corev1.EnvVar{{Name: "A", Value: "b"}}},
		{Name: "cpu-only", Image: "logger"},
	}
	p.Spec.InitContainers = []corev1.Container{
		{Name: "sidecar", Image: "proxy", RestartPolicy: &always, Resources: gpu("1")},
		{Name: "warmup", Image: "warm", Resources: gpu("2")},
		{Name: "cpu-init", Image: "setup"},
	}
	before, err := ledger.GPUCount(p, v1alpha1.ResourceGPU)
	if err != nil || before != 3 {
		t.Fatalf("GPUCount before stripping = %d, %v; want 3 (sidecar 1 + main 2)", before, err)
	}
	obj, err := cluster.StripPod(v1alpha1.ResourceGPU)(p)
	if err != nil {
		t.Fatal(err)
	}
	s := obj.(*corev1.Pod)
	after, err := ledger.GPUCount(s, v1alpha1.ResourceGPU)
	if err != nil || after != before {
		t.Errorf("GPUCount after stripping = %d, %v; want %d", after, err, before)
	}
	var names []string
	for _, c := range append(append([]corev1.Container(nil), s.Spec.InitContainers...), s.Spec.Containers...) {
		names = append(names, c.Name)
		if c.Image != "" || len(c.Env) > 0 {
			t.Errorf("container %s kept %q / %v; only resources and restartPolicy are read", c.Name, c.Image, c.Env)
		}
	}
	if diff := cmp.Diff([]string{"sidecar", "warmup", "main"}, names); diff != "" {
		t.Errorf("kept containers (-want +got):\n%s", diff)
	}
	// Stripped for another resource, the nvidia.com/gpu containers go.
	obj, _ = cluster.StripPod(testAccel)(p)
	if s := obj.(*corev1.Pod); len(s.Spec.Containers)+len(s.Spec.InitContainers) != 0 {
		t.Errorf("stripped for %s, kept %d containers that do not ask for it", testAccel, len(s.Spec.Containers)+len(s.Spec.InitContainers))
	}
}

func nodeWith(name string, res corev1.ResourceName, n int64) *corev1.Node {
	node := gpuNode(name, 0)
	node.Status.Allocatable = corev1.ResourceList{res: *resource.NewQuantity(n, resource.DecimalSI)}
	return node
}

var cmpEmptyStrings = cmp.FilterValues(func(a, b []string) bool { return len(a) == 0 && len(b) == 0 }, cmp.Ignore())
