package allocator

import (
	"container/list"
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// tablesMaxGPUs is the largest graph for which the allocator precomputes
// the fragmentation of every free mask (2^n entries, 7 bytes each).
const tablesMaxGPUs = 16

// maxTables bounds how many distinct topologies' tables one Allocator keeps.
const maxTables = 64

// Allocator chooses GPUs for requests. It is safe for concurrent use. It
// remembers answers by (topology hash, free GPUs, request) so that a
// cluster of identical nodes pays for each distinct question once, and it
// keeps per-topology tables of what every free mask leaves behind.
type Allocator struct {
	memoSize int
	// budget is SearchBudget; tests lower it to reach the heuristic on
	// small machines.
	budget int64

	// memo is split into shards (memoShards, or one for a memo smaller
	// than minShardedMemo), each with its own lock and LRU list, so that
	// the parallel filters of one pod do not queue on one lock; a key
	// always goes to the same shard, and the shards' sizes add up to at
	// most memoSize.
	memo      []memoShard
	shardBits uint

	// tabs is the per-topology tables by graph hash, an immutable map
	// replaced whole under tabMu when a topology is added: reads take no
	// lock.
	tabMu    sync.Mutex
	tabs     atomic.Pointer[map[string]*tableEntry]
	tabOrder []string
}

// memoShards is how many shards a large memo has (a power of two), and
// minShardedMemo the smallest memo that is sharded.
const (
	memoShards     = 16
	minShardedMemo = 64 * memoShards
)

type memoShard struct {
	mu   sync.Mutex
	size int // the shard's share of memoSize
	memo map[memoKey]*list.Element
	lru  *list.List // of *memoEntry, most recent first
	_    [24]byte   // keep shards' locks on separate cache lines
}

type memoKey struct {
	hash  string
	free  topology.Mask
	count int
	req   v1alpha1.Requirement
	util  string // only for balanced_utilization, which reads it
}

type memoEntry struct {
	key memoKey
	res topology.Result
	err error
}

type tableEntry struct {
	once sync.Once
	t    *tables
}

// New returns an Allocator remembering up to memoSize answers
// (least recently used first out, within each of its shards); memoSize
// <= 0 disables the memo.
func New(memoSize int) *Allocator {
	a := &Allocator{
		memoSize: memoSize,
		budget:   SearchBudget,
	}
	a.tabs.Store(&map[string]*tableEntry{})
	n := 1
	if memoSize >= minShardedMemo {
		n, a.shardBits = memoShards, 4
	}
	a.memo = make([]memoShard, n)
	for i := range a.memo {
		a.memo[i] = memoShard{size: max(memoSize/n, 1), memo: make(map[memoKey]*list.Element), lru: list.New()}
	}
	return a
}

// shard is the memo shard of k.
func (a *Allocator) shard(k *memoKey) *memoShard {
	h := (k.free.Word(0) ^ k.free.Word(1)*0xD6E8FEB86659FD93) * 0x9E3779B97F4A7C15
	h ^= uint64(k.count) * 0xC2B2AE3D27D4EB4F
	for i := max(len(k.hash)-8, 0); i < len(k.hash); i++ {
		h = (h ^ uint64(k.hash[i])) * 0x100000001B3
	}
	for i := 0; i < len(k.util); i++ {
		h = (h ^ uint64(k.util[i])) * 0x100000001B3
	}
	return &a.memo[h>>(64-a.shardBits)&(uint64(len(a.memo))-1)]
}

// memoLen is how many answers the memo holds.
func (a *Allocator) memoLen() int {
	n := 0
	for i := range a.memo {
		a.memo[i].mu.Lock()
		n += a.memo[i].lru.Len()
		a.memo[i].mu.Unlock()
	}
	return n
}

// Allocate chooses req.Count GPUs among free (ANDed with g.Healthy()) that
// satisfy req.Requirement and are best under its strategy (see Score).
// Result.GPUs are in best ring order. The work is bounded by SearchBudget:
// when the exact search cannot finish within it, the answer is the
// heuristic's (it still meets every constraint) and Result.Heuristic says
// so. Bad input is a plain error naming the field; when the free GPUs
// cannot satisfy the request the error is an *InfeasibleError whose reason
// a person can act on.
func (a *Allocator) Allocate(g *topology.Graph, free topology.Mask, req topology.Request) (topology.Result, error) {
	if g == nil {
		return topology.Result{}, errors.New("allocate: graph is nil")
	}
	if err := validateRequest(g, req); err != nil {
		return topology.Result{}, fmt.Errorf("allocate: %w", err)
	}
	free = free.Intersect(g.Healthy())
	if a.memoSize <= 0 {
		// allocateAny's dispatch, written out: allocateAny is too large to
		// inline, and the extra call is measurable on 8-GPU decisions.
		if !g.Wide() {
			return a.allocate(g, free.Bitset(), req)
		}
		return a.allocateWide(g, free, req)
	}
	key := memoKey{hash: g.Hash(), free: free, count: req.Count, req: req.Requirement}
	key.req.Strategy = req.Requirement.EffectiveStrategy()
	if key.req.Strategy == v1alpha1.StrategyBalancedUtilization {
		key.util = utilKey(req.Utilization)
	}
	sh := a.shard(&key)
	sh.mu.Lock()
	if el, ok := sh.memo[key]; ok {
		sh.lru.MoveToFront(el)
		e := el.Value.(*memoEntry)
		sh.mu.Unlock()
		return copyResult(e.res), e.err
	}
	sh.mu.Unlock()

	res, err := a.allocateAny(g, free, req)

	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.memo[key]; !ok {
		sh.memo[key] = sh.lru.PushFront(&memoEntry{key: key, res: copyResult(res), err: err})
		for sh.lru.Len() > sh.size {
			old := sh.lru.Remove(sh.lru.Back()).(*memoEntry)
			delete(sh.memo, old.key)
		}
	}
	return res, err
}

func copyResult(r topology.Result) topology.Result {
	r.GPUs = append([]int(nil), r.GPUs...)
	return r
}

func utilKey(util []int32) string {
	b := make([]byte, len(util))
	for i, u := range util {
		b[i] = byte(u) // validated 0..100
	}
	return string(b)
}

// validateRequest reports the first invalid field of req for g.
func validateRequest(g *topology.Graph, req topology.Request) error {
	if req.Count <= 0 {
		return fmt.Errorf("request count: %d; must be at least 1", req.Count)
	}
	if req.Count > g.Len() {
		return fmt.Errorf("request count: %d GPUs requested but the node has %d", req.Count, g.Len())
	}
	r := req.Requirement
	if r.Strategy != "" && !v1alpha1.ValidStrategy(r.Strategy) {
		return fmt.Errorf("request requirement.strategy: unknown strategy %q; want one of %v", r.Strategy, v1alpha1.Strategies)
	}
	if errs := r.Validate(nil); len(errs) > 0 {
		return fmt.Errorf("request requirement: %w", errs.ToAggregate())
	}
	if req.Utilization != nil && len(req.Utilization) != g.Len() {
		return fmt.Errorf("request utilization: %d entries; want none or one per GPU (%d)", len(req.Utilization), g.Len())
	}
	for i, u := range req.Utilization {
		if u < 0 || u > 100 {
			return fmt.Errorf("request utilization[%d]: %d; must be a percentage 0..100", i, u)
		}
	}
	return nil
}

// feasibility holds what the constraints leave: the GPUs that may be
// chosen, which pairs may be chosen together (nil: any), and one feasible
// set to start from.
type feasibility struct {
	eligible topology.Bitset
	ok       []topology.Bitset
	seed     topology.Bitset
}

// checkFeasible applies the constraints in the order a person would fix
// them (count, memory, NVLink, bandwidth) and explains the first that the
// free GPUs cannot meet. Its clique searches are charged to w (nil: no
// limit); one that runs out of work without finding k GPUs is reported as
// infeasible within the budget, a case not seen on any graph of 64 GPUs
// (docs/topology.md).
func checkFeasible(g *topology.Graph, free topology.Bitset, req topology.Request, w *topology.Work) (feasibility, error) {
	k := req.Count
	r := req.Requirement
	free &= g.Healthy().Bitset() & g.All().Bitset()
	if c := free.Count(); c < k {
		return feasibility{}, tooFewFree(g, k, c)
	}
	eligible := free
	if r.GPUMemoryMiB > 0 {
		var most int64
		for m := free; m != 0; m &= m - 1 {
			i := bits.TrailingZeros64(uint64(m))
			mem := g.GPU(i).MemoryMiB
			most = max(most, mem)
			if mem < r.GPUMemoryMiB {
				eligible &^= 1 << i
			}
		}
		switch c := eligible.Count(); {
		case c == 0:
			return feasibility{}, &topology.InfeasibleError{Kind: topology.InfeasibleMemory, Reason: fmt.Sprintf("needs %d MiB per GPU; free GPUs have at most %d MiB", r.GPUMemoryMiB, most)}
		case c < k:
			return feasibility{}, &topology.InfeasibleError{Kind: topology.InfeasibleMemory, Reason: fmt.Sprintf("needs %d GPUs with %d MiB each; %d free GPUs have that much", k, r.GPUMemoryMiB, c)}
		}
	}
	f := feasibility{eligible: eligible}
	if k == 1 || (!r.RequireNVLink && r.MinPairBandwidthGBps <= 0) {
		f.seed = firstK(eligible, k)
		return f, nil
	}
	if r.RequireNVLink {
		clique, done := topology.LargestClique(g.NVAdjacency(), eligible, 0, k, w)
		if c := clique.Count(); c < k {
			return feasibility{}, &topology.InfeasibleError{Kind: topology.InfeasibleNVLink, Reason: fmt.Sprintf("needs NVLink between %d GPUs; largest free NVLink-connected set has %d%s", k, c, unfinished(done))}
		}
	}
	f.ok = make([]topology.Bitset, g.Len())
	bestPair := 0
	for a := 0; a < g.Len(); a++ {
		for b := 0; b < g.Len(); b++ {
			if a == b || (r.RequireNVLink && g.NVAdjacency()[a]&(1<<b) == 0) {
				continue
			}
			bw := g.BW(a, b)
			if eligible.Has(a) && eligible.Has(b) {
				bestPair = max(bestPair, bw)
			}
			if bw >= r.MinPairBandwidthGBps {
				f.ok[a] |= 1 << b
			}
		}
	}
	clique, done := topology.LargestClique(f.ok, eligible, 0, k, w)
	if c := clique.Count(); c < k {
		what := "free GPUs"
		if r.RequireNVLink {
			what = "free NVLink-connected GPUs"
		}
		return feasibility{}, &topology.InfeasibleError{Kind: topology.InfeasibleBandwidth, Reason: fmt.Sprintf(
			"needs at least %d GB/s between every pair of %d GPUs; largest set of %s meeting it has %d (best pair: %d GB/s)%s",
			r.MinPairBandwidthGBps, k, what, c, bestPair, unfinished(done))}
	}
	f.seed = firstK(clique, k)
	return f, nil
}

// tooFewFree explains a request for k GPUs when only c are free and
// healthy.
func tooFewFree(g *topology.Graph, k, c int) *topology.InfeasibleError {
	reason := fmt.Sprintf("needs %d GPUs; %d of %d are free", k, c, g.Len())
	if unhealthy := g.All().Minus(g.Healthy()).Count(); unhealthy > 0 {
		reason += fmt.Sprintf(" and healthy (%d unhealthy)", unhealthy)
	}
	return &topology.InfeasibleError{Kind: topology.InfeasibleTooFewFree, Reason: reason}
}

// unfinished qualifies a largest-clique figure whose search ran out of
// work: it is then only the largest found.
func unfinished(done bool) string {
	if done {
		return ""
	}
	return " found within the search budget"
}

// firstK is the k lowest GPUs of m.
func firstK(m topology.Bitset, k int) topology.Bitset {
	var out topology.Bitset
	for ; k > 0 && m != 0; k-- {
		low := m & -m
		out |= low
		m &^= low
	}
	return out
}

// allocateAny answers on a graph of any size: directly, or through a
// window of a large one (wide.go).
func (a *Allocator) allocateAny(g *topology.Graph, free topology.Mask, req topology.Request) (topology.Result, error) {
	if g.Wide() {
		return a.allocateWide(g, free, req)
	}
	return a.allocate(g, free.Bitset(), req)
}

func (a *Allocator) allocate(g *topology.Graph, free topology.Bitset, req topology.Request) (topology.Result, error) {
	res, _, err := a.decide(g, free, req)
	return res, err
}

// decide answers one request within a.budget and also returns the work
// it spent, for the tests of the bound. The phases: the feasibility check
// (which finds a seed set meeting the constraints), the exact search up to
// searchShare percent of what finish does not need (finishReserve), the
// heuristic up to all of that when the search did not finish, and finish
// (the final ring and metrics) with the rest.
func (a *Allocator) decide(g *topology.Graph, free topology.Bitset, req topology.Request) (topology.Result, topology.Work, error) {
	w := &topology.Work{Limit: a.budget}
	f, err := checkFeasible(g, free, req, w)
	if err != nil {
		return topology.Result{}, *w, err
	}
	var s search
	s.init(g, free, req, f, a.tables(g))
	s.w = w
	w.Charge(int64(g.Len() * g.Len()))
	if f.eligible.Count() == req.Count {
		// Only one set has k of the eligible GPUs, and the feasibility
		// check has shown that it meets the constraints.
		s.best = cand{set: f.eligible}
	} else {
		rest := a.budget - finishReserve(req.Count, g.Len())
		w.Limit = rest * searchShare / 100
		s.run(f.eligible)
		if s.heuristic {
			w.Limit = rest
			s.improve()
		}
	}
	res := s.finish(a.budget)
	return res, *w, nil
}

// result describes a chosen set: ring order and metrics.
func result(g *topology.Graph, set, free topology.Bitset) topology.Result {
	return topology.Result{GPUs: g.RingOrder(set.Mask()), Metrics: g.Metrics(set.Mask(), free.Mask())}
}

// tables returns the fragmentation tables for g's topology, building them
// once per hash; nil for graphs too large to tabulate.
func (a *Allocator) tables(g *topology.Graph) *tables {
	if g.Len() > tablesMaxGPUs {
		return nil
	}
	e, ok := (*a.tabs.Load())[g.Hash()]
	if !ok {
		a.tabMu.Lock()
		if e, ok = (*a.tabs.Load())[g.Hash()]; !ok {
			next := maps.Clone(*a.tabs.Load())
			e = &tableEntry{}
			next[g.Hash()] = e
			a.tabOrder = append(a.tabOrder, g.Hash())
			if len(a.tabOrder) > maxTables {
				delete(next, a.tabOrder[0])
				a.tabOrder = a.tabOrder[1:]
			}
			a.tabs.Store(&next)
		}
		a.tabMu.Unlock()
	}
	e.once.Do(func() { e.t = buildTables(g.NVAdjacency(), g.Len()) })
	return e.t
}

// tables hold, for every subset S of a small graph's GPUs, the largest
// NVLink clique and the numbers of NVLink pairs and 4-cliques inside S.
type tables struct {
	island []uint8
	pairs  []uint16
	quads  []uint16
}

// left is the tables' value of fragmentation key k (isLeftKey) for the
// set of GPUs set.
func (t *tables) left(k keyKind, set topology.Bitset) int64 {
	switch k {
	case keyLeftIsland:
		return int64(t.island[set])
	case keyLeftQuads:
		return int64(t.quads[set])
	}
	return int64(t.pairs[set])
}

// buildTables fills the tables in O(2^n): removing S's lowest GPU v gives
// S', and every clique of S either avoids v (a clique of S') or is v plus a
// clique of S' ∩ N(v). Both subsets are numerically smaller than S, so one
// pass in increasing order suffices.
func buildTables(nv []topology.Bitset, n int) *tables {
	size := 1 << n
	t := &tables{island: make([]uint8, size), pairs: make([]uint16, size), quads: make([]uint16, size)}
	tri := make([]uint16, size)
	for s := 1; s < size; s++ {
		v := bits.TrailingZeros(uint(s))
		rest := s &^ (1 << v)
		nb := rest & int(nv[v])
		t.pairs[s] = t.pairs[rest] + uint16(bits.OnesCount(uint(nb)))
		tri[s] = tri[rest] + t.pairs[nb]
		t.quads[s] = t.quads[rest] + tri[nb]
		t.island[s] = max(t.island[rest], 1+t.island[nb])
	}
	return t
}

// BruteForce is the reference allocator: it scores every k-subset of the
// free healthy GPUs that meets the requirement with Objective and keeps the
// best. It shares no search code with Allocate; tests, benchmarks and the
// simulator use it as the baseline.
//
// On a graph of more than WindowGPUs GPUs it searches the window of the
// free GPUs, and refuses when more than WindowGPUs are free.
func BruteForce(g *topology.Graph, free topology.Mask, req topology.Request) (topology.Result, error) {
	if g == nil {
		return topology.Result{}, errors.New("brute force: graph is nil")
	}
	if err := validateRequest(g, req); err != nil {
		return topology.Result{}, fmt.Errorf("brute force: %w", err)
	}
	free = free.Intersect(g.Healthy())
	if !g.Wide() {
		return bruteForce(g, free.Bitset(), req)
	}
	if c := free.Count(); c > topology.WindowGPUs {
		return topology.Result{}, fmt.Errorf("brute force: %d free GPUs; the reference search takes at most %d", c, topology.WindowGPUs)
	}
	w, idx := g.Window(free)
	res, err := bruteForce(w, w.All().Bitset(), windowRequest(req, idx))
	for i, l := range res.GPUs {
		res.GPUs[i] = idx[l]
	}
	return res, err
}

func bruteForce(g *topology.Graph, free topology.Bitset, req topology.Request) (topology.Result, error) {
	free &= g.Healthy().Bitset() & g.All().Bitset()
	r := req.Requirement
	idx := free.Indices()
	k := req.Count
	var best Score
	found := false
	topology.Combinations(len(idx), k, func(pos []int) bool {
		var set topology.Bitset
		for _, p := range pos {
			set |= 1 << idx[p]
		}
		if meets(g, set.Mask(), r) {
			if sc := objective(g, set, free, req); !found || sc.Better(best) {
				best, found = sc, true
			}
		}
		return true
	})
	if !found {
		if _, err := checkFeasible(g, free, req, nil); err != nil {
			return topology.Result{}, err
		}
		return topology.Result{}, &topology.InfeasibleError{Reason: fmt.Sprintf("no set of %d free GPUs meets the requirement", k)}
	}
	return result(g, best.Set.Bitset(), free), nil
}

// meets checks the requirement's constraints pair by pair.
func meets(g *topology.Graph, set topology.Mask, r v1alpha1.Requirement) bool {
	idx := set.Indices()
	for i, a := range idx {
		if r.GPUMemoryMiB > 0 && g.GPU(a).MemoryMiB < r.GPUMemoryMiB {
			return false
		}
		for _, b := range idx[i+1:] {
			if r.RequireNVLink && !g.NVLinked(a, b) {
				return false
			}
			if g.Bandwidth(a, b) < r.MinPairBandwidthGBps {
				return false
			}
		}
	}
	return true
}
