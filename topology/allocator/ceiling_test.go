package allocator

import (
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// maxedGraph is n GPUs whose every pair claims the ceiling: the largest
// numbers the allocator and the metrics can ever be handed.
func maxedGraph(t testing.TB, n int) *topology.Graph {
	t.Helper()
	gpus := make([]v1alpha1.GPU, n)
	var links []v1alpha1.Link
	for i := range gpus {
		gpus[i] = v1alpha1.GPU{Index: i, UUID: machine.FixtureUUID("maxed", i), MemoryMiB: 1 << 40}
		for j := i + 1; j < n; j++ {
			links = append(links, v1alpha1.Link{A: i, B: j, NVLinks: topology.MaxNVLinks, NVSwitch: true, P2P: true, PCIe: v1alpha1.PCIeCrossSocket, BandwidthGBps: topology.MaxPairGBps})
		}
	}
	g, err := topology.NewGraph(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// With every pair of a node at the ceiling, every sum the metrics and the
// objective form is exact: no overflow, no wrap to negative. 64 GPUs is
// the largest graph searched directly, topology.MaxGPUs the largest searched
// through windows.
func TestSumsAtTheCeilingDoNotOverflow(t *testing.T) {
	for _, n := range []int{topology.WindowGPUs, topology.MaxGPUs} {
		g := maxedGraph(t, n)
		all := g.All()
		pairs := n * (n - 1) / 2
		m := g.Metrics(all, all)
		if want := pairs * topology.MaxPairGBps; m.SumGBps != want || m.MinPairGBps != topology.MaxPairGBps || m.RingGBps != topology.MaxPairGBps {
			t.Errorf("metrics of all %d GPUs: sum %d, min pair %d, ring %d; want %d, %d, %d", n, m.SumGBps, m.MinPairGBps, m.RingGBps, want, topology.MaxPairGBps, topology.MaxPairGBps)
		}
		var even []int
		for i := 0; i < n; i += 2 {
			even = append(even, i)
		}
		half := topology.MaskOf(even...)
		h := int64(n / 2)
		for _, s := range v1alpha1.Strategies {
			score := Objective(g, half, all, topology.Request{Count: half.Count(), Requirement: v1alpha1.Requirement{Strategy: s}})
			for i, k := range objectives[s] {
				var want int64
				switch k {
				case keyMinPair, keyRing:
					want = topology.MaxPairGBps
				case keySum:
					want = h * (h - 1) / 2 * topology.MaxPairGBps
				case keyNegCut:
					want = -h * h * topology.MaxPairGBps
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

// The allocator answers on the largest graph the model accepts, every
// pair at the ceiling: each strategy returns k distinct GPUs whose metrics
// carry the ceiling's exact figures.
func TestAllocatorOnA64GPUGraphAtTheCeiling(t *testing.T) {
	g := maxedGraph(t, topology.MaxGPUs)
	a := New(4)
	for _, k := range []int{1, 2, 8, 63, 64} {
		for _, s := range v1alpha1.Strategies {
			req := topology.Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s, RequireNVLink: true, MinPairBandwidthGBps: topology.MaxPairGBps}}
			res, err := a.Allocate(g, g.All(), req)
			if err != nil {
				t.Fatalf("k=%d %s: %v", k, s, err)
			}
			set := topology.MaskOf(res.GPUs...)
			if set.Count() != k || len(res.GPUs) != k {
				t.Fatalf("k=%d %s: got GPUs %v", k, s, res.GPUs)
			}
			if want := k * (k - 1) / 2 * topology.MaxPairGBps; res.Metrics.SumGBps != want {
				t.Errorf("k=%d %s: sum %d GB/s, want %d", k, s, res.Metrics.SumGBps, want)
			}
		}
	}
}
