package topology

import "math/bits"

// largestClique returns a largest clique of adj inside set if it has at
// least floor vertices, and the empty set otherwise. With stop > 0 it
// returns as soon as it holds a clique of stop vertices. It is branch
// and bound in the manner of Tomita's MCQ: the candidates are coloured
// greedily (a colour class is an independent set, so a clique takes at most
// one vertex of each), and a branch ends when its size plus its number of
// colours cannot beat the best. On graphs of 64 vertices of any density
// this takes well under a millisecond, where plain size-bounded branch and
// bound takes up to seconds on dense graphs.
//
// w is charged for every vertex coloured; done is false when it ran out,
// and the clique returned is then only the largest one found.
func largestClique(adj []bitset, set bitset, floor, stop int, w *work) (members bitset, done bool) {
	c := cliqueSearch{adj: adj, stop: stop, w: w, bestN: max(floor-1, 0)}
	if set != 0 {
		c.expand(0, 0, set)
	}
	return c.best, !c.out
}

type cliqueSearch struct {
	adj   []bitset
	best  bitset
	bestN int
	stop  int
	w     *work
	out   bool
}

func (c *cliqueSearch) expand(in bitset, size int, p bitset) {
	var order, color [windowGPUs]uint8
	n, col := 0, 0
	for unc := p; unc != 0; {
		col++
		for q := unc; q != 0; {
			v := bits.TrailingZeros64(uint64(q))
			q &^= 1<<v | c.adj[v]
			unc &^= 1 << v
			order[n], color[n] = uint8(v), uint8(col)
			n++
		}
	}
	// A coloured vertex costs about four steps (calibrated against the
	// ring table, docs/topology.md).
	if !c.w.spend(int64(4*(n+col) + 8)) {
		c.out = true
		return
	}
	// Highest colours first: they promise the largest cliques.
	for i := n - 1; i >= 0; i-- {
		if size+int(color[i]) <= c.bestN {
			return
		}
		v := int(order[i])
		if np := p & c.adj[v]; np == 0 {
			if size+1 > c.bestN {
				c.best, c.bestN = in|1<<v, size+1
			}
		} else {
			c.expand(in|1<<v, size+1, np)
		}
		if c.out || (c.stop > 0 && c.bestN >= c.stop) {
			return
		}
		p &^= 1 << v
	}
}

// maxClique is the size of the largest clique of adj inside set. When
// budget is not nil it is charged in work units (see SearchBudget) and the
// search stops when it reaches zero; the answer is then a lower bound.
func maxClique(adj []bitset, set bitset, budget *int) int {
	if budget == nil {
		m, _ := largestClique(adj, set, 0, 0, nil)
		return m.Count()
	}
	w := newWork(int64(*budget))
	m, _ := largestClique(adj, set, 0, 0, w)
	*budget = int(max(w.limit-w.used, 0))
	return m.Count()
}

// greedyColours is the number of colours a greedy colouring of set needs:
// an upper bound on its largest clique, in O(|set|) mask operations.
func greedyColours(adj []bitset, set bitset) int {
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

// quadsWithin counts the 4-cliques of adj inside set like countQuads,
// charging w two units per step; done is false when w ran out first.
func quadsWithin(adj []bitset, set bitset, w *work) (quads int, done bool) {
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		na := adj[a] & set &^ (bitset(2)<<a - 1)
		if !w.spend(int64(2 + 2*na.Count())) {
			return quads, false
		}
		for s := na; s != 0; s &= s - 1 {
			b := bits.TrailingZeros64(uint64(s))
			nab := na & adj[b] &^ (bitset(2)<<b - 1)
			if !w.spend(int64(2 * nab.Count())) {
				return quads, false
			}
			for t := nab; t != 0; t &= t - 1 {
				d := bits.TrailingZeros64(uint64(t))
				quads += (nab & adj[d] &^ (bitset(2)<<d - 1)).Count()
			}
		}
	}
	return quads, true
}

// trianglesWithin counts the triangles of adj inside set, charging w two
// units per step; done is false when w ran out first.
func trianglesWithin(adj []bitset, set bitset, w *work) (triangles int, done bool) {
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		na := adj[a] & set &^ (bitset(2)<<a - 1)
		if !w.spend(int64(2 + 2*na.Count())) {
			return triangles, false
		}
		for s := na; s != 0; s &= s - 1 {
			b := bits.TrailingZeros64(uint64(s))
			triangles += (na & adj[b] &^ (bitset(2)<<b - 1)).Count()
		}
	}
	return triangles, true
}
