package allocator

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// FuzzFromStatus feeds arbitrary JSON as NodeGPUTopology status to the
// builder and, when it is accepted, to the allocator: neither may panic, an
// accepted graph must round-trip, and every answer must respect the request.
func FuzzFromStatus(f *testing.F) {
	for _, fx := range machine.Fixtures() {
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
		g, err := topology.FromStatus(&st)
		if err != nil {
			return
		}
		st2 := g.Status()
		back, err := topology.FromStatus(&st2)
		if err != nil || back.Hash() != g.Hash() {
			t.Fatalf("accepted graph does not round-trip: %v", err)
		}
		// Any accepted graph is allocated on: the work budget keeps every
		// decision within milliseconds.
		strategy := v1alpha1.Strategies[int(variant)%len(v1alpha1.Strategies)]
		r := topology.Request{Count: int(k % 10), Requirement: v1alpha1.Requirement{
			Strategy:             strategy,
			RequireNVLink:        variant&4 != 0,
			MinPairBandwidthGBps: int(variant&8) * 10,
		}}
		res, err := New(4).Allocate(g, maskBits(free), r)
		if err != nil {
			var inf *topology.InfeasibleError
			if errors.As(err, &inf) && inf.Reason == "" {
				t.Fatal("infeasible without a reason")
			}
			return
		}
		set := topology.MaskOf(res.GPUs...)
		if len(res.GPUs) != r.Count || set.Count() != r.Count || !set.Minus(maskBits(free).Intersect(g.Healthy())).Empty() || !meets(g, set, r.Requirement) {
			t.Fatalf("result %v breaks request %+v on free %s", res.GPUs, r, maskBits(free))
		}
	})
}

// FuzzAllocateWithinBudget builds a random node of up to 64 GPUs (the
// search's own size; larger nodes go through windows, FuzzAllocateLargeNode) from the
// fuzzer's numbers (NVLink density, bandwidth levels, PCIe tree, busy and
// unhealthy GPUs) and asks for any count under any strategy and
// constraint: the work stays within the budget, Heuristic is set exactly
// when it ran out, and every answer meets the request.
func FuzzAllocateWithinBudget(f *testing.F) {
	f.Add(uint64(1), uint8(63), uint8(15), uint8(0), uint8(128), uint8(4), uint64(0))
	f.Add(uint64(2), uint8(15), uint8(7), uint8(1), uint8(255), uint8(1), uint64(0x10))
	f.Add(uint64(3), uint8(63), uint8(62), uint8(2), uint8(200), uint8(30), uint64(0xf0f0))
	f.Add(uint64(4), uint8(40), uint8(3), uint8(7), uint8(60), uint8(9), uint64(1))
	f.Add(uint64(5), uint8(63), uint8(31), uint8(11), uint8(0), uint8(2), uint64(0))
	f.Fuzz(func(t *testing.T, seed uint64, n, k, variant, density, levels uint8, busy uint64) {
		size := int(n)%topology.WindowGPUs + 1
		rng := rand.New(rand.NewPCG(seed, uint64(density)))
		p := float64(density) / 255
		spread := int(levels)%32 + 1
		var sick topology.Bitset
		if variant&32 != 0 {
			sick = topology.Bitset(rng.Uint64()) & topology.Bitset(rng.Uint64())
		}
		links := []v1alpha1.Link{}
		for a := 0; a < size; a++ {
			for b := a + 1; b < size; b++ {
				lvl := machine.SyntheticPCIeLevel(size, a, b)
				l := v1alpha1.Link{A: a, B: b, PCIe: lvl, BandwidthGBps: max(machine.PCIeBandwidthGBps(4, lvl)-rng.IntN(spread), 0)}
				if rng.Float64() < p {
					l.NVLinks, l.P2P = 1+rng.IntN(4), true
					l.BandwidthGBps = 50*l.NVLinks + rng.IntN(spread)
				}
				links = append(links, l)
			}
		}
		gpus := machine.SyntheticGPUs(fmt.Sprint("fuzz-", seed), size)
		for i := range gpus {
			if sick.Has(i) {
				gpus[i].Health = v1alpha1.GPUUnhealthy
			}
		}
		g, err := topology.NewGraph(gpus, links)
		if err != nil {
			t.Fatalf("synthetic graph: %v", err)
		}
		r := topology.Request{Count: int(k)%size + 1, Requirement: v1alpha1.Requirement{
			Strategy:             v1alpha1.Strategies[int(variant)%len(v1alpha1.Strategies)],
			RequireNVLink:        variant&4 != 0,
			MinPairBandwidthGBps: int(variant&8) * 12,
		}, Utilization: benchUtil(size)}
		if variant&16 != 0 {
			r.Requirement.GPUMemoryMiB = 81920
		}
		free := g.All().Bitset() &^ topology.Bitset(busy)
		res, w, err := New(0).decide(g, free, r)
		if w.Used > SearchBudget {
			t.Fatalf("spent %d work units; the budget is %d", w.Used, SearchBudget)
		}
		if err != nil {
			var inf *topology.InfeasibleError
			if !errors.As(err, &inf) || inf.Reason == "" {
				t.Fatalf("want an infeasible reason, got %v", err)
			}
			return
		}
		if res.Heuristic != w.Short {
			t.Fatalf("Heuristic %t but the budget ran out: %t", res.Heuristic, w.Short)
		}
		checkAnswer(t, "fuzz", g, free.Mask(), r, res)
	})
}

// FuzzAllocateLargeNode builds a random node of 65..MaxGPUs GPUs, some busy
// or unhealthy, and asks for any count under any strategy and constraint:
// no panic, every answer meets the request and reports its metrics, and an
// answer from a window of more than 64 free GPUs says Heuristic.
func FuzzAllocateLargeNode(f *testing.F) {
	f.Add(uint64(1), uint8(7), uint8(4), uint8(0), uint8(255), uint64(0), uint64(0))
	f.Add(uint64(2), uint8(63), uint8(70), uint8(4), uint8(128), uint64(0xffff), uint64(0))
	f.Add(uint64(3), uint8(0), uint8(64), uint8(13), uint8(30), uint64(1), uint64(1<<63))
	f.Add(uint64(4), uint8(40), uint8(2), uint8(6), uint8(200), ^uint64(0), uint64(0xff))
	f.Fuzz(func(t *testing.T, seed uint64, n, k, variant, density uint8, busyLow, busyHigh uint64) {
		size := topology.WindowGPUs + 1 + int(n)%(topology.MaxGPUs-topology.WindowGPUs)
		rng := rand.New(rand.NewPCG(seed, uint64(density)))
		p := float64(density) / 255
		links := []v1alpha1.Link{}
		for a := 0; a < size; a++ {
			for b := a + 1; b < size; b++ {
				lvl := machine.SyntheticPCIeLevel(size, a, b)
				l := v1alpha1.Link{A: a, B: b, PCIe: lvl, BandwidthGBps: machine.PCIeBandwidthGBps(4, lvl)}
				if rng.Float64() < p {
					l.NVLinks, l.P2P = 1+rng.IntN(4), true
					l.BandwidthGBps = 50 * l.NVLinks
				}
				links = append(links, l)
			}
		}
		gpus := machine.SyntheticGPUs(fmt.Sprint("fuzz-large-", seed), size)
		if variant&32 != 0 {
			gpus[rng.IntN(size)].Health = v1alpha1.GPUUnhealthy
		}
		g, err := topology.NewGraph(gpus, links)
		if err != nil {
			t.Fatalf("synthetic graph: %v", err)
		}
		busy := maskOfWords(busyLow, busyHigh)
		free := g.All().Minus(busy)
		r := topology.Request{Count: int(k)%size + 1, Requirement: v1alpha1.Requirement{
			Strategy:             v1alpha1.Strategies[int(variant)%len(v1alpha1.Strategies)],
			RequireNVLink:        variant&4 != 0,
			MinPairBandwidthGBps: int(variant&8) * 12,
		}, Utilization: benchUtil(size)}
		res, err := New(0).Allocate(g, free, r)
		if err != nil {
			var inf *topology.InfeasibleError
			if !errors.As(err, &inf) || inf.Reason == "" {
				t.Fatalf("want an infeasible reason, got %v", err)
			}
			return
		}
		checkAnswer(t, "fuzz-large", g, free, r, res)
		if c := free.Intersect(g.Healthy()).Count(); c > topology.WindowGPUs && r.Count < c && !res.Heuristic {
			t.Fatalf("answer from a window of %d free GPUs without Heuristic", c)
		}
	})
}
