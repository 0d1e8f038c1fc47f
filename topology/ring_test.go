package topology_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

func TestRingWithinMatchesEveryOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := 0; trial < 300; trial++ {
		n := 3 + rng.IntN(14)
		levels := 1 + rng.IntN(12)
		g := machine.Synthetic(fmt.Sprintf("ring-%d", trial), n, func(a, b int) v1alpha1.Link {
			return v1alpha1.Link{PCIe: v1alpha1.PCIeSameNUMA, BandwidthGBps: 10 * (1 + rng.IntN(levels))}
		})
		idx := g.All().Indices()
		best := 0
		if n <= 8 {
			permute(idx, 1, func(p []int) { best = max(best, ringOf(g, p)) })
		} else {
			// The Hamiltonian-cycle table is exact: the strongest level
			// with a cycle.
			for a := range idx {
				for b := a + 1; b < n; b++ {
					if bw := g.Bandwidth(a, b); bw > best && g.HamiltonCycle(idx, bw) != nil {
						best = bw
					}
				}
			}
		}
		for _, floor := range []int{0, best, best + 1} {
			v, ok, done := g.RingWithin(g.All().Bitset(), floor, nil)
			if !done || ok != (best >= floor) || (ok && v != best) {
				t.Fatalf("trial %d (%d GPUs) floor %d: RingWithin = %d, %t, %t; best ring %d", trial, n, floor, v, ok, done, best)
			}
		}
		for _, bw := range []int{best, best + 10} {
			cycle, done := g.CycleAtLeast(idx, bw, nil)
			if !done || cycle != (g.HamiltonCycle(idx, bw) != nil) {
				t.Fatalf("trial %d (%d GPUs): cycleAtLeast(%d) = %t, %t; the table says otherwise", trial, n, bw, cycle, done)
			}
		}
		// Starved of work, it says so and keeps a ring it has seen.
		w := &topology.Work{Limit: 0}
		if v, _, done := g.RingWithin(g.All().Bitset(), 0, w); !done && (v > best || !w.Short) {
			t.Fatalf("trial %d: out of work: ring %d (best %d), short %t", trial, v, best, w.Short)
		}
		order := make([]int, n)
		if v := g.GreedyRing(idx, order, n); v > best || ringOf(g, order) != v || topology.MaskOf(order...) != g.All() || order[0] != 0 {
			t.Fatalf("trial %d: greedy ring %d with order %v (its ring %d); best %d", trial, v, order, ringOf(g, order), best)
		}
	}
}
