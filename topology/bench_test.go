package topology

import (
	"fmt"
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// benchAllocate runs the brute-force baseline and then the allocator on the
// same question, and reports the allocator's speedup over the baseline
// measured in the same process.
func benchAllocate(b *testing.B, g *Graph, free Mask, r Request) {
	var bruteNs float64
	b.Run("bruteforce", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := BruteForce(g, free, r); err != nil {
				b.Fatal(err)
			}
		}
		bruteNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("allocate", func(b *testing.B) {
		a := NewAllocator(0) // no memo: every iteration searches
		if _, err := a.Allocate(g, free, r); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := a.Allocate(g, free, r); err != nil {
				b.Fatal(err)
			}
		}
		if ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N); ns > 0 && bruteNs > 0 {
			b.ReportMetric(bruteNs/ns, "x-faster")
		}
	})
}

// BenchmarkAllocate_N8 is the DGX-1 V100 hybrid cube-mesh, every k, with
// the bandwidth and fragmentation strategies.
func BenchmarkAllocate_N8(b *testing.B) {
	g := mustFixture(b, "dgx1-v100")
	for _, s := range []v1alpha1.Strategy{v1alpha1.StrategyHighestBandwidth, v1alpha1.StrategyLowestFragmentation} {
		for k := 1; k <= 8; k++ {
			b.Run(fmt.Sprintf("%s/k=%d", s, k), func(b *testing.B) {
				benchAllocate(b, g, g.All(), req(k, s))
			})
		}
	}
}

// BenchmarkAllocate_N16 is the DGX-2 (16 GPUs on NVSwitch, where every set
// ties on bandwidth: the hardest case for pruning) with two GPUs busy.
func BenchmarkAllocate_N16(b *testing.B) {
	g := mustFixture(b, "dgx2")
	free := g.All() &^ MaskOf(3, 12)
	for _, s := range v1alpha1.Strategies {
		for _, k := range []int{2, 4, 8} {
			r := req(k, s)
			if s == v1alpha1.StrategyBalancedUtilization {
				r.Utilization = make([]int32, g.Len())
				for i := range r.Utilization {
					r.Utilization[i] = int32(i * 37 % 100)
				}
			}
			b.Run(fmt.Sprintf("%s/k=%d", s, k), func(b *testing.B) {
				benchAllocate(b, g, free, r)
			})
		}
	}
}

// BenchmarkAllocate_MemoHit is the cost of a repeated question: what a
// cluster of identical nodes pays per node after the first.
func BenchmarkAllocate_MemoHit(b *testing.B) {
	f := FixturesMust(b, "dgx2")
	a := NewAllocator(1024)
	g := f.Graph("node-0")
	r := req(8, v1alpha1.StrategyHighestBandwidth)
	if _, err := a.Allocate(g, g.All(), r); err != nil {
		b.Fatal(err)
	}
	other := f.Graph("node-1") // identical machine: same hash
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Allocate(other, g.All(), r); err != nil {
			b.Fatal(err)
		}
	}
}
