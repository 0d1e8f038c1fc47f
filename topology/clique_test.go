package topology_test

import (
	"math/rand/v2"
	"testing"

	"github.com/gputopo/gputopo/topology"
)

func TestLargestCliqueMatchesExhaustiveSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for trial := 0; trial < 300; trial++ {
		n := 1 + rng.IntN(14)
		adj := make([]topology.Bitset, n)
		p := rng.Float64()
		for a := 0; a < n; a++ {
			for b := a + 1; b < n; b++ {
				if rng.Float64() < p {
					adj[a] |= 1 << b
					adj[b] |= 1 << a
				}
			}
		}
		set := topology.Bitset(rng.Uint64()) & (topology.Bitset(1)<<n - 1)
		want := 0
		for sub := set; ; sub = (sub - 1) & set {
			if isClique(adj, sub) {
				want = max(want, sub.Count())
			}
			if sub == 0 {
				break
			}
		}
		got, done := topology.LargestClique(adj, set, 0, 0, nil)
		if !done || got.Count() != want || !isClique(adj, got) || got&^set != 0 {
			t.Fatalf("trial %d: got %s (done %t); want a clique of %d inside %s", trial, got, done, want, set)
		}
		if size := topology.MaxClique(adj, set, nil); size != want {
			t.Fatalf("trial %d: maxClique %d; want %d", trial, size, want)
		}
		// A floor above the answer finds nothing; stop returns early.
		if m, _ := topology.LargestClique(adj, set, want+1, 0, nil); m != 0 {
			t.Fatalf("trial %d: floor %d found %s", trial, want+1, m)
		}
		if m, _ := topology.LargestClique(adj, set, 0, 1, nil); want > 0 && (m.Count() < 1 || !isClique(adj, m)) {
			t.Fatalf("trial %d: stop 1 found %s", trial, m)
		}
		budget := 5
		if size := topology.MaxClique(adj, set, &budget); size > want {
			t.Fatalf("trial %d: a budgeted search found %d > %d", trial, size, want)
		}
	}
}

func isClique(adj []topology.Bitset, set topology.Bitset) bool {
	for _, i := range set.Indices() {
		if set&^(1<<i)&^adj[i] != 0 {
			return false
		}
	}
	return true
}
