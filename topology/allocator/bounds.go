package allocator

import (
	"math/bits"

	"github.com/gputopo/gputopo/topology"
)

// The search's bounds: what prune compares with the best set before the
// walk extends a partial set, and the tables the cheap bounds and the
// minimum-pair filter read.

// sortByUtil fills byUtil, once, for the tight utilization bound.
func (s *search) sortByUtil() {
	s.w.Charge(int64(s.eligible.Count() * s.eligible.Count()))
	// Insertion sort, stable: at most 64 GPUs.
	for r := s.eligible; r != 0; r &= r - 1 {
		v := uint8(bits.TrailingZeros64(uint64(r)))
		j := s.nUtil
		for ; j > 0 && s.utilOf(int(s.byUtil[j-1])) > s.utilOf(int(v)); j-- {
			s.byUtil[j] = s.byUtil[j-1]
		}
		s.byUtil[j] = v
		s.nUtil++
	}
}

// prepareBounds finds what the cheap bounds need, once per search, only
// when some subtree is large enough for them.
func (s *search) prepareBounds() {
	g := s.g
	s.w.Charge(int64(2 * g.Len() * g.Len()))
	s.minRow = int64(maxInt)
	for a := 0; a < g.Len(); a++ {
		if !s.eligible.Has(a) {
			continue
		}
		s.minRow = min(s.minRow, s.row[a])
		for r := s.eligible &^ (topology.Bitset(2)<<a - 1); r != 0; r &= r - 1 {
			s.maxBW = max(s.maxBW, int64(g.BW(a, bits.TrailingZeros64(uint64(r)))))
		}
	}
	s.bounded = true
}

// buildStrong fills strong for floor: O(n^2), once per improvement of the
// best's minimum pair.
func (s *search) buildStrong(floor int) {
	g := s.g
	s.w.Charge(int64(2 * g.Len() * g.Len()))
	for a := 0; a < g.Len(); a++ {
		var m topology.Bitset
		for b := 0; b < g.Len(); b++ {
			if g.BW(a, b) >= floor {
				m |= 1 << b
			}
		}
		s.strong[a] = m &^ (1 << a)
	}
	s.strongFloor = floor
}

// prune reports whether no completion of p (p plus need GPUs of allowed)
// can beat the best: upper bounds on each key of every completion,
// compared with the best's keys in the strategy's order, fall below them,
// or tie them all while the best set has lower indices than any
// completion. The cost of a bound is paid only where it may save more:
// every partial set gets the first key's cheap bound (O(1)); a subtree of
// at least boundMinSets complete sets gets every key's cheap bound and, of
// at least tightBoundMinSets (or any subtree below tightBoundMinDepth
// GPUs), if those do not cut, the tight bounds, which cost a pass over
// allowed. It is true as well when the work ran out.
func (s *search) prune(p *partial, allowed topology.Bitset) bool {
	first := s.firstBound(p)
	bv := s.key(&s.best, s.order[0])
	if s.halt || first < bv {
		return true
	}
	n, r := allowed.Count(), s.k-p.cnt
	if !binomialAtLeast(n, r, boundMinSets) {
		return false
	}
	// Above the best on the first key, the cheap bounds of the others
	// cannot cut (highest_bandwidth's has one more term: try it).
	if (first == bv || s.order[0] == keyMinPair) && s.cuts(p, allowed, false, len(s.order)) {
		return true
	}
	// Deep partial sets (k close to n) cost O(|p|) each, as much as the
	// tight bounds: those get them whatever their subtree.
	return (p.cnt >= tightBoundMinDepth || binomialAtLeast(n, r, tightBoundMinSets)) && s.cuts(p, allowed, true, len(s.order))
}

// firstBound is the O(1) bound of the strategy's first key over p's
// completions, the one every partial set gets.
func (s *search) firstBound(p *partial) int64 {
	switch s.order[0] {
	case keyMinPair:
		if p.cnt < 2 {
			return int64(maxInt)
		}
		return int64(p.minPair)
	case keyNegDomains:
		return -int64(s.domainsOf(p))
	case keyNegUtil:
		return -(p.util + int64(s.k-p.cnt)*s.minUtil)
	case keyLeftIsland:
		if s.tabs != nil {
			return min(int64(s.freeN-s.k), int64(s.tabs.island[s.free&^p.chosen]))
		}
		return int64(s.freeN - s.k)
	}
	return int64(maxInt)
}

// boundMinSets and tightBoundMinSets are the smallest subtrees (in
// complete sets) for which prune computes every key's cheap bound and
// their tight bounds: below them, visiting the sets costs less.
const (
	boundMinSets       = 24
	tightBoundMinSets  = 64
	tightBoundMinDepth = 16
)

// cuts compares the bounds of the first keys keys with the best's; with
// every key and all of them tied, the lower indices decide.
func (s *search) cuts(p *partial, allowed topology.Bitset, tight bool, keys int) bool {
	if !s.bounded {
		s.prepareBounds()
	}
	for _, k := range s.order[:keys] {
		ub := s.upper(k, p, allowed, tight)
		bv := s.key(&s.best, k)
		if s.halt {
			return true
		}
		if ub != bv {
			return ub < bv
		}
	}
	if keys < len(s.order) {
		return false
	}
	least := p.chosen | firstK(allowed, s.k-p.cnt)
	return s.best.set == least || lowerIndices(s.best.set, least)
}

// upper bounds key k over every completion of p by s.k-p.cnt GPUs of
// allowed (p is not complete; it may be empty). Each bound holds for every
// completion, so comparing the bounds lexicographically with the best's
// keys bounds the completions' scores. Tight bounds are at most the cheap
// ones.
func (s *search) upper(k keyKind, p *partial, allowed topology.Bitset, tight bool) int64 {
	r := s.k - p.cnt
	switch k {
	case keyMinPair:
		return s.upperMinPair(p, allowed, tight)
	case keyRing:
		return s.upperRing(p, allowed, tight)
	case keySum:
		return s.upperSum(p, r)
	case keyNegDomains:
		if !tight {
			return -int64(s.domainsOf(p))
		}
		return -int64(s.domainsAtLeast(p, allowed, r))
	case keyNegUtil:
		return s.upperNegUtil(p, allowed, r, tight)
	case keyLeftIsland, keyLeftQuads, keyLeftPairs:
		return s.upperLeft(k, p, tight)
	case keyNegCut:
		// cut = rows of the set's GPUs - 2·sum.
		return 2*s.upperSum(p, r) - p.row - int64(r)*s.minRow
	}
	return int64(maxInt)
}

// upperRing: a ring's bottleneck is at most the minimum pair's bound where
// the ring is reported as the minimum pair, else at most the strongest
// eligible pair; tight, also at most each chosen GPU's second-strongest
// link into the GPUs a completion may hold, since a ring uses two links
// of every GPU.
func (s *search) upperRing(p *partial, allowed topology.Bitset, tight bool) int64 {
	if s.k <= 3 || s.k > topology.RingExactMaxGPUs {
		return s.upperMinPair(p, allowed, tight)
	}
	if !tight {
		return s.maxBW
	}
	g := s.g
	span := p.chosen | allowed
	s.w.Charge(int64(2 * p.cnt * span.Count()))
	ub := s.maxBW
	for c := p.chosen; c != 0; c &= c - 1 {
		a := bits.TrailingZeros64(uint64(c))
		first, second := -1, -1
		for x := span &^ (1 << a); x != 0; x &= x - 1 {
			bw := g.BW(a, bits.TrailingZeros64(uint64(x)))
			if bw > first {
				first, second = bw, first
			} else if bw > second {
				second = bw
			}
		}
		ub = min(ub, int64(second))
	}
	return ub
}

// upperNegUtil: the r GPUs still to come add at least r times the least
// utilization; tight, at least the r least utilized GPUs of allowed.
func (s *search) upperNegUtil(p *partial, allowed topology.Bitset, r int, tight bool) int64 {
	if !tight {
		return -(p.util + int64(r)*s.minUtil)
	}
	if s.nUtil == 0 {
		s.sortByUtil()
	}
	s.w.Charge(int64(s.nUtil))
	least, taken := int64(0), 0
	for _, u := range s.byUtil[:s.nUtil] {
		if taken == r {
			break
		}
		if allowed.Has(int(u)) {
			least += s.utilOf(int(u))
			taken++
		}
	}
	return -(p.util + least)
}

// upperLeft bounds the fragmentation keys (leftIsland, leftQuads,
// leftPairs). What is left is what is free now minus the completion: at
// most what p leaves, and at most everything among freeN-k GPUs.
func (s *search) upperLeft(k keyKind, p *partial, tight bool) int64 {
	g := s.g
	m := int64(s.freeN - s.k)
	rest := s.free &^ p.chosen
	if s.tabs != nil {
		switch k {
		case keyLeftIsland:
			return min(m, int64(s.tabs.island[rest]))
		case keyLeftQuads:
			return min(m*(m-1)*(m-2)*(m-3)/24, int64(s.tabs.quads[rest]))
		}
		return min(m*(m-1)/2, int64(s.tabs.pairs[rest]))
	}
	switch {
	case k == keyLeftIsland && !tight:
		if s.omega >= 0 {
			return min(m, int64(s.omega))
		}
		return m
	case k == keyLeftIsland:
		s.w.Charge(int64(4 * rest.Count()))
		ub := min(m, int64(greedyColours(g.NVAdjacency(), rest)))
		if s.omega >= 0 {
			ub = min(ub, int64(s.omega))
		}
		return ub
	case !tight && k == keyLeftQuads:
		return m * (m - 1) * (m - 2) * (m - 3) / 24
	case !tight:
		return m * (m - 1) / 2
	}
	s.w.Charge(int64(6 * rest.Count()))
	pairs := int64(topology.CountPairs(g.NVAdjacency(), rest))
	if k == keyLeftPairs {
		return min(m*(m-1)/2, pairs)
	}
	// A graph with P edges has at most as many 4-cliques as a
	// complete graph with P edges (Kruskal-Katona).
	t := min(m, cliqueSide(pairs))
	return t * (t - 1) * (t - 2) * (t - 3) / 24
}

// greedyColours is the number of colours a greedy colouring of set needs:
// an upper bound on its largest clique, in O(|set|) mask operations.
func greedyColours(adj []topology.Bitset, set topology.Bitset) int {
	col := 0
	for unc := set; unc != 0; {
		col++
		for q := unc; q != 0; {
			v := bits.TrailingZeros64(uint64(q))
			q &^= 1<<v | adj[v]
			unc &^= 1 << v
		}
	}
	return col
}

// cliqueSide is the fewest vertices whose complete graph has at least p
// edges.
func cliqueSide(p int64) int64 {
	t := int64(0)
	for t*(t-1)/2 < p {
		t++
	}
	return t
}

// upperMinPair: the completion's minimum pair is at most p's and, when
// two or more GPUs are still to come, at most the strongest eligible pair;
// tight, also at most the weakest link to p of the GPU of allowed best
// linked to p.
func (s *search) upperMinPair(p *partial, allowed topology.Bitset, tight bool) int64 {
	if s.k < 2 {
		return 0
	}
	ub := s.maxBW
	if p.cnt >= 2 {
		ub = min(ub, int64(p.minPair))
	}
	if !tight || p.cnt == 0 {
		return ub
	}
	g := s.g
	s.w.Charge(int64(allowed.Count() * (2*p.cnt + 1)))
	reach := 0
	for m := allowed; m != 0; m &= m - 1 {
		u := bits.TrailingZeros64(uint64(m))
		lu := maxInt
		for c := p.chosen; c != 0 && lu > reach; c &= c - 1 {
			lu = min(lu, g.BW(u, bits.TrailingZeros64(uint64(c))))
		}
		reach = max(reach, lu)
	}
	return min(ub, int64(reach))
}

// upperSum: p's pairs plus every pair still to come at the strongest
// eligible bandwidth.
func (s *search) upperSum(p *partial, r int) int64 {
	return int64(p.sum) + int64(r*p.cnt+r*(r-1)/2)*s.maxBW
}

// domainsAtLeast is a lower bound on the domain boundaries every
// completion of p crosses: at each level, p's domains, then, when the GPUs
// of allowed inside them are too few for the r still to come, as few more
// domains as can hold the rest (largest first).
func (s *search) domainsAtLeast(p *partial, allowed topology.Bitset, r int) int {
	g := s.g
	s.w.Charge(int64(topology.DomainLevels * (2*allowed.Count() + 8)))
	d := 0
	for t := range topology.DomainLevels {
		spanned := p.dom[t]
		d += spanned.Count() - 1
		var count [topology.WindowGPUs]uint8
		inside := 0
		var others topology.Bitset
		for m := allowed; m != 0; m &= m - 1 {
			b := g.DomainBit(t, bits.TrailingZeros64(uint64(m)))
			if b&spanned != 0 {
				inside++
			} else {
				count[bits.TrailingZeros64(uint64(b))]++
				others |= b
			}
		}
		for need := r - inside; need > 0 && others != 0; d++ {
			most := -1
			for o := others; o != 0; o &= o - 1 {
				if i := bits.TrailingZeros64(uint64(o)); most < 0 || count[i] > count[most] {
					most = i
				}
			}
			need -= int(count[most])
			others &^= 1 << most
			s.w.Charge(int64(others.Count()))
		}
	}
	return d
}
