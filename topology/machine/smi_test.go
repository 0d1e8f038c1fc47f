package machine

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
)

// updateGolden regenerates testdata/smi/*.yaml from the importer:
// GPUTOPO_UPDATE_GOLDEN=1 go test ./topology/machine -run TestImportSMIRealOutputs
var updateGolden = os.Getenv("GPUTOPO_UPDATE_GOLDEN") == "1"

// realOutput is one real `nvidia-smi topo -m` output in testdata/smi (the
// file's header names where it was published) and what its import must say.
type realOutput struct {
	file string
	gpu  string
	// fixture is the built-in fixture of the same machine, "" when none.
	fixture string
	// nvswitchLinks or nvlinks: the NVLink fabric as imported.
	nvswitchLinks int
	nvlinks       []NVLinkPair
	numa          []int
	// pix maps a NIC to the GPUs it shares a PCIe switch with (PIX).
	pix map[string][]int
	// levels spot-checks PCIe levels of GPU pairs.
	levels map[[2]int]v1alpha1.PCIeLevel
	// differs explains each choice ("k=<k>/<strategy>") on which the
	// imported machine and its fixture do not pick the same GPUs.
	differs map[string]string
	// sameGraph: the import builds exactly the fixture's graph.
	sameGraph bool
}

var dgx1V100Links = []NVLinkPair{
	{0, 1, 1}, {0, 2, 1}, {0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 3, 1}, {1, 5, 2}, {2, 3, 2},
	{2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {4, 7, 2}, {5, 6, 2}, {5, 7, 1}, {6, 7, 2},
}

var realOutputs = []realOutput{
	{
		file: "dgx1-v100", gpu: "v100", fixture: "dgx1-v100",
		nvlinks: dgx1V100Links, numa: []int{0, 0, 0, 0, 1, 1, 1, 1},
		pix: map[string][]int{"mlx5_0": {2, 3}},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{0, 5}: v1alpha1.PCIeCrossSocket, // printed
			{2, 3}: v1alpha1.PCIeSameSwitch,  // NV2: inferred through mlx5_0 (PIX to both)
			{0, 1}: v1alpha1.PCIeSameNUMA,    // NV1: only the NUMA node says anything
		},
	},
	{
		file: "hgx-h100", gpu: "h100", fixture: "hgx-h100", sameGraph: true,
		nvswitchLinks: 18, numa: []int{0, 0, 0, 0, 1, 1, 1, 1},
		pix: map[string][]int{"mlx5_0": {0}, "mlx5_1": {0}, "mlx5_2": {2}, "mlx5_3": {2}, "mlx5_4": {4}, "mlx5_5": {4}, "mlx5_6": {6}, "mlx5_7": {6}},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{0, 2}: v1alpha1.PCIeSameNUMA,    // NV18: mlx5_0 is NODE to both
			{3, 4}: v1alpha1.PCIeCrossSocket, // NV18: every chain crosses the sockets
		},
	},
	{
		file: "hgx-h100-tabs", gpu: "h100", fixture: "hgx-h100", sameGraph: true,
		nvswitchLinks: 18, numa: []int{0, 0, 0, 0, 1, 1, 1, 1},
		pix: map[string][]int{"NIC0": {0}, "NIC1": {1}, "NIC2": {2}, "NIC3": {}, "NIC4": {}, "NIC5": {3}, "NIC6": {4}, "NIC7": {5}, "NIC8": {6}, "NIC9": {7}},
	},
	{
		file: "dgx-a100-pcie-only", gpu: "a100", fixture: "dgx-a100",
		numa: []int{6, 6, 6, 6, 6, 6, 6, 6},
		pix:  map[string][]int{"mlx5_0": {}, "mlx5_11": {}},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{0, 1}: v1alpha1.PCIeMultipleSwitches, {6, 7}: v1alpha1.PCIeMultipleSwitches, {1, 2}: v1alpha1.PCIeCrossSocket,
		},
		differs: map[string]string{
			// The GPUs are the fixture's, only the links are not: this
			// capture shows no NV# cell (the NVSwitch fabric was not up), so
			// the same sets come out at PCIe tiers instead of NVSwitch.
		},
	},
	{
		file: "hgx-a100", gpu: "a100", fixture: "dgx-a100",
		nvswitchLinks: 12, numa: []int{0, 0, 0, 0, 1, 1, 1, 1},
		pix: map[string][]int{"mlx5_0": {}, "mlx5_7": {}},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{0, 1}: v1alpha1.PCIeMultipleSwitches, // NV12: mlx5_0 is PXB to both
			{0, 2}: v1alpha1.PCIeSameNUMA,         // NV12: mlx5_0 is PXB to GPU 0, NODE to GPU 2
			{3, 4}: v1alpha1.PCIeCrossSocket,      // NV12: every chain crosses the sockets
		},
		// Same choices as dgx-a100 for every k. The graphs differ only in
		// PCIe levels under the NVSwitch: GPU pairs share a switch tree
		// (PXB, inferred through their NICs) where the fixture says one
		// switch, and the fixture has no NICs.
	},
	{
		file: "a30-nvlink-pairs", gpu: "a30", fixture: "pcie-8x-nvlink-pairs",
		nvlinks: []NVLinkPair{{0, 1, 4}, {2, 3, 4}}, numa: []int{0, 0, 1, 1},
		pix: map[string][]int{"mlx5_0": {3}},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{2, 3}: v1alpha1.PCIeMultipleSwitches, // NV4: mlx5_0 is PXB to GPU 2 and PIX to GPU 3
			{0, 1}: v1alpha1.PCIeSameNUMA,         // NV4: only the NUMA node says anything
			{1, 2}: v1alpha1.PCIeCrossSocket,
		},
		differs: map[string]string{
			// The real box has 4 GPUs, the fixture 8 with every bridged pair
			// under a PCIe switch. Here {2,3} share a switch tree (PXB)
			// while {0,1} only share a NUMA node, so the fewest-boundaries
			// strategy takes {2,3}.
			"k=2/numa_local": "imported {2,3} (PXB), fixture {0,1}",
			// Same indices, different machines: the fixture's {0,1,2,3} is
			// one socket behind one switch, the real {0,1,2,3} is all four
			// GPUs across two sockets.
			"k=4/highest_bandwidth": "same indices, the real set crosses sockets",
			"k=4/numa_local":        "same indices, the real set crosses sockets",
		},
	},
	{
		file: "l40s-pcie", gpu: "l40s", fixture: "pcie-8x",
		numa: []int{0, 0, 0, 0, 1, 1, 1, 1},
		pix:  map[string][]int{"NIC0": {}},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{0, 1}: v1alpha1.PCIeSameNUMA, {0, 4}: v1alpha1.PCIeCrossSocket,
		},
	},
	{
		file: "pcie-8x-pix-quads", gpu: "l40s", fixture: "pcie-8x",
		numa: []int{0, 0, 0, 0, 0, 0, 0, 0},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{0, 3}: v1alpha1.PCIeSameSwitch, {3, 4}: v1alpha1.PCIeSameNUMA,
		},
		// Same choices as pcie-8x for every k, at nearer tiers: each quad is
		// one switch here (the fixture has a switch per pair) and all eight
		// GPUs share a NUMA node (the fixture has two sockets).
	},
	{
		file: "pcie-8x-pix-phb", gpu: "t4", fixture: "pcie-8x",
		numa: []int{-1, -1, -1, -1, -1, -1, -1, -1},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{0, 1}: v1alpha1.PCIeSameSwitch, {1, 2}: v1alpha1.PCIeHostBridge, {3, 4}: v1alpha1.PCIeCrossSocket,
		},
		// No CPU Affinity column, so no NUMA node is known; the choices
		// are pcie-8x's for every k, a switch pair being the nearest tier
		// on both and the quads {0-3}, {4-7} a socket each.
	},
	{
		file: "k80-pcie", gpu: "k80",
		numa: []int{0, 0, 1, 1, 1, 1},
		levels: map[[2]int]v1alpha1.PCIeLevel{
			{0, 1}: v1alpha1.PCIeSameSwitch, {2, 4}: v1alpha1.PCIeHostBridge, {0, 2}: v1alpha1.PCIeCrossSocket, // SOC
		},
	},
}

func importTestdata(t *testing.T, file, gpu string) Fixture {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "smi", file+".txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "Source: https://") {
		t.Fatalf("%s.txt: the header must name the public source of the output", file)
	}
	f, err := ImportSMI(string(data), SMIOptions{Name: file, GPU: gpu, Source: "topology/machine/testdata/smi/" + file + ".txt"})
	if err != nil {
		t.Fatalf("import %s: %v", file, err)
	}
	return f
}

func TestImportSMIRealOutputsMatchGoldenMachineFiles(t *testing.T) {
	for _, c := range realOutputs {
		t.Run(c.file, func(t *testing.T) {
			f := importTestdata(t, c.file, c.gpu)
			got, err := f.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", "smi", c.file+".yaml")
			if updateGolden {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (GPUTOPO_UPDATE_GOLDEN=1 writes it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("machine file differs from %s (-want +got):\n%s", golden, diff)
			}
			// The file reads back to the same machine.
			back, err := Parse(want)
			if err != nil {
				t.Fatalf("parse %s: %v", golden, err)
			}
			if back.Graph("n").Hash() != f.Graph("n").Hash() {
				t.Errorf("%s reads back to another graph", golden)
			}
			if diff := cmp.Diff(f.NICs, back.NICs); diff != "" {
				t.Errorf("NICs read back differ (-imported +file):\n%s", diff)
			}
		})
	}
}

func TestImportSMIRealOutputsLinksTiersNUMAAndNICs(t *testing.T) {
	for _, c := range realOutputs {
		t.Run(c.file, func(t *testing.T) {
			f := importTestdata(t, c.file, c.gpu)
			if f.NVSwitchLinks != c.nvswitchLinks {
				t.Errorf("NVSwitch links %d; want %d", f.NVSwitchLinks, c.nvswitchLinks)
			}
			if diff := cmp.Diff(c.nvlinks, f.NVLinks); diff != "" {
				t.Errorf("NVLink pairs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.numa, f.NUMANodes); diff != "" {
				t.Errorf("NUMA nodes (-want +got):\n%s", diff)
			}
			for name, want := range c.pix {
				i := slices.IndexFunc(f.NICs, func(n NIC) bool { return n.Name == name })
				if i < 0 {
					t.Errorf("no NIC %s; have %v", name, f.NICs)
					continue
				}
				got := []int{}
				for g, l := range f.NICs[i].PCIe {
					if l == v1alpha1.PCIeSameSwitch {
						got = append(got, g)
					}
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("GPUs under %s's PCIe switch (-want +got):\n%s", name, diff)
				}
			}
			g := f.Graph("n")
			for pair, want := range c.levels {
				if got := g.Link(pair[0], pair[1]).PCIe; got != want {
					t.Errorf("GPU %d-GPU %d PCIe level %s; want %s", pair[0], pair[1], got, want)
				}
			}
			// Tiers follow the links: an NVLinked pair is at the NVLink
			// tier, a PCIe pair at its PCIe level's.
			for a := 0; a < g.Len(); a++ {
				for b := a + 1; b < g.Len(); b++ {
					res, err := allocator.New(0).Allocate(g, topology.MaskOf(a, b), req(2, v1alpha1.StrategyHighestBandwidth))
					if err != nil {
						t.Fatal(err)
					}
					l := g.Link(a, b)
					want := map[v1alpha1.PCIeLevel]v1alpha1.LinkTier{
						v1alpha1.PCIeSameSwitch: v1alpha1.TierPCIeSwitch, v1alpha1.PCIeMultipleSwitches: v1alpha1.TierPCIeSwitch,
						v1alpha1.PCIeHostBridge: v1alpha1.TierPCIeHostBridge, v1alpha1.PCIeSameNUMA: v1alpha1.TierPCIeHostBridge,
						v1alpha1.PCIeCrossSocket: v1alpha1.TierCrossSocket,
					}[l.PCIe]
					switch {
					case l.NVSwitch:
						want = v1alpha1.TierNVSwitch
					case l.NVLinks > 0:
						want = v1alpha1.TierNVLink
					}
					if res.Metrics.Tier != want {
						t.Errorf("GPU %d-GPU %d (%+v): tier %s; want %s", a, b, l, res.Metrics.Tier, want)
					}
				}
			}
		})
	}
}

// TestImportedMachinesChooseLikeTheirFixtures: on every real machine that
// has a built-in fixture, the allocator picks the same GPUs for k = 2, 4, 8
// as on the fixture, except where the case documents why not.
func TestImportedMachinesChooseLikeTheirFixtures(t *testing.T) {
	for _, c := range realOutputs {
		if c.fixture == "" {
			continue
		}
		t.Run(c.file, func(t *testing.T) {
			g := importTestdata(t, c.file, c.gpu).Graph("n")
			fx, err := FixtureByName(c.fixture)
			if err != nil {
				t.Fatal(err)
			}
			fg := fx.Graph("n")
			if c.sameGraph && g.Hash() != fg.Hash() {
				t.Errorf("the import builds another graph than fixture %s", c.fixture)
			}
			for _, k := range []int{2, 4, 8} {
				if k > g.Len() || k > fg.Len() {
					continue
				}
				for _, s := range []v1alpha1.Strategy{v1alpha1.StrategyHighestBandwidth, v1alpha1.StrategyNUMALocal} {
					key := fmt.Sprintf("k=%d/%s", k, s)
					got := mustAllocate(t, g, g.All(), req(k, s))
					want := mustAllocate(t, fg, fg.All(), req(k, s))
					same := topology.MaskOf(got.GPUs...) == topology.MaskOf(want.GPUs...)
					why, documented := c.differs[key]
					switch {
					case documented && same && !strings.HasPrefix(why, "same indices"):
						t.Errorf("%s: documented as differing (%s) but both pick %v", key, why, got.GPUs)
					case !documented && !same:
						t.Errorf("%s: imported picks %v, fixture %s picks %v; document why or fix the import", key, got.GPUs, c.fixture, want.GPUs)
					}
				}
			}
		})
	}
}

// TestImportSMIOfEveryFixtureRendering reads back what RenderSMI prints for
// every built-in fixture, the 16-GPU DGX-2 included: with the -mp matrix
// the links and NUMA nodes are the fixture's exactly; without it the PCIe
// levels of NVLinked pairs are inferred, never nearer than the truth.
func TestImportSMIOfEveryFixtureRendering(t *testing.T) {
	for _, fx := range Fixtures() {
		t.Run(fx.Name, func(t *testing.T) {
			kind, ok := GPUKindOfName(fx.Model)
			if !ok {
				t.Fatalf("model %q has no GPU kind", fx.Model)
			}
			list := ""
			for i := 0; i < fx.GPUs; i++ {
				list += fmt.Sprintf("GPU %d: %s (UUID: %s)\n", i, fx.Model, FixtureUUID("n", i))
			}
			f, err := ImportSMI(RenderSMI(fx, false), SMIOptions{Name: "rendered", List: list, PCIMatrix: RenderSMI(fx, true)})
			if err != nil {
				t.Fatalf("import: %v\n%s", err, RenderSMI(fx, false))
			}
			if kind.NVLinkGen != fx.NVLinkGen && fx.NVLinkGen != 0 {
				t.Fatalf("kind %s has NVLink%d; fixture NVLink%d", kind.Key, kind.NVLinkGen, fx.NVLinkGen)
			}
			want, got := fx.Graph("n").Status(), f.Graph("n").Status()
			if diff := cmp.Diff(want.Links, got.Links); diff != "" {
				t.Errorf("links (-fixture +imported):\n%s", diff)
			}
			for i := range want.GPUs {
				if want.GPUs[i].NUMANode != got.GPUs[i].NUMANode || want.GPUs[i].Model != got.GPUs[i].Model {
					t.Errorf("GPU %d: NUMA %d model %q; want %d %q", i, got.GPUs[i].NUMANode, got.GPUs[i].Model, want.GPUs[i].NUMANode, want.GPUs[i].Model)
				}
			}
			// Without -mp: NVLinks the same, inferred levels never nearer.
			inf, err := ImportSMI(RenderSMI(fx, false), SMIOptions{Name: "rendered", List: list})
			if err != nil {
				t.Fatal(err)
			}
			ig := inf.Graph("n")
			for a := 0; a < fx.GPUs; a++ {
				for b := a + 1; b < fx.GPUs; b++ {
					wl, il := fx.Link(a, b), ig.Link(a, b)
					if wl.NVLinks != il.NVLinks || wl.NVSwitch != il.NVSwitch || rankOf(il.PCIe) < rankOf(wl.PCIe) {
						t.Errorf("GPU %d-GPU %d: inferred %+v; fixture %+v", a, b, il, wl)
					}
				}
			}
		})
	}
}

func TestImportSMIRefusesBadInputNamingLineAndCell(t *testing.T) {
	good := "        GPU0    GPU1    GPU2    NIC0    CPU Affinity    NUMA Affinity\n" +
		"GPU0     X      NV4     SYS     PIX     0-7     0\n" +
		"GPU1    NV4      X      SYS     PIX     0-7     0\n" +
		"GPU2    SYS     SYS      X      SYS     8-15    1\n" +
		"NIC0    PIX     PIX     SYS      X\n"
	if _, err := ImportSMI(good, SMIOptions{Name: "m", GPU: "a100"}); err != nil {
		t.Fatalf("the base case must import: %v", err)
	}
	edit := func(old, new string) string {
		if !strings.Contains(good, old) {
			t.Fatalf("base case has no %q", old)
		}
		return strings.Replace(good, old, new, 1)
	}
	for _, c := range []struct {
		name string
		text string
		opts SMIOptions
		want []string
	}{
		{"asymmetric GPU pair names both cells", edit("GPU2    SYS     SYS ", "GPU2    SYS     PHB "), SMIOptions{}, []string{"line 3, row GPU1, column GPU2 says SYS", "line 4, row GPU2, column GPU1 says PHB", "asymmetric"}},
		{"asymmetric NIC cell names both cells", edit("NIC0    PIX     PIX ", "NIC0    PIX     PXB "), SMIOptions{}, []string{"line 3, row GPU1, column NIC0 says PIX", "line 5, row NIC0, column GPU1 says PXB"}},
		{"unknown token", edit("GPU1    NV4      X      SYS", "GPU1    NV4      X      QPI"), SMIOptions{}, []string{"line 3, row GPU1, column GPU2", `unknown token "QPI"`}},
		{"missing row", strings.Replace(good, "GPU2    SYS     SYS      X      SYS     8-15    1\n", "", 1), SMIOptions{}, []string{"rows are missing for GPU2", "GPU counts"}},
		{"extra row", good + "GPU3    SYS     SYS     SYS      X      SYS     8-15    1\n", SMIOptions{}, []string{"line 6: row GPU3 has no column", "GPU counts"}},
		{"short row", edit("GPU2    SYS     SYS      X      SYS     8-15    1", "GPU2    SYS     SYS"), SMIOptions{}, []string{"line 4: row GPU2 has 2 cells", "names 4 devices"}},
		{"X off the diagonal", edit("GPU0     X      NV4 ", "GPU0     X      X   "), SMIOptions{}, []string{"line 2, row GPU0, column GPU1: X off the diagonal"}},
		{"diagonal not X", edit("GPU1    NV4      X  ", "GPU1    NV4     SYS "), SMIOptions{}, []string{"line 3, row GPU1, column GPU1", "diagonal"}},
		{"NVLink to a NIC", edit("GPU2    SYS     SYS      X      SYS", "GPU2    SYS     SYS      X      NV2"), SMIOptions{}, []string{"column NIC0", "NVLink joins GPUs"}},
		{"no header", "GPU0     X      NV4\n", SMIOptions{}, []string{"no matrix header"}},
		{"missing NVLink generation", good, SMIOptions{GPU: ""}, []string{"line 2, row GPU0, column GPU1 (NV4)", "NVLink generation", "--gpu"}},
		{"unknown --gpu", good, SMIOptions{GPU: "z9000"}, []string{`gpu "z9000": unknown`, "a100"}},
		{"-L lists other GPU count", good, SMIOptions{List: "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-a)\n"}, []string{"nvidia-smi -L: lists 1 GPUs; topo -m names 3"}},
		{"-L names an unknown GPU", good, SMIOptions{List: "GPU 0: Foo\nGPU 1: Foo\nGPU 2: Foo\n"}, []string{`"Foo" is not a GPU the importer knows`}},
		{"-L mixes models", good, SMIOptions{List: "GPU 0: NVIDIA A100-SXM4-40GB\nGPU 1: NVIDIA A100-SXM4-40GB\nGPU 2: NVIDIA H100 80GB HBM3\n"}, []string{"GPU 2 is", "one GPU model"}},
		{"bad machine name", good, SMIOptions{Name: "My Box", GPU: "a100"}, []string{`machine name "My Box"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := c.opts
			if o.Name == "" {
				o.Name = "m"
			}
			if o.GPU == "" && o.List == "" && c.name != "missing NVLink generation" {
				o.GPU = "a100"
			}
			_, err := ImportSMI(c.text, o)
			if err == nil {
				t.Fatalf("imported; want an error containing %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestImportSMITakesTheModelFromNvidiaSmiL(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "smi", "dgx1-v100.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var list strings.Builder
	for i := 0; i < 8; i++ {
		fmt.Fprintf(&list, "GPU %d: Tesla V100-SXM2-32GB (UUID: GPU-%08d-0000-0000-0000-000000000000)\n", i, i)
	}
	f, err := ImportSMI(string(data), SMIOptions{Name: "v100-32", List: list.String()})
	if err != nil {
		t.Fatal(err)
	}
	if f.Model != "Tesla V100-SXM2-32GB" || f.NVLinkGen != 2 || f.NVLinkGBps != 50 {
		t.Errorf("model %q NVLink%d at %d GB/s; want Tesla V100-SXM2-32GB, NVLink2, 50 GB/s", f.Model, f.NVLinkGen, f.NVLinkGBps)
	}
}

func TestImportSMIMPMatrixGivesTheLevelsOfNVLinkedPairs(t *testing.T) {
	m := "        GPU0    GPU1    CPU Affinity    NUMA Affinity\nGPU0     X      NV12    0-7     0\nGPU1    NV12     X      0-7     0\n"
	mp := "        GPU0    GPU1    CPU Affinity    NUMA Affinity\nGPU0     X      PIX     0-7     0\nGPU1    PIX      X      0-7     0\n"
	f, err := ImportSMI(m, SMIOptions{Name: "m", GPU: "a100", PCIMatrix: mp})
	if err != nil {
		t.Fatal(err)
	}
	if l := f.Link(0, 1); l.PCIe != v1alpha1.PCIeSameSwitch || l.NVLinks != 12 || l.NVSwitch {
		t.Errorf("link %+v; want 12 direct NVLinks (2 GPUs × 12 fit one A100) over a shared PCIe switch", l)
	}
	if slices.ContainsFunc(f.Notes, func(s string) bool { return strings.Contains(s, "inferred") }) {
		t.Errorf("notes %q claim inference although -mp gave every level", f.Notes)
	}
	if _, err := ImportSMI(m, SMIOptions{Name: "m", GPU: "a100", PCIMatrix: m}); err == nil || !strings.Contains(err.Error(), "no NV# cells") {
		t.Errorf("an -mp matrix with NV# cells: err %v; want it refused", err)
	}
}
