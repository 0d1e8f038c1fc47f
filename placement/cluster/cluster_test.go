package cluster

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/topology/machine"
)

// boundPod is pod name bound to node with GPUs idx of a dgx1-v100 fixture.
func boundPod(t *testing.T, name, node string, idx ...int) *corev1.Pod {
	t.Helper()
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	st := f.Graph(node).Status()
	var uuids []string
	for _, i := range idx {
		uuids = append(uuids, st.GPUs[i].UUID)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			Annotations: map[string]string{v1alpha1.AnnotationAssignedGPUs: strings.Join(uuids, ",")}},
		Spec: corev1.PodSpec{NodeName: node, SchedulerName: v1alpha1.DefaultSchedulerName, Containers: []corev1.Container{{Name: "c",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(int64(len(idx)), resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
}

func topology(t *testing.T, node string) *v1alpha1.NodeGPUTopology {
	t.Helper()
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	st := f.Graph(node).Status()
	st.ObservedTime = metav1.Now()
	return &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: st}
}

// An informer delivers a deleted pod as a tombstone when it missed the
// delete: the handlers unwrap it, so the pod's GPUs are freed either way.
func TestDeletedPodsReleaseTheirGPUsAlsoFromATombstone(t *testing.T) {
	for name, wrap := range map[string]func(*corev1.Pod) any{
		"the pod":   func(p *corev1.Pod) any { return p },
		"tombstone": func(p *corev1.Pod) any { return toolscache.DeletedFinalStateUnknown{Key: "default/" + p.Name, Obj: p} },
	} {
		t.Run(name, func(t *testing.T) {
			x, err := placement.New(placement.Options{})
			if err != nil {
				t.Fatal(err)
			}
			h := feedHandlers(x.Feed())
			h.topologies.OnAdd(topology(t, "a"), true)
			p := boundPod(t, "p", "a", 0, 1)
			h.pods.OnAdd(p, true)
			if c := x.Report().Counts(); c.Held != 2 {
				t.Fatalf("counts after the pod was added: %+v, want 2 held", c)
			}
			h.pods.OnDelete(wrap(p))
			if c := x.Report().Counts(); c.Held != 0 || c.Free != 8 {
				t.Errorf("counts after the delete: %+v, want all 8 free", c)
			}
			h.topologies.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "a", Obj: topology(t, "a")})
			if c := x.Report().Counts(); c.Total != 0 {
				t.Errorf("counts after the topology's tombstone: %+v, want no GPUs", c)
			}
		})
	}
}

// The runtime is its core's Gate: the core decides nothing until the
// informers synced and Lead rebuilt the ledger, and it then reports the
// GPUs it found held twice while it did not serve.
func TestTheCoreDecidesOnlyOnceTheRuntimeLeads(t *testing.T) {
	p1, p2 := boundPod(t, "p1", "a", 5), boundPod(t, "p2", "a", 5)
	cs := fake.NewClientset(p1, p2)
	rec := record.NewFakeRecorder(8)
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	rt, err := New(nil, cs, Options{Core: placement.Options{Config: cfg, Recorder: rec}, DecidesNothing: true})
	if err != nil {
		t.Fatal(err)
	}
	x := rt.Core()
	if msg := x.NotReady(); !strings.Contains(msg, "informer caches are syncing") {
		t.Errorf("NotReady before Sync = %q, want it to say the caches are syncing", msg)
	}
	rt.synced.Store(true) // as Sync does once the informers delivered their lists
	x.Feed().UpsertTopology(topology(t, "a"))
	if msg := x.NotReady(); !strings.Contains(msg, "not the leader") {
		t.Errorf("NotReady before Lead = %q, want it to say it does not lead", msg)
	}
	if err := rt.Lead(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	if msg := x.NotReady(); msg != "" {
		t.Errorf("NotReady after Lead = %q, want ready", msg)
	}
	// Lead rebuilt the ledger from the pods the API server lists.
	if c := x.Report().Counts(); c.Held != 1 {
		t.Errorf("counts after Lead: %+v, want GPU 5 held (by two pods, counted once)", c)
	}
	var got []string
	for len(rec.Events) > 0 {
		got = append(got, <-rec.Events)
	}
	if len(got) != 2 || !strings.Contains(got[0], "GPUDoubleHeld") || !strings.Contains(got[1], "GPUDoubleHeld") {
		t.Errorf("events after Lead = %q, want a GPUDoubleHeld warning for each pod", got)
	}
	rt.StopLeading()
	if msg := x.NotReady(); !strings.Contains(msg, "not the leader") {
		t.Errorf("NotReady after StopLeading = %q", msg)
	}
}
