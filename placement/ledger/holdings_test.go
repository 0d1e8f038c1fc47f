package ledger_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// podBuilder builds GPU pods for the holdings tests.
type podBuilder struct{ p *corev1.Pod }

func makePod(name string) *podBuilder {
	return &podBuilder{p: &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{SchedulerName: v1alpha1.DefaultSchedulerName, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}}
}

func (b *podBuilder) gpus(n int64) *podBuilder {
	b.p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI)}
	return b
}

func (b *podBuilder) annotate(k, v string) *podBuilder {
	if b.p.Annotations == nil {
		b.p.Annotations = map[string]string{}
	}
	b.p.Annotations[k] = v
	return b
}

func (b *podBuilder) node(n string) *podBuilder { b.p.Spec.NodeName = n; return b }

func (b *podBuilder) phase(p corev1.PodPhase) *podBuilder { b.p.Status.Phase = p; return b }

func (b *podBuilder) assigned(uuids ...string) *podBuilder {
	return b.annotate(v1alpha1.AnnotationAssignedGPUs, v1alpha1.FormatGPUList(uuids))
}

func (b *podBuilder) obj() *corev1.Pod { return b.p.DeepCopy() }

// topo is node's NodeGPUTopology of a fixture machine, observed now.
func topo(t testing.TB, fixture, node string) *v1alpha1.NodeGPUTopology {
	return fixtureTopology(t, fixture, node)
}

func uuidsOn(node string, idx ...int) []string {
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = machine.FixtureUUID(node, j)
	}
	return out
}

func TestLedgerHoldings(t *testing.T) {
	tests := []struct {
		name   string
		events func(l *ledger.Ledger)
		want   []ledger.Holding
		counts ledger.Counts
	}{{
		name: "bound pod holds its assigned GPUs",
		events: func(l *ledger.Ledger) {
			l.UpsertPod(makePod("p").gpus(2).node("a").assigned(uuidsOn("a", 0, 1)...).obj())
		},
		want:   []ledger.Holding{{PodUID: "uid-p", Pod: types.NamespacedName{Namespace: "default", Name: "p"}, Node: "a", GPUs: uuidsOn("a", 0, 1)}},
		counts: ledger.Counts{Total: 8, Free: 6, Held: 2},
	}, {
		name: "allocated-gpus (what kubelet gave) wins over assigned-gpus (the plan)",
		events: func(l *ledger.Ledger) {
			l.UpsertPod(makePod("p").gpus(2).node("a").assigned(uuidsOn("a", 0, 1)...).
				annotate(v1alpha1.AnnotationAllocatedGPUs, v1alpha1.FormatGPUList(uuidsOn("a", 4, 5))).obj())
		},
		want:   []ledger.Holding{{PodUID: "uid-p", Pod: types.NamespacedName{Namespace: "default", Name: "p"}, Node: "a", GPUs: uuidsOn("a", 4, 5)}},
		counts: ledger.Counts{Total: 8, Free: 6, Held: 2},
	}, {
		name: "finished pod releases",
		events: func(l *ledger.Ledger) {
			l.UpsertPod(makePod("p").gpus(2).node("a").assigned(uuidsOn("a", 0, 1)...).obj())
			l.UpsertPod(makePod("p").gpus(2).node("a").assigned(uuidsOn("a", 0, 1)...).phase(corev1.PodFailed).obj())
		},
		counts: ledger.Counts{Total: 8, Free: 8},
	}, {
		name: "deleted pod releases",
		events: func(l *ledger.Ledger) {
			p := makePod("p").gpus(2).node("a").assigned(uuidsOn("a", 0, 1)...).obj()
			l.UpsertPod(p)
			l.DeletePod(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, p.UID)
		},
		counts: ledger.Counts{Total: 8, Free: 8},
	}, {
		name: "an older unbound event after the bound one does not free the GPUs",
		events: func(l *ledger.Ledger) {
			l.UpsertPod(makePod("p").gpus(2).node("a").assigned(uuidsOn("a", 0, 1)...).obj())
			l.UpsertPod(makePod("p").gpus(2).obj())
		},
		want:   []ledger.Holding{{PodUID: "uid-p", Pod: types.NamespacedName{Namespace: "default", Name: "p"}, Node: "a", GPUs: uuidsOn("a", 0, 1)}},
		counts: ledger.Counts{Total: 8, Free: 6, Held: 2},
	}, {
		name: "pod bound without an assignment holds an unknown count",
		events: func(l *ledger.Ledger) {
			l.UpsertPod(makePod("p").gpus(3).node("a").obj())
		},
		want:   []ledger.Holding{{PodUID: "uid-p", Pod: types.NamespacedName{Namespace: "default", Name: "p"}, Node: "a", Unknown: 3}},
		counts: ledger.Counts{Total: 8, Free: 5, Held: 3},
	}, {
		name: "holdings recorded before the topology arrives count once it does",
		events: func(l *ledger.Ledger) {
			l.DeleteTopology("a")
			l.UpsertPod(makePod("p").gpus(1).node("a").assigned(uuidsOn("a", 2)...).obj())
			l.UpsertTopology(topo(t, "dgx1-v100", "a"))
		},
		want:   []ledger.Holding{{PodUID: "uid-p", Pod: types.NamespacedName{Namespace: "default", Name: "p"}, Node: "a", GPUs: uuidsOn("a", 2)}},
		counts: ledger.Counts{Total: 8, Free: 7, Held: 1},
	}, {
		name: "pods without GPUs are ignored",
		events: func(l *ledger.Ledger) {
			l.UpsertPod(makePod("cpu").node("a").obj())
		},
		counts: ledger.Counts{Total: 8, Free: 8},
	}, {
		name: "unhealthy GPUs are not free",
		events: func(l *ledger.Ledger) {
			o := topo(t, "dgx1-v100", "a")
			o.Status.GPUs[0].Health = v1alpha1.GPUUnhealthy
			l.UpsertTopology(o)
		},
		counts: ledger.Counts{Total: 8, Free: 7, Unhealthy: 1},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := ledger.New(ledger.Options{})
			l.UpsertTopology(topo(t, "dgx1-v100", "a"))
			tc.events(l)
			if diff := cmp.Diff(tc.want, l.Report().Holdings(), cmpEmptyHoldings); diff != "" {
				t.Errorf("holdings (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.counts, l.Report().Counts()); diff != "" {
				t.Errorf("counts (-want +got):\n%s", diff)
			}
		})
	}
}

var cmpEmptyHoldings = cmp.FilterValues(func(a, b []ledger.Holding) bool { return len(a) == 0 && len(b) == 0 }, cmp.Ignore())

func TestSweepReleasesOnlyExpiredReservations(t *testing.T) {
	clock := now
	l := ledger.New(ledger.Options{Clock: func() time.Time { return clock }})
	l.UpsertTopology(topo(t, "dgx1-v100", "a"))
	if _, err := l.Reserve("uid-old", types.NamespacedName{Namespace: "default", Name: "old"}, "a", firstFree(2)); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(time.Minute)
	if _, err := l.Reserve("uid-new", types.NamespacedName{Namespace: "default", Name: "new"}, "a", firstFree(2)); err != nil {
		t.Fatal(err)
	}
	// A bound pod's holding never expires.
	l.UpsertPod(makePod("bound").gpus(1).node("a").assigned(uuidsOn("a", 7)...).obj())
	clock = clock.Add(90 * time.Second)
	if n := l.SweepReservations(2 * time.Minute); n != 1 {
		t.Errorf("swept %d reservations, want 1 (the one older than the TTL)", n)
	}
	var left []types.UID
	for _, h := range l.Report().Holdings() {
		left = append(left, h.PodUID)
	}
	if diff := cmp.Diff([]types.UID{"uid-bound", "uid-new"}, left); diff != "" {
		t.Errorf("holdings left (-want +got):\n%s", diff)
	}
}

func TestGPUCount(t *testing.T) {
	const other corev1.ResourceName = "example.com/accel"
	withLimit := func(name corev1.ResourceName, v string) corev1.ResourceRequirements {
		return corev1.ResourceRequirements{Limits: corev1.ResourceList{name: resource.MustParse(v)}}
	}
	always := corev1.ContainerRestartPolicyAlways
	tests := []struct {
		name     string
		pod      *corev1.Pod
		resource corev1.ResourceName
		want     int
		wantErr  string
	}{
		{name: "no GPUs", pod: makePod("p").obj(), want: 0},
		{name: "limits", pod: makePod("p").gpus(4).obj(), want: 4},
		{name: "init container larger than containers", pod: func() *corev1.Pod {
			p := makePod("p").gpus(1).obj()
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: withLimit(v1alpha1.ResourceGPU, "3")}}
			return p
		}(), want: 3},
		{name: "sidecar init container adds to the app containers", pod: func() *corev1.Pod {
			p := makePod("p").gpus(2).obj()
			p.Spec.InitContainers = []corev1.Container{{Name: "sidecar", RestartPolicy: &always, Resources: withLimit(v1alpha1.ResourceGPU, "1")}}
			return p
		}(), want: 3},
		{name: "requests only", pod: func() *corev1.Pod {
			p := makePod("p").obj()
			p.Spec.Containers[0].Resources.Requests = makePod("x").gpus(2).obj().Spec.Containers[0].Resources.Limits
			return p
		}(), want: 2},
		{name: "configured resource is counted, nvidia.com/gpu is not", pod: func() *corev1.Pod {
			p := makePod("p").gpus(4).obj()
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "accel", Resources: withLimit(other, "2")})
			return p
		}(), resource: other, want: 2},
		{name: "negative count is an error naming the field", pod: func() *corev1.Pod {
			p := makePod("p").obj()
			p.Spec.Containers[0].Resources = withLimit(v1alpha1.ResourceGPU, "-1")
			return p
		}(), wantErr: `pod default/p: spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "-1": must not be negative`},
		{name: "fractional count is an error naming the field", pod: func() *corev1.Pod {
			p := makePod("p").obj()
			p.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: withLimit(v1alpha1.ResourceGPU, "500m")}}
			return p
		}(), wantErr: `spec.initContainers[0].resources.limits[nvidia.com/gpu]: Invalid value: "500m": must be a whole number of devices`},
		{name: "huge count is an error, not a clamped 65536", pod: func() *corev1.Pod {
			p := makePod("p").obj()
			p.Spec.Containers[0].Resources = withLimit(v1alpha1.ResourceGPU, "1e12")
			return p
		}(), wantErr: `spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "1e12": must be at most 65536`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := tc.resource
			if res == "" {
				res = v1alpha1.ResourceGPU
			}
			got, err := ledger.GPUCount(tc.pod, res)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("GPUCount = %d, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("GPUCount = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// drifted is pod name bound to node a with assigned-gpus (the plan) plan
// and allocated-gpus (what kubelet gave) got.
func drifted(name string, plan, got []int) *corev1.Pod {
	return makePod(name).gpus(int64(len(plan))).node("a").assigned(uuidsOn("a", plan...)...).
		annotate(v1alpha1.AnnotationAllocatedGPUs, v1alpha1.FormatGPUList(uuidsOn("a", got...))).obj()
}

func TestLedgerDoubleHeldGPUs(t *testing.T) {
	p1 := types.NamespacedName{Namespace: "default", Name: "p1"}
	p2 := types.NamespacedName{Namespace: "default", Name: "p2"}
	gpu1 := machine.FixtureUUID("a", 1)
	var added, cleared []ledger.DoubleHold
	l := ledger.New(ledger.Options{OnDoubleHeld: func(a, c []ledger.DoubleHold) { added, cleared = append(added, a...), append(cleared, c...) }})
	l.UpsertTopology(topo(t, "dgx1-v100", "a"))

	// p1 holds 0,1; p2 was planned on 2,3 but kubelet gave it 1,2.
	l.UpsertPod(makePod("p1").gpus(2).node("a").assigned(uuidsOn("a", 0, 1)...).obj())
	l.UpsertPod(drifted("p2", []int{2, 3}, []int{1, 2}))

	want := []ledger.DoubleHold{{Node: "a", GPU: gpu1, Holders: []ledger.GPUHolder{{PodUID: "uid-p1", Pod: p1}, {PodUID: "uid-p2", Pod: p2}}}}
	if diff := cmp.Diff(want, l.Report().DoubleHolds()); diff != "" {
		t.Errorf("DoubleHolds (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, added); diff != "" || len(cleared) > 0 {
		t.Errorf("reported added (-want +got):\n%s\ncleared %v", diff, cleared)
	}
	// Both holdings stay whole; the GPU counts as used once.
	wantHoldings := []ledger.Holding{
		{PodUID: "uid-p1", Pod: p1, Node: "a", GPUs: uuidsOn("a", 0, 1), DoubleHeld: []string{gpu1}},
		{PodUID: "uid-p2", Pod: p2, Node: "a", GPUs: uuidsOn("a", 1, 2), DoubleHeld: []string{gpu1}},
	}
	if diff := cmp.Diff(wantHoldings, l.Report().Holdings()); diff != "" {
		t.Errorf("holdings (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(ledger.Counts{Total: 8, Free: 5, Held: 3, DoubleHeld: 1}, l.Report().Counts()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	var free topology.Mask
	l.Read(func(v ledger.View) { free = v.Node("a").Free() })
	if free != topology.MaskOf(3, 4, 5, 6, 7) {
		t.Errorf("free GPUs %v, want 3-7: a double-held GPU is never free", free.Indices())
	}

	// The same state seen again (an informer resync) reports nothing new.
	added = nil
	l.UpsertPod(drifted("p2", []int{2, 3}, []int{1, 2}))
	l.UpsertTopology(topo(t, "dgx1-v100", "a"))
	if len(added) > 0 || len(cleared) > 0 {
		t.Errorf("a resync reported added %v cleared %v, want nothing", added, cleared)
	}

	// p1 ends: the conflict clears and p2 keeps its GPUs.
	l.DeletePod(types.NamespacedName{Namespace: "default", Name: "p1"}, "uid-p1")
	if diff := cmp.Diff(want, cleared); diff != "" {
		t.Errorf("reported cleared (-want +got):\n%s", diff)
	}
	if got := l.Report().DoubleHolds(); len(got) > 0 {
		t.Errorf("DoubleHolds after p1 ended = %v, want none", got)
	}
	if diff := cmp.Diff([]ledger.Holding{{PodUID: "uid-p2", Pod: p2, Node: "a", GPUs: uuidsOn("a", 1, 2)}}, l.Report().Holdings()); diff != "" {
		t.Errorf("holdings (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(ledger.Counts{Total: 8, Free: 6, Held: 2}, l.Report().Counts()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

func TestLedgerDoubleHeldWithAReservationCountsAsHeld(t *testing.T) {
	l := ledger.New(ledger.Options{})
	l.UpsertTopology(topo(t, "dgx1-v100", "a"))
	res, err := l.Reserve("uid-r", types.NamespacedName{Namespace: "default", Name: "r"}, "a", firstFree(1))
	if err != nil {
		t.Fatal(err)
	}
	uuids := res.UUIDs
	idx, _ := machine.FixtureByName("dgx1-v100")
	i, _ := idx.Graph("a").IndexOf(uuids[0])
	// A pod bound elsewhere is recorded by the node agent on the reserved GPU.
	l.UpsertPod(drifted("b", []int{(i + 1) % 8}, []int{i}))
	got := l.Report().DoubleHolds()
	if len(got) != 1 || len(got[0].Holders) != 2 || !got[0].Holders[1].Reserved || got[0].Holders[0].Reserved {
		t.Fatalf("DoubleHolds = %+v, want GPU %d held by pod b and reserved for r", got, i)
	}
	if diff := cmp.Diff(ledger.Counts{Total: 8, Free: 7, Held: 1, Reserved: 0, DoubleHeld: 1}, l.Report().Counts()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
	l.Release("uid-r")
	if c := l.Report().Counts(); c.DoubleHeld != 0 || c.Held != 1 || c.Free != 7 {
		t.Errorf("after the reservation is released: %s, want held=1 free=7 and no double hold", c)
	}
}
