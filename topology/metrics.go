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
	set, free = set.Intersect(g.All()), free.Intersect(g.All())
	if g.wide() {
		return g.wideMetrics(set, free, -1)
	}
	return g.metricsOf(set.bits(), free.bits())
}

func (g *Graph) metricsOf(set, free bitset) SetMetrics {
	ring, _ := g.ringAtLeast(set, 0)
	return g.metrics(set, free&g.all(), ring)
}

func (g *Graph) metrics(set, free bitset, ring int) SetMetrics {
	minPair, sum := g.pairStats(set)
	left := free &^ set
	return SetMetrics{
		MinPairGBps:       minPair,
		RingGBps:          ring,
		SumGBps:           sum,
		DomainsCrossed:    g.domains(set),
		Tier:              g.tier(set),
		LeftLargestIsland: maxClique(g.nv, left, nil),
		LeftNVLinkPairs:   countPairs(g.nv, left),
		LeftNVLinkQuads:   countQuads(g.nv, left),
	}
}

// RingOrder returns the set's GPUs in the order of its best ring (the one
// whose weakest link is strongest), starting at the lowest index.
func (g *Graph) RingOrder(set Mask) []int {
	set = set.Intersect(g.All())
	if !g.wide() {
		_, order := g.ring(set.bits())
		return order
	}
	if c := set.Count(); c <= 3 || c > RingExactMaxGPUs {
		return set.Indices()
	}
	w, idx := g.window(set)
	_, order := w.ring(w.all())
	for i, l := range order {
		order[i] = idx[l]
	}
	return order
}

// pairStats is the minimum and the sum of pair bandwidths inside set (0, 0
// for fewer than two GPUs).
func (g *Graph) pairStats(set bitset) (minPair, sum int) {
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

// domains counts the domain boundaries set crosses: at each domain level,
// the number of domains it spans minus one.
func (g *Graph) domains(set bitset) int {
	total := 0
	for t := range domainLevels {
		var spanned bitset
		for r := set; r != 0; r &= r - 1 {
			spanned |= g.domBit[t][bits.TrailingZeros64(uint64(r))]
		}
		if c := spanned.Count(); c > 1 {
			total += c - 1
		}
	}
	return total
}

// tier is the weakest link tier inside set.
func (g *Graph) tier(set bitset) v1alpha1.LinkTier {
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
func (g *Graph) ring(set bitset) (int, []int) {
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
// work limit (see ringWithin). It does not allocate for sets of up to 12
// GPUs.
func (g *Graph) ringAtLeast(set bitset, floor int) (int, bool) {
	v, ok, _ := g.ringWithin(set, floor, nil)
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
	// the links (ringTableCost).
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

// countPairs counts the edges of adj inside set.
func countPairs(adj []bitset, set bitset) int {
	c := 0
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		c += (adj[a] & set &^ (bitset(2)<<a - 1)).Count()
	}
	return c
}

// countQuads counts the 4-cliques of adj inside set.
func countQuads(adj []bitset, set bitset) int {
	c := 0
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		na := adj[a] & set &^ (bitset(2)<<a - 1)
		for s := na; s != 0; s &= s - 1 {
			b := bits.TrailingZeros64(uint64(s))
			nab := na & adj[b] &^ (bitset(2)<<b - 1)
			for t := nab; t != 0; t &= t - 1 {
				d := bits.TrailingZeros64(uint64(t))
				c += (nab & adj[d] &^ (bitset(2)<<d - 1)).Count()
			}
		}
	}
	return c
}
