package topology

import (
	"math/bits"
	"slices"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// A graph of more than WindowGPUs GPUs (up to MaxGPUs) is wide: set
// searches, whose sets are one machine word, see it through windows, the
// graphs induced on at most WindowGPUs of its GPUs with the same links,
// domains and health (the allocator's choice of window is
// allocator/wide.go's). The metrics of a set on a wide graph come from
// windows of the set and of the free GPUs it leaves; where those leave more
// than WindowGPUs GPUs, LeftLargestIsland is a greedy clique (a lower bound,
// exact on NVSwitch machines). docs/topology.md has the figures.

// wideWindowBudget is the work allowed to the metrics of a large graph's
// set (its left cliques), in work units (see Work).
const wideWindowBudget = 400_000

// Wide reports whether g has more than WindowGPUs GPUs, so that set
// searches see it through windows (Window).
func (g *Graph) Wide() bool { return g.n > WindowGPUs }

// Window is the graph induced on the GPUs of u (at most WindowGPUs of
// them), numbered in increasing order of their index in g; idx maps each
// window index to g's. Domains are g's: two GPUs of the window share a
// domain when they share it in g. The window's hash is g's and u's.
func (g *Graph) Window(u Mask) (w *Graph, idx []int) {
	idx = u.Indices()
	n := len(idx)
	w = &Graph{n: n, gpus: make([]v1alpha1.GPU, n), tables: &tables{links: make([]v1alpha1.Link, n*n),
		bw: make([]int, n*n), rank: make([]int8, n*n), nvW: make([]Mask, n)}}
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
			w, _ := g.Window(set)
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
	if left.Count() <= WindowGPUs {
		w, _ := g.Window(left)
		budget := wideWindowBudget
		return MaxClique(w.nv, w.all(), &budget), CountPairs(w.nv, w.all()), countQuads(w.nv, w.all())
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
