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
	set &= g.All()
	ring, _ := g.ringAtLeast(set, 0)
	return g.metrics(set, free&g.All(), ring)
}

func (g *Graph) metrics(set, free Mask, ring int) SetMetrics {
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
	_, order := g.ring(set & g.All())
	return order
}

// pairStats is the minimum and the sum of pair bandwidths inside set (0, 0
// for fewer than two GPUs).
func (g *Graph) pairStats(set Mask) (minPair, sum int) {
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
func (g *Graph) domains(set Mask) int {
	total := 0
	for t := range domainLevels {
		var spanned Mask
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
func (g *Graph) tier(set Mask) v1alpha1.LinkTier {
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
func (g *Graph) ring(set Mask) (int, []int) {
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
// (ok), and otherwise only reports that it is below floor (!ok), which lets
// the search drop a candidate early. It tries the bandwidth levels present
// in the set from the strongest down, bounded above by every GPU's
// second-strongest link (a ring uses two links per GPU) and below by the
// minimum pair (any order of a complete graph is a ring). Sets of more than
// RingExactMaxGPUs GPUs get the lower bound. It does not allocate for sets
// of up to 12 GPUs.
func (g *Graph) ringAtLeast(set Mask, floor int) (int, bool) {
	var buf [MaxGPUs]int
	idx := buf[:0]
	for r := set; r != 0; r &= r - 1 {
		idx = append(idx, bits.TrailingZeros64(uint64(r)))
	}
	k := len(idx)
	var v int
	switch {
	case k <= 1:
		return 0, floor <= 0
	case k == 2:
		v = g.bw[idx[0]*g.n+idx[1]]
		return v, v >= floor
	}
	minPair, _ := g.pairStats(set)
	if minPair >= floor && (k == 3 || k > RingExactMaxGPUs) {
		return minPair, true
	}
	if k == 3 || k > RingExactMaxGPUs {
		return minPair, false
	}
	upper := g.ringUpperBound(idx)
	if upper < floor {
		return upper, false
	}
	if upper <= minPair {
		return minPair, minPair >= floor
	}
	// Candidate levels: distinct pair bandwidths in (max(minPair, floor-1), upper].
	var lv [64]int
	levels := lv[:0]
	for i, a := range idx {
		for _, b := range idx[i+1:] {
			if bw := g.bw[a*g.n+b]; bw > minPair && bw <= upper && bw >= floor {
				levels = appendUnique(levels, bw)
			}
		}
	}
	sortDesc(levels)
	for _, t := range levels {
		if g.hamiltonCycle(idx, t, false) != nil {
			return t, true
		}
	}
	return minPair, minPair >= floor
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
	for mask := uint32(1); mask <= full; mask += 2 { // bit 0 always set
		for ends := uint32(reach[mask]); ends != 0; ends &= ends - 1 {
			v := bits.TrailingZeros32(ends)
			for next := adj[v] &^ mask; next != 0; next &= next - 1 {
				u := bits.TrailingZeros32(next)
				reach[mask|1<<u] |= 1 << u
			}
		}
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

// maxClique is the size of the largest clique of adj inside set: branch and
// bound, taking the lowest vertex in or out; bound by the set size. When
// budget is not nil it counts search nodes down and stops at zero (the
// answer is then a lower bound).
func maxClique(adj []Mask, set Mask, budget *int) int {
	best := 0
	var grow func(cand Mask, size int)
	grow = func(cand Mask, size int) {
		if size > best {
			best = size
		}
		for cand != 0 {
			if size+cand.Count() <= best {
				return
			}
			if budget != nil {
				if *budget <= 0 {
					return
				}
				*budget--
			}
			v := bits.TrailingZeros64(uint64(cand))
			cand &^= 1 << v
			grow(cand&adj[v], size+1)
		}
	}
	grow(set, 0)
	return best
}

// maxCliqueSet returns one largest clique of adj inside set (lowest indices
// among equals, found first by the search order).
func maxCliqueSet(adj []Mask, set Mask) Mask {
	var best Mask
	bestN := 0
	var grow func(cand, in Mask, size int)
	grow = func(cand, in Mask, size int) {
		if size > bestN {
			best, bestN = in, size
		}
		for cand != 0 {
			if size+cand.Count() <= bestN {
				return
			}
			v := bits.TrailingZeros64(uint64(cand))
			cand &^= 1 << v
			grow(cand&adj[v], in|1<<v, size+1)
		}
	}
	grow(set, 0, 0)
	return best
}

// countPairs counts the edges of adj inside set.
func countPairs(adj []Mask, set Mask) int {
	c := 0
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		c += (adj[a] & set &^ (Mask(2)<<a - 1)).Count()
	}
	return c
}

// countQuads counts the 4-cliques of adj inside set.
func countQuads(adj []Mask, set Mask) int {
	c := 0
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		na := adj[a] & set &^ (Mask(2)<<a - 1)
		for s := na; s != 0; s &= s - 1 {
			b := bits.TrailingZeros64(uint64(s))
			nab := na & adj[b] &^ (Mask(2)<<b - 1)
			for t := nab; t != 0; t &= t - 1 {
				d := bits.TrailingZeros64(uint64(t))
				c += (nab & adj[d] &^ (Mask(2)<<d - 1)).Count()
			}
		}
	}
	return c
}

func appendUnique(s []int, v int) []int {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

func sortDesc(s []int) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] > s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
