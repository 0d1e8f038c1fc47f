package ledger

import "sync/atomic"

// shapeCache is the distinct machine shapes of the nodes with a topology,
// as of generation gen.
type shapeCache struct {
	gen    uint64
	shapes []*Topo
}

// shapeIndex remembers the ledger's machine shapes between topology
// changes: gen moves (under the write lock) whenever a node's topology
// changes or goes, and a cache of another generation is rebuilt.
type shapeIndex struct {
	gen   atomic.Uint64
	cache atomic.Pointer[shapeCache]
}

// shapesChangedLocked is called, under the write lock, whenever a node's
// topology or its trust is decided again (trustLocked).
func (l *Ledger) shapesChangedLocked() { l.shapes.gen.Add(1) }

// Shapes returns the machine shapes of the nodes whose topology is valid,
// not marked stale by its agent and trusted, each once, in no particular
// order: a node that is refused anyway (a compromised agent claiming a
// machine it does not have, whose claims kubelet contradicts) does not
// count. Staleness by age is not looked at. Callers must not modify the slice.
// It is rebuilt, under the caller's read lock, only after a topology
// changed: a cluster of thousands of nodes has a handful of shapes.
func (v View) Shapes() []*Topo {
	s := &v.l.shapes
	gen := s.gen.Load()
	if c := s.cache.Load(); c != nil && c.gen == gen {
		return c.shapes
	}
	seen := map[*Topo]bool{}
	var out []*Topo
	for _, n := range v.l.nodes {
		if t := n.topo; t != nil && n.graph != nil && !n.stale && n.distrust == "" && !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	// Readers that rebuild at once store the same shapes; a writer moves
	// gen only under the write lock, which no reader holds with us.
	s.cache.Store(&shapeCache{gen: gen, shapes: out})
	return out
}
