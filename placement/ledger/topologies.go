package ledger

import (
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// UpsertTopology records a NodeGPUTopology. The graph is rebuilt whenever
// the GPUs or links it is built from changed, whatever topologyHash the
// object carries (the graph never reads it), and not on a telemetry round
// that changed neither. The ledger keeps obj's GPU list and telemetry
// rather than copies: obj must not change afterwards (an informer cache's
// objects never do).
func (l *Ledger) UpsertTopology(obj *v1alpha1.NodeGPUTopology) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodeLocked(obj.Name)
	st := &obj.Status
	wasOld := l.onUsable != nil && n.State(NewFreshWindow(l.now(), l.maxAge)) == TopoOld
	had := n.hasTopology
	n.hasTopology = true
	if sig := l.signature(st); !had || sig != n.topoSig {
		// The object is the informer cache's (read-only): the graph keeps
		// its GPU list rather than a copy.
		g, err := topology.FromStatusKeeping(st)
		var uuids []string
		if err != nil {
			n.graph, n.topo = nil, nil
			n.topoErr = err.Error()
		} else {
			n.topo = l.topoLocked(g, st)
			// Nodes of one machine shape share its link tables.
			n.graph, n.topoErr = g.SharingTables(n.topo.pristine), ""
			uuids = claimedUUIDs(st.GPUs)
		}
		n.topoSig = sig
		l.setClaimsLocked(n, uuids)
	} else if n.graph != nil {
		// The same GPUs (a telemetry round): the graph holds this copy
		// of their list, so that the cache's older copy goes.
		n.graph = n.graph.Rebased(st.GPUs)
		l.rekeyClaimsLocked(n, st.GPUs)
	}
	n.stale, n.staleReason = st.Stale, st.StaleReason
	n.observed = st.ObservedTime.Time
	n.observedNs = 0
	if !n.observed.IsZero() {
		n.observedNs = n.observed.UnixNano()
	}
	n.clique = ""
	for i := range st.GPUs {
		if c := st.GPUs[i].FabricClique; c != "" {
			n.clique = c
			break
		}
	}
	n.statusTel, n.statusTelTime = st.Telemetry, st.TelemetryTime.Time
	l.applyTelemetryLocked(n)
	l.trustLocked(n)
	if wasOld && n.State(NewFreshWindow(l.now(), l.maxAge)) == TopoFresh {
		l.onUsable() // published again after its agent was away too long
	}
}

// topoLocked returns the shared entry for g's topology hash.
func (l *Ledger) topoLocked(g *topology.Graph, st *v1alpha1.NodeGPUTopologyStatus) *Topo {
	if e, ok := l.topos[g.Hash()]; ok {
		return e
	}
	healthy := *st
	healthy.GPUs = append([]v1alpha1.GPU(nil), st.GPUs...)
	for i := range healthy.GPUs {
		healthy.GPUs[i].Health = v1alpha1.GPUHealthy
	}
	p, err := topology.FromStatus(&healthy)
	if err != nil {
		p = g // health never makes a topology invalid; keep going
	}
	maxIsland := p.Metrics(topology.Mask{}, p.All()).LeftLargestIsland
	e := &Topo{pristine: p, maxIsland: maxIsland, logCapability: math.Log(CapabilityOf(p, maxIsland)), islandOf: make([]topology.Mask, p.Len()), id: uint64(len(l.topos))}
	for _, isl := range p.Islands() {
		for _, i := range isl.Indices() {
			e.islandOf[i] = isl
		}
	}
	l.topos[g.Hash()] = e
	return e
}

// DeleteTopology forgets a node's NodeGPUTopology.
func (l *Ledger) DeleteTopology(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, ok := l.nodes[name]
	if !ok {
		return
	}
	n.hasTopology, n.graph, n.topo, n.topoErr = false, nil, nil, ""
	n.topoSig = 0
	n.statusTel, n.statusTelTime = nil, time.Time{}
	l.applyTelemetryLocked(n)
	l.setClaimsLocked(n, nil)
	l.trustLocked(n)
	l.dropIfEmptyLocked(n)
}

// UpsertNode records a Node's GPU allocatable and capacity.
func (l *Ledger) UpsertNode(node *corev1.Node) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodeLocked(node.Name)
	n.obj = node
	l.setDomainsLocked(n, node.Labels)
	l.countsLocked(n)
	l.trustLocked(n)
}

// countsLocked reads n's GPU allocatable and capacity from its Node. A
// node whose GPUs a DRA driver publishes and whose Node advertises none
// of the resource reports no count (-1): its GPUs are the driver's.
func (l *Ledger) countsLocked(n *Node) {
	n.allocatable, n.capacity = -1, -1
	if n.obj == nil {
		return
	}
	a, aok := n.obj.Status.Allocatable[l.resource]
	c, cok := n.obj.Status.Capacity[l.resource]
	if n.dra != nil && !aok && !cok {
		return
	}
	n.allocatable = 0
	if aok {
		n.allocatable = int(min(a.Value(), 1<<16))
	}
	if cok {
		n.capacity = int(min(max(c.Value(), 0), 1<<16))
	}
}

// DeleteNode forgets a Node object (its topology and holdings stay until
// their own objects go).
func (l *Ledger) DeleteNode(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n, ok := l.nodes[name]; ok {
		n.obj = nil
		n.allocatable, n.capacity = -1, -1
		l.trustLocked(n)
		l.dropIfEmptyLocked(n)
	}
}

func (l *Ledger) nodeLocked(name string) *Node {
	n, ok := l.nodes[name]
	if !ok {
		n = &Node{name: name, allocatable: -1, capacity: -1, holdings: make(map[types.UID]*holding)}
		l.nodes[name] = n
		l.changedLocked(n)
	}
	return n
}

func (l *Ledger) dropIfEmptyLocked(n *Node) {
	if n.empty() {
		l.goneLocked(n)
		delete(l.nodes, n.name)
		l.unindexLocked(n.name)
	}
}

// recomputeLocked refreshes the values requests read from a node: the used
// mask, GPUs held but not identified, the utilization of free GPUs, and
// the GPUs that more than one pod holds.
//
// Two live pods may name the same GPU (the node agent recorded what
// kubelet gave after a drift, a pod was bound outside gputopo). Neither
// holding is dropped, since either pod may really have the GPU; the GPU
// counts as used once, and the conflict is recorded (doubleHeld) and
// reported through onDoubleHeld when it appears and when it clears.
func (l *Ledger) recomputeLocked(n *Node) {
	n.used, n.unknownHeld, n.utilFree = topology.Mask{}, 0, 0
	n.heldCount, n.reservedCount = 0, 0
	var dup topology.Mask
	var seen map[string]bool // held UUIDs the topology does not resolve
	var dupUnresolved []string
	// Bound holdings first, then reservations: a GPU that both name counts
	// as held.
	for _, reserved := range [2]bool{false, true} {
		for _, h := range n.holdings {
			if h.reserved != reserved {
				continue
			}
			k := h.unknown
			for _, u := range h.uuids {
				i, ok := -1, false
				if n.graph != nil {
					i, ok = n.graph.IndexOf(u)
				}
				if !ok {
					if seen[u] {
						dupUnresolved = append(dupUnresolved, u)
						continue
					}
					if seen == nil {
						seen = make(map[string]bool)
					}
					seen[u] = true
					k++
					n.unknownHeld++
					continue
				}
				if n.used.Has(i) {
					dup = dup.With(i)
				} else {
					n.used = n.used.With(i)
					k++
				}
			}
			n.unknownHeld += h.unknown
			if reserved {
				n.reservedCount += k
			} else {
				n.heldCount += k
			}
		}
	}
	// withoutLocked recomputes copies: only the node itself reports.
	if (!dup.Empty() || len(dupUnresolved) > 0 || len(n.doubleHeld) > 0) && l.nodes[n.name] == n {
		l.noteDoubleHeldLocked(n, dup, dupUnresolved)
	}
	n.size, n.freeMask, n.usedCount = 0, topology.Mask{}, n.used.Count()
	if n.graph != nil {
		n.size, n.freeMask = n.graph.Len(), n.graph.Healthy().Minus(n.used)
	}
	if n.util != nil {
		for _, i := range n.freeMask.Indices() {
			n.utilFree += n.util[i]
		}
	}
	l.indexLocked(n)
}
