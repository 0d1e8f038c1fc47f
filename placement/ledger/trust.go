package ledger

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// How far the ledger trusts a node's NodeGPUTopology. The node agent that
// publishes it runs on the node, so a compromised node can publish any
// topology for itself (docs/security.md). The ledger checks it against
// what it can get from elsewhere:
//
//   - the Node's GPU count: kubelet's status.capacity of the resource is
//     every device the device plugin registered and status.allocatable the
//     healthy ones. A topology listing another number of GPUs than the
//     capacity, or more healthy ones than the allocatable, is not trusted
//     until the two agree. A Node that reports no capacity of the resource
//     is not checked (its allocatable check already refuses pods);
//   - the GPUs' UUIDs: one GPU is in one machine. When a UUID is listed by
//     a node's topology after another node's already listed it, the later
//     claim is not trusted and the earlier node keeps working, so a node
//     copying an honest node's UUIDs cannot take that node out. Claims the
//     ledger first saw in the initial list (before TopologiesListed) have
//     no known order: two such claims of one UUID are both kept, and only
//     counted (DuplicateGPUs).
//
// Both checks are made on events (Node and topology updates), so filter
// reads one string per node.

// signature identifies everything of a topology's GPUs and links that the
// graph is built from (not the stored topologyHash, which the graph never
// reads, nor telemetry or times): a telemetry round that changes none of
// it keeps the graph, any other change rebuilds it. It is seeded per
// ledger, so nobody outside the process can make two contents collide.
func (l *Ledger) signature(st *v1alpha1.NodeGPUTopologyStatus) uint64 {
	var h maphash.Hash
	h.SetSeed(l.seed)
	var b [8]byte
	num := func(v int64) {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		_, _ = h.Write(b[:])
	}
	str := func(s string) {
		num(int64(len(s)))
		_, _ = h.WriteString(s)
	}
	flag := func(v bool) {
		if v {
			num(1)
		} else {
			num(0)
		}
	}
	num(int64(len(st.GPUs)))
	for i := range st.GPUs {
		g := &st.GPUs[i]
		num(int64(g.Index))
		str(g.UUID)
		str(g.Model)
		num(g.MemoryMiB)
		num(int64(g.NUMANode))
		str(g.PCIBusID)
		str(string(g.Health))
		str(g.HealthReason)
		str(g.FabricClique)
	}
	num(int64(len(st.Links)))
	for i := range st.Links {
		k := &st.Links[i]
		num(int64(k.A))
		num(int64(k.B))
		num(int64(k.NVLinks))
		flag(k.NVSwitch)
		str(string(k.PCIe))
		flag(k.P2P)
		num(int64(k.BandwidthGBps))
	}
	return h.Sum64()
}

// gpuClaim is one node's topology listing a GPU UUID; seq orders the
// claims the ledger saw after the initial list (1, 2, ...), 0 for those
// it saw before (no known order).
type gpuClaim struct {
	node string
	seq  uint64
}

// TopologiesListed tells the ledger that the initial list of
// NodeGPUTopologies has been delivered: from now on, a GPU UUID that a
// node's topology lists after another node's did is the later claim, and
// that node's topology is not trusted. Before it (and in a ledger that is
// never told, such as a simulation's) claims have no order.
func (l *Ledger) TopologiesListed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.claimsOrdered = true
}

// DuplicateGPUs counts the GPU UUIDs that more than one node's topology
// lists now; 0 in a healthy cluster.
func (r Report) DuplicateGPUs() int {
	l := r.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.duplicateGPUs
}

// setClaimsLocked makes uuids the GPUs n's topology claims (nil: none,
// for a missing or invalid topology) and re-judges every node that
// shares a UUID with what changed.
func (l *Ledger) setClaimsLocked(n *Node, uuids []string) {
	if slices.Equal(n.claimed, uuids) {
		return
	}
	affected := map[string]bool{n.name: true}
	for _, u := range n.claimed {
		if slices.Contains(uuids, u) {
			continue
		}
		cs := l.claimsOf(u)
		if len(cs) > 1 {
			l.duplicateGPUs--
		}
		cs = slices.DeleteFunc(cs, func(c gpuClaim) bool { return c.node == n.name })
		for _, c := range cs {
			affected[c.node] = true
		}
		l.setClaims(u, cs)
		if len(cs) > 1 {
			l.duplicateGPUs++
		}
	}
	for _, u := range uuids {
		if slices.Contains(n.claimed, u) {
			continue
		}
		c := gpuClaim{node: n.name}
		if l.claimsOrdered {
			l.claimSeq++
			c.seq = l.claimSeq
		}
		cs := l.claimsOf(u)
		for _, o := range cs {
			affected[o.node] = true
		}
		if len(cs) == 1 {
			l.duplicateGPUs++
		}
		l.setClaims(u, append(cs, c))
	}
	n.claimed = uuids
	for name := range affected {
		if m := l.nodes[name]; m != nil {
			l.judgeClaimsLocked(m)
			l.trustLocked(m)
		}
	}
}

// judgeClaimsLocked finds a UUID that n lists after another node did:
// n's claim is ordered (seen after the initial list) and some other
// claim is older (seen before it, or in the initial list).
func (l *Ledger) judgeClaimsLocked(n *Node) {
	n.dupGPU, n.dupFirst = "", ""
	for _, u := range n.claimed {
		cs := l.moreClaims[u] // only a UUID claimed twice can be a later claim
		if len(cs) < 2 {
			continue
		}
		var mine uint64
		for _, c := range cs {
			if c.node == n.name {
				mine = c.seq
			}
		}
		if mine == 0 {
			continue // no known order against the initial list's claims
		}
		first := gpuClaim{seq: mine}
		for _, c := range cs {
			if c.node != n.name && (c.seq < first.seq || c.seq == first.seq && c.node < first.node) {
				first = c
			}
		}
		if first.node != "" {
			n.dupGPU, n.dupFirst = u, first.node
			return
		}
	}
}

// trustLocked says whether n's topology is trusted, from its Node's GPU
// counts and its GPUs' claims; the reason is what filter gives.
func (l *Ledger) trustLocked(n *Node) {
	defer l.indexLocked(n)
	defer l.shapeMemberLocked(n)
	n.distrust = ""
	if n.graph == nil {
		return // missing or invalid: State says so
	}
	if n.dra != nil {
		if n.distrust = l.draDistrust(n); n.distrust != "" {
			return
		}
	} else if n.distrust = CountDistrust(n.graph, n.capacity, n.allocatable, l.resource); n.distrust != "" {
		return
	}
	switch {
	case n.dupGPU != "":
		n.distrust = fmt.Sprintf("node's NodeGPUTopology lists GPU %s, which node %s's NodeGPUTopology listed first; the topology is not trusted while both list it; check the gputopo node agent on this node (a GPU moved from %s stays in that node's NodeGPUTopology until its agent republishes or the object is deleted)",
			n.dupGPU, n.dupFirst, n.dupFirst)
	}
}

// CountDistrust is why a topology g is not trusted given its Node's
// capacity and allocatable of res (-1: the Node does not report it, not
// checked), "" when the counts agree: the count must equal capacity (every
// device kubelet registered), and no more GPUs may be healthy than
// allocatable. `kubectl gputopo nodes` shows the same.
func CountDistrust(g *topology.Graph, capacity, allocatable int, res corev1.ResourceName) string {
	size, healthy := g.Len(), g.Healthy().Count()
	switch {
	case capacity >= 0 && size != capacity:
		return fmt.Sprintf("node's NodeGPUTopology lists %d GPUs but the Node advertises capacity %d %s; the topology is not trusted until they agree; check the gputopo node agent on this node (kubelet's capacity counts the devices it registered)",
			size, capacity, res)
	case capacity >= 0 && healthy > max(allocatable, 0):
		return fmt.Sprintf("node's NodeGPUTopology lists %d healthy GPUs but the Node advertises %d allocatable %s; the topology is not trusted until they agree (kubelet reports a recovered GPU at its next node status update); if it lasts, check the gputopo node agent on this node",
			healthy, max(allocatable, 0), res)
	}
	return ""
}

// claimedUUIDs are the UUIDs of a valid topology's GPUs, in index order.
func claimedUUIDs(gpus []v1alpha1.GPU) []string {
	out := make([]string, len(gpus))
	for i := range gpus {
		out[i] = gpus[i].UUID
	}
	return out
}

// rekeyClaimsLocked points n's claims at the UUID strings of gpus, a
// newer copy of the GPU list its claims were made from (same UUIDs, same
// order), so that the older copy's strings go with it. A map assignment
// to an existing string key stores the new key.
func (l *Ledger) rekeyClaimsLocked(n *Node, gpus []v1alpha1.GPU) {
	if len(gpus) != len(n.claimed) {
		return
	}
	for i := range gpus {
		u := gpus[i].UUID
		if u != n.claimed[i] {
			return // not the same list: setClaimsLocked's business
		}
	}
	for i := range gpus {
		u := gpus[i].UUID
		n.claimed[i] = u
		if c, ok := l.claims[u]; ok {
			l.claims[u] = c
		}
		if cs, ok := l.moreClaims[u]; ok {
			l.moreClaims[u] = cs
		}
	}
}

// claimsOf lists the claims of GPU UUID u.
func (l *Ledger) claimsOf(u string) []gpuClaim {
	if cs, ok := l.moreClaims[u]; ok {
		return slices.Clone(cs)
	}
	if c, ok := l.claims[u]; ok {
		return []gpuClaim{c}
	}
	return nil
}

// setClaims makes cs the claims of GPU UUID u.
func (l *Ledger) setClaims(u string, cs []gpuClaim) {
	switch len(cs) {
	case 0:
		delete(l.claims, u)
		delete(l.moreClaims, u)
	case 1:
		l.claims[u] = cs[0]
		delete(l.moreClaims, u)
	default:
		delete(l.claims, u)
		l.moreClaims[u] = cs
	}
}
