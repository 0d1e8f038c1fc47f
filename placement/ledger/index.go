package ledger

import (
	"math/bits"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gputopo/gputopo/topology"
)

// IndexMax is the largest GPU count the fit index answers for; a pod that
// asks for more is filtered node by node (no machine shape in the
// catalogue has more GPUs per node).
const IndexMax = 32

// fitIndex is, kept current on every change to a node, the nodes that can
// hold a pod of t GPUs now, for t up to IndexMax: free[t] those with at
// least t GPUs that are healthy, free and countable (not past the Node's
// allocatable, not taken by GPUs held without a known identity), linked[t]
// those with, in addition, t such GPUs all joined by NVLink to each other
// (what a requireNVLink pod needs). A node is in neither while its
// topology is missing, invalid, marked stale by its agent or not trusted.
// The index is a necessary condition: a node in it may still fail the
// filter (an observedTime past its age, GPU memory, pair bandwidth), a
// node outside it always fails.
type fitIndex struct {
	// free[t] and linked[t] are sets of node ordinals (ord): a bit per
	// node and count rather than a set of names, so a large cluster's
	// index costs a few bytes per node.
	free, linked [IndexMax + 1]ordSet
	// ord numbers the indexed nodes; names and offers are by ordinal
	// ("" and the zero offer where unused), spare the unused ordinals.
	ord    map[string]int32
	names  []string
	offers []offer
	spare  []int32
	// ever[t] counts the nodes whose machine, with every GPU free and
	// healthy, could ever hold t NVLink-joined GPUs (everFree: t GPUs).
	ever, everFree [IndexMax + 1]int
	unusable       int
}

// offer is what one node offers now and, with every GPU free, ever.
type offer struct {
	free, linked, everFree, everLinked int32
	unusable                           bool
}

// ordSet is a set of node ordinals, with its size.
type ordSet struct {
	w   []uint64
	len int
}

func (s *ordSet) insert(i int32) {
	word, bit := int(i)/64, uint64(1)<<(uint(i)%64)
	if word >= len(s.w) {
		s.w = append(s.w, make([]uint64, word+1-len(s.w))...)
	}
	if s.w[word]&bit == 0 {
		s.w[word] |= bit
		s.len++
	}
}

func (s *ordSet) delete(i int32) {
	word, bit := int(i)/64, uint64(1)<<(uint(i)%64)
	if word < len(s.w) && s.w[word]&bit != 0 {
		s.w[word] &^= bit
		s.len--
	}
}

// each calls f with every ordinal in s.
func (s *ordSet) each(f func(int32)) {
	for word, w := range s.w {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			f(int32(word*64 + b))
			w &= w - 1
		}
	}
}

func (ix *fitIndex) init() {
	ix.ord = make(map[string]int32)
}

// offerOf is n's offer; the caller holds the write lock.
func offerOf(n *Node) offer {
	if n.graph == nil || n.topo == nil {
		return offer{unusable: n.hasTopology || n.allocatable > 0}
	}
	everFree, everLinked := n.size, n.topo.maxIsland
	if n.allocatable >= 0 {
		everFree = min(everFree, n.allocatable)
		everLinked = min(everLinked, n.allocatable)
	}
	o := offer{everFree: int32(everFree), everLinked: int32(everLinked)}
	if n.stale || n.distrust != "" {
		o.unusable = true
		return o
	}
	// Mid-update (a new graph, the free mask not yet recomputed for it)
	// the mask may name GPUs the graph lacks; the recompute that follows
	// indexes the node again.
	free := n.freeMask.Intersect(n.graph.All())
	nfree := free.Count() - n.unknownHeld
	if n.allocatable >= 0 {
		nfree = min(nfree, n.allocatable)
	}
	nfree = max(nfree, 0)
	o.free, o.linked = int32(nfree), int32(min(nfree, n.topo.freeClique(n.graph, free)))
	return o
}

// freeClique is the size of the largest set of free GPUs all NVLinked to
// each other, remembered per free mask (the caller holds the write lock).
// On a machine larger than a Bitset it is the free count: the index
// stays a necessary condition.
func (t *Topo) freeClique(g *topology.Graph, free topology.Mask) int {
	adj := g.NVAdjacency()
	if adj == nil || len(adj) != g.Len() || free.Empty() {
		return free.Count()
	}
	if c, ok := t.cliques[free]; ok {
		return c
	}
	m, _ := topology.LargestClique(adj, free.Bitset(), 0, 0, nil)
	c := m.Count()
	if free.Count() == 1 {
		c = 1
	}
	if t.cliques == nil {
		t.cliques = make(map[topology.Mask]int)
	}
	if len(t.cliques) < maxCliqueMemo {
		t.cliques[free] = c
	}
	return c
}

// maxCliqueMemo bounds a topology's remembered free cliques.
const maxCliqueMemo = 1 << 14

// indexLocked brings n's entries in the fit index up to date; the caller
// holds the write lock. Copies of a node (View.Without) are not indexed.
func (l *Ledger) indexLocked(n *Node) {
	if l.nodes[n.name] != n {
		return
	}
	l.changedLocked(n)
	o := offerOf(n)
	if old := l.index.set(n.name, o); l.onUsable != nil && gains(old, o) {
		l.onUsable()
	}
}

// gains says whether o, a node's new offer, is usable where old, its
// previous one, was not (the zero offer: the node was not indexed), or
// could ever hold more GPUs than it.
func gains(old, o offer) bool {
	if o.unusable || o.everFree == 0 {
		return false
	}
	return old.unusable || old.everFree < o.everFree || old.everLinked < o.everLinked
}

// unindexLocked drops a node that left the ledger.
func (l *Ledger) unindexLocked(name string) { l.index.set(name, offer{}) }

// set makes o name's offer and returns the one it replaces.
func (ix *fitIndex) set(name string, o offer) (old offer) {
	i, ok := ix.ord[name]
	if ok {
		old = ix.offers[i]
	}
	if old == o {
		return old
	}
	if !ok {
		if k := len(ix.spare); k > 0 {
			i, ix.spare = ix.spare[k-1], ix.spare[:k-1]
		} else {
			i = int32(len(ix.names))
			ix.names, ix.offers = append(ix.names, ""), append(ix.offers, offer{})
		}
		ix.ord[name], ix.names[i] = i, name
	}
	move(ix.free[:], i, old.free, o.free)
	move(ix.linked[:], i, old.linked, o.linked)
	count(ix.everFree[:], old.everFree, -1)
	count(ix.everFree[:], o.everFree, 1)
	count(ix.ever[:], old.everLinked, -1)
	count(ix.ever[:], o.everLinked, 1)
	if old.unusable {
		ix.unusable--
	}
	if o.unusable {
		ix.unusable++
	}
	ix.offers[i] = o
	if o == (offer{}) {
		delete(ix.ord, name)
		ix.names[i] = ""
		ix.spare = append(ix.spare, i)
	}
	return old
}

// move puts node i into s[1..to] and out of s[to+1..from].
func move(s []ordSet, i int32, from, to int32) {
	from, to = min(from, IndexMax), min(to, IndexMax)
	for t := to + 1; t <= from; t++ {
		s[t].delete(i)
	}
	for t := from + 1; t <= to; t++ {
		s[t].insert(i)
	}
}

// count adds d to c[1..v].
func count(c []int, v int32, d int) {
	for t := 1; t <= min(int(v), IndexMax); t++ {
		c[t] += d
	}
}

// Fit is the fit index's answer for a pod of count GPUs (linked: all
// joined by NVLink).
type Fit struct {
	// Nodes are the nodes that can hold it now, a copy the caller owns;
	// nil when count is beyond the index (every node is a candidate).
	Nodes sets.Set[string]
	// Most is the largest such offer of any node (the most free GPUs, or
	// the largest free NVLink-joined set) and MostNode one node with it
	// (the first by name), for the reason when Nodes is empty.
	Most     int
	MostNode string
	// Ever counts the nodes whose machine could hold the pod with every
	// GPU free; Unusable those whose topology is missing, invalid, stale
	// or not trusted; EverMost is the most any machine could ever offer.
	Ever, Unusable, EverMost int
}

// Fits answers from the fit index for pod uid. When more than limit
// nodes can hold the pod, Nodes is left nil (a larger copy costs more
// than it spares its caller); limit < 0 means no limit. A node on which
// uid holds a reservation is always in Nodes: the pod's own GPUs count
// as free to it (NodeFor), which the index does not see.
func (v View) Fits(count int, linked bool, limit int, uid types.UID) Fit {
	ix := &v.l.index
	if count < 1 || count > IndexMax {
		return Fit{Ever: -1}
	}
	s, ever := ix.free[count], ix.everFree[count]
	if linked && count > 1 {
		s, ever = ix.linked[count], ix.ever[count]
	}
	f := Fit{Ever: ever, Unusable: ix.unusable}
	if ever == 0 {
		e := ix.everFree[:]
		if linked && count > 1 {
			e = ix.ever[:]
		}
		for t := range e {
			if e[t] > 0 {
				f.EverMost = t
			}
		}
	}
	if limit >= 0 && s.len > limit {
		return f
	}
	f.Nodes = make(sets.Set[string], s.len)
	s.each(func(i int32) { f.Nodes.Insert(ix.names[i]) })
	if node, ok := v.reservedNode(uid); ok {
		f.Nodes.Insert(node)
	}
	if len(f.Nodes) == 0 {
		for i, o := range ix.offers {
			name := ix.names[i]
			most := int(o.free)
			if linked && count > 1 {
				most = int(o.linked)
			}
			if name != "" && (most > f.Most || most == f.Most && most > 0 && name < f.MostNode) {
				f.Most, f.MostNode = most, name
			}
		}
	}
	return f
}
