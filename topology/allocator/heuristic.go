package allocator

import (
	"math/bits"
	"slices"

	"github.com/gputopo/gputopo/topology"
)

// heuristicStarts is how many greedy constructions improve tries.
const heuristicStarts = 8

// improve is the allocator's answer when the exact search ran out of
// work. It starts from the best set the search found (at worst the
// feasibility check's seed), builds greedy sets from up to
// heuristicStarts GPUs and keeps whichever scores best, then swaps one GPU
// in and one out, keeping any swap that scores better, until no swap helps
// or its share of the work is spent. Every set it considers meets the
// constraints (eligible GPUs only, every pair allowed), so its answer does
// too.
func (s *search) improve() {
	s.halt = false
	for _, start := range s.starts(heuristicStarts) {
		set := s.greedy(start)
		if s.halt {
			return
		}
		if set == 0 || set == s.best.set {
			continue
		}
		if c := (cand{set: set}); s.better(&c) {
			s.best = c
		}
		if s.halt {
			return
		}
	}
	s.swaps()
}

// swaps is first-improvement local search over one-for-one exchanges.
func (s *search) swaps() {
restart:
	for !s.halt {
		for out := s.best.set; out != 0; out &= out - 1 {
			v := bits.TrailingZeros64(uint64(out))
			rest := s.best.set &^ (1 << v)
			in := s.eligible &^ s.best.set
			if s.ok != nil {
				s.w.Charge(int64(rest.Count()))
				for c := rest; c != 0; c &= c - 1 {
					in &= s.ok[bits.TrailingZeros64(uint64(c))]
				}
			}
			for ; in != 0; in &= in - 1 {
				c := cand{set: rest | in&-in}
				if s.better(&c) {
					s.best = c
					continue restart
				}
				if s.halt {
					return
				}
			}
		}
		return
	}
}

// starts orders the eligible GPUs by how promising a first GPU they are
// for the strategy's first key (startScore) and keeps the first n.
func (s *search) starts(n int) []int {
	s.w.Charge(int64(s.g.Len() * s.g.Len()))
	type start struct {
		gpu   int
		score int64
	}
	var all []start
	for m := s.eligible; m != 0; m &= m - 1 {
		v := bits.TrailingZeros64(uint64(m))
		all = append(all, start{v, s.startScore(v)})
	}
	slices.SortStableFunc(all, func(a, b start) int {
		switch {
		case a.score > b.score:
			return -1
		case a.score < b.score:
			return 1
		}
		return 0
	})
	out := make([]int, 0, n)
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, all[i].gpu)
	}
	return out
}

// firstStart is the most promising start (lowest index among equals), -1
// when no GPU is eligible; it is the warm start of every larger exact
// search, so it neither sorts nor allocates.
func (s *search) firstStart() int {
	s.w.Charge(int64(s.g.Len() * s.g.Len()))
	best, bestScore := -1, int64(0)
	for m := s.eligible; m != 0; m &= m - 1 {
		v := bits.TrailingZeros64(uint64(m))
		if sc := s.startScore(v); best < 0 || sc > bestScore {
			best, bestScore = v, sc
		}
	}
	return best
}

// startScore rates v as the first GPU of a greedy set: its strongest
// eligible link (highest_bandwidth), its utilization, lowest first
// (balanced_utilization), the NVLinks it takes from the free GPUs, fewest
// first (lowest_fragmentation); numa_local starts from the lowest index.
func (s *search) startScore(v int) int64 {
	g := s.g
	var score int64
	switch s.order[0] {
	case keyMinPair:
		for o := s.eligible &^ (1 << v); o != 0; o &= o - 1 {
			score = max(score, int64(g.BW(v, bits.TrailingZeros64(uint64(o)))))
		}
	case keyNegUtil:
		score = -s.utilOf(v)
	case keyLeftIsland:
		score = -int64((g.NVAdjacency()[v] & s.free).Count())
	}
	return score
}

// greedy builds a set from start, each step adding the allowed GPU that
// does best on a cheap stand-in for the strategy's first key, then on its
// weakest and total link to the set (lowest index among equals): the
// strongest weakest link (highest_bandwidth), the fewest new domains
// (numa_local), the least utilized (balanced_utilization), the fewest
// NVLinks into the free GPUs left (lowest_fragmentation). It returns 0
// when the constraints leave too few GPUs on the way.
func (s *search) greedy(start int) topology.Bitset {
	g := s.g
	set := topology.Bitset(1) << start
	allowed := s.eligible &^ set
	if s.ok != nil {
		allowed &= s.ok[start]
	}
	var minTo, sumTo [topology.WindowGPUs]int64
	for m := allowed; m != 0; m &= m - 1 {
		u := bits.TrailingZeros64(uint64(m))
		minTo[u] = int64(g.BW(u, start))
		sumTo[u] = minTo[u]
	}
	var dom [topology.DomainLevels]topology.Bitset
	for t := range dom {
		dom[t] = g.DomainBit(t, start)
	}
	for n := 1; n < s.k; n++ {
		if allowed.Count() < s.k-n {
			return 0
		}
		if !s.w.Spend(int64(4 * allowed.Count())) {
			s.halt = true
			return 0
		}
		pick := -1
		var best [3]int64
		for m := allowed; m != 0; m &= m - 1 {
			u := bits.TrailingZeros64(uint64(m))
			var first int64
			switch s.order[0] {
			case keyMinPair:
				first = minTo[u]
			case keyNegDomains:
				for t := range dom {
					if dom[t]&g.DomainBit(t, u) == 0 {
						first--
					}
				}
			case keyNegUtil:
				first = -s.utilOf(u)
			case keyLeftIsland:
				first = -int64((g.NVAdjacency()[u] & s.free &^ set).Count())
			}
			gain := [3]int64{first, minTo[u], sumTo[u]}
			if pick < 0 || slices.Compare(gain[:], best[:]) > 0 {
				pick, best = u, gain
			}
		}
		set |= 1 << pick
		allowed &^= 1 << pick
		if s.ok != nil {
			allowed &= s.ok[pick]
		}
		for t := range dom {
			dom[t] |= g.DomainBit(t, pick)
		}
		for m := allowed; m != 0; m &= m - 1 {
			u := bits.TrailingZeros64(uint64(m))
			bw := int64(g.BW(u, pick))
			minTo[u] = min(minTo[u], bw)
			sumTo[u] += bw
		}
	}
	return set
}
