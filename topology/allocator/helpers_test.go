package allocator

import (
	"github.com/gputopo/gputopo/topology"
)

// maskBits is the Mask of the low 64 GPUs given as a word, for tests that
// draw or enumerate sets.
func maskBits(v uint64) topology.Mask { return topology.Bitset(v).Mask() }

// maskOfWords is the Mask whose 64-bit words are lo (GPUs 0..63) and hi
// (GPUs 64..127).
func maskOfWords(lo, hi uint64) topology.Mask {
	idx := topology.Bitset(lo).Indices()
	for _, i := range topology.Bitset(hi).Indices() {
		idx = append(idx, 64+i)
	}
	return topology.MaskOf(idx...)
}

// firstN is the set {0..n-1}.
func firstN(n int) topology.Mask {
	var idx []int
	for i := range min(n, topology.MaxGPUs) {
		idx = append(idx, i)
	}
	return topology.MaskOf(idx...)
}

// countQuads counts the 4-cliques of adj inside set.
func countQuads(adj []topology.Bitset, set topology.Bitset) int {
	q, _ := topology.CountCliques(adj, set, 4, nil)
	return q
}

// ringOf is the bottleneck of the ring through order.
func ringOf(g *topology.Graph, order []int) int {
	m := int(^uint(0) >> 1)
	for i, a := range order {
		m = min(m, g.Bandwidth(a, order[(i+1)%len(order)]))
	}
	return m
}
