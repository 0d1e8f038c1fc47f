package topology

// The package's tests are external (package topology_test): they build
// graphs with topology/machine, which imports this package. These give
// them what they check of the unexported code.

// FirstN is firstN.
var FirstN = firstN

// Ring is ring: the best ring through set and its order.
func (g *Graph) Ring(set Bitset) (int, []int) { return g.ring(set) }

// CycleAtLeast is cycleAtLeast.
func (g *Graph) CycleAtLeast(idx []int, t int, w *Work) (cycle, done bool) {
	return g.cycleAtLeast(idx, t, w)
}
