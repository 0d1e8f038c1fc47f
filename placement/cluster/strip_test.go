package cluster

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology/machine"
)

// decoded is a fixture's NodeGPUTopology as a watch delivers it: decoded
// from JSON, every string its own.
func decoded(t *testing.T, fixture, name string) *v1alpha1.NodeGPUTopology {
	t.Helper()
	f, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	o := &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("u-" + name), ResourceVersion: "7",
		Labels: map[string]string{"a": "b"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "agent"}}}}
	o.Status = f.Graph(name).Status()
	o.Status.DriverVersion = "570.1"
	o.Status.Telemetry = []v1alpha1.Telemetry{{Index: 0, UtilizationPercent: 40, ThrottleReasons: []string{"SwPowerCap"}}}
	o.Status.ObservedTime = metav1.Now()
	o.Status.Stale, o.Status.StaleReason = true, "NVML: timeout"
	b, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	var d v1alpha1.NodeGPUTopology
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

func TestStripTopologyKeepsWhatTheLedgerReadsAndSharesLinks(t *testing.T) {
	strip := stripTopology()
	got := func(o *v1alpha1.NodeGPUTopology) *v1alpha1.NodeGPUTopology {
		t.Helper()
		s, err := strip(o)
		if err != nil {
			t.Fatal(err)
		}
		return s.(*v1alpha1.NodeGPUTopology)
	}
	a, b, c := decoded(t, "dgx-a100", "a"), decoded(t, "dgx-a100", "b"), decoded(t, "pcie-8x", "c")
	sa, sb, sc := got(a), got(b), got(c)
	for _, p := range []struct{ in, out *v1alpha1.NodeGPUTopology }{{a, sa}, {b, sb}, {c, sc}} {
		want := p.in.Status
		want.DriverVersion, want.TopologyHash, want.Conditions = "", "", nil
		if diff := cmp.Diff(want, p.out.Status); diff != "" {
			t.Errorf("%s: status the ledger reads changed (-want +got):\n%s", p.in.Name, diff)
		}
		if p.out.Name != p.in.Name || p.out.UID != p.in.UID || p.out.ResourceVersion != p.in.ResourceVersion {
			t.Errorf("%s: identity %s/%s/%s, want %s/%s/%s", p.in.Name, p.out.Name, p.out.UID, p.out.ResourceVersion, p.in.Name, p.in.UID, p.in.ResourceVersion)
		}
		if p.out.Labels != nil || p.out.ManagedFields != nil {
			t.Errorf("%s: kept metadata the ledger never reads: %v %v", p.in.Name, p.out.Labels, p.out.ManagedFields)
		}
	}
	if &sa.Status.Links[0] != &sb.Status.Links[0] {
		t.Error("two nodes of one machine shape hold two link tables")
	}
	if &sa.Status.Links[0] == &sc.Status.Links[0] {
		t.Error("two machine shapes share one link table")
	}
	// The shared table is the cache's own: changing an input later, or
	// a node whose links differ, leaves it alone.
	want := sa.Status.Links[3]
	a.Status.Links[3].BandwidthGBps++
	d := decoded(t, "dgx-a100", "d")
	d.Status.Links[3].BandwidthGBps = 1
	sd := got(d)
	if sa.Status.Links[3] != want || sb.Status.Links[3] != want {
		t.Errorf("shared link 3 = %+v, want %+v", sa.Status.Links[3], want)
	}
	if sd.Status.Links[3].BandwidthGBps != 1 || &sd.Status.Links[0] == &sa.Status.Links[0] {
		t.Errorf("a node with a different link shares the table: %+v", sd.Status.Links[3])
	}
	if o, err := strip("not a topology"); err != nil || o != "not a topology" {
		t.Errorf("strip(other) = %v, %v; want it unchanged", o, err)
	}
}

// Past the bound, each object keeps its own table, still whole.
func TestStripTopologyBoundsTheSharedTables(t *testing.T) {
	tables := &linkTables{}
	base := decoded(t, "pcie-8x", "x").Status.Links
	for i := range maxLinkTables + 10 {
		links := append([]v1alpha1.Link(nil), base...)
		links[0].BandwidthGBps = i + 1
		got := tables.share(links)
		if diff := cmp.Diff(links, got); diff != "" {
			t.Fatalf("table %d (-want +got):\n%s", i, diff)
		}
	}
	if len(tables.tables) != maxLinkTables {
		t.Errorf("%d tables kept, want the bound %d", len(tables.tables), maxLinkTables)
	}
}

// The stripped pod keeps what preemption reads (priority, start, the node
// it is nominated to, and kube-scheduler's mark on a victim) and what a
// waiting group's reservation reads (activeDeadlineSeconds), and drops the
// pod's other conditions.
func TestStripPodKeepsWhatPreemptionReads(t *testing.T) {
	prio, deadline := int32(1000), int64(3600)
	start := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "v", Namespace: "ns", UID: "uid-v"},
		Spec: corev1.PodSpec{Priority: &prio, ActiveDeadlineSeconds: &deadline, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1")}}}}},
		Status: corev1.PodStatus{StartTime: &start, NominatedNodeName: "n1", Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, Message: "long text"},
			{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: corev1.PodReasonPreemptionByScheduler, Message: "gputopo-scheduler: preempting"},
		}},
	}
	before := ledger.NewPodInfo(p, v1alpha1.ResourceGPU)
	obj, err := StripPod(v1alpha1.ResourceGPU)(p)
	if err != nil {
		t.Fatal(err)
	}
	s := obj.(*corev1.Pod)
	after := ledger.NewPodInfo(s, v1alpha1.ResourceGPU)
	if !after.Preempted || after.Priority != 1000 || !after.Started.Equal(start.Time) || after.Nominated != "n1" || after.Deadline != time.Hour {
		t.Errorf("after stripping: preempted %v, priority %d, started %v, nominated %q, deadline %s; before: %v %d %v %q %s",
			after.Preempted, after.Priority, after.Started, after.Nominated, after.Deadline, before.Preempted, before.Priority, before.Started, before.Nominated, before.Deadline)
	}
	if len(s.Status.Conditions) != 1 || s.Status.Conditions[0].Message != "" {
		t.Errorf("conditions kept: %+v, want only DisruptionTarget, without its message", s.Status.Conditions)
	}
}

// A GPU pod keeps its labels, which PodDisruptionBudgets select by (the
// extender's preempt verb counts them); a pod without GPUs keeps only its
// job label.
func TestStripPodKeepsTheLabelsOfGPUPods(t *testing.T) {
	labels := map[string]string{"app": "trainer", v1alpha1.LabelJob: "j"}
	gpu := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c",
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1")}}}}}}
	cpu := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	strip := StripPod(v1alpha1.ResourceGPU)
	for _, c := range []struct {
		in   *corev1.Pod
		want map[string]string
	}{{gpu, labels}, {cpu, map[string]string{v1alpha1.LabelJob: "j"}}} {
		obj, err := strip(c.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := obj.(*corev1.Pod).Labels; !cmp.Equal(got, c.want) {
			t.Errorf("%s: labels %v, want %v", c.in.Name, got, c.want)
		}
	}
}

// A group pod keeps what its slice follows from: its rank annotation, its
// Job completion index, or its JobSet Job's index label, with or without
// GPU containers (a pod asking its GPUs
// through ResourceClaims has none). Stripped, the ledger would put every
// pod of a sliced group in no slice, and its preemption plan would deal
// the slices' places out by pod name.
func TestStripPodKeepsAGroupPodsRank(t *testing.T) {
	spec := v1alpha1.GroupSpec{Name: "llm", Size: 32, SliceSize: 16}
	gpus := []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("4")}}}}
	for _, c := range []struct {
		name        string
		annotations map[string]string
		labels      map[string]string
		containers  []corev1.Container
	}{
		{"rank", map[string]string{v1alpha1.AnnotationRank: "20"}, nil, gpus},
		{"completion-index", map[string]string{v1alpha1.AnnotationCompletionIndex: "20"}, nil, gpus},
		{"jobset-index", nil, map[string]string{v1alpha1.LabelJobSetJobIndex: "1"}, nil},
	} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: c.name, Namespace: "ns", UID: types.UID(c.name), Annotations: c.annotations, Labels: c.labels},
			Spec: corev1.PodSpec{Containers: c.containers}}
		before := ledger.NewPodInfo(p, v1alpha1.ResourceGPU)
		obj, err := StripPod(v1alpha1.ResourceGPU)(p)
		if err != nil {
			t.Fatal(err)
		}
		after := ledger.NewPodInfo(obj.(*corev1.Pod), v1alpha1.ResourceGPU)
		sb, errb := before.Slice(spec)
		sa, erra := after.Slice(spec)
		if sb != 1 || errb != nil || sa != sb || erra != nil {
			t.Errorf("%s: slice %d (%v) stripped, %d (%v) whole; want 1", c.name, sa, erra, sb, errb)
		}
	}
}
