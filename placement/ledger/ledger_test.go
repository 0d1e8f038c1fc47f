package ledger_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newLedger is a ledger on the fixed clock with one fresh dgx-a100 node
// per name.
func newLedger(t testing.TB, nodes ...string) *ledger.Ledger {
	t.Helper()
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(ledger.Options{Clock: func() time.Time { return now }})
	for _, name := range nodes {
		st := f.Graph(name).Status()
		st.ObservedTime = metav1.NewTime(now)
		l.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: st})
	}
	return l
}

func pod(name, node, job string, gpus int64, assigned ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if job != "" {
		p.Labels = map[string]string{v1alpha1.LabelJob: job}
	}
	if len(assigned) > 0 {
		p.Annotations = map[string]string{v1alpha1.AnnotationAssignedGPUs: v1alpha1.FormatGPUList(assigned)}
	}
	return p
}

// firstFree chooses the lowest free GPUs of the node, as many as count.
func firstFree(count int) func(ledger.View, *ledger.Node) (ledger.Choice, error) {
	return func(_ ledger.View, n *ledger.Node) (ledger.Choice, error) {
		if n == nil {
			return ledger.Choice{}, errors.New("unknown node")
		}
		idx := n.Free().Indices()
		if len(idx) < count {
			return ledger.Choice{}, fmt.Errorf("%d free, want %d", len(idx), count)
		}
		var c ledger.Choice
		for _, i := range idx[:count] {
			c.UUIDs = append(c.UUIDs, n.Graph().GPUs()[i].UUID)
			c.Placement.GPUIndices = append(c.Placement.GPUIndices, i)
		}
		return c, nil
	}
}

func free(l *ledger.Ledger, node string) topology.Mask {
	var m topology.Mask
	l.Read(func(v ledger.View) { m = v.Node(node).Free() })
	return m
}

func key(name string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: name} }

func TestReserveConfirmRelease(t *testing.T) {
	l := newLedger(t, "a", "b")
	c, err := l.Reserve("uid-p", key("p"), "a", firstFree(2))
	if err != nil {
		t.Fatal(err)
	}
	if got := free(l, "a"); got != topology.MaskOf(2, 3, 4, 5, 6, 7) {
		t.Fatalf("free after Reserve: %v, want 2-7", got.Indices())
	}
	if got := l.Report().Counts(); got.Reserved != 2 || got.Held != 0 {
		t.Fatalf("counts after Reserve: %s, want 2 reserved", got)
	}

	// A second Reserve for the pod on the same node hands back the same
	// GPUs without choosing again.
	again, err := l.Reserve("uid-p", key("p"), "a", func(ledger.View, *ledger.Node) (ledger.Choice, error) {
		t.Fatal("choose called for a pod that holds a reservation on the node")
		return ledger.Choice{}, nil
	})
	if err != nil || fmt.Sprint(again.UUIDs) != fmt.Sprint(c.UUIDs) {
		t.Fatalf("second Reserve: %v, %v; want %v", again.UUIDs, err, c.UUIDs)
	}

	// Retried on another node: the first reservation goes.
	if _, err := l.Reserve("uid-p", key("p"), "b", firstFree(2)); err != nil {
		t.Fatal(err)
	}
	if got := free(l, "a"); got.Count() != 8 {
		t.Fatalf("node a keeps %d GPUs after the pod moved to b", 8-got.Count())
	}

	// Confirmed (the Binding was written): ReleaseReserved leaves it to
	// the informer; Release frees it.
	l.Confirm("uid-p", "b", []string{"GPU-not-reserved"})
	if got := l.Report().Counts(); got.Reserved != 2 {
		t.Fatalf("Confirm with other GPUs changed the reservation: %s", got)
	}
	held, _ := l.Reserve("uid-p", key("p"), "b", nil)
	l.Confirm("uid-p", "b", held.UUIDs)
	if got := l.Report().Counts(); got.Held != 2 || got.Reserved != 0 {
		t.Fatalf("counts after Confirm: %s, want 2 held", got)
	}
	l.ReleaseReserved("uid-p")
	if got := l.Report().Counts(); got.Held != 2 {
		t.Fatalf("ReleaseReserved freed a confirmed holding: %s", got)
	}
	l.Release("uid-p")
	if got := l.Report().Counts(); got.Held != 0 || got.Free != 16 {
		t.Fatalf("counts after Release: %s, want all 16 free", got)
	}
}

func TestReserveHoldsNothingOnError(t *testing.T) {
	l := newLedger(t, "a")
	want := errors.New("no")
	if _, err := l.Reserve("uid-p", key("p"), "a", func(ledger.View, *ledger.Node) (ledger.Choice, error) { return ledger.Choice{}, want }); !errors.Is(err, want) {
		t.Fatalf("Reserve error %v, want choose's", err)
	}
	if _, err := l.Reserve("uid-p", key("p"), "nowhere", firstFree(1)); err == nil {
		t.Fatal("Reserve on a node the ledger does not know succeeded")
	}
	if got := l.Report().Counts(); got.Reserved != 0 || got.Free != 8 || len(l.Report().Holdings()) != 0 {
		t.Fatalf("a failed Reserve left %s, holdings %v", got, l.Report().Holdings())
	}
}

func TestReserveRefusesAPodBoundElsewhere(t *testing.T) {
	l := newLedger(t, "a", "b")
	l.UpsertPod(pod("p", "a", "", 1, machine.FixtureUUID("a", 0)))
	_, err := l.Reserve("uid-p", key("p"), "b", firstFree(1))
	var held *ledger.AlreadyHeldError
	if !errors.As(err, &held) || held.Node != "a" {
		t.Fatalf("Reserve of a pod bound on a: %v, want an AlreadyHeldError naming a", err)
	}
	if got := free(l, "b"); got.Count() != 8 {
		t.Fatalf("node b lost GPUs: %v free", got.Indices())
	}
}

// Reserves racing on one node never hand out one GPU twice, and readers
// racing with them see consistent nodes (run with -race).
func TestConcurrentReservesNeverShareAGPU(t *testing.T) {
	l := newLedger(t, "a")
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]string{}
	var failed int
	for i := range 10 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("p%d", i)
			c, err := l.Reserve(types.UID("uid-"+name), key(name), "a", firstFree(1))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			for _, u := range c.UUIDs {
				if other, ok := got[u]; ok {
					t.Errorf("GPU %s reserved for %s and %s", u, other, name)
				}
				got[u] = name
			}
		}()
		go func() {
			defer wg.Done()
			l.Read(func(v ledger.View) {
				n := v.Node("a")
				if n.Free().Count()+n.UsedCount() != n.Size() {
					t.Errorf("node read mid-change: %d free + %d used != %d", n.Free().Count(), n.UsedCount(), n.Size())
				}
			})
		}()
	}
	wg.Wait()
	if len(got) != 8 || failed != 2 {
		t.Fatalf("%d GPUs reserved, %d refused; want 8 and 2", len(got), failed)
	}
	if c := l.Report().Counts(); c.Reserved != 8 || c.Free != 0 || c.DoubleHeld != 0 {
		t.Fatalf("counts %s, want 8 reserved", c)
	}
}

func TestViewAffinityAndWithout(t *testing.T) {
	l := newLedger(t, "a", "b")
	self := pod("w0", "a", "train", 2, machine.FixtureUUID("a", 0), machine.FixtureUUID("a", 1))
	l.UpsertPod(self)
	l.Read(func(v ledger.View) {
		nodes := v.Lookup("", []string{"a", "missing", "b"}, nil)
		if nodes[0].Name() != "a" || nodes[1] != nil || nodes[2].Name() != "b" {
			t.Fatalf("Lookup: %v", nodes)
		}
		aff := v.Affinity("ns/train")
		if !aff.Placed() || aff.Of(nodes[0]) != 1 || aff.Of(nodes[2]) != 0 {
			t.Errorf("affinity of a job running on a: placed %v, a %v, b %v", aff.Placed(), aff.Of(nodes[0]), aff.Of(nodes[2]))
		}
		if aff := v.Affinity("ns/other"); aff.Placed() {
			t.Error("a job with no pods has affinity")
		}
		if aff := v.AffinityExcluding("ns/train", types.NamespacedName{Namespace: self.Namespace, Name: self.Name}, self.UID); aff.Placed() {
			t.Error("the job's only pod, excluded, still places the job")
		}
		if node, ok := v.HolderNode("uid-w0"); !ok || node != "a" {
			t.Errorf("HolderNode: %q %v", node, ok)
		}
		w := v.Without(nodes[0], "uid-w0")
		if w.Free().Count() != 8 || nodes[0].Free().Count() != 6 {
			t.Errorf("Without: copy has %d free, node %d; want 8 and 6", w.Free().Count(), nodes[0].Free().Count())
		}
	})
	if got := free(l, "a"); got.Count() != 6 {
		t.Fatalf("Without changed the ledger: %d free", got.Count())
	}
}

func TestNodeState(t *testing.T) {
	l := newLedger(t, "a")
	l.UpsertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpuless"}})
	w := ledger.NewFreshWindow(now, time.Minute)
	late := ledger.NewFreshWindow(now.Add(2*time.Minute), time.Minute)
	l.Read(func(v ledger.View) {
		if s := v.Node("a").State(w); s != ledger.TopoFresh {
			t.Errorf("a: %s, want fresh", s)
		}
		if s := v.Node("a").State(late); s != ledger.TopoOld {
			t.Errorf("a two minutes on: %s, want old", s)
		}
		if s := v.Node("gpuless").State(w); s != ledger.TopoMissing {
			t.Errorf("a Node without a topology: %s, want missing", s)
		}
		if s := v.Node("unknown").State(w); s != ledger.TopoMissing {
			t.Errorf("an unknown node: %s, want missing", s)
		}
	})
	if got := l.Report().TopologyStates(now, time.Minute); got[ledger.TopologyFresh] != 1 || got[ledger.TopologyMissing] != 0 {
		t.Errorf("TopologyStates %v: want a fresh, the Node without GPUs not counted", got)
	}
}

func TestNodeForSeesTheGPUsAPodHasReserved(t *testing.T) {
	l := newLedger(t, "a", "b")
	if _, err := l.Reserve("uid-p", key("p"), "a", firstFree(2)); err != nil {
		t.Fatal(err)
	}
	l.UpsertPod(pod("q", "a", "", 2, machine.FixtureUUID("a", 2), machine.FixtureUUID("a", 3)))
	l.Read(func(v ledger.View) {
		if got := v.NodeFor("a", "uid-p").Free(); got != topology.MaskOf(0, 1, 4, 5, 6, 7) {
			t.Errorf("NodeFor the reserving pod: free %v, want its own 0,1 and 4-7", got.Indices())
		}
		if got := v.NodeFor("a", "uid-other").Free(); got != topology.MaskOf(4, 5, 6, 7) {
			t.Errorf("NodeFor another pod: free %v, want 4-7", got.Indices())
		}
		// A bound holding is not handed back: the pod is not retrying.
		if got := v.NodeFor("a", "uid-q").Free(); got != topology.MaskOf(4, 5, 6, 7) {
			t.Errorf("NodeFor a bound pod: free %v, want 4-7", got.Indices())
		}
		if got := v.NodeFor("b", "uid-p").Free(); got.Count() != 8 {
			t.Errorf("NodeFor another node: %d free, want 8", got.Count())
		}
		if v.NodeFor("missing", "uid-p") != nil {
			t.Error("NodeFor an unknown node is not nil")
		}
		nodes := v.Lookup("uid-p", []string{"b", "a"}, nil)
		if nodes[0].Free().Count() != 8 || nodes[1].Free() != topology.MaskOf(0, 1, 4, 5, 6, 7) {
			t.Errorf("Lookup for the reserving pod: b %v, a %v", nodes[0].Free().Indices(), nodes[1].Free().Indices())
		}
		if got := v.Lookup("", []string{"a"}, nil)[0].Free(); got != topology.MaskOf(4, 5, 6, 7) {
			t.Errorf("Lookup for no pod: free %v, want 4-7", got.Indices())
		}
	})
	if got := free(l, "a"); got != topology.MaskOf(4, 5, 6, 7) {
		t.Fatalf("NodeFor changed the ledger: free %v", got.Indices())
	}
	// Confirmed: the holding is the pod's GPUs, no longer handed back.
	l.Confirm("uid-p", "a", []string{machine.FixtureUUID("a", 0), machine.FixtureUUID("a", 1)})
	l.Read(func(v ledger.View) {
		if got := v.NodeFor("a", "uid-p").Free(); got != topology.MaskOf(4, 5, 6, 7) {
			t.Errorf("NodeFor after Confirm: free %v, want 4-7", got.Indices())
		}
	})
}

// A rebuild lists pods while the watch keeps delivering: a pod deleted
// after the list was taken, and before its stale copy reaches the ledger,
// must not hold its GPUs again.
func TestAStaleCopyOfADeletedPodDoesNotHoldGPUsAgain(t *testing.T) {
	l := ledger.New(ledger.Options{Resource: v1alpha1.ResourceGPU})
	f, _ := machine.FixtureByName("dgx-a100")
	l.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Status: f.Graph("n").Status()})
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-p",
			Annotations: map[string]string{v1alpha1.AnnotationAssignedGPUs: machine.FixtureUUID("n", 0)}},
		Spec: corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Limits: corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1")}}}}},
	}
	stale := p.DeepCopy()
	l.UpsertPod(p)
	l.DeletePod(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, p.UID)
	l.UpsertPod(stale) // the rebuild's copy, listed before the delete
	if h := l.Report().Holdings(); len(h) != 0 {
		t.Errorf("holdings after a stale copy of a deleted pod = %+v, want none", h)
	}
	finished := p.DeepCopy()
	finished.UID = "uid-q"
	l.UpsertPod(finished)
	finished.Status.Phase = corev1.PodSucceeded
	l.UpsertPod(finished)
	running := finished.DeepCopy()
	running.Status.Phase = corev1.PodRunning
	l.UpsertPod(running) // a stale copy from before it finished
	if h := l.Report().Holdings(); len(h) != 0 {
		t.Errorf("holdings after a stale copy of a finished pod = %+v, want none", h)
	}
}
