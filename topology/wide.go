package topology

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Graphs of more than windowGPUs GPUs (up to MaxGPUs) are not searched
// directly: the search's sets are one machine word. Instead a decision
// looks at a window, the graph induced on at most windowGPUs of the node's
// GPUs, with the same links, domains and health:
//
//   - With at most windowGPUs free GPUs (a large node in use), the window is
//     the free GPUs. Every set the node could give is inside it and every
//     key of the objective depends only on free GPUs, so the answer is the
//     same as a direct search would give (exact unless the work budget ran
//     out, as on any node).
//   - With more free GPUs, shrink drops free GPUs until windowGPUs remain
//     (those that cannot be chosen first, then those with the most partners
//     they may not be chosen with, then the least connected, then the
//     highest index), and the window is the rest. A better set may use a
//     dropped GPU, so the answer is marked Heuristic. A request for more
//     than windowGPUs GPUs takes what shrink leaves of the free GPUs at that
//     count, checked against the requirement.
//
// The metrics of a set on a large graph come from windows of the set and of
// the free GPUs it leaves; where those leave more than windowGPUs GPUs,
// LeftLargestIsland is a greedy clique (a lower bound, exact on NVSwitch
// machines). docs/topology.md has the figures.

// wideWindowBudget is the work allowed to the metrics of a large graph's
// set (its left cliques), in SearchBudget units.
const wideWindowBudget = 400_000

// wide reports whether g is searched through windows.
func (g *Graph) wide() bool { return g.n > windowGPUs }

// window is the graph induced on the GPUs of u (at most windowGPUs of
// them), numbered in increasing order of their index in g; idx maps each
// window index to g's. Domains are g's: two GPUs of the window share a
// domain when they share it in g.
func (g *Graph) window(u Mask) (w *Graph, idx []int) {
	idx = u.Indices()
	n := len(idx)
	w = &Graph{n: n, gpus: make([]v1alpha1.GPU, n), links: make([]v1alpha1.Link, n*n),
		bw: make([]int, n*n), rank: make([]int8, n*n), nvW: make([]Mask, n)}
	for i, gi := range idx {
		gpu := g.gpus[gi]
		gpu.Index = i
		w.gpus[i] = gpu
		if g.healthyW.Has(gi) {
			w.healthyW = w.healthyW.With(i)
		}
		for j, gj := range idx {
			if i == j {
				continue
			}
			l := g.links[gi*g.n+gj]
			l.A, l.B = min(i, j), max(i, j)
			w.links[i*n+j] = l
			w.bw[i*n+j] = g.bw[gi*g.n+gj]
			w.rank[i*n+j] = g.rank[gi*g.n+gj]
			if l.NVLinks > 0 {
				w.nvW[i] = w.nvW[i].With(j)
			}
		}
	}
	local := make([]int, g.n)
	for t := range domainLevels {
		for i := range local {
			local[i] = -1
		}
		w.dom[t] = make([]int, n)
		next := 0
		for i, gi := range idx {
			c := g.dom[t][gi]
			if local[c] < 0 {
				local[c] = next
				next++
			}
			w.dom[t][i] = local[c]
		}
	}
	w.indexBits()
	w.hash = g.hash + "/" + u.String()
	return w, idx
}

// windowBits is m's GPUs among idx (a window's index map) as the window's
// bitset.
func windowBits(m Mask, idx []int) bitset {
	var b bitset
	for i, gi := range idx {
		if m.Has(gi) {
			b |= 1 << i
		}
	}
	return b
}

// windowRequest is req with its utilization renumbered for the window.
func windowRequest(req Request, idx []int) Request {
	if req.Utilization != nil {
		u := make([]int32, len(idx))
		for i, gi := range idx {
			u[i] = req.Utilization[gi]
		}
		req.Utilization = u
	}
	return req
}

// allocateWide answers a request on a graph of more than windowGPUs GPUs;
// free is already limited to healthy GPUs.
func (a *Allocator) allocateWide(g *Graph, free Mask, req Request) (Result, error) {
	k, r := req.Count, req.Requirement
	if c := free.Count(); c < k {
		return Result{}, g.tooFewFree(k, c)
	}
	if c := free.Count(); c == k && c > windowGPUs {
		// Only one set: every free GPU.
		if !meets(g, free, r) {
			return Result{}, &InfeasibleError{Reason: fmt.Sprintf("needs %d GPUs meeting the requirement; the only %d free GPUs do not meet it", k, c)}
		}
		return Result{GPUs: g.RingOrder(free), Metrics: g.wideMetrics(free, free, -1)}, nil
	}
	if free.Count() <= windowGPUs {
		w, idx := g.window(free)
		res, err := a.allocate(w, w.all(), windowRequest(req, idx))
		if err != nil {
			return Result{}, err
		}
		for i, l := range res.GPUs {
			res.GPUs[i] = idx[l]
		}
		return res, nil
	}
	if k > windowGPUs {
		set := g.shrink(free, k, r)
		if !meets(g, set, r) {
			return Result{}, &InfeasibleError{Reason: fmt.Sprintf(
				"needs %d GPUs meeting the requirement; none found among %d free GPUs within the search bound of a node of more than %d GPUs",
				k, free.Count(), windowGPUs)}
		}
		m := g.wideMetrics(set, free, -1)
		return Result{GPUs: g.RingOrder(set), Metrics: m, Heuristic: true}, nil
	}
	pool := g.shrink(free, windowGPUs, r)
	w, idx := g.window(pool)
	res, err := a.allocate(w, w.all(), windowRequest(req, idx))
	if err != nil {
		var inf *InfeasibleError
		if errors.As(err, &inf) {
			inf.Reason += fmt.Sprintf(" (among the %d best-placed of %d free GPUs)", windowGPUs, free.Count())
		}
		return Result{}, err
	}
	var set Mask
	for i, l := range res.GPUs {
		res.GPUs[i] = idx[l]
		set = set.With(idx[l])
	}
	res.Metrics = g.wideMetrics(set, free, res.Metrics.RingGBps)
	res.Heuristic = true
	return res, nil
}

// shrink drops GPUs of free until target remain, worst first: a GPU with
// too little memory, then the one with the most partners it may not be
// chosen with (no NVLink under requireNVLink, a pair below
// minPairBandwidthGBps), then the one with the least bandwidth to the
// others, then the highest index. O(|free|^2).
func (g *Graph) shrink(free Mask, target int, r v1alpha1.Requirement) Mask {
	idx := free.Indices()
	n := len(idx)
	conflicts := make([]int, n)
	sum := make([]int64, n)
	alive := make([]bool, n)
	for i, a := range idx {
		alive[i] = true
		if r.GPUMemoryMiB > 0 && g.gpus[a].MemoryMiB < r.GPUMemoryMiB {
			conflicts[i] = n * n // below every GPU that may be chosen
		}
		for _, b := range idx {
			if a == b {
				continue
			}
			sum[i] += int64(g.bw[a*g.n+b])
			if !pairAllowed(g, a, b, r) {
				conflicts[i]++
			}
		}
	}
	for left := n; left > target; left-- {
		worst := -1
		for i := n - 1; i >= 0; i-- {
			if !alive[i] {
				continue
			}
			if worst < 0 || conflicts[i] > conflicts[worst] ||
				(conflicts[i] == conflicts[worst] && sum[i] < sum[worst]) {
				worst = i
			}
		}
		alive[worst] = false
		a := idx[worst]
		for i, b := range idx {
			if !alive[i] {
				continue
			}
			sum[i] -= int64(g.bw[a*g.n+b])
			if !pairAllowed(g, a, b, r) {
				conflicts[i]--
			}
		}
	}
	var out Mask
	for i, a := range idx {
		if alive[i] {
			out = out.With(a)
		}
	}
	return out
}

// pairAllowed reports whether a and b may be chosen together under r.
func pairAllowed(g *Graph, a, b int, r v1alpha1.Requirement) bool {
	return (!r.RequireNVLink || g.NVLinked(a, b)) && g.bw[a*g.n+b] >= r.MinPairBandwidthGBps
}

// wideMetrics is Metrics on a large graph. ring is the set's ring
// bandwidth when the caller has it (-1: compute it).
func (g *Graph) wideMetrics(set, free Mask, ring int) SetMetrics {
	idx := set.Indices()
	minPair, sum := 0, 0
	tier := v1alpha1.LinkTier("")
	switch len(idx) {
	case 0:
	case 1:
		tier = v1alpha1.TierSingleGPU
	default:
		minPair, tier = int(^uint(0)>>1), v1alpha1.TierNVSwitch
		for i, a := range idx {
			for _, b := range idx[i+1:] {
				bw := g.bw[a*g.n+b]
				sum += bw
				minPair = min(minPair, bw)
				if t := g.pairTier(a, b); v1alpha1.TierRank(t) > v1alpha1.TierRank(tier) {
					tier = t
				}
			}
		}
	}
	if ring < 0 {
		ring = minPair
		if len(idx) > 3 && len(idx) <= RingExactMaxGPUs {
			w, _ := g.window(set)
			ring, _ = w.ringAtLeast(w.all(), 0)
		}
	}
	m := SetMetrics{MinPairGBps: minPair, RingGBps: ring, SumGBps: sum, DomainsCrossed: g.wideDomains(idx), Tier: tier}
	m.LeftLargestIsland, m.LeftNVLinkPairs, m.LeftNVLinkQuads = g.wideLeft(free.Minus(set))
	return m
}

// wideDomains counts the domain boundaries the GPUs idx cross.
func (g *Graph) wideDomains(idx []int) int {
	total := 0
	for t := range domainLevels {
		seen := make(map[int]bool, len(idx))
		for _, i := range idx {
			seen[g.dom[t][i]] = true
		}
		if len(seen) > 1 {
			total += len(seen) - 1
		}
	}
	return total
}

// wideLeft is the largest NVLink clique, NVLink pairs and NVLink 4-cliques
// among left on a large graph: through a window when left fits one, and
// otherwise counted directly, the clique greedily.
func (g *Graph) wideLeft(left Mask) (island, pairs, quads int) {
	if left.Count() <= windowGPUs {
		w, _ := g.window(left)
		budget := wideWindowBudget
		return maxClique(w.nv, w.all(), &budget), countPairs(w.nv, w.all()), countQuads(w.nv, w.all())
	}
	// Each pair and 4-clique is counted once, from its lowest GPU: adj[v]
	// is v's NVLinked GPUs in left after v. Word by word, without calls:
	// on 128 free NVSwitch GPUs this is C(127,3) steps.
	adj := make([][maskWords]uint64, g.n)
	for _, v := range left.Indices() {
		adj[v] = g.nvW[v].Intersect(left).Minus(firstN(v + 1)).w
	}
	for _, a := range left.Indices() {
		na := adj[a]
		for i, w := range na {
			pairs += bits.OnesCount64(w)
			for ; w != 0; w &= w - 1 {
				b := i*64 + bits.TrailingZeros64(w)
				var nab [maskWords]uint64
				for j := range nab {
					nab[j] = na[j] & adj[b][j]
				}
				for j, x := range nab {
					for ; x != 0; x &= x - 1 {
						d := j*64 + bits.TrailingZeros64(x)
						for m := range nab {
							quads += bits.OnesCount64(nab[m] & adj[d][m])
						}
					}
				}
			}
		}
	}
	return g.greedyClique(left), pairs, quads
}

// greedyClique is a clique of left built greedily, most NVLinked GPU
// first (ties: lower index): its size is a lower bound on left's largest.
func (g *Graph) greedyClique(left Mask) int {
	idx := left.Indices()
	deg := make([]int, g.n)
	for _, a := range idx {
		deg[a] = g.nvW[a].Intersect(left).Count()
	}
	slices.SortStableFunc(idx, func(a, b int) int { return deg[b] - deg[a] })
	var clique Mask
	size := 0
	for _, a := range idx {
		if g.nvW[a].Intersect(clique) == clique {
			clique, size = clique.With(a), size+1
		}
	}
	return size
}

// lowerIndicesMask is lowerIndices over Masks.
func lowerIndicesMask(a, b Mask) bool {
	for i := range a.w {
		if a.w[i] != b.w[i] {
			return bits.Reverse64(a.w[i]) > bits.Reverse64(b.w[i])
		}
	}
	return false
}
