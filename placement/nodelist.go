package placement

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/placement/ledger"
)

// checkNode is e's verdict on node as pr sees it, on e's snapshot
// (evaluator.readNode).
func (x *Core) checkNode(e *evaluator, node string, pr Request) (v *verdict) {
	e.readNode(x.ledger, node, func(lv ledger.View) { v = e.check(lv.NodeFor(node, pr.UID)) })
	return v
}

// nodeList is a request's candidate nodes resolved to their state, nil for
// unknown names; v, m and c hold prioritize's verdicts, merits and log
// capabilities per node, and over the nodes domain packing passes over
// (packDomains; nil when none).
type nodeList struct {
	s    []*ledger.Node
	v    []*verdict
	m, c []float64
	over []bool
}

var nodeListPool = sync.Pool{New: func() any { return new(nodeList) }}

// lookup resolves names with v.Lookup into a pooled list; the caller
// calls release when done, and uses the list only inside v's Read.
func lookup(v ledger.View, uid types.UID, names []string) *nodeList {
	nl := nodeListPool.Get().(*nodeList)
	nl.s = v.Lookup(uid, names, nl.s)
	return nl
}

// release returns the list to the pool, dropping its pointers.
func (nl *nodeList) release() {
	clear(nl.s)
	clear(nl.v)
	nl.over = nil
	nodeListPool.Put(nl)
}

// evalSlices sizes v and m for the list's nodes, zeroed.
func (nl *nodeList) evalSlices() {
	n := len(nl.s)
	if cap(nl.v) < n {
		nl.v, nl.m, nl.c = make([]*verdict, n), make([]float64, n), make([]float64, n)
	}
	nl.v, nl.m, nl.c = nl.v[:n], nl.m[:n], nl.c[:n]
	clear(nl.v)
	clear(nl.m)
}
