package allocator

import (
	"fmt"
	"math/bits"
	"strings"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// keyKind is one component of a Score. Every key is "higher is better":
// quantities to minimize are negated.
type keyKind uint8

const (
	keyMinPair    keyKind = iota // min pair bandwidth inside the set
	keyRing                      // bottleneck of the best ring
	keySum                       // sum of pair bandwidths
	keyNegDomains                // -(domain boundaries crossed)
	keyNegUtil                   // -(sum of the chosen GPUs' utilization)
	keyLeftIsland                // largest free NVLink clique left
	keyLeftQuads                 // free NVLink 4-cliques left
	keyLeftPairs                 // free NVLink pairs left
	keyNegCut                    // -(bandwidth from the set to the free GPUs left)
	numKeyKinds
)

// isLeftKey reports whether k is a fragmentation key: what a set leaves
// among the free GPUs, which the tables hold.
func isLeftKey(k keyKind) bool {
	return k == keyLeftIsland || k == keyLeftQuads || k == keyLeftPairs
}

var keyNames = [numKeyKinds]string{"minPair", "ring", "sum", "-domains", "-utilization", "leftIsland", "leftQuads", "leftPairs", "-cut"}

// MaxScoreKeys is the length of Score.Keys.
const MaxScoreKeys = int(numKeyKinds)

// Objectives are the lexicographic orders of Score keys per strategy. The
// fragmentation keys close every order so that, among equally good sets,
// the one that keeps the free pool healthiest wins.
var objectives = map[v1alpha1.Strategy][]keyKind{
	v1alpha1.StrategyHighestBandwidth: {
		keyMinPair, keyRing, keySum, keyLeftIsland, keyLeftQuads, keyLeftPairs, keyNegCut},
	v1alpha1.StrategyNUMALocal: {
		keyNegDomains, keyMinPair, keyRing, keySum, keyLeftIsland, keyLeftQuads, keyLeftPairs, keyNegCut},
	v1alpha1.StrategyBalancedUtilization: {
		keyNegUtil, keyMinPair, keyRing, keySum, keyLeftIsland, keyLeftQuads, keyLeftPairs, keyNegCut},
	v1alpha1.StrategyLowestFragmentation: {
		keyLeftIsland, keyLeftQuads, keyLeftPairs, keyMinPair, keyRing, keySum, keyNegCut},
}

// Score is a candidate set's value under a strategy: Keys compared
// lexicographically, higher better, then the set with the lowest indices
// (compared as sorted index lists). The order of keys per strategy:
//
//	highest_bandwidth:    minPair, ring, sum, leftIsland, leftQuads, leftPairs, -cut
//	numa_local:           -domains, minPair, ring, sum, leftIsland, leftQuads, leftPairs, -cut
//	balanced_utilization: -utilization, minPair, ring, sum, leftIsland, leftQuads, leftPairs, -cut
//	lowest_fragmentation: leftIsland, leftQuads, leftPairs, minPair, ring, sum, -cut
//
// where minPair, ring and sum are the set's pair bandwidths (GB/s), domains
// the PCIe-switch/host-bridge/NUMA boundaries crossed, utilization the sum
// of the chosen GPUs' utilization, leftIsland/leftQuads/leftPairs the
// largest NVLink clique and the NVLink 4-cliques and pairs among the free
// GPUs not chosen, and cut the bandwidth from the chosen GPUs to those free
// GPUs (a 1-GPU pod takes the worst-connected GPU). Unused Keys are zero.
type Score struct {
	Strategy v1alpha1.Strategy
	Keys     [MaxScoreKeys]int64
	Set      topology.Mask
}

// Better reports whether s is strictly preferred to o (same strategy).
func (s Score) Better(o Score) bool {
	if s.Keys != o.Keys {
		for i := range s.Keys {
			if s.Keys[i] != o.Keys[i] {
				return s.Keys[i] > o.Keys[i]
			}
		}
	}
	return lowerIndicesMask(s.Set, o.Set)
}

// lowerIndices reports whether a's sorted index list is lexicographically
// smaller than b's (for sets of equal size).
func lowerIndices(a, b topology.Bitset) bool {
	return bits.Reverse64(uint64(a)) > bits.Reverse64(uint64(b))
}

// String lists the keys by name, e.g. "highest_bandwidth{minPair=50 ...}".
func (s Score) String() string {
	var b strings.Builder
	b.WriteString(string(s.Strategy))
	b.WriteString("{")
	for i, k := range objectives[s.Strategy] {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", keyNames[k], s.Keys[i])
	}
	fmt.Fprintf(&b, " set=%s}", s.Set)
	return b.String()
}

// Objective scores set as an answer to req on g with free GPUs free (free
// is ANDed with the healthy GPUs, as Allocate does). It computes every key
// directly, without the allocator's pruning or tables, which makes it the
// reference the allocator is tested against.
//
// On a graph of more than WindowGPUs GPUs it scores through the window of
// set and the free GPUs when they fit one, and otherwise from the large
// graph's metrics (Graph.Metrics).
func Objective(g *topology.Graph, set, free topology.Mask, req topology.Request) Score {
	set = set.Intersect(g.All())
	free = free.Intersect(g.Healthy())
	if !g.Wide() {
		return objective(g, set.Bitset(), free.Bitset(), req)
	}
	if u := set.Union(free); u.Count() <= topology.WindowGPUs {
		w, idx := g.Window(u)
		s := objective(w, windowBits(set, idx), windowBits(free, idx), windowRequest(req, idx))
		s.Set = set
		return s
	}
	// Every key but utilization and cut is one of the metrics.
	m := g.Metrics(set, free)
	vals := [numKeyKinds]int64{
		keyMinPair:    int64(m.MinPairGBps),
		keyRing:       int64(m.RingGBps),
		keySum:        int64(m.SumGBps),
		keyNegDomains: -int64(m.DomainsCrossed),
		keyLeftIsland: int64(m.LeftLargestIsland),
		keyLeftQuads:  int64(m.LeftNVLinkQuads),
		keyLeftPairs:  int64(m.LeftNVLinkPairs),
	}
	left := free.Minus(set)
	for _, a := range set.Indices() {
		if a < len(req.Utilization) {
			vals[keyNegUtil] -= int64(req.Utilization[a])
		}
		for _, b := range left.Indices() {
			vals[keyNegCut] -= int64(g.BW(a, b))
		}
	}
	strategy := req.Requirement.EffectiveStrategy()
	s := Score{Strategy: strategy, Set: set}
	for i, k := range objectives[strategy] {
		s.Keys[i] = vals[k]
	}
	return s
}

// objective is Objective on a graph of at most WindowGPUs GPUs.
func objective(g *topology.Graph, set, free topology.Bitset, req topology.Request) Score {
	strategy := req.Requirement.EffectiveStrategy()
	free &= g.Healthy().Bitset()
	s := Score{Strategy: strategy, Set: set.Mask()}
	for i, k := range objectives[strategy] {
		s.Keys[i] = keyValue(g, k, set, free, req.Utilization)
	}
	return s
}

// keyValue computes one key of set from scratch.
func keyValue(g *topology.Graph, k keyKind, set, free topology.Bitset, util []int32) int64 {
	left := free &^ set
	switch k {
	case keyMinPair:
		m, _ := g.PairStats(set)
		return int64(m)
	case keyRing:
		r, _, _ := g.RingWithin(set, 0, nil)
		return int64(r)
	case keySum:
		_, s := g.PairStats(set)
		return int64(s)
	case keyNegDomains:
		return -int64(g.Domains(set))
	case keyNegUtil:
		return -utilSum(util, set)
	case keyLeftIsland:
		return int64(topology.MaxClique(g.NVAdjacency(), left, nil))
	case keyLeftQuads:
		q, _ := topology.CountCliques(g.NVAdjacency(), left, 4, nil)
		return int64(q)
	case keyLeftPairs:
		return int64(topology.CountPairs(g.NVAdjacency(), left))
	case keyNegCut:
		return -cut(g, set, left)
	}
	return 0
}

func utilSum(util []int32, set topology.Bitset) int64 {
	var s int64
	for r := set; r != 0; r &= r - 1 {
		if i := bits.TrailingZeros64(uint64(r)); i < len(util) {
			s += int64(util[i])
		}
	}
	return s
}

// cut is the total bandwidth between set and other.
func cut(g *topology.Graph, set, other topology.Bitset) int64 {
	var c int64
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		for s := other; s != 0; s &= s - 1 {
			c += int64(g.BW(a, bits.TrailingZeros64(uint64(s))))
		}
	}
	return c
}
