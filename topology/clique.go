package topology

import "math/bits"

// LargestClique returns a largest clique of adj inside set if it has at
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
func LargestClique(adj []Bitset, set Bitset, floor, stop int, w *Work) (members Bitset, done bool) {
	c := cliqueSearch{adj: adj, stop: stop, w: w, bestN: max(floor-1, 0)}
	if set != 0 {
		c.expand(0, 0, set)
	}
	return c.best, !c.out
}

type cliqueSearch struct {
	adj   []Bitset
	best  Bitset
	bestN int
	stop  int
	w     *Work
	out   bool
}

func (c *cliqueSearch) expand(in Bitset, size int, p Bitset) {
	var order, color [WindowGPUs]uint8
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
	if !c.w.Spend(int64(4*(n+col) + 8)) {
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

// MaxClique is the size of the largest clique of adj inside set. When
// budget is not nil it is charged in work units (see Work) and the search
// stops when it reaches zero; the answer is then a lower bound.
func MaxClique(adj []Bitset, set Bitset, budget *int) int {
	if budget == nil {
		m, _ := LargestClique(adj, set, 0, 0, nil)
		return m.Count()
	}
	w := &Work{Limit: int64(*budget)}
	m, _ := LargestClique(adj, set, 0, 0, w)
	*budget = int(max(w.Limit-w.Used, 0))
	return m.Count()
}

// CountCliques counts the cliques of size vertices (2, 3 or 4) of adj
// inside set, charging w two units per step (pairs are not charged); done
// is false when w ran out first, and the count is then of the cliques found
// so far. Each clique is counted from its lowest vertex a, as the pairs (a
// triangle) or the triangles (a 4-clique) among a's neighbours above a.
func CountCliques(adj []Bitset, set Bitset, size int, w *Work) (count int, done bool) {
	if size <= 2 {
		return CountPairs(adj, set), true
	}
	for r := set; r != 0; r &= r - 1 {
		a := bits.TrailingZeros64(uint64(r))
		na := adj[a] & set &^ (Bitset(2)<<a - 1)
		if w != nil && !w.Spend(int64(2+2*na.Count())) {
			return count, false
		}
		if size == 3 {
			count += CountPairs(adj, na)
			continue
		}
		for s := na; s != 0; s &= s - 1 {
			b := bits.TrailingZeros64(uint64(s))
			nab := na & adj[b] &^ (Bitset(2)<<b - 1)
			if w != nil && !w.Spend(int64(2*nab.Count())) {
				return count, false
			}
			count += CountPairs(adj, nab)
		}
	}
	return count, true
}
