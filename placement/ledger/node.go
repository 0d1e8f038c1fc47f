package ledger

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/topology"
)

// Node accessors: what filter and score read of a node. A *Node is valid
// only inside the Read (or Reserve) call that handed it out; the accessors
// read without locking, the caller's Read holds the lock.

// Name is the node's name ("" for nil).
func (n *Node) Name() string {
	if n == nil {
		return ""
	}
	return n.name
}

// Size is the number of GPUs (0 without a valid topology).
func (n *Node) Size() int { return n.size }

// Free is the healthy GPUs nobody holds or has been promised.
func (n *Node) Free() topology.Mask { return n.freeMask }

// UsedCount is the number of identified GPUs held or reserved.
func (n *Node) UsedCount() int { return n.usedCount }

// UnknownHeld counts GPUs held whose identity is not known: pods bound
// without an assignment, or UUIDs not in the node's topology.
func (n *Node) UnknownHeld() int { return n.unknownHeld }

// Allocatable is the Node's allocatable count of the ledger's resource, -1
// when no Node object has been seen.
func (n *Node) Allocatable() int { return n.allocatable }

// Capacity is the Node's capacity of the ledger's resource, -1 when the
// Node reports none or no Node object has been seen.
func (n *Node) Capacity() int { return n.capacity }

// UntrustedReason says why the node's topology is not trusted (its GPU
// count disagrees with the Node's, or it lists a GPU another node listed
// first; see trust.go); "" when it is trusted or there is none.
func (n *Node) UntrustedReason() string { return n.distrust }

// UtilFree sums the telemetry utilization of the healthy GPUs not held.
func (n *Node) UtilFree() int32 { return n.utilFree }

// Graph is the node's topology with its GPUs' health, nil when the
// topology is missing or invalid.
func (n *Node) Graph() *topology.Graph { return n.graph }

// Topo is what every node of the same machine shares, nil without a valid
// topology.
func (n *Node) Topo() *Topo { return n.topo }

// TopologyError is why the node's NodeGPUTopology is invalid.
func (n *Node) TopologyError() string { return n.topoErr }

// StaleReason is why the node agent marked the topology stale.
func (n *Node) StaleReason() string { return n.staleReason }

// Observed is the topology's observedTime (zero when unset).
func (n *Node) Observed() time.Time { return n.observed }

// Clique is the node's NVLink fabric clique ("" outside a multi-node
// NVLink domain).
func (n *Node) Clique() string { return n.clique }

// Telemetry is each GPU's telemetry, by index, when it was taken at or
// after afterNs (Unix nanoseconds); nil when the node has none that recent.
func (n *Node) Telemetry(afterNs int64) []GPUTelemetry {
	if n.tel == nil || n.telemetryNs == 0 || n.telemetryNs < afterNs {
		return nil
	}
	return n.tel
}

// Utilization is each GPU's compute utilization, by index, for the
// allocator, when taken at or after afterNs; nil otherwise.
func (n *Node) Utilization(afterNs int64) []int32 {
	if n.util == nil || n.telemetryNs == 0 || n.telemetryNs < afterNs {
		return nil
	}
	return n.util
}

// Pristine is the machine's topology with every GPU healthy and free: what
// a node of it could ever offer, to tell "not now" from "never".
func (t *Topo) Pristine() *topology.Graph { return t.pristine }

// MaxIsland is the size of the machine's largest NVLink-connected clique.
func (t *Topo) MaxIsland() int { return t.maxIsland }

// LogCapability is the log of CapabilityOf the machine.
func (t *Topo) LogCapability() float64 { return t.logCapability }

// IslandOf is GPU i's NVLink island.
func (t *Topo) IslandOf(i int) topology.Mask { return t.islandOf[i] }

// ID numbers the machine (IDs are never reused), for per-request caches.
func (t *Topo) ID() uint64 { return t.id }

// CapabilityOf is what a machine's interconnect can offer the most
// demanding pod: its peak pair bandwidth times its largest NVLink clique
// (at least 1). A PCIe server scores its PCIe bandwidth, NVLink-bridged
// pairs twice their bridge, a DGX-1 V100 four times its best pair, an
// NVSwitch machine eight times its any-pair bandwidth.
func CapabilityOf(g *topology.Graph, maxIsland int) float64 {
	return float64(max(g.PeakBandwidth(), 1)) * float64(max(maxIsland, 1))
}

// ClockSkew is how far in the future a NodeGPUTopology's observedTime may
// lie before filter distrusts it: the node's clock and the scheduler's may
// differ by this much (docs/extender.md).
const ClockSkew = 2 * time.Minute

// FreshWindow is the range a fresh topology's observedTime lies in, in
// Unix nanoseconds: from now - maxAge to now + ClockSkew, or unbounded
// without an age check.
type FreshWindow struct{ from, to int64 }

// NewFreshWindow is the window at now for maxAge (0 or less: no age check).
func NewFreshWindow(now time.Time, maxAge time.Duration) FreshWindow {
	if maxAge <= 0 {
		return FreshWindow{math.MinInt64, math.MaxInt64}
	}
	return FreshWindow{now.Add(-maxAge).UnixNano(), now.Add(ClockSkew).UnixNano()}
}

// TopoState is the state of a node's NodeGPUTopology as filter judges it.
type TopoState uint8

// Topology states; filter refuses every node that is not TopoFresh.
const (
	TopoFresh TopoState = iota
	TopoMissing
	TopoInvalid
	TopoAgentStale
	TopoOld
	TopoUntrusted
)

var topoStateNames = [...]string{TopologyFresh, TopologyMissing, TopologyInvalid, TopologyAgentStale, TopologyOld, TopologyUntrusted}

// String is the state's metric label (TopologyFresh, ...).
func (s TopoState) String() string { return topoStateNames[s] }

// State judges n's topology (n may be nil: missing): missing, invalid,
// marked stale by the agent, old (observedTime missing or outside w),
// untrusted (UntrustedReason) or fresh.
func (n *Node) State(w FreshWindow) TopoState {
	switch {
	case n == nil || !n.hasTopology:
		return TopoMissing
	case n.graph == nil:
		return TopoInvalid
	case n.stale:
		return TopoAgentStale
	case n.observedNs == 0 || n.observedNs < w.from || n.observedNs > w.to:
		return TopoOld
	case n.distrust != "":
		return TopoUntrusted
	}
	return TopoFresh
}

// View is the ledger as one Read sees it, or as a Snapshot saw it (s not
// nil: nodes resolve to their frozen copies). It is valid only inside
// that call.
type View struct {
	l *Ledger
	s *Snapshot
}

// node is the named node as v sees it.
func (v View) node(name string) *Node {
	n := v.l.nodes[name]
	if v.s != nil {
		return v.s.at(name, n)
	}
	return n
}

// each calls fn with every node as v sees it, in map order.
func (v View) each(fn func(n *Node)) {
	for _, n := range v.l.nodes {
		if v.s != nil {
			if n = v.s.version(n); n == nil {
				continue
			}
		}
		fn(n)
	}
	if v.s == nil {
		return
	}
	for _, g := range v.l.snaps.gone {
		if g.after >= v.s.seq && v.s.version(v.l.nodes[g.n.name]) == nil {
			if f := v.s.version(g.n); f != nil {
				fn(f)
			}
		}
	}
}

// Read calls fn with a view of the ledger under its read lock: every node
// fn reads is in one consistent state. fn must not keep the view or the
// nodes past its return, nor call the ledger's other methods (they lock).
func (l *Ledger) Read(fn func(v View)) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	fn(View{l: l})
}

// Node is the named node, nil when the ledger knows nothing of it.
func (v View) Node(name string) *Node { return v.node(name) }

// Lookup resolves names into dst (reused when large enough) in one pass
// before any node is evaluated: the lookups do not depend on each other,
// so the CPU overlaps their cache misses, and the evaluation pass then
// finds the nodes' state warm. Unknown names resolve to nil. The nodes are
// as pod uid sees them (see NodeFor); uid "" sees them as they are.
func (v View) Lookup(uid types.UID, names []string, dst []*Node) []*Node {
	if cap(dst) < len(names) {
		dst = make([]*Node, len(names))
	}
	dst = dst[:len(names)]
	for i, name := range names {
		dst[i] = v.node(name)
	}
	if node, ok := v.reservedNode(uid); ok {
		for i, name := range names {
			if name == node && dst[i] != nil {
				dst[i] = v.Without(dst[i], uid)
			}
		}
	}
	return dst
}

// NodeFor is the named node as pod uid sees it: where uid holds a
// reservation (a bind in flight, or one whose outcome was unknown and is
// being retried) its own reserved GPUs count as free, since Reserve hands
// them back to it on that node. Without that, a retry after an unknown
// outcome would find the node short of exactly the GPUs it was promised,
// and in a full cluster wait unschedulable until the reservation expired.
// nil when the ledger knows nothing of the node.
func (v View) NodeFor(name string, uid types.UID) *Node {
	n := v.node(name)
	if node, ok := v.reservedNode(uid); ok && node == name && n != nil {
		return v.Without(n, uid)
	}
	return n
}

// reservedNode is the node on which pod uid holds a reservation.
func (v View) reservedNode(uid types.UID) (string, bool) {
	if v.s != nil && uid == v.s.uid {
		return v.s.resNode, v.s.resOK
	}
	if uid == "" || len(v.l.holdings) == 0 {
		return "", false
	}
	h, ok := v.l.holdings[uid]
	if !ok || !h.reserved {
		return "", false
	}
	return h.node, true
}

// HolderNode is the node on which pod uid holds or has been promised GPUs.
func (v View) HolderNode(uid types.UID) (node string, ok bool) {
	h, ok := v.l.holdings[uid]
	if !ok {
		return "", false
	}
	return h.node, true
}

// HeldOn is the GPUs pod uid holds or has been promised on node (its
// reservation, its group slot), nil when none there.
func (v View) HeldOn(uid types.UID, node string) []string {
	h, ok := v.l.holdings[uid]
	if !ok || h.node != node || len(h.uuids) == 0 {
		return nil
	}
	return slices.Clone(h.uuids)
}

// Without is n as if pod uid held nothing on it: a copy, n is left alone.
// n itself when uid holds nothing there.
func (v View) Without(n *Node, uid types.UID) *Node {
	if _, ok := n.holdings[uid]; !ok {
		return n
	}
	return v.As(n, func(u types.UID) bool { return u == uid }, nil)
}

// As is n as it would be if the pods gone says so held nothing on it and
// the pods of added each held that many more GPUs of unknown identity
// there (pods nominated to the node, whose GPUs are not chosen yet): the
// question preemption asks, "would it fit with these victims gone". An
// added pod that already holds GPUs on n counts once, as it is. A copy;
// n is left alone, and n itself is returned when nothing changes.
func (v View) As(n *Node, gone func(types.UID) bool, added map[types.UID]int) *Node {
	if n == nil {
		return nil
	}
	drop, extra := false, 0
	if gone != nil {
		for uid := range n.holdings {
			if gone(uid) {
				drop = true
				break
			}
		}
	}
	for uid, k := range added {
		if _, holds := n.holdings[uid]; !holds {
			extra += k
		}
	}
	if !drop && extra == 0 {
		return n
	}
	c := *n
	if drop {
		c.holdings = make(map[types.UID]*holding, len(n.holdings))
		for k, h := range n.holdings {
			if !gone(k) {
				c.holdings[k] = h
			}
		}
		v.l.recomputeLocked(&c)
	}
	c.unknownHeld += extra
	return &c
}

// Affinity answers "does the pod's job run on this node or in its NVLink
// fabric clique?" for one request.
type Affinity struct {
	nodes   map[string]int
	cliques map[string]bool
}

// Affinity indexes where job (namespace/job label) has live bound pods;
// the zero Affinity for "" or a job with none placed.
func (v View) Affinity(job string) Affinity {
	if job == "" {
		return Affinity{}
	}
	if v.s != nil && job == v.s.job {
		return v.s.aff
	}
	return v.affinityOf(v.l.jobs[job])
}

// AffinityExcluding is Affinity without pod itself, for deciding as if it
// were not bound yet.
func (v View) AffinityExcluding(job string, pod types.NamespacedName, uid types.UID) Affinity {
	idx := v.Affinity(job)
	info := v.l.pods[pod]
	if info == nil || info.UID != uid || info.Node == "" || info.Job != job || idx.nodes[info.Node] == 0 {
		return idx
	}
	nodes := maps.Clone(idx.nodes)
	if nodes[info.Node]--; nodes[info.Node] == 0 {
		delete(nodes, info.Node)
	}
	if len(nodes) == 0 {
		// The job's only placed pod: as for a job with none placed,
		// task affinity does not count.
		return Affinity{}
	}
	return v.affinityOf(nodes)
}

func (v View) affinityOf(nodes map[string]int) Affinity {
	idx := Affinity{nodes: nodes}
	for name := range nodes {
		if n := v.node(name); n != nil && n.clique != "" {
			if idx.cliques == nil {
				idx.cliques = make(map[string]bool)
			}
			idx.cliques[n.clique] = true
		}
	}
	return idx
}

// Placed says whether the job has pods placed: only then does task
// affinity count for the pod.
func (a Affinity) Placed() bool { return a.nodes != nil }

// Of is the task affinity of node n: 1 when the job runs there, 0.5 when
// it runs in n's fabric clique, else 0.
func (a Affinity) Of(n *Node) float64 {
	switch {
	case a.nodes == nil:
		return 0
	case a.nodes[n.name] > 0:
		return 1
	case n.clique != "" && a.cliques[n.clique]:
		return 0.5
	}
	return 0
}

// HoldersBelow says whether some pod of priority below prio holds GPUs:
// only then can preemption free GPUs for a pod of priority prio.
func (v View) HoldersBelow(prio int32) bool {
	for p := range v.l.byPriority {
		if p < prio {
			return true
		}
	}
	return false
}

// Holder is a pod that holds GPUs on a node, as preemption weighs it.
type Holder struct {
	UID      types.UID
	Pod      types.NamespacedName
	Priority int32
	Started  time.Time
	// Reserved: its bind is in flight (or it is a group's planned slot);
	// it is not a pod that could be evicted.
	Reserved bool
	// UUIDs are the GPUs it holds on the node; Unknown counts those whose
	// identity is not known.
	UUIDs   []string
	Unknown int
	// Group is the pod's group ("" for none): evicting one pod of a group
	// stops the whole group.
	Group string
	// Preempted: kube-scheduler is evicting it (its DisruptionTarget
	// condition); its GPUs go to the pod that preempted it.
	Preempted bool
	// Ends is when the pod is gone at the latest (its activeDeadlineSeconds
	// after it started, or after now when it has not started yet); zero
	// when it does not say.
	Ends time.Time
}

// Holders are the pods holding GPUs on node n, by UID.
func (v View) Holders(n *Node) []Holder {
	if n == nil {
		return nil
	}
	out := make([]Holder, 0, len(n.holdings))
	for uid, h := range n.holdings {
		hd := Holder{UID: uid, Pod: h.pod, Reserved: h.reserved, UUIDs: h.uuids, Unknown: h.unknown}
		if info := v.l.pods[h.pod]; info != nil && info.UID == uid {
			hd.Priority, hd.Started, hd.Group, hd.Preempted = info.Priority, info.Started, info.Group, info.Preempted
			if info.Deadline > 0 {
				start := info.Started
				if start.IsZero() {
					start = v.l.now()
				}
				hd.Ends = start.Add(info.Deadline)
			}
		}
		out = append(out, hd)
	}
	slices.SortFunc(out, func(a, b Holder) int { return strings.Compare(string(a.UID), string(b.UID)) })
	return out
}
