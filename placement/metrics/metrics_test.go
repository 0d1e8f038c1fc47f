package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

func TestGroupReservationsAreGauges(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := at
	l := ledger.New(ledger.Options{Clock: func() time.Time { return clock }})
	f, err := machine.FixtureByName("hgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	st := f.Graph("n").Status()
	st.ObservedTime = metav1.NewTime(at)
	l.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: st})
	// Two GPUs held by a running pod, a group of two waiting.
	l.UpsertPod(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "run", Namespace: "ml", UID: "uid-run",
			Annotations: map[string]string{v1alpha1.AnnotationAssignedGPUs: v1alpha1.FormatGPUList([]string{st.GPUs[0].UUID, st.GPUs[1].UUID})}},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(2, resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	})
	for _, name := range []string{"g-0", "g-1"} {
		l.UpsertPod(&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", UID: types.UID("uid-" + name),
				Annotations: map[string]string{v1alpha1.AnnotationGroup: "g", v1alpha1.AnnotationGroupSize: "2"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(4, resource.DecimalSI)}}}}},
		})
	}
	m := New(l.Report())
	want := func(text string) {
		t.Helper()
		names := []string{"gputopo_extender_group_reservations", "gputopo_extender_group_reserved_gpus", "gputopo_extender_group_reservation_oldest_seconds"}
		if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(text), names...); err != nil {
			t.Error(err)
		}
	}
	header := `# HELP gputopo_extender_group_reservation_oldest_seconds How long the oldest reservation for a waiting group has lasted; 0 when none.
# TYPE gputopo_extender_group_reservation_oldest_seconds gauge
gputopo_extender_group_reservation_oldest_seconds %s
# HELP gputopo_extender_group_reservations Waiting groups whose GPUs are kept from later pods of their priority or lower now (fabric.reserveAfter).
# TYPE gputopo_extender_group_reservations gauge
gputopo_extender_group_reservations %s
# HELP gputopo_extender_group_reserved_gpus GPUs kept for waiting groups, by whether they are free now (free) or still held by the pods the group waits for (held).
# TYPE gputopo_extender_group_reserved_gpus gauge
gputopo_extender_group_reserved_gpus{state="free"} %s
gputopo_extender_group_reserved_gpus{state="held"} %s
`
	fill := func(vals ...string) string {
		out := header
		for _, v := range vals {
			out = strings.Replace(out, "%s", v, 1)
		}
		return out
	}
	want(fill("0", "0", "0", "0"))
	if !l.KeepForGroup("ml/g", 0, "cluster", "cluster", time.Time{}, map[string]topology.Mask{"n": topology.MaskOf(0, 1, 2, 3, 4, 5, 6, 7)}) {
		t.Fatal("reservation refused")
	}
	clock = at.Add(90 * time.Second)
	want(fill("90", "1", "6", "2"))
	l.EndKeep("ml/g")
	want(fill("0", "0", "0", "0"))
}
