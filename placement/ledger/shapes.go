package ledger

import (
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
)

// shapeCache is the distinct machine shapes of the usable nodes, with
// their nodes, as of generation gen.
type shapeCache struct {
	gen    uint64
	shapes []Shape
}

// Shape is one machine shape of the cluster and the nodes of that shape
// whose topology is valid, not marked stale by its agent and trusted.
type Shape struct {
	Topo  *Topo
	nodes []*Node
}

// AnyNode says whether fn accepts the Node object of some node of the
// shape (nodes without one are skipped: kube-scheduler has no Node to
// send a pod to).
func (s Shape) AnyNode(fn func(*corev1.Node) bool) bool {
	for _, n := range s.nodes {
		if n.obj != nil && fn(n.obj) {
			return true
		}
	}
	return false
}

// shapeIndex remembers the ledger's machine shapes between changes: gen
// moves (under the write lock) whenever a node's topology, Node or trust
// is decided again, and a cache of another generation is rebuilt.
type shapeIndex struct {
	gen   atomic.Uint64
	cache atomic.Pointer[shapeCache]
}

// shapeMemberLocked is called, under the write lock, whenever a node's
// topology, Node object or trust is decided again (trustLocked): it moves
// gen only when the node joins, leaves or changes its shape, not on the
// telemetry rounds and Node status updates that leave it where it was
// (the Node object itself is read when Shapes is asked).
func (l *Ledger) shapeMemberLocked(n *Node) {
	l.changedLocked(n)
	var in *Topo
	if n.topo != nil && n.graph != nil && !n.stale && n.distrust == "" {
		in = n.topo
	}
	if in != n.shape {
		n.shape = in
		l.shapes.gen.Add(1)
	}
}

// Shapes returns the machine shapes of the nodes whose topology is valid,
// not marked stale by its agent and trusted, each once with those nodes,
// in no particular order: a node that is refused anyway (a compromised
// agent claiming a machine kubelet contradicts) does not count. Staleness
// by age is not looked at. Callers must not modify the slice. It is
// rebuilt, under the caller's read lock, only after a change: a cluster
// of thousands of nodes has a handful of shapes.
func (v View) Shapes() []Shape {
	s := &v.l.shapes
	gen := s.gen.Load()
	if c := s.cache.Load(); c != nil && c.gen == gen {
		return c.shapes
	}
	at := map[*Topo]int{}
	var out []Shape
	for _, n := range v.l.nodes {
		t := n.shape
		if t == nil {
			continue
		}
		i, ok := at[t]
		if !ok {
			i = len(out)
			at[t] = i
			out = append(out, Shape{Topo: t})
		}
		out[i].nodes = append(out[i].nodes, n)
	}
	// Readers that rebuild at once store the same shapes; a writer moves
	// gen only under the write lock, which no reader holds with us.
	s.cache.Store(&shapeCache{gen: gen, shapes: out})
	return out
}
