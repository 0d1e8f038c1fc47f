package ledger

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"

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
// and numbers the snapshot. A snapshot's reader resolves a node to its
// newest frozen copy no newer than the snapshot, so it costs the copies
// of the nodes that changed since the previous snapshot, not one of the
// whole cluster. Each node keeps its two newest frozen copies: cycles
// run one after the other, so a cycle's snapshot is the newest or, while
// the next cycle starts, the one before it.
//
// Reads of a snapshot still take the ledger's read lock (the node map
// and the pods a what-if weighs are the live ledger's), so a snapshot is
// consistent in each node's GPUs, holdings, reservations, telemetry and
// topology; a node added after it is unknown to it, and one deleted after
// it is gone from it too.
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

// frozenRef is a live node's link to its frozen copies: the newest and
// the one before it, replaced together.
type frozenRef struct {
	p atomic.Pointer[frozenPair]
}

type frozenPair struct{ cur, prev *Node }

// snapshots numbers the snapshots and keeps their takers apart; the dirty
// nodes wait for the next snapshot to freeze them.
type snapshots struct {
	mu    sync.Mutex
	seq   uint64
	dirty []*Node
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

// Snapshot takes a snapshot of the ledger for a cycle of pod uid in job
// (namespace/job label; "" for none).
func (l *Ledger) Snapshot(job string, uid types.UID) *Snapshot {
	l.mu.RLock()
	defer l.mu.RUnlock()
	l.snaps.mu.Lock()
	l.snaps.seq++
	s := &Snapshot{l: l, seq: l.snaps.seq, job: job, uid: uid}
	for _, n := range l.snaps.dirty {
		// The dirty flags are written by writers (under the write lock)
		// and here (under the read lock and snaps.mu): never at once.
		n.dirty = false
		if l.nodes[n.name] != n {
			continue // deleted since
		}
		f := n.freeze(s.seq)
		var prev *Node
		if old := n.fz.p.Load(); old != nil {
			prev = old.cur
		}
		n.fz.p.Store(&frozenPair{cur: f, prev: prev})
	}
	clear(l.snaps.dirty)
	l.snaps.dirty = l.snaps.dirty[:0]
	l.snaps.mu.Unlock()
	v := View{l: l}
	if job != "" {
		s.aff = v.Affinity(job)
		s.aff.nodes = maps.Clone(s.aff.nodes)
	}
	s.resNode, s.resOK = v.reservedNode(uid)
	return s
}

// freeze is a copy of n that no later change of n reaches: its own
// holdings map and slices that changes write in place.
func (n *Node) freeze(seq uint64) *Node {
	c := *n
	c.fz, c.dirty, c.frozenAt = nil, false, seq
	c.holdings = maps.Clone(n.holdings)
	if len(n.tel) > 0 && len(n.tel) <= len(n.telInline) && &n.tel[0] == &n.telInline[0] {
		c.tel = c.telInline[:len(n.tel)]
	}
	c.claimed = slices.Clone(n.claimed)
	return &c
}

// version is live node n as s sees it: its newest frozen copy no newer
// than s; nil when n is nil or was never frozen (added after s). When
// both copies are newer than s (a cycle that outlived two later ones),
// the older copy stands in.
func (s *Snapshot) version(n *Node) *Node {
	if n == nil || n.fz == nil {
		return nil
	}
	p := n.fz.p.Load()
	switch {
	case p == nil:
		return nil
	case p.cur.frozenAt <= s.seq:
		return p.cur
	case p.prev != nil && p.prev.frozenAt <= s.seq:
		return p.prev
	case p.prev != nil:
		return p.prev
	}
	return p.cur
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
