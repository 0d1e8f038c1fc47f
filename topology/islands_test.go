package topology_test

import (
	"testing"

	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

func TestIslandsFollowNVLinkComponents(t *testing.T) {
	cases := map[string]struct {
		fixture string
		want    []topology.Mask
		peak    int
	}{
		"nvswitch machine is one island":     {fixture: "dgx-a100", want: []topology.Mask{topology.MaskOf(0, 1, 2, 3, 4, 5, 6, 7)}, peak: 600},
		"cube mesh is connected":             {fixture: "dgx1-v100", want: []topology.Mask{topology.MaskOf(0, 1, 2, 3, 4, 5, 6, 7)}},
		"bridged pairs are islands of two":   {fixture: "pcie-8x-nvlink-pairs", want: []topology.Mask{topology.MaskOf(0, 1), topology.MaskOf(2, 3), topology.MaskOf(4, 5), topology.MaskOf(6, 7)}},
		"plain pcie gpus are islands of one": {fixture: "pcie-8x", want: []topology.Mask{topology.MaskOf(0), topology.MaskOf(1), topology.MaskOf(2), topology.MaskOf(3), topology.MaskOf(4), topology.MaskOf(5), topology.MaskOf(6), topology.MaskOf(7)}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f, err := machine.FixtureByName(tc.fixture)
			if err != nil {
				t.Fatal(err)
			}
			g := f.Graph("n")
			got := g.Islands()
			if len(got) != len(tc.want) {
				t.Fatalf("Islands() = %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("Islands() = %v, want %v", got, tc.want)
				}
			}
			if tc.peak > 0 && g.PeakBandwidth() != tc.peak {
				t.Errorf("PeakBandwidth() = %d, want %d", g.PeakBandwidth(), tc.peak)
			}
			for a := range g.Len() {
				for b := range g.Len() {
					if a != b && g.Bandwidth(a, b) > g.PeakBandwidth() {
						t.Errorf("pair %d-%d has %d GB/s, above PeakBandwidth %d", a, b, g.Bandwidth(a, b), g.PeakBandwidth())
					}
				}
			}
		})
	}
}
