package ledger_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// fixtureTopology is node's NodeGPUTopology of a fixture machine, observed
// now, as the node agent publishes it.
func fixtureTopology(t testing.TB, fixture, node string) *v1alpha1.NodeGPUTopology {
	t.Helper()
	f, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	st := f.Graph(node).Status()
	st.ObservedTime = metav1.NewTime(now)
	return &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: st}
}

// kubeletNode is a Node as kubelet reports it; capacity < 0 leaves the
// resource out of status.capacity, allocatable < 0 out of allocatable.
func kubeletNode(name string, capacity, allocatable int64) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if capacity >= 0 {
		n.Status.Capacity = corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(capacity, resource.DecimalSI)}
	}
	if allocatable >= 0 {
		n.Status.Allocatable = corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(allocatable, resource.DecimalSI)}
	}
	return n
}

// judged is a node's state and untrusted reason in l now.
func judged(l *ledger.Ledger, node string) (ledger.TopoState, string) {
	var st ledger.TopoState
	var reason string
	l.Read(func(v ledger.View) {
		n := v.Node(node)
		st = n.State(ledger.NewFreshWindow(now, 0))
		if n != nil {
			reason = n.UntrustedReason()
		}
	})
	return st, reason
}

func TestTopologyTrustAgainstTheNodesGPUCounts(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		capacity, allocatable int64 // -1: not reported
		unhealthy             []int // GPUs the topology marks unhealthy
		wantReason            string
	}{
		{name: "agreeing Node is trusted", capacity: 8, allocatable: 8},
		{name: "Node reporting no GPU capacity is not checked", capacity: -1, allocatable: 4},
		{name: "Node reporting neither is not checked", capacity: -1, allocatable: -1},
		{name: "fewer healthy GPUs than allocatable is trusted (kubelet has not seen a GPU fail yet)", capacity: 8, allocatable: 8, unhealthy: []int{3}},
		{name: "an unhealthy GPU kubelet counts out too is trusted", capacity: 8, allocatable: 7, unhealthy: []int{3}},
		{name: "more GPUs than capacity is untrusted", capacity: 4, allocatable: 4,
			wantReason: "node's NodeGPUTopology lists 8 GPUs but the Node advertises capacity 4 nvidia.com/gpu; the topology is not trusted until they agree; check the gputopo node agent on this node"},
		{name: "fewer GPUs than capacity is untrusted", capacity: 16, allocatable: 16,
			wantReason: "lists 8 GPUs but the Node advertises capacity 16 nvidia.com/gpu"},
		{name: "more healthy GPUs than allocatable is untrusted", capacity: 8, allocatable: 6, unhealthy: []int{0},
			wantReason: "node's NodeGPUTopology lists 7 healthy GPUs but the Node advertises 6 allocatable nvidia.com/gpu; the topology is not trusted until they agree"},
		{name: "capacity without allocatable counts as none allocatable", capacity: 8, allocatable: -1,
			wantReason: "lists 8 healthy GPUs but the Node advertises 0 allocatable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := ledger.New(ledger.Options{Clock: func() time.Time { return now }})
			o := fixtureTopology(t, "dgx-a100", "a")
			for _, i := range tc.unhealthy {
				o.Status.GPUs[i].Health = v1alpha1.GPUUnhealthy
			}
			l.UpsertTopology(o)
			l.UpsertNode(kubeletNode("a", tc.capacity, tc.allocatable))
			st, reason := judged(l, "a")
			if tc.wantReason == "" {
				if st != ledger.TopoFresh || reason != "" {
					t.Fatalf("state %s, reason %q; want fresh, trusted", st, reason)
				}
				return
			}
			if st != ledger.TopoUntrusted || !strings.Contains(reason, tc.wantReason) {
				t.Fatalf("state %s, reason %q; want untrusted, reason containing %q", st, reason, tc.wantReason)
			}
			if got := l.Report().TopologyStates(now, 0)[ledger.TopologyUntrusted]; got != 1 {
				t.Errorf("TopologyStates counts %d untrusted, want 1", got)
			}
		})
	}
}

func TestTopologyTrustFollowsEitherSideUntilTheyAgree(t *testing.T) {
	l := newLedger(t, "a")
	l.UpsertNode(kubeletNode("a", 4, 4))
	if st, _ := judged(l, "a"); st != ledger.TopoUntrusted {
		t.Fatalf("8-GPU topology on a 4-GPU Node: %s, want untrusted", st)
	}
	// kubelet catches up with the device plugin.
	l.UpsertNode(kubeletNode("a", 8, 8))
	if st, r := judged(l, "a"); st != ledger.TopoFresh {
		t.Fatalf("after the Node agrees: %s (%s), want fresh", st, r)
	}
	// A topology republished with one GPU fewer (a GPU lost, the agent
	// restarted) disagrees until kubelet re-registers the devices.
	o := fixtureTopology(t, "dgx-a100", "a")
	o.Status.GPUs, o.Status.Links = o.Status.GPUs[:4], nil
	for _, k := range fixtureTopology(t, "dgx-a100", "a").Status.Links {
		if k.B < 4 {
			o.Status.Links = append(o.Status.Links, k)
		}
	}
	l.UpsertTopology(o)
	if st, r := judged(l, "a"); st != ledger.TopoUntrusted || !strings.Contains(r, "lists 4 GPUs but the Node advertises capacity 8") {
		t.Fatalf("4-GPU topology on an 8-GPU Node: %s (%q), want untrusted", st, r)
	}
	l.UpsertNode(kubeletNode("a", 4, 4))
	if st, r := judged(l, "a"); st != ledger.TopoFresh {
		t.Fatalf("after both say 4: %s (%s), want fresh", st, r)
	}
	// A deleted Node leaves a topology without counts to check.
	l.UpsertNode(kubeletNode("a", 2, 2))
	l.DeleteNode("a")
	if st, r := judged(l, "a"); st != ledger.TopoFresh {
		t.Fatalf("after the Node is deleted: %s (%s), want fresh", st, r)
	}
}

func TestGPUClaimedByTwoNodesDistrustsTheLaterClaim(t *testing.T) {
	honest := fixtureTopology(t, "dgx-a100", "honest")
	// copied lists the honest node's GPU 2 as its own GPU 2.
	copied := func() *v1alpha1.NodeGPUTopology {
		o := fixtureTopology(t, "dgx-a100", "liar")
		o.Status.GPUs[2].UUID = honest.Status.GPUs[2].UUID
		return o
	}
	stolen := honest.Status.GPUs[2].UUID

	t.Run("a copy published after the initial list is the liar's; the honest node keeps working", func(t *testing.T) {
		l := ledger.New(ledger.Options{})
		l.UpsertTopology(honest)
		l.TopologiesListed()
		l.UpsertTopology(copied())
		if st, r := judged(l, "honest"); st != ledger.TopoFresh {
			t.Errorf("honest: %s (%s), want fresh", st, r)
		}
		st, r := judged(l, "liar")
		want := "node's NodeGPUTopology lists GPU " + stolen + ", which node honest's NodeGPUTopology listed first; the topology is not trusted while both list it"
		if st != ledger.TopoUntrusted || !strings.Contains(r, want) {
			t.Errorf("liar: %s (%q), want untrusted containing %q", st, r, want)
		}
		if got := l.Report().DuplicateGPUs(); got != 1 {
			t.Errorf("DuplicateGPUs = %d, want 1", got)
		}
		// Telemetry rounds (each a new object with the same GPUs) do not
		// make the claim new again, nor forget it.
		for range 2 {
			l.UpsertTopology(fixtureTopology(t, "dgx-a100", "honest"))
			l.UpsertTopology(copied())
		}
		if st, _ := judged(l, "honest"); st != ledger.TopoFresh {
			t.Errorf("honest after more rounds: %s, want fresh", st)
		}
		if st, r := judged(l, "liar"); st != ledger.TopoUntrusted || !strings.Contains(r, want) || l.Report().DuplicateGPUs() != 1 {
			t.Errorf("liar after more rounds: %s (%q), %d duplicates; want untrusted, 1", st, r, l.Report().DuplicateGPUs())
		}
		// The liar stops listing the GPU: both are trusted, nothing shared.
		l.UpsertTopology(fixtureTopology(t, "dgx-a100", "liar"))
		if st, r := judged(l, "liar"); st != ledger.TopoFresh || l.Report().DuplicateGPUs() != 0 {
			t.Errorf("liar without the copy: %s (%s), %d duplicates; want fresh, 0", st, r, l.Report().DuplicateGPUs())
		}
	})
	t.Run("both claims in the initial list have no order: both are kept and counted", func(t *testing.T) {
		l := ledger.New(ledger.Options{})
		l.UpsertTopology(copied())
		l.UpsertTopology(honest)
		l.TopologiesListed()
		for _, n := range []string{"honest", "liar"} {
			if st, r := judged(l, n); st != ledger.TopoFresh {
				t.Errorf("%s: %s (%s), want fresh", n, st, r)
			}
		}
		if got := l.Report().DuplicateGPUs(); got != 1 {
			t.Errorf("DuplicateGPUs = %d, want 1", got)
		}
	})
	t.Run("a claim after the initial list is later than one in it", func(t *testing.T) {
		l := ledger.New(ledger.Options{})
		l.UpsertTopology(copied())
		l.TopologiesListed()
		l.UpsertTopology(honest)
		if st, _ := judged(l, "liar"); st != ledger.TopoFresh {
			t.Errorf("liar, listed first: %s, want fresh", st)
		}
		if st, r := judged(l, "honest"); st != ledger.TopoUntrusted || !strings.Contains(r, "which node liar's NodeGPUTopology listed first") {
			t.Errorf("honest, listed later: %s (%q), want untrusted naming liar", st, r)
		}
	})
	t.Run("the first claim going away leaves the other trusted", func(t *testing.T) {
		l := ledger.New(ledger.Options{})
		l.TopologiesListed()
		l.UpsertTopology(honest)
		l.UpsertTopology(copied())
		l.DeleteTopology("honest")
		if st, r := judged(l, "liar"); st != ledger.TopoFresh || l.Report().DuplicateGPUs() != 0 {
			t.Errorf("liar alone: %s (%s), %d duplicates; want fresh, 0", st, r, l.Report().DuplicateGPUs())
		}
	})
	t.Run("an invalid topology claims nothing", func(t *testing.T) {
		l := ledger.New(ledger.Options{})
		l.TopologiesListed()
		l.UpsertTopology(honest)
		bad := copied()
		bad.Status.Links = bad.Status.Links[:3]
		l.UpsertTopology(bad)
		if st, _ := judged(l, "liar"); st != ledger.TopoInvalid || l.Report().DuplicateGPUs() != 0 {
			t.Errorf("invalid copy: %s, %d duplicates; want invalid, 0", st, l.Report().DuplicateGPUs())
		}
		if st, _ := judged(l, "honest"); st != ledger.TopoFresh {
			t.Errorf("honest: %s, want fresh", st)
		}
	})
	t.Run("without TopologiesListed (a simulation) no claim is ordered", func(t *testing.T) {
		l := ledger.New(ledger.Options{})
		l.UpsertTopology(honest)
		l.UpsertTopology(copied())
		if st, _ := judged(l, "liar"); st != ledger.TopoFresh {
			t.Errorf("liar: %s, want fresh", st)
		}
	})
}

// TestLinksRepublishedUnderTheOldHashRebuildTheGraph: the graph follows
// the links and GPUs published, whatever topologyHash the object carries.
func TestLinksRepublishedUnderTheOldHashRebuildTheGraph(t *testing.T) {
	l := newLedger(t, "a")
	var before *topology.Graph
	var oldHash string
	l.Read(func(v ledger.View) { before = v.Node("a").Graph(); oldHash = before.Hash() })
	if bw := before.Bandwidth(0, 1); bw != 600 {
		t.Fatalf("dgx-a100 GPU 0-1: %d GB/s, want 600", bw)
	}

	// A telemetry round: same GPUs and links, the same graph, holding the
	// new object's GPU list (the cache's older copy can go).
	o := fixtureTopology(t, "dgx-a100", "a")
	o.Status.Telemetry = []v1alpha1.Telemetry{{Index: 0, UtilizationPercent: 50}}
	l.UpsertTopology(o)
	l.Read(func(v ledger.View) {
		after := v.Node("a").Graph()
		if !reflect.DeepEqual(after.Status(), before.Status()) {
			t.Errorf("a telemetry round changed the graph: %+v", after.Status())
		}
		if gpusOf(after) != &o.Status.GPUs[0] {
			t.Error("after a telemetry round the graph holds an older copy of the GPU list")
		}
	})

	// The links change (an NVSwitch tray lost), the stored hash does not.
	o = fixtureTopology(t, "dgx-a100", "a")
	for i := range o.Status.Links {
		k := &o.Status.Links[i]
		if k.A == 0 || k.B == 0 {
			k.NVLinks, k.NVSwitch, k.BandwidthGBps = 0, false, 32
		}
	}
	if o.Status.TopologyHash != oldHash {
		t.Fatalf("fixture hash %q, want the old %q", o.Status.TopologyHash, oldHash)
	}
	l.UpsertTopology(o)
	l.Read(func(v ledger.View) {
		g := v.Node("a").Graph()
		if g == before || g.Bandwidth(0, 1) != 32 || g.NVLinked(0, 1) || g.Hash() == oldHash {
			t.Errorf("after the links changed under the old hash: GPU 0-1 %d GB/s (NVLink %v), hash %s; want the new graph: 32 GB/s, no NVLink, a new hash",
				g.Bandwidth(0, 1), g.NVLinked(0, 1), g.Hash())
		}
		if v.Node("a").Topo().Pristine().Bandwidth(0, 1) != 32 {
			t.Error("the shared machine entry is the old machine's")
		}
	})

	// GPU facts too: memory changed under the old hash.
	o = fixtureTopology(t, "dgx-a100", "a")
	o.Status.GPUs[5].MemoryMiB = 81920
	l.UpsertTopology(o)
	l.Read(func(v ledger.View) {
		if got := v.Node("a").Graph().GPUs()[5].MemoryMiB; got != 81920 {
			t.Errorf("GPU 5 memory %d MiB after republishing, want 81920", got)
		}
	})

	// And back: the original links again give the original machine.
	l.UpsertTopology(fixtureTopology(t, "dgx-a100", "a"))
	l.Read(func(v ledger.View) {
		if g := v.Node("a").Graph(); g.Hash() != oldHash || g.Bandwidth(0, 1) != 600 {
			t.Errorf("after republishing the original: hash %s, GPU 0-1 %d GB/s; want %s, 600", g.Hash(), g.Bandwidth(0, 1), oldHash)
		}
	})
}

// gpusOf is the first element of the GPU list a graph holds.
func gpusOf(g *topology.Graph) *v1alpha1.GPU {
	return (*v1alpha1.GPU)(reflect.ValueOf(g).Elem().FieldByName("gpus").UnsafePointer())
}
