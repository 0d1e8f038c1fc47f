package topology_test

import (
	"testing"

	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// Islands, RingOrder and Healthy see GPUs past 64.
func TestLargeNodeHelpersSeeEveryGPU(t *testing.T) {
	g := machine.SyntheticRandomNVLink(72, 0.9, 5)
	var union topology.Mask
	for _, is := range g.Islands() {
		if !union.Intersect(is).Empty() {
			t.Fatalf("islands overlap: %v", g.Islands())
		}
		union = union.Union(is)
	}
	if union != g.All() || g.Healthy() != g.All() {
		t.Errorf("islands cover %s, healthy %s; want all 72", union, g.Healthy())
	}
	set := topology.MaskOf(3, 40, 65, 70, 71)
	order := g.RingOrder(set)
	if topology.MaskOf(order...) != set || order[0] != 3 || ringOf(g, order) != g.Metrics(set, set).RingGBps {
		t.Errorf("ring order %v (ring %d); metrics say %d", order, ringOf(g, order), g.Metrics(set, set).RingGBps)
	}
}
