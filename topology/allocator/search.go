package allocator

import (
	"math/bits"
	"slices"

	"github.com/gputopo/gputopo/topology"
)

const maxInt = int(^uint(0) >> 1)

// search is one decision: a branch-and-bound walk over sets in increasing
// index order (so sets are met in the order of the final tie-break, lowest
// indices first), extending only with GPUs that keep every pair allowed,
// and cutting a partial set when an upper bound on every key of its
// completions (bounds.go) is already worse than the best set, or ties it
// while the best set has lower indices than every completion. Complete
// sets are compared key by key, computing a key only when the earlier ones
// tie. Every step is charged to w; when it runs out the walk stops
// (heuristic is set) and improve takes over from the best set found.
type search struct {
	g     *topology.Graph
	k     int
	order []keyKind
	free  topology.Bitset // free healthy GPUs
	ok    []topology.Bitset
	util  []int32
	tabs  *tables
	row   [topology.WindowGPUs]int64 // bandwidth from each GPU to every other free GPU
	best  cand
	w     *topology.Work

	// halt stops the current phase: its work ran out. heuristic records
	// that the exact search stopped before it finished.
	halt, heuristic bool
	// tally counts finish's metrics, which are not cut short.
	tally topology.Work

	eligible topology.Bitset
	omega    int // largest NVLink clique among the free GPUs; -1 until needed
	// cliques are largest NVLink cliques of the free GPUs found so far.
	cliques   [16]topology.Bitset
	nCliques  int
	quadsFree int64 // NVLink 4-cliques among the free GPUs; -1 until needed
	// strong[v] holds the eligible GPUs whose link to v reaches
	// strongFloor (highest_bandwidth's filter; strongFloor -1: not built).
	strong      [topology.WindowGPUs]topology.Bitset
	strongFloor int
	freeN       int                        // number of free GPUs
	maxBW       int64                      // strongest pair among the eligible GPUs (once bounded)
	minRow      int64                      // smallest row among the eligible GPUs (once bounded)
	bounded     bool                       // maxBW and minRow are set
	byUtil      [topology.WindowGPUs]uint8 // eligible GPUs, least utilized first (ties: lower index)
	minUtil     int64                      // least utilization among the eligible GPUs
	nUtil       int
}

// cand is a complete candidate whose keys are computed on demand.
type cand struct {
	set  topology.Bitset
	have uint16
	vals [numKeyKinds]int64
}

// partial is a set being built and what is known of it so far.
type partial struct {
	chosen           topology.Bitset
	cnt              int
	minPair, maxPair int
	sum              int
	dom              [topology.DomainLevels]topology.Bitset
	util             int64
	row              int64 // bandwidth from the chosen GPUs to every free GPU
}

// init prepares s, a zero search, for one request. s, and the work it
// charges (s.w, set by the caller), are the caller's, so that both can live
// on the stack.
func (s *search) init(g *topology.Graph, free topology.Bitset, req topology.Request, f feasibility, tabs *tables) {
	// Field by field: s is already zero, and a composite literal would
	// clear its 2 KiB again.
	s.g, s.k = g, req.Count
	s.order = objectives[req.Requirement.EffectiveStrategy()]
	s.free = free & g.Healthy().Bitset() & g.All().Bitset()
	s.ok, s.util, s.tabs, s.eligible = f.ok, req.Utilization, tabs, f.eligible
	s.omega, s.quadsFree, s.strongFloor = -1, -1, -1
	s.best = cand{set: f.seed}
	s.freeN = s.free.Count()
	for a := 0; a < g.Len(); a++ {
		for r := s.free &^ (1 << a); r != 0; r &= r - 1 {
			s.row[a] += int64(g.BW(a, bits.TrailingZeros64(uint64(r))))
		}
	}
	if s.order[0] == keyNegUtil {
		s.minUtil = int64(maxInt)
		for r := f.eligible; r != 0; r &= r - 1 {
			s.minUtil = min(s.minUtil, s.utilOf(bits.TrailingZeros64(uint64(r))))
		}
	}
}

func (s *search) utilOf(i int) int64 {
	if i < len(s.util) {
		return int64(s.util[i])
	}
	return 0
}

// run walks every set of eligible GPUs, or until the search's share of the
// work is spent. A greedy set (heuristic.go) replaces the seed first when it
// scores better, so that bounds cut early; the walk still proves or finds
// the optimum and its tie-break.
func (s *search) run(eligible topology.Bitset) {
	if binomialAtLeast(eligible.Count(), s.k, warmStartMinSets) {
		s.warmStart()
	}
	if !s.halt {
		s.dfs(partial{minPair: maxInt}, eligible)
	}
	if s.halt {
		s.heuristic = true
	}
}

// warmStartMinSets is the number of candidate sets from which the search
// starts from a greedy set: below it the walk is cheaper than the greedy.
const warmStartMinSets = 1000

func (s *search) warmStart() {
	if start := s.firstStart(); start >= 0 {
		if set := s.greedy(start); set != 0 && set != s.best.set && !s.halt {
			if c := (cand{set: set}); s.better(&c) {
				s.best = c
			}
		}
	}
}

// binomialAtLeast reports whether C(n, k) >= t (0 <= n <= WindowGPUs).
func binomialAtLeast(n, k int, t int64) bool {
	if k < 0 || k > n {
		return t <= 0
	}
	return binomials[n][k] >= t
}

// binomials is Pascal's triangle up to WindowGPUs, saturating at 2^62: a
// constant table, looked up on every partial set.
var binomials = func() (c [topology.WindowGPUs + 1][topology.WindowGPUs + 1]int64) {
	for n := range c {
		c[n][0] = 1
		for k := 1; k <= n; k++ {
			c[n][k] = min(c[n-1][k-1]+c[n-1][k], 1<<62)
		}
	}
	return c
}()

// key is c's key k, computed on first use (halt is set when the work ran
// out). The cached case inlines.
func (s *search) key(c *cand, k keyKind) int64 {
	if c.have&(1<<k) != 0 {
		return c.vals[k]
	}
	return s.fill(c, k)
}

func (s *search) fill(c *cand, k keyKind) int64 {
	v, done := s.compute(k, c.set)
	if !done {
		s.halt = true
		return v
	}
	c.vals[k] = v
	c.have |= 1 << k
	return v
}

// compute evaluates one key of set, charging its cost; done is false when
// the work ran out first.
func (s *search) compute(k keyKind, set topology.Bitset) (int64, bool) {
	left := s.free &^ set
	if s.tabs != nil && isLeftKey(k) {
		return s.tabs.left(k, left), true
	}
	g := s.g
	c := int64(set.Count())
	var cost int64
	switch k {
	case keyRing:
		v, _, done := g.RingWithin(set, 0, s.w)
		return int64(v), done
	case keyLeftIsland:
		return s.island(left, 0)
	case keyLeftQuads:
		return s.quads(left)
	case keyLeftPairs:
		cost = 4 * int64(left.Count())
	case keyNegCut:
		cost = 2 * c * int64(left.Count())
	default:
		cost = c * c
	}
	if !s.w.Afford(cost) {
		return 0, false
	}
	s.w.Charge(cost)
	return keyValue(g, k, set, s.free, s.util), true
}

// island is the largest NVLink clique in left (a subset of the free GPUs)
// when it has at least floor GPUs, else 0. Its search stops at the free
// GPUs' largest clique, which no subset exceeds.
//
// Largest cliques of the free GPUs found on the way are remembered: when
// one of them lies inside left, so does the answer, without a search.
func (s *search) island(left topology.Bitset, floor int) (int64, bool) {
	if s.omega < 0 {
		m, done := topology.LargestClique(s.g.NVAdjacency(), s.free, 0, 0, s.w)
		if !done {
			return 0, false
		}
		s.omega = m.Count()
		s.remember(m)
	}
	s.w.Charge(int64(s.nCliques))
	for _, c := range s.cliques[:s.nCliques] {
		if c&^left == 0 {
			return int64(s.omega), true
		}
	}
	m, done := topology.LargestClique(s.g.NVAdjacency(), left, floor, s.omega, s.w)
	if m.Count() == s.omega {
		s.remember(m)
	}
	return int64(m.Count()), done
}

// remember keeps a largest clique of the free GPUs (up to len(cliques)).
func (s *search) remember(c topology.Bitset) {
	if s.nCliques < len(s.cliques) {
		s.cliques[s.nCliques] = c
		s.nCliques++
	}
}

// quads counts the NVLink 4-cliques in left, a subset of the free GPUs.
// When few free GPUs are missing from left it counts from the free GPUs'
// total down, one missing GPU v at a time (removing v from X loses the
// triangles of N(v) ∩ X), which costs k·deg^2 instead of n^3.
func (s *search) quads(left topology.Bitset) (int64, bool) {
	g := s.g
	gone := s.free &^ left
	if gone.Count()*6 >= s.freeN {
		q, done := topology.CountCliques(g.NVAdjacency(), left, 4, s.w)
		return int64(q), done
	}
	if s.quadsFree < 0 {
		q, done := topology.CountCliques(g.NVAdjacency(), s.free, 4, s.w)
		if !done {
			return 0, false
		}
		s.quadsFree = int64(q)
	}
	q, x := s.quadsFree, s.free
	for r := gone; r != 0; r &= r - 1 {
		v := bits.TrailingZeros64(uint64(r))
		x &^= 1 << v
		t, done := topology.CountCliques(g.NVAdjacency(), g.NVAdjacency()[v]&x, 3, s.w)
		if !done {
			return 0, false
		}
		q -= int64(t)
	}
	return q, true
}

// better reports whether c beats the current best. It is false as well
// when the work ran out during the comparison (halt is then set).
func (s *search) better(c *cand) bool {
	for _, k := range s.order {
		if k == keyRing && c.have&(1<<keyRing) == 0 {
			// Only a ring at least as good as the best's matters.
			floor := s.key(&s.best, keyRing)
			if s.halt {
				return false
			}
			r, ok, done := s.g.RingWithin(c.set, int(floor), s.w)
			if !done {
				s.halt = true
				return false
			}
			if !ok {
				return false
			}
			c.vals[keyRing] = int64(r)
			c.have |= 1 << keyRing
		}
		if k == keyLeftIsland && s.tabs == nil && c.have&(1<<keyLeftIsland) == 0 {
			// Likewise only an island at least as large as the best's.
			floor := s.key(&s.best, keyLeftIsland)
			if s.halt {
				return false
			}
			v, done := s.island(s.free&^c.set, int(floor))
			if !done {
				s.halt = true
				return false
			}
			if v < floor {
				return false
			}
			c.vals[keyLeftIsland] = v
			c.have |= 1 << keyLeftIsland
		}
		x := s.key(c, k)
		y := s.key(&s.best, k)
		if s.halt {
			return false
		}
		if x != y {
			return x > y
		}
	}
	return lowerIndices(c.set, s.best.set)
}

// dfs extends p with GPUs from allowed.
func (s *search) dfs(p partial, allowed topology.Bitset) {
	if p.cnt == s.k {
		s.leaf(&p)
		return
	}
	need := s.k - p.cnt
	if allowed.Count() < need {
		return
	}
	if !s.w.Spend(int64(8 + 2*p.cnt + 4*allowed.Count())) {
		s.halt = true
		return
	}
	if s.prune(&p, allowed) {
		return
	}
	g := s.g
	// When the minimum pair is the first key, a GPU whose link to v is
	// below the best's minimum pair makes every set holding both worse.
	filter := s.order[0] == keyMinPair && s.k >= 2
	for r := allowed; r != 0; r &= r - 1 {
		v := bits.TrailingZeros64(uint64(r))
		next := r &^ (topology.Bitset(2)<<v - 1)
		if s.ok != nil {
			next &= s.ok[v]
		}
		if filter {
			floor := int(s.key(&s.best, keyMinPair))
			if s.halt {
				return
			}
			if floor != s.strongFloor {
				s.buildStrong(floor)
			}
			next &= s.strong[v]
		}
		if next.Count() < need-1 {
			// Later v only have fewer GPUs above them.
			if s.ok == nil && !filter {
				return
			}
			continue
		}
		q := p
		q.chosen |= 1 << v
		q.cnt++
		for c := p.chosen; c != 0; c &= c - 1 {
			bw := g.BW(v, bits.TrailingZeros64(uint64(c)))
			q.sum += bw
			q.minPair = min(q.minPair, bw)
			q.maxPair = max(q.maxPair, bw)
		}
		for t := range q.dom {
			q.dom[t] |= g.DomainBit(t, v)
		}
		q.util += s.utilOf(v)
		q.row += s.row[v]
		s.dfs(q, next)
		if s.halt {
			return
		}
	}
}

// leaf compares a complete set with the best, presetting the keys the walk
// already knows.
func (s *search) leaf(p *partial) {
	if !s.w.Spend(int64(8 + p.cnt)) {
		s.halt = true
		return
	}
	c := cand{set: p.chosen, have: 1<<keyMinPair | 1<<keySum | 1<<keyNegDomains | 1<<keyNegUtil | 1<<keyNegCut}
	minPair := p.minPair
	if p.cnt < 2 {
		minPair = 0
	}
	c.vals[keyMinPair], c.vals[keySum], c.vals[keyNegUtil] = int64(minPair), int64(p.sum), -p.util
	// Every pair inside the set is counted twice in row.
	c.vals[keyNegCut] = -(p.row - 2*int64(p.sum))
	if p.cnt <= 3 || p.cnt > topology.RingExactMaxGPUs || p.minPair == p.maxPair {
		// Every ring's weakest link is the minimum pair (or, above
		// RingExactMaxGPUs, the ring is reported as the minimum pair).
		c.vals[keyRing] = int64(minPair)
		c.have |= 1 << keyRing
	}
	c.vals[keyNegDomains] = -int64(s.domainsOf(p))
	if s.better(&c) {
		s.best = c
	}
}

func (s *search) domainsOf(p *partial) int {
	d := 0
	for _, m := range p.dom {
		d += m.Count() - 1
	}
	return d
}

// finishReserve is the work kept back from the search and the heuristic
// for finish: two ring tables (the ring's level, then its order) and the
// metrics (metricsReserve).
func finishReserve(k, n int) int64 {
	r := metricsReserve(n)
	if k > 3 && k <= topology.RingExactMaxGPUs {
		r += 2 * topology.RingTableCost(k)
	}
	return r
}

// metricsReserve covers finish's metrics of the set and of what it leaves:
// pairs and tiers (O(k^2), with map lookups), 4-cliques (O(n^3)) and one
// clique search.
func metricsReserve(n int) int64 {
	return int64(16*n*n+n*n*n/3) + 1<<18
}

// finish describes the best set: its ring order and metrics, reusing the
// keys the search computed. A ring whose exact computation does not fit in
// the work left is the best nearest-neighbour tour, and the result is then
// heuristic too.
func (s *search) finish(budget int64) topology.Result {
	g, set := s.g, s.best.set
	idx := set.Indices()
	k := len(idx)
	s.w.Limit = budget - metricsReserve(g.Len())
	exact := true
	var ring int
	if s.best.have&(1<<keyRing) != 0 {
		ring = int(s.best.vals[keyRing])
	} else {
		ring, _, exact = g.RingWithin(set, 0, s.w)
	}
	minPair, sum := g.PairStats(set)
	order := idx
	if k > 3 && k <= topology.RingExactMaxGPUs {
		switch {
		case exact && minPair >= ring:
			completeRingOrder(idx)
		case exact && s.w.Afford(topology.RingTableCost(k)):
			s.w.Charge(topology.RingTableCost(k))
			if o := g.HamiltonCycle(idx, ring); o != nil {
				order = o
			}
		default:
			exact = false
			order = make([]int, k)
			s.w.Charge(int64(3 * k * k * k))
			ring = g.GreedyRing(idx, order, k)
		}
	}
	// What is left: from the search's keys or the tables when it has them,
	// else counted here (polynomial, charged but not cut short).
	s.w.Limit = budget
	s.w.Charge(int64(16 * k * k))
	s.tally = topology.Work{Limit: int64(maxInt)}
	left := s.free &^ set
	island := s.leftKey(keyLeftIsland, left)
	quads := s.leftKey(keyLeftQuads, left)
	pairs := s.leftKey(keyLeftPairs, left)
	s.w.Charge(s.tally.Used)
	res := topology.Result{GPUs: order, Metrics: topology.SetMetrics{
		MinPairGBps:       minPair,
		RingGBps:          ring,
		SumGBps:           sum,
		DomainsCrossed:    g.Domains(set),
		Tier:              g.Tier(set),
		LeftLargestIsland: island,
		LeftNVLinkPairs:   pairs,
		LeftNVLinkQuads:   quads,
	}}
	res.Heuristic = s.heuristic || !exact
	return res
}

// leftKey is the best set's fragmentation key k (leftIsland, leftQuads or
// leftPairs) over left, the free GPUs it leaves: the search's value when
// it computed one, else the tables', else counted here and charged to
// s.tally.
func (s *search) leftKey(k keyKind, left topology.Bitset) int {
	if s.best.have&(1<<k) != 0 {
		return int(s.best.vals[k])
	}
	if s.tabs != nil {
		return int(s.tabs.left(k, left))
	}
	adj := s.g.NVAdjacency()
	switch k {
	case keyLeftIsland:
		m, _ := topology.LargestClique(adj, left, 0, 0, &s.tally)
		return m.Count()
	case keyLeftQuads:
		q, _ := topology.CountCliques(adj, left, 4, &s.tally)
		return q
	}
	s.tally.Charge(int64(left.Count()))
	return topology.CountPairs(adj, left)
}

// completeRingOrder is the ring order HamiltonCycle returns when every
// link qualifies (each path through a subset can then end at any GPU but
// the first, and its walk back always steps to the lowest remaining one):
// idx[0], idx[k-2], idx[k-3], ..., idx[1], idx[k-1]. It saves a table of
// 2^(k-1) entries on NVSwitch machines, where every ring is such a ring.
// It reorders idx in place.
func completeRingOrder(idx []int) {
	slices.Reverse(idx[1 : len(idx)-1])
}
