package topology

import (
	"math/bits"
	"slices"
)

// ringTourMinGPUs is the smallest set for which RingWithin first tries
// nearest-neighbour tours (O(k^3)) for a lower bound: below it a ring table
// (O(2^k·k)) costs less than the tours.
const ringTourMinGPUs = 9

// RingTableCost is the work of one Hamiltonian-cycle table over k GPUs
// (hamiltonCycle): 2^(k-1) subsets, k-1 steps each, two units a step (one
// unit is about a nanosecond; 16 GPUs take about 1 M units).
func RingTableCost(k int) int64 {
	if k < 2 {
		return 1
	}
	return 2*int64(1)<<(k-1)*int64(k-1) + int64(k*k)
}

// RingWithin computes the best ring's bottleneck through set when it is at
// least floor (ok), and otherwise only reports that it is below floor (!ok).
// The answer lies between a lower bound, the minimum pair (any order of a
// complete graph is a ring) or, from ringTourMinGPUs GPUs, the best
// nearest-neighbour tour, and an upper bound, every GPU's second-strongest
// link (a ring uses two links per GPU); between them it tries the
// strongest of the set's distinct bandwidths, then binary-searches the
// others (a cycle using only links of at least t exists for every t up to
// the best ring's bottleneck and for none above), each probe a
// cycleAtLeast. Sets of more than RingExactMaxGPUs GPUs get the minimum
// pair. w is charged and asked before each Hamiltonian-cycle table; done
// is false when it could not pay for one, and v is then the best ring
// found so far.
func (g *Graph) RingWithin(set Bitset, floor int, w *Work) (v int, ok, done bool) {
	var buf [WindowGPUs]int
	idx := buf[:0]
	for r := set; r != 0; r &= r - 1 {
		idx = append(idx, bits.TrailingZeros64(uint64(r)))
	}
	k := len(idx)
	switch {
	case k <= 1:
		return 0, floor <= 0, true
	case k == 2:
		v = g.bw[idx[0]*g.n+idx[1]]
		return v, v >= floor, true
	}
	w.Charge(int64(2 * k * k))
	minPair, _ := g.PairStats(set)
	if k == 3 || k > RingExactMaxGPUs {
		return minPair, minPair >= floor, true
	}
	upper := g.ringUpperBound(idx)
	if upper < floor {
		return upper, false, true
	}
	if upper <= minPair {
		return minPair, minPair >= floor, true
	}
	lower := minPair
	if k >= ringTourMinGPUs {
		w.Charge(int64(3 * k * k))
		lower = max(g.GreedyRing(idx, nil, 1), minPair)
		if lower >= upper {
			return upper, upper >= floor, true
		}
	}
	// Candidate levels, ascending: distinct pair bandwidths in
	// (lower, upper] that reach floor.
	var lv [RingExactMaxGPUs * (RingExactMaxGPUs - 1) / 2]int
	levels := lv[:0]
	for i, a := range idx {
		for _, b := range idx[i+1:] {
			if bw := g.bw[a*g.n+b]; bw > lower && bw <= upper && bw >= floor {
				levels = append(levels, bw)
			}
		}
	}
	w.Charge(int64(8 * len(levels)))
	slices.Sort(levels)
	levels = slices.Compact(levels)
	// levels[lo] has a cycle (lo = -1: lower has one), levels[hi] has none
	// (hi = len(levels): nothing above upper has one). Below a floor above
	// lower, the floor's level is tried first: most candidates of a search
	// fail there. Then the strongest: on real machines the upper bound is
	// usually the ring.
	lo, hi := -1, len(levels)
	atFloor, atTop := floor > lower, true
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		switch {
		case atFloor:
			mid, atFloor = 0, false
		case atTop:
			mid, atTop = hi-1, false
		}
		cycle, done := g.cycleAtLeast(idx, levels[mid], w)
		if !done {
			if lo >= 0 {
				lower = levels[lo]
			}
			return lower, lower >= floor, false
		}
		if cycle {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo < 0 {
		return lower, lower >= floor, true
	}
	return levels[lo], true, true
}

// GreedyRing is the best bottleneck among the nearest-neighbour tours
// through idx from its first starts GPUs (all of them when starts >= k),
// each step taking the strongest link to a GPU not yet visited (the lowest
// index among equals). When order is not nil it receives the best tour,
// rotated to start at idx[0]. O(starts·k^2).
func (g *Graph) GreedyRing(idx []int, order []int, starts int) int {
	k := len(idx)
	best := -1
	var tour [RingExactMaxGPUs]int
	if k > RingExactMaxGPUs {
		return 0
	}
	for s := range min(starts, k) {
		var seen uint32 = 1 << s
		cur, bottleneck := s, int(^uint(0)>>1)
		tour[0] = s
		for step := 1; step < k; step++ {
			next, nbw := -1, -1
			for u := range idx {
				if seen&(1<<u) == 0 {
					if bw := g.bw[idx[cur]*g.n+idx[u]]; bw > nbw {
						next, nbw = u, bw
					}
				}
			}
			seen |= 1 << next
			bottleneck = min(bottleneck, nbw)
			tour[step] = next
			cur = next
		}
		bottleneck = min(bottleneck, g.bw[idx[cur]*g.n+idx[s]])
		if bottleneck > best {
			best = bottleneck
			if order != nil {
				// Rotate so the tour starts at idx[0].
				at := 0
				for i := range k {
					if tour[i] == 0 {
						at = i
					}
				}
				for i := range k {
					order[i] = idx[tour[(at+i)%k]]
				}
			}
		}
	}
	return best
}

// cycleAtLeast reports whether a ring through idx can use only links of at
// least t. From ringTourMinGPUs GPUs it first tries what is cheap: a ring
// needs every GPU to keep two such links and the links to be 2-connected
// (else no), and a short backtracking search, strongest-constrained GPU
// first, usually finds a ring when there is one; only when both are
// inconclusive does it build the Hamiltonian-cycle table, which w must
// afford (done is false when it cannot).
func (g *Graph) cycleAtLeast(idx []int, t int, w *Work) (cycle, done bool) {
	k := len(idx)
	if k >= ringTourMinGPUs {
		var adj [RingExactMaxGPUs]uint32
		for i, a := range idx {
			for j, b := range idx {
				if i != j && g.bw[a*g.n+b] >= t {
					adj[i] |= 1 << j
				}
			}
		}
		w.Charge(int64(3 * k * k))
		if !biconnected(&adj, k) {
			return false, true
		}
		h := hamiltonSearch{adj: &adj, k: k, full: uint32(1)<<k - 1, left: 64 * k}
		found := h.extend(0, 1)
		w.Charge(int64((64*k - h.left) * 3 * k))
		if found || h.left > 0 {
			return found, true
		}
	}
	cost := RingTableCost(k)
	if !w.Afford(cost) {
		return false, false
	}
	w.Charge(cost)
	return g.hamiltonCycle(idx, t, false) != nil, true
}

// biconnected reports whether the graph adj on vertices 0..k-1 (k >= 3)
// stays connected after removing any one vertex, which a Hamiltonian
// cycle needs. O(k^2) mask steps (k+1 searches of O(k)).
func biconnected(adj *[RingExactMaxGPUs]uint32, k int) bool {
	all := uint32(1)<<k - 1
	for v := -1; v < k; v++ {
		within := all
		if v >= 0 {
			within &^= 1 << v
		}
		seen := within & -within
		for frontier := seen; frontier != 0; {
			var next uint32
			for f := frontier; f != 0; f &= f - 1 {
				next |= adj[bits.TrailingZeros32(f)]
			}
			next &= within &^ seen
			seen |= next
			frontier = next
		}
		if seen != within {
			return false
		}
	}
	return true
}

// hamiltonSearch looks for a Hamiltonian cycle by extending a path from
// vertex 0, trying the next vertex with the fewest unvisited neighbours
// first, and cutting a path after which some unvisited vertex could not
// get its two ring links. left bounds the paths it extends; when it
// reaches zero the search gives up without an answer.
type hamiltonSearch struct {
	adj  *[RingExactMaxGPUs]uint32
	k    int
	full uint32
	left int
}

func (h *hamiltonSearch) extend(v int, visited uint32) bool {
	if visited == h.full {
		return h.adj[v]&1 != 0
	}
	if h.left <= 0 {
		return false
	}
	h.left--
	unvisited := h.full &^ visited
	// Every unvisited vertex needs two links among the unvisited, the
	// path's end and its start.
	open := unvisited | 1<<v | 1
	for u := unvisited; u != 0; u &= u - 1 {
		if bits.OnesCount32(h.adj[bits.TrailingZeros32(u)]&open) < 2 {
			return false
		}
	}
	for next := h.adj[v] & unvisited; next != 0; {
		// Fewest onward links first (Warnsdorff), lowest index among equals.
		pick, fewest := -1, 99
		for c := next; c != 0; c &= c - 1 {
			u := bits.TrailingZeros32(c)
			if d := bits.OnesCount32(h.adj[u] & unvisited); d < fewest {
				pick, fewest = u, d
			}
		}
		next &^= 1 << pick
		if h.extend(pick, visited|1<<pick) {
			return true
		}
		if h.left <= 0 {
			return false
		}
	}
	return false
}
