package machine

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

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
	var quads []topology.Mask
	for m := topology.Bitset(0); m <= g.All().Bitset(); m++ {
		if m.Count() == 4 && topology.CountPairs(g.NVAdjacency(), m) == 6 {
			quads = append(quads, m.Mask())
		}
	}
	for a := 0; a < 8; a++ {
		for b := 0; b < 8; b++ {
			links[a] += g.Link(a, b).NVLinks
		}
	}
	if diff := cmp.Diff([]topology.Mask{topology.MaskOf(0, 1, 2, 3), topology.MaskOf(4, 5, 6, 7)}, quads); diff != "" {
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
