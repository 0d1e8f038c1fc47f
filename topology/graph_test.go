package topology_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
	"github.com/gputopo/gputopo/topology/machine"
)

func threeGPUs() ([]v1alpha1.GPU, []v1alpha1.Link) {
	gpus := []v1alpha1.GPU{
		{Index: 0, UUID: "GPU-a", MemoryMiB: 1024, Health: v1alpha1.GPUHealthy},
		{Index: 1, UUID: "GPU-b", MemoryMiB: 1024},
		{Index: 2, UUID: "GPU-c", MemoryMiB: 1024, NUMANode: 1},
	}
	links := []v1alpha1.Link{
		{A: 0, B: 1, NVLinks: 2, PCIe: v1alpha1.PCIeSameSwitch, P2P: true, BandwidthGBps: 100},
		{A: 0, B: 2, PCIe: v1alpha1.PCIeCrossSocket, BandwidthGBps: 10},
		{A: 1, B: 2, PCIe: v1alpha1.PCIeCrossSocket, BandwidthGBps: 10},
	}
	return gpus, links
}

func TestNewGraphRejectsBadInputNamingTheEntry(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link)
		want   []string
	}{
		{"duplicate index", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			g[2].Index = 1
			return g, l
		}, []string{"gpus[2].index: 1 is also used by gpus[1]"}},
		{"index out of range", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			g[2].Index = 3
			return g, l
		}, []string{"gpus[2].index: 3 is out of range; indices must be 0..2"}},
		{"duplicate uuid", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			g[1].UUID = "GPU-a"
			return g, l
		}, []string{`gpus[1].uuid: "GPU-a" is also the UUID of GPU 0`}},
		{"empty uuid", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			g[1].UUID = ""
			return g, l
		}, []string{"gpus[1].uuid: must not be empty"}},
		{"bad health", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			g[0].Health = "Sick"
			return g, l
		}, []string{`gpus[0].health: "Sick" is not one of`}},
		{"negative memory", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			g[0].MemoryMiB = -1
			return g, l
		}, []string{"gpus[0].memoryMiB: -1 must not be negative"}},
		{"link to missing GPU", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[2].B = 7
			return g, l
		}, []string{"links[2]: GPU 1-GPU 7 names a GPU that does not exist", "no link between GPU 1 and GPU 2"}},
		{"self link", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[2].A = 2
			return g, l
		}, []string{"links[2]: links GPU 2 to itself"}},
		{"asymmetric links", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			return g, append(l, v1alpha1.Link{A: 1, B: 0, PCIe: v1alpha1.PCIeSameSwitch, BandwidthGBps: 64})
		}, []string{"links[3]: GPU 0-GPU 1 describes the same pair in the other direction as links[0]"}},
		{"duplicate link", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			return g, append(l, l[0])
		}, []string{"links[3]: GPU 0-GPU 1 describes the same pair as links[0]"}},
		{"missing link", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			return g, l[:2]
		}, []string{"links: no link between GPU 1 and GPU 2"}},
		{"negative bandwidth and nvlinks", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[0].BandwidthGBps, l[1].NVLinks = -5, -1
			return g, l
		}, []string{"links[0].bandwidthGBps: -5 must not be negative", "links[1].nvlinks: -1 must not be negative"}},
		{"unknown PCIe level", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[1].PCIe = "Nearby"
			return g, l
		}, []string{`links[1].pcie: "Nearby" is not a known PCIe level`}},
		{"NVSwitch without NVLinks", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[1].NVSwitch = true
			return g, l
		}, []string{"links[1].nvswitch: set but nvlinks is 0"}},
		{"NVLinked pair at 0 GB/s", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[0].BandwidthGBps = 0
			return g, l
		}, []string{"links[0].bandwidthGBps: 0 with 2 NVLinks; an NVLinked pair needs its bandwidth"}},
		{"PCIe pair claiming NVSwitch bandwidth", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[2].BandwidthGBps = 900
			return g, l
		}, []string{"links[2].bandwidthGBps: 900; a PCIe link carries at most 256 GB/s"}},
		{"pair above the ceiling", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[0].BandwidthGBps = topology.MaxPairGBps + 1
			return g, l
		}, []string{"links[0].bandwidthGBps: 2001; a GPU pair carries at most 2000 GB/s"}},
		{"MaxInt bandwidth on a PCIe pair names the ceiling once", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[1].BandwidthGBps = int(^uint(0) >> 1)
			return g, l
		}, []string{"links[1].bandwidthGBps: 9223372036854775807; a GPU pair carries at most 2000 GB/s"}},
		{"more NVLinks than a GPU has", func(g []v1alpha1.GPU, l []v1alpha1.Link) ([]v1alpha1.GPU, []v1alpha1.Link) {
			l[0].NVLinks = 1 << 40
			return g, l
		}, []string{"links[0].nvlinks: 1099511627776; a GPU has at most 36 NVLinks"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := topology.NewGraph(tc.mutate(threeGPUs()))
			if err == nil {
				t.Fatalf("got a graph of %d GPUs; want an error", g.Len())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// The ceilings themselves are accepted: a PCIe Gen6 x16 pair at 256 GB/s
// and an NVLinked pair at 2,000 GB/s are real (or nearly real) machines.
func TestNewGraphAcceptsLinksAtTheCeilings(t *testing.T) {
	gpus, links := threeGPUs()
	links[0].BandwidthGBps = topology.MaxPairGBps
	links[0].NVLinks = topology.MaxNVLinks
	links[1].BandwidthGBps = topology.MaxPCIeGBps
	g, err := topology.NewGraph(gpus, links)
	if err != nil {
		t.Fatalf("links at the ceilings refused: %v", err)
	}
	if got := g.Bandwidth(0, 1); got != topology.MaxPairGBps {
		t.Errorf("Bandwidth(0, 1) = %d, want %d", got, topology.MaxPairGBps)
	}
}

func TestNewGraphRejectsTooManyGPUs(t *testing.T) {
	gpus := make([]v1alpha1.GPU, topology.MaxGPUs+1)
	if _, err := topology.NewGraph(gpus, nil); err == nil || !strings.Contains(err.Error(), "at most 128") {
		t.Errorf("got %v; want an error naming the limit", err)
	}
}

func TestNewGraphNormalisesOrderAndDirection(t *testing.T) {
	gpus, links := threeGPUs()
	gpus[0], gpus[2] = gpus[2], gpus[0]
	links[0].A, links[0].B = 1, 0
	g, err := topology.NewGraph(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	wantGPUs, wantLinks := threeGPUs()
	if diff := cmp.Diff(v1alpha1.NodeGPUTopologyStatus{GPUs: wantGPUs, Links: wantLinks, TopologyHash: g.Hash()}, g.Status()); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
	if !g.NVLinked(1, 0) || g.NVLinked(0, 2) || g.Bandwidth(1, 0) != 100 || g.Bandwidth(2, 0) != 10 {
		t.Errorf("links are not symmetric: %+v %+v", g.Link(1, 0), g.Link(2, 0))
	}
	if g.Bandwidth(0, 0) != 0 || g.Bandwidth(0, 9) != 0 || g.NVLinked(-1, 0) || g.Link(0, 3) != (v1alpha1.Link{}) {
		t.Error("out-of-range pairs must read as no link")
	}
	if i, ok := g.IndexOf("GPU-c"); !ok || i != 2 {
		t.Errorf("IndexOf(GPU-c) = %d, %t", i, ok)
	}
	if _, ok := g.IndexOf("GPU-z"); ok {
		t.Error("IndexOf(unknown) found something")
	}
}

func TestEmptyGraphIsValid(t *testing.T) {
	g, err := topology.NewGraph(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.Len() != 0 || !g.All().Empty() {
		t.Errorf("len %d all %s", g.Len(), g.All())
	}
	if _, err := allocator.New(4).Allocate(g, topology.FirstN(topology.MaxGPUs), topology.Request{Count: 1}); err == nil {
		t.Error("allocating on a node with no GPUs must fail")
	}
}

func TestStatusRoundTripsThroughJSON(t *testing.T) {
	for _, f := range machine.Fixtures() {
		g := f.Graph("node-a")
		data, err := json.Marshal(g.Status())
		if err != nil {
			t.Fatal(err)
		}
		var st v1alpha1.NodeGPUTopologyStatus
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		back, err := topology.FromStatus(&st)
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		if diff := cmp.Diff(g.Status(), back.Status()); diff != "" {
			t.Errorf("%s: round trip (-want +got):\n%s", f.Name, diff)
		}
	}
	if _, err := topology.FromStatus(nil); err == nil {
		t.Error("FromStatus(nil): want an error")
	}
}

func TestHashIgnoresUUIDsHealthAndTelemetryButNotLinks(t *testing.T) {
	f := FixturesMust(t, "dgx1-v100")
	a, b := f.Graph("node-a"), f.Graph("node-b")
	if a.Hash() != b.Hash() {
		t.Error("identical machines must share a hash")
	}
	if a.GPUs()[0].UUID == b.GPUs()[0].UUID {
		t.Error("different nodes must have different UUIDs")
	}
	gpus, links := f.Parts("node-a")
	gpus[3].Health, gpus[3].HealthReason = v1alpha1.GPUUnhealthy, "XID 48"
	sick, err := topology.NewGraph(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	if sick.Hash() != a.Hash() || sick.Healthy() != a.All().Minus(topology.MaskOf(3)) {
		t.Errorf("health changed the hash or Healthy() is wrong: %s", sick.Healthy())
	}
	links[5].BandwidthGBps++
	changed, err := topology.NewGraph(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Hash() == a.Hash() {
		t.Error("a different link must change the hash")
	}
}

func TestMaskHelpers(t *testing.T) {
	m := topology.MaskOf(5, 0, 63, 5, 64, 127, 128, -1)
	if diff := cmp.Diff([]int{0, 5, 63, 64, 127}, m.Indices()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if m.Count() != 5 || !m.Has(63) || !m.Has(64) || m.Has(1) || m.Has(128) || m.Has(-1) || m.String() != "{0,5,63,64,127}" {
		t.Errorf("count %d string %s", m.Count(), m)
	}
	o := topology.MaskOf(0, 64, 100)
	for _, tc := range []struct {
		name      string
		got, want topology.Mask
	}{
		{"union", m.Union(o), topology.MaskOf(0, 5, 63, 64, 100, 127)},
		{"intersect", m.Intersect(o), topology.MaskOf(0, 64)},
		{"minus", m.Minus(o), topology.MaskOf(5, 63, 127)},
		{"with", o.With(65).With(200), topology.MaskOf(0, 64, 65, 100)},
		{"first 70", topology.FirstN(70), topology.MaskOf(func() []int {
			var idx []int
			for i := range 70 {
				idx = append(idx, i)
			}
			return idx
		}()...)},
		{"first 0", topology.FirstN(0), topology.Mask{}},
	} {
		if !tc.got.Equal(tc.want) {
			t.Errorf("%s: got %s; want %s", tc.name, tc.got, tc.want)
		}
	}
	if !(topology.Mask{}).Empty() || m.Empty() || topology.FirstN(topology.MaxGPUs).Count() != topology.MaxGPUs {
		t.Error("Empty or topology.FirstN(topology.MaxGPUs) is wrong")
	}
}

func TestRingMatchesEveryPermutation(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	levels := []int{10, 20, 40, 50, 100}
	for trial := 0; trial < 200; trial++ {
		n := 3 + rng.IntN(6)
		gpus := make([]v1alpha1.GPU, n)
		var links []v1alpha1.Link
		for i := range gpus {
			gpus[i] = v1alpha1.GPU{Index: i, UUID: machine.FixtureUUID("r", i)}
			for j := i + 1; j < n; j++ {
				links = append(links, v1alpha1.Link{A: i, B: j, PCIe: v1alpha1.PCIeSameNUMA, BandwidthGBps: levels[rng.IntN(len(levels))]})
			}
		}
		g, err := topology.NewGraph(gpus, links)
		if err != nil {
			t.Fatal(err)
		}
		set := g.All().Bitset()
		got, order := g.Ring(set)
		want := 0
		permute(set.Indices(), 1, func(p []int) {
			want = max(want, ringOf(g, p))
		})
		if got != want || ringOf(g, order) != got || topology.MaskOf(order...) != set.Mask() || order[0] != 0 {
			t.Fatalf("trial %d: ring %d order %v (its ring %d); want %d", trial, got, order, ringOf(g, order), want)
		}
	}
}

func ringOf(g *topology.Graph, order []int) int {
	m := int(^uint(0) >> 1)
	for i, a := range order {
		m = min(m, g.Bandwidth(a, order[(i+1)%len(order)]))
	}
	return m
}

// permute calls f with every order of p[from:] (p[0] fixed).
func permute(p []int, from int, f func([]int)) {
	if from == len(p) {
		f(p)
		return
	}
	for i := from; i < len(p); i++ {
		p[from], p[i] = p[i], p[from]
		permute(p, from+1, f)
		p[from], p[i] = p[i], p[from]
	}
}

func TestMetricsOfASet(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	got := g.Metrics(topology.MaskOf(0, 3), g.All())
	want := topology.SetMetrics{MinPairGBps: 100, RingGBps: 100, SumGBps: 100, DomainsCrossed: 3, Tier: v1alpha1.TierNVLink,
		LeftLargestIsland: 4, LeftNVLinkPairs: 9, LeftNVLinkQuads: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	pcie := mustFixture(t, "pcie-8x")
	if m := pcie.Metrics(topology.MaskOf(0, 1), pcie.All()); m.DomainsCrossed != 0 || m.Tier != v1alpha1.TierPCIeSwitch {
		t.Errorf("same switch: %+v", m)
	}
	if m := pcie.Metrics(topology.MaskOf(0, 4), pcie.All()); m.Tier != v1alpha1.TierCrossSocket || m.MinPairGBps != 20 {
		t.Errorf("cross socket: %+v", m)
	}
	if m := pcie.Metrics(topology.MaskOf(2), pcie.All()); m.Tier != v1alpha1.TierSingleGPU || m.RingGBps != 0 {
		t.Errorf("one GPU: %+v", m)
	}
}

func TestGraphWithMoreThanMaxGPUsIsRefusedNamingCountAndLimit(t *testing.T) {
	gpus := machine.SyntheticGPUs("big", topology.MaxGPUs+1)
	want := []string{"gpus: 129 GPUs listed", "at most 128"}
	_, err := topology.NewGraph(gpus, nil)
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("NewGraph: got %v; want an error containing %q", err, w)
		}
	}
	_, err = topology.FromStatus(&v1alpha1.NodeGPUTopologyStatus{GPUs: gpus})
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("FromStatus: got %v; want an error containing %q", err, w)
		}
	}
	if _, err := topology.NewGraph(machine.SyntheticGPUs("max", topology.MaxGPUs), nil); err == nil || strings.Contains(err.Error(), "at most") {
		t.Errorf("%d GPUs without links: got %v; want only missing-link errors", topology.MaxGPUs, err)
	}
}

// Domain numbers the PCIe switches and NUMA nodes as the fixture lays
// them out, and answers -1 out of range.
func TestDomainNumbersSwitchesAndNUMANodes(t *testing.T) {
	f, err := machine.FixtureByName("pcie-8x")
	if err != nil {
		t.Fatal(err)
	}
	g := f.Graph("n")
	numa := topology.DomainLevels - 1
	for i := 0; i < g.Len(); i++ {
		if got, want := g.Domain(0, i) == g.Domain(0, i^1), true; got != want {
			t.Errorf("GPU %d and %d: same switch %t, want %t", i, i^1, got, want)
		}
		if g.Domain(0, i) == g.Domain(0, (i+2)%8) {
			t.Errorf("GPU %d and %d share a switch; they do not", i, (i+2)%8)
		}
		if got, want := g.Domain(numa, i) == g.Domain(numa, 0), i < 4; got != want {
			t.Errorf("GPU %d: NUMA node of GPU 0 %t, want %t", i, got, want)
		}
	}
	for _, c := range [][2]int{{-1, 0}, {topology.DomainLevels, 0}, {0, -1}, {0, 8}} {
		if got := g.Domain(c[0], c[1]); got != -1 {
			t.Errorf("Domain(%d, %d) = %d, want -1", c[0], c[1], got)
		}
	}
}

// A graph sharing another machine's tables answers every question as its
// own would; a graph of another machine shares nothing.
func TestSharingTablesKeepsTheNodesOwnGPUs(t *testing.T) {
	for _, f := range machine.Fixtures() {
		t.Run(f.Name, func(t *testing.T) {
			gpus, links := f.Parts("node-a")
			gpus[len(gpus)-1].Health = v1alpha1.GPUUnhealthy
			a, err := topology.NewGraph(gpus, links)
			if err != nil {
				t.Fatal(err)
			}
			b := f.Graph("node-b")
			s := a.SharingTables(b)
			if s == a {
				t.Fatal("identical machines: SharingTables returned the graph unchanged")
			}
			if diff := cmp.Diff(a.Status(), s.Status()); diff != "" {
				t.Errorf("status (-own +shared):\n%s", diff)
			}
			if s.Healthy() != a.Healthy() || s.Hash() != a.Hash() {
				t.Errorf("healthy %s, want %s", s.Healthy(), a.Healthy())
			}
			if i, ok := s.IndexOf(a.GPU(0).UUID); !ok || i != 0 {
				t.Errorf("IndexOf(own GPU 0) = %d, %v", i, ok)
			}
			if _, ok := s.IndexOf(b.GPU(0).UUID); ok {
				t.Error("the shared graph knows the other node's UUIDs")
			}
			for x := range a.Len() {
				for lv := range topology.DomainLevels {
					if s.Domain(lv, x) != a.Domain(lv, x) {
						t.Errorf("Domain(%d, %d) = %d, want %d", lv, x, s.Domain(lv, x), a.Domain(lv, x))
					}
				}
				for y := range a.Len() {
					if s.Bandwidth(x, y) != a.Bandwidth(x, y) || s.NVLinked(x, y) != a.NVLinked(x, y) {
						t.Errorf("pair %d-%d: bandwidth %d nvlinked %t, want %d %t", x, y, s.Bandwidth(x, y), s.NVLinked(x, y), a.Bandwidth(x, y), a.NVLinked(x, y))
					}
				}
			}
			if m := s.Metrics(topology.Mask{}, s.Healthy()); m != a.Metrics(topology.Mask{}, a.Healthy()) {
				t.Errorf("metrics %+v, want %+v", m, a.Metrics(topology.Mask{}, a.Healthy()))
			}
		})
	}
	a, other := mustFixture(t, "dgx1-v100"), mustFixture(t, "dgx-a100")
	if a.SharingTables(other) != a || a.SharingTables(nil) != a {
		t.Error("a graph of another machine (or none) must not share tables")
	}
}

// A graph kept from a read-only status is the graph FromStatus builds,
// for GPUs listed in index order (kept as they are) or not (copied), on
// every machine and on one of 24 GPUs (past the size where UUIDs are
// scanned rather than mapped), and a duplicate UUID is still refused
// naming the GPU listed first.
func TestFromStatusKeepingIsFromStatus(t *testing.T) {
	statuses := map[string]func() v1alpha1.NodeGPUTopologyStatus{"24 GPUs": func() v1alpha1.NodeGPUTopologyStatus { return pcieStatus(24) }}
	for _, f := range machine.Fixtures() {
		statuses[f.Name] = func() v1alpha1.NodeGPUTopologyStatus { return f.Graph("node-a").Status() }
	}
	for name, status := range statuses {
		f := struct{ Name string }{name}
		for _, shuffled := range []bool{false, true} {
			st := status()
			if shuffled {
				rand.New(rand.NewPCG(1, 2)).Shuffle(len(st.GPUs), func(i, j int) { st.GPUs[i], st.GPUs[j] = st.GPUs[j], st.GPUs[i] })
			}
			before := append([]v1alpha1.GPU(nil), st.GPUs...)
			want, err := topology.FromStatus(&st)
			if err != nil {
				t.Fatal(err)
			}
			got, err := topology.FromStatusKeeping(&st)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want.Status(), got.Status()); diff != "" {
				t.Errorf("%s (shuffled %t): status (-FromStatus +Keeping):\n%s", f.Name, shuffled, diff)
			}
			if diff := cmp.Diff(before, st.GPUs); diff != "" {
				t.Errorf("%s (shuffled %t): the status's GPUs changed:\n%s", f.Name, shuffled, diff)
			}
			for i := range got.Len() {
				if j, ok := got.IndexOf(got.GPU(i).UUID); !ok || j != i || got.GPU(i).Index != i {
					t.Errorf("%s (shuffled %t): IndexOf(GPU %d) = %d, %t", f.Name, shuffled, i, j, ok)
				}
			}
		}
		st := status()
		st.GPUs[len(st.GPUs)-1].UUID = st.GPUs[0].UUID
		_, err := topology.FromStatusKeeping(&st)
		if want := "is also the UUID of GPU 0"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: a duplicate UUID: %v, want %q", f.Name, err, want)
		}
	}
}

// pcieStatus is a machine of n GPUs on PCIe only, across sockets.
func pcieStatus(n int) v1alpha1.NodeGPUTopologyStatus {
	var st v1alpha1.NodeGPUTopologyStatus
	for i := range n {
		st.GPUs = append(st.GPUs, v1alpha1.GPU{Index: i, UUID: fmt.Sprintf("GPU-w%02d", i), MemoryMiB: 1024})
		for j := i + 1; j < n; j++ {
			st.Links = append(st.Links, v1alpha1.Link{A: i, B: j, PCIe: v1alpha1.PCIeCrossSocket, BandwidthGBps: 20})
		}
	}
	return st
}

// A graph rebased on a newer copy of its GPU list is the same graph; on
// another list it is left as it is. On every machine and one of 24 GPUs
// (whose UUIDs are mapped).
func TestRebasedKeepsTheGraphOnANewerCopyOnly(t *testing.T) {
	type machineOf struct {
		Name  string
		Graph func(node string) *topology.Graph
	}
	wide := machineOf{"24 GPUs", func(node string) *topology.Graph {
		st := pcieStatus(24)
		for i := range st.GPUs {
			st.GPUs[i].UUID += "-" + node
		}
		g, err := topology.FromStatus(&st)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}}
	machines := []machineOf{wide}
	for _, f := range machine.Fixtures() {
		machines = append(machines, machineOf{f.Name, f.Graph})
	}
	for _, f := range machines {
		st := f.Graph("node-a").Status()
		g, err := topology.FromStatusKeeping(&st)
		if err != nil {
			t.Fatal(err)
		}
		again := f.Graph("node-a").Status().GPUs
		r := g.Rebased(again)
		if r == g {
			t.Errorf("%s: Rebased on an equal copy returned the graph unchanged", f.Name)
		}
		if diff := cmp.Diff(g.Status(), r.Status()); diff != "" {
			t.Errorf("%s: rebased status (-before +after):\n%s", f.Name, diff)
		}
		for i := range r.Len() {
			if j, ok := r.IndexOf(again[i].UUID); !ok || j != i {
				t.Errorf("%s: IndexOf(GPU %d) = %d, %t after Rebased", f.Name, i, j, ok)
			}
		}
		other := f.Graph("node-b").Status().GPUs
		healthier := f.Graph("node-a").Status().GPUs
		healthier[0].Health = v1alpha1.GPUUnhealthy
		for what, gpus := range map[string][]v1alpha1.GPU{"another node's": other, "a changed": healthier, "a shorter": again[1:], "its own": st.GPUs} {
			if g.Rebased(gpus) != g {
				t.Errorf("%s: Rebased on %s list changed the graph", f.Name, what)
			}
		}
	}
}
