package ledger

import (
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// A Snapshot is the ledger as it was when a scheduling cycle began: every
// answer of the cycle (each node's filter, the score, what-ifs for
// preemption) reads the nodes as they were then, so that answers of one
// cycle never come from different ledger states. Commits (Reserve,
// PlanGroup, ClaimSlot) still decide on the live ledger and check that
// what they take is free there.
//
// It is copy-on-write by node. Every change to a node marks it dirty
// (changedLocked); taking a snapshot freezes a copy of each dirty node
// and numbers the snapshot. A snapshot's reader resolves a node to the
// live node itself when it has not changed since its newest copy, which
// the snapshot sees (the usual case, at the cost of two fields the
// request reads anyway), and otherwise to its newest frozen copy no newer
// than the snapshot. So a snapshot costs the copies of the nodes that
// changed since the previous one, not a copy of the cluster. A node keeps
// the frozen copies the last keepSnapshots snapshots may read: cycles run
// one after the other, and a cycle's preemption dry runs take a few
// snapshots of their own inside it; a cycle that outlives more later
// snapshots than that reads the oldest copy kept, and no longer sees a
// node deleted since (its reads are then as inconsistent as live reads;
// commits still check the live ledger).
//
// Reads of a snapshot take the ledger's read lock, as live reads do; the
// pods a what-if weighs are the live ledger's. A snapshot is consistent
// in each node's GPUs, holdings, reservations, telemetry and topology; a
// node added after it is unknown to it, and one deleted after it is still
// there (snapshots.gone).
type Snapshot struct {
	l   *Ledger
	seq uint64
	// job's affinity and uid's reservation are captured when the
	// snapshot is taken: the cycle's pod asks for them.
	job     string
	aff     Affinity
	uid     types.UID
	resNode string
	resOK   bool
}

// keepSnapshots is how many of the latest snapshots a node's frozen
// copies serve.
const keepSnapshots = 16

// snapshots numbers the snapshots; the dirty nodes wait for the next
// snapshot to freeze them. Everything here changes under the write lock.
type snapshots struct {
	seq   uint64
	dirty []*Node
	// gone are the nodes deleted lately, kept for the snapshots taken
	// before they went.
	gone []goneNode
}

// goneNode is a node deleted when snapshot number after was the newest:
// snapshots up to after still see it.
type goneNode struct {
	n     *Node
	after uint64
}

// changedLocked marks live node n as changed since the last snapshot;
// the caller holds the write lock. Copies of a node (View.As) are not
// marked.
func (l *Ledger) changedLocked(n *Node) {
	if n == nil || n.dirty || l.nodes[n.name] != n {
		return
	}
	n.dirty = true
	l.snaps.dirty = append(l.snaps.dirty, n)
}

// goneLocked keeps deleted node n for the snapshots taken before.
func (l *Ledger) goneLocked(n *Node) {
	if n.frozen != nil {
		l.snaps.gone = append(l.snaps.gone, goneNode{n: n, after: l.snaps.seq})
	}
}

// Snapshot takes a snapshot of the ledger for a cycle of pod uid in job
// (namespace/job label; "" for none). It takes the write lock for as long
// as it freezes the nodes that changed since the previous snapshot.
func (l *Ledger) Snapshot(job string, uid types.UID) *Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.snaps.seq++
	s := &Snapshot{l: l, seq: l.snaps.seq, job: job, uid: uid}
	for _, n := range l.snaps.dirty {
		// A node deleted since stays dirty: the snapshots that still
		// see it read its frozen copies, not what the delete left.
		if l.nodes[n.name] == n {
			n.dirty = false
			l.freezeLocked(n, s.seq)
		}
	}
	clear(l.snaps.dirty)
	l.snaps.dirty = l.snaps.dirty[:0]
	keep := l.snaps.gone[:0]
	for _, g := range l.snaps.gone {
		if g.after+keepSnapshots >= s.seq {
			keep = append(keep, g)
		}
	}
	clear(l.snaps.gone[len(keep):])
	l.snaps.gone = keep
	v := View{l: l}
	if job != "" {
		s.aff = v.Affinity(job)
		s.aff.nodes = maps.Clone(s.aff.nodes)
	}
	s.resNode, s.resOK = v.reservedNode(uid)
	return s
}

// freezeLocked makes a frozen copy of live node n for snapshot seq, its
// newest, and drops the copies no snapshot of the last keepSnapshots
// reads. A frozen copy is one no later change of n reaches: its own
// holdings map and slices that changes write in place.
func (l *Ledger) freezeLocked(n *Node, seq uint64) {
	c := *n
	c.dirty, c.frozen, c.frozenAt, c.older = false, nil, seq, n.frozen
	c.holdings = maps.Clone(n.holdings)
	if len(n.tel) > 0 && len(n.tel) <= len(n.telInline) && &n.tel[0] == &n.telInline[0] {
		c.tel = c.telInline[:len(n.tel)]
	}
	c.claimed = slices.Clone(n.claimed)
	// The copies a snapshot after seq-keepSnapshots reads: those newer
	// than that and the newest one not.
	for o := c.older; o != nil; o = o.older {
		if o.frozenAt+keepSnapshots <= seq {
			o.older = nil
			break
		}
	}
	if n.frozen == nil {
		n.born = seq
	}
	n.frozen, n.frozenAt = &c, seq
}

// version is live node n as s sees it: n itself when it has not changed
// since its newest frozen copy and s sees that copy; else its newest
// frozen copy no newer than s; nil when n is nil or was not yet frozen
// when s was taken (added after s). When every copy kept is newer than s
// (a cycle that outlived keepSnapshots later ones), the oldest stands in.
func (s *Snapshot) version(n *Node) *Node {
	switch {
	case n == nil || n.frozen == nil || n.born > s.seq:
		return nil
	case !n.dirty && n.frozenAt <= s.seq:
		return n
	}
	return s.older(n.frozen)
}

// older is the newest of the frozen copies from c on that s sees, or the
// oldest kept.
func (s *Snapshot) older(c *Node) *Node {
	for ; c.older != nil; c = c.older {
		if c.frozenAt <= s.seq {
			return c
		}
	}
	return c
}

// at is live node n, named name, as s sees it, or as s saw it when it was
// deleted since.
func (s *Snapshot) at(name string, n *Node) *Node {
	if f := s.version(n); f != nil {
		return f
	}
	return s.gone(name)
}

// gone is the node name deleted after s was taken, as s saw it; nil when
// none.
func (s *Snapshot) gone(name string) *Node {
	for _, g := range s.l.snaps.gone {
		if g.n.name == name && g.after >= s.seq {
			if f := s.version(g.n); f != nil {
				return f
			}
		}
	}
	return nil
}

// Read calls fn with a view of the snapshot under the ledger's read lock;
// the rules of Ledger.Read apply.
func (s *Snapshot) Read(fn func(v View)) {
	s.l.mu.RLock()
	defer s.l.mu.RUnlock()
	fn(View{l: s.l, s: s})
}

// ReadNode is Read for a question about one node, under one stripe of the
// read lock chosen by the node's name: readers of different nodes mostly
// take different stripes, so that the parallel filters of one pod do not
// contend on one reader count.
func (s *Snapshot) ReadNode(node string, fn func(v View)) {
	st := &s.l.mu.stripes[stripeOf(node)]
	st.RLock()
	defer st.RUnlock()
	fn(View{l: s.l, s: s})
}
