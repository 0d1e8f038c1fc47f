package ledger

import (
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Release frees whatever pod uid holds or was promised.
func (l *Ledger) Release(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.holdings[uid]; h != nil && l.giveBackLocked(uid, h) {
		return // a group's slot goes back to its plan
	}
	l.releaseLocked(uid)
}

// ReleaseReserved frees what pod uid was promised, unless its Binding was
// written (the holding is confirmed): then the informer decides.
func (l *Ledger) ReleaseReserved(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.holdings[uid]; ok && h.reserved && !l.giveBackLocked(uid, h) {
		l.releaseLocked(uid)
	}
}

// Confirm marks pod uid's reservation of uuids on node as bound: its
// Binding was written. A reservation that differs is left alone.
func (l *Ledger) Confirm(uid types.UID, node string, uuids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.holdings[uid]; ok && h.node == node && slices.Equal(h.uuids, uuids) && h.reserved {
		h.reserved = false
		l.recomputeLocked(l.nodeLocked(node))
		l.confirmGroupLocked(h.group)
	}
}

// AlreadyHeldError is Reserve's error for a pod that is bound and holds
// GPUs that Reserve cannot hand back: on another node, or not identified.
type AlreadyHeldError struct {
	Pod  types.NamespacedName
	Node string
}

func (e *AlreadyHeldError) Error() string {
	return fmt.Sprintf("pod %s already holds GPUs on node %s", e.Pod, e.Node)
}

// Choice is the GPUs Reserve holds for a pod and the placement record that
// goes with them.
type Choice struct {
	UUIDs     []string
	Placement v1alpha1.Placement
}

// Reserve chooses and holds pod uid's GPUs on node. choose runs under
// the ledger's read lock, so that filters go on while the allocator
// works; the hold is then recorded under the write lock only if the
// chosen GPUs are still free there (commitFree): two reservations on one
// node never get the same GPU. When they are not (another hold landed in
// between), choose runs again; after commitTries it runs under the write
// lock, where nothing can change, so Reserve always ends. choose sees the
// node as it is (nil when the ledger does not know it) and the rest of the
// ledger through v; its error is returned as is and nothing is held.
//
// A pod that already holds GPUs on node (a retry of a bind, a second
// Reserve in one scheduling cycle) gets the same GPUs without choose being
// called. A reservation on another node (kube-scheduler retried elsewhere)
// is released first. A bound pod holding other GPUs is an
// *AlreadyHeldError.
func (l *Ledger) Reserve(uid types.UID, pod types.NamespacedName, node string, choose func(v View, n *Node) (Choice, error)) (Choice, error) {
	for range commitTries {
		l.mu.RLock()
		h := l.holdings[uid]
		var c Choice
		var err error
		switch {
		case h != nil && h.node == node && len(h.uuids) > 0:
			c = Choice{UUIDs: h.uuids, Placement: h.placement}
		case h != nil && !h.reserved:
			err = &AlreadyHeldError{Pod: pod, Node: h.node}
		default:
			n := l.nodes[node]
			if n != nil && h != nil {
				n = View{l: l}.Without(n, uid)
			}
			c, err = choose(View{l: l}, n)
		}
		l.mu.RUnlock()
		if err != nil || h != nil && h.node == node && len(h.uuids) > 0 {
			return c, err
		}
		l.mu.Lock()
		if l.holdings[uid] == h && l.commitFree(node, uid, c.UUIDs) {
			if h != nil {
				l.releaseLocked(uid)
			}
			l.setHoldingLocked(&holding{uid: uid, pod: pod, node: node, uuids: c.UUIDs, reserved: true, since: l.now(), placement: c.Placement})
			l.mu.Unlock()
			return c, nil
		}
		l.mu.Unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.holdings[uid]; h != nil {
		if h.node == node && len(h.uuids) > 0 {
			return Choice{UUIDs: h.uuids, Placement: h.placement}, nil
		}
		if !h.reserved {
			return Choice{}, &AlreadyHeldError{Pod: pod, Node: h.node}
		}
		l.releaseLocked(uid)
	}
	c, err := choose(View{l: l}, l.nodes[node])
	if err != nil {
		return Choice{}, err
	}
	l.setHoldingLocked(&holding{uid: uid, pod: pod, node: node, uuids: c.UUIDs, reserved: true, since: l.now(), placement: c.Placement})
	return c, nil
}

// commitTries is how many times Reserve and PlanGroup choose under the
// read lock before they choose under the write lock.
const commitTries = 3

// commitFree says, under the write lock, whether uuids are GPUs of node
// that are healthy and free (pod uid's own holding there counting as
// free), no UUID twice, with room left by the GPUs held with no known
// identity: what a choice made under the read lock needs to be recorded.
func (l *Ledger) commitFree(node string, uid types.UID, uuids []string) bool {
	n := l.nodes[node]
	if n == nil || n.graph == nil {
		return len(uuids) == 0
	}
	if uid != "" {
		n = View{l: l}.Without(n, uid)
	}
	var seen topology.Mask
	for _, u := range uuids {
		i, ok := n.graph.IndexOf(u)
		if !ok || !n.freeMask.Has(i) || seen.Has(i) {
			return false
		}
		seen = seen.With(i)
	}
	return n.freeMask.Count()-n.unknownHeld >= len(uuids)
}

// SweepReservations frees reservations older than ttl (binds whose outcome
// stayed unknown and were never retried) and returns how many it freed; it
// also forgets the UIDs of pods gone longer than goneTTL.
func (l *Ledger) SweepReservations(ttl time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	cutoff := now.Add(-ttl)
	var freed int
	for uid, h := range l.holdings {
		if h.reserved && h.group == "" && h.since.Before(cutoff) {
			l.releaseLocked(uid)
			freed++
		}
	}
	for uid, at := range l.gone {
		if now.Sub(at) > goneTTL {
			delete(l.gone, uid)
		}
	}
	return freed
}
