package allocator

import (
	"errors"
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// TestInfeasibleErrorsCarryTheirKind: every way a request fails names the
// part that failed in Kind, so that the core labels its metrics without
// reading the text.
func TestInfeasibleErrorsCarryTheirKind(t *testing.T) {
	pcie := FixturesMust(t, "pcie-8x").Graph("p")
	dgx := FixturesMust(t, "dgx1-v100").Graph("d")
	for _, tc := range []struct {
		name string
		g    *topology.Graph
		free topology.Mask
		req  topology.Request
		want topology.InfeasibleKind
	}{
		{"too few free", dgx, topology.MaskOf(0, 1), topology.Request{Count: 4}, topology.InfeasibleTooFewFree},
		{"memory", dgx, dgx.All(), topology.Request{Count: 2, Requirement: v1alpha1.Requirement{GPUMemoryMiB: 1 << 20}}, topology.InfeasibleMemory},
		{"nvlink", pcie, pcie.All(), topology.Request{Count: 2, Requirement: v1alpha1.Requirement{RequireNVLink: true}}, topology.InfeasibleNVLink},
		{"bandwidth", dgx, dgx.All(), topology.Request{Count: 4, Requirement: v1alpha1.Requirement{MinPairBandwidthGBps: 10000}}, topology.InfeasibleBandwidth},
	} {
		_, err := New(0).Allocate(tc.g, tc.free, tc.req)
		var inf *topology.InfeasibleError
		if !errors.As(err, &inf) {
			t.Fatalf("%s: error %v, want an InfeasibleError", tc.name, err)
		}
		if inf.Kind != tc.want {
			t.Errorf("%s: kind %d (%q), want %d", tc.name, inf.Kind, inf.Reason, tc.want)
		}
	}
}
