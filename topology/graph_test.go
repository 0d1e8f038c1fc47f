package topology

import (
	"encoding/json"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
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
			l[0].BandwidthGBps = MaxPairGBps + 1
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
			g, err := NewGraph(tc.mutate(threeGPUs()))
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
	links[0].BandwidthGBps = MaxPairGBps
	links[0].NVLinks = MaxNVLinks
	links[1].BandwidthGBps = MaxPCIeGBps
	g, err := NewGraph(gpus, links)
	if err != nil {
		t.Fatalf("links at the ceilings refused: %v", err)
	}
	if got := g.Bandwidth(0, 1); got != MaxPairGBps {
		t.Errorf("Bandwidth(0, 1) = %d, want %d", got, MaxPairGBps)
	}
}

// maxedGraph is n GPUs whose every pair claims the ceiling: the largest
// numbers the allocator and the metrics can ever be handed.
func maxedGraph(t testing.TB, n int) *Graph {
	t.Helper()
	gpus := make([]v1alpha1.GPU, n)
	var links []v1alpha1.Link
	for i := range gpus {
		gpus[i] = v1alpha1.GPU{Index: i, UUID: FixtureUUID("maxed", i), MemoryMiB: 1 << 40}
		for j := i + 1; j < n; j++ {
			links = append(links, v1alpha1.Link{A: i, B: j, NVLinks: MaxNVLinks, NVSwitch: true, P2P: true, PCIe: v1alpha1.PCIeCrossSocket, BandwidthGBps: MaxPairGBps})
		}
	}
	g, err := NewGraph(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// With every pair of a node at the ceiling, every sum the metrics and the
// objective form is exact: no overflow, no wrap to negative. 64 GPUs is
// the largest graph searched directly, MaxGPUs the largest searched
// through windows.
func TestSumsAtTheCeilingDoNotOverflow(t *testing.T) {
	for _, n := range []int{windowGPUs, MaxGPUs} {
		g := maxedGraph(t, n)
		all := g.All()
		pairs := n * (n - 1) / 2
		m := g.Metrics(all, all)
		if want := pairs * MaxPairGBps; m.SumGBps != want || m.MinPairGBps != MaxPairGBps || m.RingGBps != MaxPairGBps {
			t.Errorf("metrics of all %d GPUs: sum %d, min pair %d, ring %d; want %d, %d, %d", n, m.SumGBps, m.MinPairGBps, m.RingGBps, want, MaxPairGBps, MaxPairGBps)
		}
		var even []int
		for i := 0; i < n; i += 2 {
			even = append(even, i)
		}
		half := MaskOf(even...)
		h := int64(n / 2)
		for _, s := range v1alpha1.Strategies {
			score := Objective(g, half, all, Request{Count: half.Count(), Requirement: v1alpha1.Requirement{Strategy: s}})
			for i, k := range objectives[s] {
				var want int64
				switch k {
				case keyMinPair, keyRing:
					want = MaxPairGBps
				case keySum:
					want = h * (h - 1) / 2 * MaxPairGBps
				case keyNegCut:
					want = -h * h * MaxPairGBps
				default:
					continue
				}
				if score.Keys[i] != want {
					t.Errorf("%d GPUs %s: key %s = %d, want %d", n, s, keyNames[k], score.Keys[i], want)
				}
			}
		}
	}
}

func TestNewGraphRejectsTooManyGPUs(t *testing.T) {
	gpus := make([]v1alpha1.GPU, MaxGPUs+1)
	if _, err := NewGraph(gpus, nil); err == nil || !strings.Contains(err.Error(), "at most 128") {
		t.Errorf("got %v; want an error naming the limit", err)
	}
}

func TestNewGraphNormalisesOrderAndDirection(t *testing.T) {
	gpus, links := threeGPUs()
	gpus[0], gpus[2] = gpus[2], gpus[0]
	links[0].A, links[0].B = 1, 0
	g, err := NewGraph(gpus, links)
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
	g, err := NewGraph(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if g.Len() != 0 || !g.All().Empty() {
		t.Errorf("len %d all %s", g.Len(), g.All())
	}
	if _, err := NewAllocator(4).Allocate(g, firstN(MaxGPUs), Request{Count: 1}); err == nil {
		t.Error("allocating on a node with no GPUs must fail")
	}
}

func TestStatusRoundTripsThroughJSON(t *testing.T) {
	for _, f := range Fixtures() {
		g := f.Graph("node-a")
		data, err := json.Marshal(g.Status())
		if err != nil {
			t.Fatal(err)
		}
		var st v1alpha1.NodeGPUTopologyStatus
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		back, err := FromStatus(&st)
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		if diff := cmp.Diff(g.Status(), back.Status()); diff != "" {
			t.Errorf("%s: round trip (-want +got):\n%s", f.Name, diff)
		}
	}
	if _, err := FromStatus(nil); err == nil {
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
	sick, err := NewGraph(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	if sick.Hash() != a.Hash() || sick.Healthy() != a.All().Minus(MaskOf(3)) {
		t.Errorf("health changed the hash or Healthy() is wrong: %s", sick.Healthy())
	}
	links[5].BandwidthGBps++
	changed, err := NewGraph(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	if changed.Hash() == a.Hash() {
		t.Error("a different link must change the hash")
	}
}

func TestMaskHelpers(t *testing.T) {
	m := MaskOf(5, 0, 63, 5, 64, 127, 128, -1)
	if diff := cmp.Diff([]int{0, 5, 63, 64, 127}, m.Indices()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if m.Count() != 5 || !m.Has(63) || !m.Has(64) || m.Has(1) || m.Has(128) || m.Has(-1) || m.String() != "{0,5,63,64,127}" {
		t.Errorf("count %d string %s", m.Count(), m)
	}
	o := MaskOf(0, 64, 100)
	for _, tc := range []struct {
		name      string
		got, want Mask
	}{
		{"union", m.Union(o), MaskOf(0, 5, 63, 64, 100, 127)},
		{"intersect", m.Intersect(o), MaskOf(0, 64)},
		{"minus", m.Minus(o), MaskOf(5, 63, 127)},
		{"with", o.With(65).With(200), MaskOf(0, 64, 65, 100)},
		{"first 70", firstN(70), MaskOf(func() []int {
			var idx []int
			for i := range 70 {
				idx = append(idx, i)
			}
			return idx
		}()...)},
		{"first 0", firstN(0), Mask{}},
	} {
		if !tc.got.Equal(tc.want) {
			t.Errorf("%s: got %s; want %s", tc.name, tc.got, tc.want)
		}
	}
	if !(Mask{}).Empty() || m.Empty() || firstN(MaxGPUs).Count() != MaxGPUs {
		t.Error("Empty or firstN(MaxGPUs) is wrong")
	}
	// Lower index lists sort first, across the word boundary too.
	if !lowerIndicesMask(MaskOf(1, 70), MaskOf(1, 80)) || lowerIndicesMask(MaskOf(2, 3), MaskOf(1, 90)) || lowerIndicesMask(m, m) {
		t.Error("lowerIndicesMask orders sets wrongly")
	}
}

func TestFixturesDescribeTheMachines(t *testing.T) {
	uuidRE := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	names := map[string]int{}
	for _, f := range Fixtures() {
		names[f.Name] = f.GPUs
		g := f.Graph("node-x")
		if g.Len() != f.GPUs {
			t.Errorf("%s: %d GPUs", f.Name, g.Len())
		}
		for _, gpu := range g.GPUs() {
			if !uuidRE.MatchString(gpu.UUID) || gpu.PCIBusID == "" || gpu.NUMANode < 0 || gpu.Model != f.Model {
				t.Errorf("%s: GPU %+v", f.Name, gpu)
			}
			if (f.Name == "gb200-nvl72-tray") != (gpu.FabricClique != "") {
				t.Errorf("%s: fabric clique %q", f.Name, gpu.FabricClique)
			}
		}
		for a := 0; a < g.Len(); a++ {
			for b := a + 1; b < g.Len(); b++ {
				l := g.Link(a, b)
				want := PCIeBandwidthGBps(f.PCIeGen, l.PCIe)
				if l.NVLinks > 0 {
					want = l.NVLinks * f.NVLinkGBps
				}
				if l.BandwidthGBps != want || (l.NVSwitch && l.NVLinks != f.NVSwitchLinks) {
					t.Errorf("%s: link %+v; want %d GB/s", f.Name, l, want)
				}
				if l.PCIe != v1alpha1.PCIeCrossSocket && !l.P2P {
					t.Errorf("%s: link %+v within a socket lacks P2P", f.Name, l)
				}
			}
		}
	}
	if diff := cmp.Diff(map[string]int{"dgx1-p100": 8, "dgx1-v100": 8, "dgx-a100": 8, "hgx-h100": 8, "hgx-h200": 8,
		"pcie-8x": 8, "pcie-8x-nvlink-pairs": 8, "dgx2": 16, "gb200-nvl72-tray": 4}, names); diff != "" {
		t.Errorf("fixtures (-want +got):\n%s", diff)
	}
	if _, err := FixtureByName("dgx-9"); err == nil || !strings.Contains(err.Error(), "dgx1-v100") {
		t.Errorf("unknown fixture: got %v; want an error listing the known names", err)
	}
}

func TestDGX1V100HasOnlyTwoFullyNVLinkedQuads(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	links := map[int]int{}
	var quads []Mask
	for m := bitset(0); m <= g.all(); m++ {
		if m.Count() == 4 && countPairs(g.nv, m) == 6 {
			quads = append(quads, m.mask())
		}
	}
	for a := 0; a < 8; a++ {
		for b := 0; b < 8; b++ {
			links[a] += g.Link(a, b).NVLinks
		}
	}
	if diff := cmp.Diff([]Mask{MaskOf(0, 1, 2, 3), MaskOf(4, 5, 6, 7)}, quads); diff != "" {
		t.Errorf("fully NVLinked quads (-want +got):\n%s", diff)
	}
	for gpu, n := range links {
		if n != 6 {
			t.Errorf("GPU %d has %d NVLinks; DGX-1 V100 has 6 per GPU", gpu, n)
		}
	}
	p100 := mustFixture(t, "dgx1-p100")
	for a := 0; a < 8; a++ {
		n := 0
		for b := 0; b < 8; b++ {
			n += p100.Link(a, b).NVLinks
		}
		if n != 4 {
			t.Errorf("P100 GPU %d has %d NVLinks; want 4", a, n)
		}
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
			gpus[i] = v1alpha1.GPU{Index: i, UUID: FixtureUUID("r", i)}
			for j := i + 1; j < n; j++ {
				links = append(links, v1alpha1.Link{A: i, B: j, PCIe: v1alpha1.PCIeSameNUMA, BandwidthGBps: levels[rng.IntN(len(levels))]})
			}
		}
		g, err := NewGraph(gpus, links)
		if err != nil {
			t.Fatal(err)
		}
		set := g.all()
		got, order := g.ring(set)
		want := 0
		permute(set.Indices(), 1, func(p []int) {
			want = max(want, ringOf(g, p))
		})
		if got != want || ringOf(g, order) != got || MaskOf(order...) != set.mask() || order[0] != 0 {
			t.Fatalf("trial %d: ring %d order %v (its ring %d); want %d", trial, got, order, ringOf(g, order), want)
		}
	}
}

func ringOf(g *Graph, order []int) int {
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

func TestFragmentationTablesMatchDirectCounts(t *testing.T) {
	for _, name := range []string{"dgx1-v100", "dgx1-p100", "pcie-8x-nvlink-pairs", "dgx2"} {
		g := mustFixture(t, name)
		tabs := buildTables(g.nv, g.n)
		step := bitset(1)
		if g.n > 8 {
			step = 97
		}
		for m := bitset(0); m <= g.all(); m += step {
			got := []int{int(tabs.island[m]), int(tabs.pairs[m]), int(tabs.quads[m])}
			want := []int{maxClique(g.nv, m, nil), countPairs(g.nv, m), countQuads(g.nv, m)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%s mask %s (-direct +table):\n%s", name, m, diff)
			}
		}
	}
}

func TestMetricsOfASet(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	got := g.Metrics(MaskOf(0, 3), g.All())
	want := SetMetrics{MinPairGBps: 100, RingGBps: 100, SumGBps: 100, DomainsCrossed: 3, Tier: v1alpha1.TierNVLink,
		LeftLargestIsland: 4, LeftNVLinkPairs: 9, LeftNVLinkQuads: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	pcie := mustFixture(t, "pcie-8x")
	if m := pcie.Metrics(MaskOf(0, 1), pcie.All()); m.DomainsCrossed != 0 || m.Tier != v1alpha1.TierPCIeSwitch {
		t.Errorf("same switch: %+v", m)
	}
	if m := pcie.Metrics(MaskOf(0, 4), pcie.All()); m.Tier != v1alpha1.TierCrossSocket || m.MinPairGBps != 20 {
		t.Errorf("cross socket: %+v", m)
	}
	if m := pcie.Metrics(MaskOf(2), pcie.All()); m.Tier != v1alpha1.TierSingleGPU || m.RingGBps != 0 {
		t.Errorf("one GPU: %+v", m)
	}
}

// The allocator answers on the largest graph the model accepts, every
// pair at the ceiling: each strategy returns k distinct GPUs whose metrics
// carry the ceiling's exact figures.
func TestAllocatorOnA64GPUGraphAtTheCeiling(t *testing.T) {
	g := maxedGraph(t, MaxGPUs)
	a := NewAllocator(4)
	for _, k := range []int{1, 2, 8, 63, 64} {
		for _, s := range v1alpha1.Strategies {
			req := Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s, RequireNVLink: true, MinPairBandwidthGBps: MaxPairGBps}}
			res, err := a.Allocate(g, g.All(), req)
			if err != nil {
				t.Fatalf("k=%d %s: %v", k, s, err)
			}
			set := MaskOf(res.GPUs...)
			if set.Count() != k || len(res.GPUs) != k {
				t.Fatalf("k=%d %s: got GPUs %v", k, s, res.GPUs)
			}
			if want := k * (k - 1) / 2 * MaxPairGBps; res.Metrics.SumGBps != want {
				t.Errorf("k=%d %s: sum %d GB/s, want %d", k, s, res.Metrics.SumGBps, want)
			}
		}
	}
}

// maskBits is the Mask of the low 64 GPUs given as a word, for tests that
// draw or enumerate sets.
func maskBits(v uint64) Mask { return bitset(v).mask() }
