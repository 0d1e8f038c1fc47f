package topology

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// FuzzFromStatus feeds arbitrary JSON as NodeGPUTopology status to the
// builder and, when it is accepted, to the allocator: neither may panic, an
// accepted graph must round-trip, and every answer must respect the request.
func FuzzFromStatus(f *testing.F) {
	for _, fx := range Fixtures() {
		if fx.GPUs > 4 { // larger seeds (5 KB of JSON) stall the fuzzing engine
			continue
		}
		data, err := json.Marshal(fx.Graph("seed").Status())
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, uint64(0xff), uint8(2), uint8(0))
	}
	f.Add([]byte(`{"gpus":[{"index":0,"uuid":"a"},{"index":0,"uuid":"b"}]}`), uint64(3), uint8(1), uint8(1))
	f.Add([]byte(`{"gpus":[{"index":0,"uuid":"a"},{"index":1,"uuid":"b"}],"links":[{"a":1,"b":0,"pcie":"SameSwitch","bandwidthGBps":-1}]}`), uint64(3), uint8(2), uint8(2))
	f.Add([]byte(`{"gpus":[{"index":1,"uuid":"a","health":"Unhealthy"},{"index":0,"uuid":"b"}],"links":[{"a":0,"b":1,"pcie":"CrossSocket","nvlinks":3}]}`), uint64(3), uint8(2), uint8(3))
	f.Add([]byte(`null`), uint64(0), uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, data []byte, free uint64, k, variant uint8) {
		var st v1alpha1.NodeGPUTopologyStatus
		if json.Unmarshal(data, &st) != nil {
			return
		}
		g, err := FromStatus(&st)
		if err != nil {
			return
		}
		st2 := g.Status()
		back, err := FromStatus(&st2)
		if err != nil || back.Hash() != g.Hash() {
			t.Fatalf("accepted graph does not round-trip: %v", err)
		}
		if g.Len() > 12 {
			return // keep each input fast; the allocator's bounds are tested elsewhere
		}
		strategy := v1alpha1.Strategies[int(variant)%len(v1alpha1.Strategies)]
		r := Request{Count: int(k % 10), Requirement: v1alpha1.Requirement{
			Strategy:             strategy,
			RequireNVLink:        variant&4 != 0,
			MinPairBandwidthGBps: int(variant&8) * 10,
		}}
		res, err := NewAllocator(4).Allocate(g, Mask(free), r)
		if err != nil {
			var inf *InfeasibleError
			if errors.As(err, &inf) && inf.Reason == "" {
				t.Fatal("infeasible without a reason")
			}
			return
		}
		set := MaskOf(res.GPUs...)
		if len(res.GPUs) != r.Count || set.Count() != r.Count || set&^(Mask(free)&g.Healthy()) != 0 || !meets(g, set, r.Requirement) {
			t.Fatalf("result %v breaks request %+v on free %s", res.GPUs, r, Mask(free))
		}
	})
}
