package topology

import "testing"

func TestIslandsFollowNVLinkComponents(t *testing.T) {
	cases := map[string]struct {
		fixture string
		want    []Mask
		peak    int
	}{
		"nvswitch machine is one island":     {fixture: "dgx-a100", want: []Mask{MaskOf(0, 1, 2, 3, 4, 5, 6, 7)}, peak: 600},
		"cube mesh is connected":             {fixture: "dgx1-v100", want: []Mask{MaskOf(0, 1, 2, 3, 4, 5, 6, 7)}},
		"bridged pairs are islands of two":   {fixture: "pcie-8x-nvlink-pairs", want: []Mask{MaskOf(0, 1), MaskOf(2, 3), MaskOf(4, 5), MaskOf(6, 7)}},
		"plain pcie gpus are islands of one": {fixture: "pcie-8x", want: []Mask{MaskOf(0), MaskOf(1), MaskOf(2), MaskOf(3), MaskOf(4), MaskOf(5), MaskOf(6), MaskOf(7)}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f, err := FixtureByName(tc.fixture)
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
