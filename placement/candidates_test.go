package placement

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// mixedCore is an offline core over nodes of every fixture shape named,
// node i of shape shapes[i%len(shapes)]; gpusOf(i) is node i's
// allocatable (-1: its machine's GPU count), topology(i) whether it
// publishes a NodeGPUTopology.
func mixedCore(t *testing.T, shapes []string, n int, gpusOf func(i int) int, topology func(i int) bool) (*Core, []string) {
	t.Helper()
	x := offlineCore(t)
	var names []string
	for i := range n {
		f, err := machine.FixtureByName(shapes[i%len(shapes)])
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("node-%02d", i)
		names = append(names, name)
		g := f.Graph(name)
		count := gpusOf(i)
		if count < 0 {
			count = g.Len()
		}
		gpus := corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(int64(count), resource.DecimalSI)}
		x.ledger.UpsertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Capacity: gpus, Allocatable: gpus}})
		if topology(i) {
			st := g.Status()
			st.ObservedTime = metav1.NewTime(groupEpoch)
			x.ledger.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: st})
		}
	}
	return x, names
}

// TestCandidatesHoldEveryNodeFilterPasses: on a mixed fleet under a random
// load of bound pods, reservations, freed pods, an untrusted node and one
// without topology, the fit index's candidates for any pod hold every node
// filter passes (PreFilterResult may leave out only nodes that fail), are
// exactly filter's nodes for a pod that asks only a GPU count, and when
// the index finds none, filter passes none either.
func TestCandidatesHoldEveryNodeFilterPasses(t *testing.T) {
	shapes := []string{"dgx-a100", "dgx1-v100", "pcie-8x", "pcie-8x-nvlink-pairs", "dgx2", "gb200-nvl72-tray", "dgx1-p100"}
	x, names := mixedCore(t, shapes, 21,
		func(i int) int {
			if i == 3 {
				return 4 // lists 8 GPUs where kubelet counts 4: untrusted
			}
			return -1
		},
		func(i int) bool { return i != 5 })
	rng := rand.New(rand.NewPCG(7, 35))
	reqs := []string{"", `{"requireNVLink":true,"strategy":"highest_bandwidth"}`, `{"strategy":"numa_local"}`, `{"requireNVLink":true}`}
	var bound []*corev1.Pod
	narrowed := 0
	for step := range 300 {
		// Change the load: place a pod, reserve one without binding, or
		// delete a bound one.
		switch r := rng.IntN(10); {
		case r < 6:
			p := gpuPod(fmt.Sprintf("load-%d", step), 1+rng.IntN(8), reqAnn(reqs[rng.IntN(len(reqs))]))
			if n, _ := place(t, x, names, p); n != "" {
				bound = append(bound, p)
			}
		case r < 8:
			p := gpuPod(fmt.Sprintf("held-%d", step), 1+rng.IntN(4), map[string]string{})
			x.ledger.UpsertPod(p)
			pr := request(t, x, p)
			if ans, _ := x.Filter(context.Background(), pr, names); len(ans.Passed) > 0 {
				x.Reserve(context.Background(), pr, ans.Passed[rng.IntN(len(ans.Passed))])
			}
		case len(bound) > 0:
			i := rng.IntN(len(bound))
			x.ledger.DeletePod(types.NamespacedName{Namespace: bound[i].Namespace, Name: bound[i].Name}, bound[i].UID)
			bound = slices.Delete(bound, i, i+1)
		}

		count := 1 + rng.IntN(10)
		req := reqs[rng.IntN(len(reqs))]
		p := gpuPod(fmt.Sprintf("probe-%d", step), count, reqAnn(req))
		p.UID = types.UID(fmt.Sprintf("uid-probe-%d", step))
		pr := request(t, x, p)
		ans, err := x.Filter(context.Background(), pr, names)
		if err != nil {
			t.Fatal(err)
		}
		c := x.fits(pr, 1<<20)
		what := fmt.Sprintf("step %d: %d GPUs %s", step, count, req)
		switch {
		case c.Reason != "":
			if len(ans.Passed) > 0 {
				t.Fatalf("%s: candidates refuse the pod (%s) but filter passes %v", what, c.Reason, ans.Passed)
			}
			if !strings.HasPrefix(c.Reason, ReasonPrefix) || !strings.Contains(c.Reason, "kubectl gputopo explain -n ml "+p.Name) {
				t.Errorf("%s: reason %q, want gputopo's words and the explain command", what, c.Reason)
			}
			if c.Unresolvable != (len(ans.Unresolvable) == len(names)) {
				t.Errorf("%s: unresolvable %v, filter refuses %d of %d nodes as unresolvable", what, c.Unresolvable, len(ans.Unresolvable), len(names))
			}
		case c.Nodes == nil:
			if count <= 8 {
				t.Fatalf("%s: no candidate set for a pod the index counts", what)
			}
		default:
			for _, n := range ans.Passed {
				if !c.Nodes.Has(n) {
					t.Fatalf("%s: filter passes %s, candidates %v leave it out", what, n, sortedNames(c.Nodes))
				}
			}
			if req == "" && c.Nodes.Len() != len(ans.Passed) {
				t.Errorf("%s: candidates %v, filter passes %v; a count-only pod's should be the same", what, sortedNames(c.Nodes), ans.Passed)
			}
			if c.Nodes.Len() < len(names) {
				narrowed++
			}
		}
	}
	if narrowed < 50 {
		t.Errorf("the candidates narrowed the nodes for %d of 300 pods; the load never made the index matter", narrowed)
	}
}

// request is p's parsed request at x's time.
func request(t *testing.T, x *Core, p *corev1.Pod) Request {
	t.Helper()
	pr, err := ParseRequest(p, v1alpha1.ResourceGPU, x.Now())
	if err != nil {
		t.Fatal(err)
	}
	return pr
}

// reqAnn is the annotations of a pod with requirement req ("" none).
func reqAnn(req string) map[string]string {
	if req == "" {
		return map[string]string{}
	}
	return map[string]string{v1alpha1.AnnotationRequirement: req}
}

func sortedNames[T interface{ UnsortedList() []string }](s T) []string {
	l := s.UnsortedList()
	slices.Sort(l)
	return l
}

// A pod whose GPUs are reserved on a node finds that node among its
// candidates even when the reservation leaves it no other free GPU: its
// own GPUs count as free to it.
func TestCandidatesKeepThePodsOwnReservation(t *testing.T) {
	x, names := mixedCore(t, []string{"dgx-a100"}, 2, func(int) int { return -1 }, func(int) bool { return true })
	p := gpuPod("own", 8, map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true}`})
	x.ledger.UpsertPod(p)
	pr := request(t, x, p)
	other := gpuPod("other", 8, map[string]string{})
	if n, _ := place(t, x, names[1:], other); n != names[1] {
		t.Fatalf("other on %q, want %s", n, names[1])
	}
	if res := x.Reserve(context.Background(), pr, names[0]); res.Err != nil {
		t.Fatal(res.Err)
	}
	c := x.fits(pr, 1<<20)
	if c.Reason != "" || !c.Nodes.Has(names[0]) || c.Nodes.Len() != 1 {
		t.Fatalf("candidates %v (%q), want exactly %s, where the pod holds its reservation", c.Nodes, c.Reason, names[0])
	}
	// Another pod sees both nodes full, in words.
	q := gpuPod("late", 2, map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true}`})
	qr := request(t, x, q)
	c = x.fits(qr, 1<<20)
	if want := "no node has 2 free GPUs joined by NVLink; no node has a free GPU"; !strings.Contains(c.Reason, want) || c.Unresolvable {
		t.Fatalf("late: %q (unresolvable %v), want %q, resolvable", c.Reason, c.Unresolvable, want)
	}
}
