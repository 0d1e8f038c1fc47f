package nodeagent

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

type fakePodResources struct {
	pods []*podresourcesapi.PodResources
}

func (f *fakePodResources) List(context.Context) ([]*podresourcesapi.PodResources, error) {
	return f.pods, nil
}

func podRes(ns, name string, containers ...[]string) *podresourcesapi.PodResources {
	pr := &podresourcesapi.PodResources{Namespace: ns, Name: name}
	for i, ids := range containers {
		pr.Containers = append(pr.Containers, &podresourcesapi.ContainerResources{
			Name:    "c" + string(rune('0'+i)),
			Devices: []*podresourcesapi.ContainerDevices{{ResourceName: v1alpha1.ResourceGPU, DeviceIds: ids}},
		})
	}
	return pr
}

func plannedPod(name, assigned string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name)}, Spec: corev1.PodSpec{NodeName: testNode}}
	if assigned != "" {
		p.Annotations = map[string]string{v1alpha1.AnnotationAssignedGPUs: assigned}
	}
	return p
}

func TestReconcilerRecordsTruthAndDrift(t *testing.T) {
	cs := fake.NewClientset(
		plannedPod("on-plan", "GPU-b,GPU-a"),
		plannedPod("off-plan", "GPU-c,GPU-d"),
		plannedPod("no-plan", ""),
		plannedPod("cpu-only", ""),
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pods := NewPodCache(cs, testNode)
	if err := pods.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pr := &fakePodResources{pods: []*podresourcesapi.PodResources{
		podRes("ns", "on-plan", []string{"GPU-a"}, []string{"GPU-b"}),
		podRes("ns", "off-plan", []string{"GPU-e", "GPU-c"}),
		podRes("ns", "no-plan", []string{"GPU-f"}),
		{Namespace: "ns", Name: "cpu-only", Containers: []*podresourcesapi.ContainerResources{{Name: "main"}}},
		podRes("ns", "gone", []string{"GPU-g"}),
	}}
	rec := record.NewFakeRecorder(10)
	metrics := NewMetrics(prometheus.NewRegistry(), testNode)
	r := NewReconciler(cs, pods, pr, v1alpha1.ResourceGPU, rec, metrics, logr.Discard(), 0)
	for range 2 { // the second pass must change nothing and raise nothing
		if err := r.Reconcile(ctx); err != nil {
			t.Fatalf("Reconcile: %v", err)
		}
	}
	got := map[string]string{}
	for _, name := range []string{"on-plan", "off-plan", "no-plan", "cpu-only"} {
		p, err := cs.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got[name] = p.Annotations[v1alpha1.AnnotationAllocatedGPUs]
	}
	want := map[string]string{"on-plan": "GPU-a,GPU-b", "off-plan": "GPU-c,GPU-e", "no-plan": "GPU-f", "cpu-only": ""}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("allocated-gpus annotations (-want +got):\n%s", diff)
	}
	close(rec.Events)
	var events []string
	for ev := range rec.Events {
		events = append(events, ev)
	}
	wantEvents := []string{"Warning GPUAssignmentDrift kubelet allocated GPUs GPU-c,GPU-e but the extender assigned GPU-c,GPU-d"}
	if diff := cmp.Diff(wantEvents, events); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got := testutil.ToFloat64(metrics.drift); got != 1 {
		t.Errorf("drift metric: got %v, want 1", got)
	}
}

func TestPendingFromPodsKeepsPendingGPUPods(t *testing.T) {
	now := metav1.Now()
	withGPUs := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.InitContainers = []corev1.Container{
			{Name: "init", Resources: gpuLimits(1)},
			{Name: "sidecar", Resources: gpuLimits(1), RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)},
			{Name: "no-gpu"},
		}
		p.Spec.Containers = []corev1.Container{{Name: "app", Resources: gpuLimits(2)}}
		return p
	}
	pending := withGPUs(plannedPod("pending", "GPU-a,GPU-b,GPU-c"))
	pending.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now}}
	running := withGPUs(plannedPod("running", "GPU-c"))
	running.Status.Phase = corev1.PodRunning
	deleting := withGPUs(plannedPod("deleting", "GPU-d"))
	deleting.DeletionTimestamp = &now
	allocated := withGPUs(plannedPod("allocated", "GPU-e"))
	allocated.Annotations[v1alpha1.AnnotationAllocatedGPUs] = "GPU-e"
	malformed := withGPUs(plannedPod("malformed", "GPU-a,,GPU-b"))
	noPlan := withGPUs(plannedPod("no-plan", ""))
	noGPU := plannedPod("no-gpu", "GPU-f")
	got := PendingFromPods([]*corev1.Pod{pending, running, deleting, allocated, malformed, noPlan, noGPU}, v1alpha1.ResourceGPU)
	containers := []ContainerGPUs{{Name: "init", GPUs: 1, OneShot: true}, {Name: "sidecar", GPUs: 1}, {Name: "app", GPUs: 2}}
	want := []PendingPod{
		{Plan: Plan{Pod: "ns/pending", UID: "uid-pending", GPUs: []string{"GPU-a", "GPU-b", "GPU-c"}, BoundAt: now.Time}, Demand: 3, Containers: containers},
		{Plan: Plan{Pod: "ns/allocated", UID: "uid-allocated", GPUs: []string{"GPU-e"}}, Demand: 3, Recorded: []string{"GPU-e"}, Containers: containers},
		{Plan: Plan{Pod: "ns/malformed", UID: "uid-malformed"}, Demand: 3, Containers: containers},
		{Plan: Plan{Pod: "ns/no-plan", UID: "uid-no-plan"}, Demand: 3, Containers: containers},
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("pending pods (-want +got):\n%s", diff)
	}
}

func TestOptionsValidateNamesEveryBadField(t *testing.T) {
	o := Options{Simulate: "dgx-9000", NodeAgentConfiguration: configv1alpha1.NodeAgentConfiguration{TelemetryInterval: metav1.Duration{Duration: -1}}}
	err := o.Validate()
	if err == nil {
		t.Fatal("Validate of bad options: got nil")
	}
	for _, want := range []string{"node-name: Required", `simulate: Invalid value: "dgx-9000"`, "known fixtures are", "telemetry-interval", "topology-interval", "resource-name", "device-plugin-dir", "pod-resources-socket"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %q does not mention %q", err, want)
		}
	}
}
