package topology

import (
	"math/bits"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// RingExactMaxGPUs is the largest set whose best ring is computed exactly
// (a Hamiltonian-cycle search over subsets, O(2^k·k) per bandwidth level).
// Larger sets report the minimum pair bandwidth as their ring bandwidth, a
// lower bound that is exact on NVSwitch machines, and ring order ascending.
const RingExactMaxGPUs = 16

// Metrics describes set as a placement: its bandwidths, the boundaries it
// crosses, its weakest tier, and what it leaves behind among free &^ set.
func (g *Graph) Metrics(set, free Mask) SetMetrics {
	return g.MetricsWithRing(set, free, -1)
}

// MetricsWithRing is Metrics with the set's ring bandwidth given by the
// caller, a search that has it (possibly only the best ring its work budget
// found), instead of computed; ring < 0 computes it.
func (g *Graph) MetricsWithRing(set, free Mask, ring int) SetMetrics {
	set, free = set.Intersect(g.All()), free.Intersect(g.All())
	if g.Wide() {
		return g.wideMetrics(set, free, ring)
	}
	if ring < 0 {
		ring, _ = g.ringAtLeast(set.Bitset(), 0)
	}
	return g.metrics(set.Bitset(), free.Bitset()&g.all(), ring)
}

func (g *Graph) metrics(set, free Bitset, ring int) SetMetrics {
	minPair, sum := g.PairStats(set)
	left := free &^ set
	return SetMetrics{
		MinPairGBps:       minPair,
		RingGBps:          ring,
		SumGBps:           sum,
		DomainsCrossed:    g.Domains(set),
		Tier:              g.Tier(set),
		LeftLargestIsland: MaxClique(g.nv, left, nil),
		LeftNVLinkPairs:   CountPairs(g.nv, left),
		LeftNVLinkQuads:   countQuads(g.nv, left),
	}
}

// countQuads counts the 4-cliques of adj inside set.
func countQuads(adj []Bitset, set Bitset) int {
	q, _ := CountCliques(adj, set, 4, nil)
	return q
}

// RingOrder returns the set's GPUs in the order of its best ring (the one
// whose weakest link is strongest), starting at the lowest index.
func (g *Graph) RingOrder(set Mask) []int {
	set = set.Intersect(g.All())
	if !g.Wide() {
		_, order := g.ring(set.Bitset())
		return order
	}
	if c := set.Count(); c <= 3 || c > RingExactMaxGPUs {
		return set.Indices()
	}
	w, idx := g.Window(set)
	_, order := w.ring(w.all())
	for i, l := range order {
		order[i] = idx[l]
	}
	return order
}

// PairStats is the minimum and the sum of pair bandwidths inside set (0, 0
// for fewer than two GPUs), on a graph of at most WindowGPUs GPUs.
func (g *Graph) PairStats(set Bitset) (minPair, sum int) {
	if set.Count() < 2 {
		return 0, 0
	}
	minPair = int(^uint(0) >> 1)
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		for s := r & (r - 1); s != 0; s &= s - 1 {
			b := bits.TrailingZeros64(uint64(s))
			bw := g.bw[a*g.n+b]
			sum += bw
			if bw < minPair {
				minPair = bw
			}
		}
	}
	return minPair, sum
}

// Domains counts the domain boundaries set crosses, on a graph of at most
// WindowGPUs GPUs: at each domain level, the number of domains it spans
// minus one (SetMetrics.DomainsCrossed).
func (g *Graph) Domains(set Bitset) int {
	total := 0
	for t := range domainLevels {
		var spanned Bitset
		for r := set; r != 0; r &= r - 1 {
			spanned |= g.domBit[t][bits.TrailingZeros64(uint64(r))]
		}
		if c := spanned.Count(); c > 1 {
			total += c - 1
		}
	}
	return total
}

// Tier is the weakest link tier inside set, on a graph of at most
// WindowGPUs GPUs.
func (g *Graph) Tier(set Bitset) v1alpha1.LinkTier {
	switch set.Count() {
	case 0:
		return ""
	case 1:
		return v1alpha1.TierSingleGPU
	}
	worst := v1alpha1.TierNVSwitch
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		for s := r & (r - 1); s != 0; s &= s - 1 {
			b := bits.TrailingZeros64(uint64(s))
			t := g.pairTier(a, b)
			if v1alpha1.TierRank(t) > v1alpha1.TierRank(worst) {
				worst = t
			}
		}
	}
	return worst
}

func (g *Graph) pairTier(a, b int) v1alpha1.LinkTier {
	l := g.links[a*g.n+b]
	switch {
	case l.NVLinks > 0 && l.NVSwitch:
		return v1alpha1.TierNVSwitch
	case l.NVLinks > 0:
		return v1alpha1.TierNVLink
	}
	switch r := g.rank[a*g.n+b]; {
	case r <= pcieRanks[v1alpha1.PCIeMultipleSwitches]:
		return v1alpha1.TierPCIeSwitch
	case r <= pcieRanks[v1alpha1.PCIeSameNUMA]:
		return v1alpha1.TierPCIeHostBridge
	}
	return v1alpha1.TierCrossSocket
}

// ring finds the best ring through set: the cyclic order whose weakest link
// is strongest (bottleneck travelling salesman), and that order starting at
// the lowest index.
func (g *Graph) ring(set Bitset) (int, []int) {
	v, _ := g.ringAtLeast(set, 0)
	idx := set.Indices()
	if len(idx) <= 3 || len(idx) > RingExactMaxGPUs {
		return v, idx
	}
	if order := g.hamiltonCycle(idx, v, true); order != nil {
		return v, order
	}
	return v, idx
}

// ringAtLeast computes the best ring's bottleneck when it is at least floor
// (ok), and otherwise only reports that it is below floor (!ok), without a
// work limit (see RingWithin). It does not allocate for sets of up to 12
// GPUs.
func (g *Graph) ringAtLeast(set Bitset, floor int) (int, bool) {
	v, ok, _ := g.RingWithin(set, floor, nil)
	return v, ok
}

// ringUpperBound is the smallest second-strongest link over the set's GPUs.
func (g *Graph) ringUpperBound(idx []int) int {
	upper := int(^uint(0) >> 1)
	for _, a := range idx {
		first, second := -1, -1
		for _, b := range idx {
			if a == b {
				continue
			}
			bw := g.bw[a*g.n+b]
			if bw > first {
				first, second = bw, first
			} else if bw > second {
				second = bw
			}
		}
		if second < upper {
			upper = second
		}
	}
	return upper
}

// HamiltonCycle returns a ring order through idx (at most RingExactMaxGPUs
// GPUs of a graph of at most WindowGPUs) using only links of at least
// minBW, starting at idx[0] with the smaller of its neighbours second; nil
// when there is none. It builds the table RingTableCost(len(idx)) prices.
func (g *Graph) HamiltonCycle(idx []int, minBW int) []int {
	return g.hamiltonCycle(idx, minBW, true)
}

// found is hamiltonCycle's non-nil answer when the order is not wanted.
var found = []int{}

// hamiltonCycle returns a cycle through idx (at most RingExactMaxGPUs GPUs)
// using only links of at least minBW, or nil; with wantOrder false, any
// non-nil slice means yes. Dynamic programming over subsets: reach[mask]
// holds the vertices a path from idx[0] through exactly mask can end at.
func (g *Graph) hamiltonCycle(idx []int, minBW int, wantOrder bool) []int {
	k := len(idx)
	var adj [RingExactMaxGPUs]uint32
	for i, a := range idx {
		for j, b := range idx {
			if i != j && g.bw[a*g.n+b] >= minBW {
				adj[i] |= 1 << j
			}
		}
	}
	var small [1 << 12]uint16
	var reach []uint16
	if k <= 12 {
		reach = small[:1<<k]
	} else {
		reach = make([]uint16, 1<<k)
	}
	reach[1] = 1
	full := uint32(1)<<k - 1
	// A path through mask (bit 0 always set) can end at u when one through
	// mask without u ends at a neighbour of u: 2^(k-1)·(k-1) steps whatever
	// the links (RingTableCost).
	for mask := uint32(3); mask <= full; mask += 2 {
		var ends uint16
		for m := mask &^ 1; m != 0; m &= m - 1 {
			u := bits.TrailingZeros32(m)
			if uint32(reach[mask&^(1<<u)])&adj[u] != 0 {
				ends |= 1 << u
			}
		}
		reach[mask] = ends
	}
	closing := uint32(reach[full]) & adj[0]
	if closing == 0 {
		return nil
	}
	if !wantOrder {
		return found
	}
	// Walk back from the highest-numbered closing vertex.
	order := make([]int, k)
	v := 31 - bits.LeadingZeros32(closing)
	mask := full
	for pos := k - 1; pos > 0; pos-- {
		order[pos] = idx[v]
		mask &^= 1 << v
		for p := uint32(reach[mask]); p != 0; p &= p - 1 {
			u := bits.TrailingZeros32(p)
			if adj[u]&(1<<v) != 0 {
				v = u
				break
			}
		}
	}
	order[0] = idx[0]
	// Canonical direction: the smaller neighbour of the first GPU second.
	if order[1] > order[k-1] {
		for i, j := 1, k-1; i < j; i, j = i+1, j-1 {
			order[i], order[j] = order[j], order[i]
		}
	}
	return order
}

// CountPairs counts the edges of adj inside set: for an NVLink adjacency,
// the NVLinked pairs.
func CountPairs(adj []Bitset, set Bitset) int {
	c := 0
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		c += (adj[a] & set &^ (Bitset(2)<<a - 1)).Count()
	}
	return c
}
