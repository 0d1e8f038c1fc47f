// Package ledger is gputopo's decision core's memory of the cluster's GPUs:
// every node's topology and telemetry, and which pod holds which GPU. The
// HTTP extender and the scheduler plugin build decide from it through a
// narrow API:
//
//   - feeds: UpsertTopology, DeleteTopology, UpsertNode, DeleteNode,
//     UpsertPod, DeletePod (informer events), TopologiesListed (the
//     initial list is in) and the external telemetry rounds; a topology
//     is checked against its Node's GPU counts and the other nodes' GPU
//     UUIDs on these events (trust.go);
//   - reads: Read hands a read-only View (nodes, job affinity) to a
//     function under the ledger's read lock, so that filter and score see
//     one consistent state without copying it;
//   - holds: Reserve chooses and holds a pod's GPUs under the write lock,
//     Confirm marks the hold bound once the Binding is written, Release and
//     ReleaseReserved free it, SweepReservations expires holds whose bind
//     outcome stayed unknown;
//   - reports for audits and metrics: Holdings, DoubleHolds, Counts,
//     TopologyStates, DuplicateGPUs, TelemetrySources.
//
// Its lock and maps are private: nothing outside the package can change
// what a node holds except through these calls. It imports topology and
// api/v1alpha1 only.
package ledger

import (
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Ledger is the memory of the cluster's GPUs. It is fed by
// informer events (and, for reservations, by bind) and read by every
// request; per-node values that requests need (graph, free mask, telemetry
// sums) are computed here, on events, so that a request only reads them.
//
// A GPU is held by a pod UID. Holdings come from live pods (allocated-gpus,
// the node agent's record of what kubelet gave, wins over assigned-gpus,
// the plan) and from reservations that bind makes before it writes the
// Binding. A bound pod's holding goes away only when the pod is deleted or
// finishes: binding cannot be undone, so no reordering of events can free a
// GPU that a live pod holds.
type Ledger struct {
	mu       sync.RWMutex
	nodes    map[string]*Node
	topos    map[string]*Topo
	holdings map[types.UID]*holding
	pods     map[types.NamespacedName]*PodInfo
	// jobs counts live bound pods per job (namespace/label) per node.
	jobs map[string]map[string]int
	now  func() time.Time
	// onTelemetry, when set, is told of every node's telemetry as
	// prioritize reads it (nil graph and telemetry: none) so that metrics
	// follow the ledger.
	onTelemetry func(node string, g *topology.Graph, tel []v1alpha1.Telemetry)
	// extMaxAge > 0 prefers external (Prometheus) telemetry no older than
	// it; 0 reads NodeGPUTopology telemetry only.
	extMaxAge time.Duration
	// extData is the last successful external query round.
	extData ExternalTelemetry
	// resource is the extended resource counted (ExtenderConfiguration's
	// resourceName).
	resource corev1.ResourceName
	// onDoubleHeld, when set, is told of GPUs that became held by more
	// than one pod (added) and of those that no longer are (cleared). It
	// is called under the ledger's lock: it must not block or call back
	// into the ledger.
	onDoubleHeld func(added, cleared []DoubleHold)
	// seed keys the topology signatures (signature).
	seed maphash.Seed
	// gone remembers, for goneTTL, the UIDs of pods that were deleted or
	// finished: a UID never comes back, so a stale copy of such a pod (a
	// rebuild's list taken before the delete arrived) is not counted again.
	gone map[types.UID]time.Time
	// claims lists, per GPU UUID, the nodes whose valid topology lists it
	// (see trust.go); duplicateGPUs counts the UUIDs with more than one.
	claims        map[string][]gpuClaim
	duplicateGPUs int
	// claimsOrdered is set by TopologiesListed; claimSeq numbers the
	// claims seen after it.
	claimsOrdered bool
	claimSeq      uint64
}

// New returns an empty ledger counting the extended resource (the
// configuration's resourceName; empty: nvidia.com/gpu), on the wall clock.
func New(resource corev1.ResourceName) *Ledger {
	if resource == "" {
		resource = v1alpha1.ResourceGPU
	}
	return &Ledger{
		nodes:    make(map[string]*Node),
		topos:    make(map[string]*Topo),
		holdings: make(map[types.UID]*holding),
		pods:     make(map[types.NamespacedName]*PodInfo),
		jobs:     make(map[string]map[string]int),
		now:      time.Now,
		resource: resource,
		seed:     maphash.MakeSeed(),
		claims:   make(map[string][]gpuClaim),
		gone:     make(map[types.UID]time.Time),
	}
}

// goneTTL is how long a deleted or finished pod's UID is remembered: far
// longer than a rebuild's list can be in flight.
const goneTTL = 10 * time.Minute

// SetClock replaces the ledger's clock (reservation ages and TTLs, external
// telemetry ages), for a simulation that runs in simulated time.
func (l *Ledger) SetClock(now func() time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.now = now
}

// OnTelemetry sets the function told of every node's telemetry as
// prioritize reads it (nil graph and telemetry: none), so that metrics
// follow the ledger. Set it before the ledger is fed.
func (l *Ledger) OnTelemetry(fn func(node string, g *topology.Graph, tel []v1alpha1.Telemetry)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onTelemetry = fn
}

// OnDoubleHeld sets the function told of GPUs that became held by more
// than one pod (added) and of those that no longer are (cleared). It is
// called under the ledger's lock: it must not block or call back into the
// ledger. Set it before the ledger is fed.
func (l *Ledger) OnDoubleHeld(fn func(added, cleared []DoubleHold)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.onDoubleHeld = fn
}

// Topo is shared by every node of one topology hash.
type Topo struct {
	// pristine is the topology with every GPU healthy and free: what the
	// node could ever offer, used to tell "not now" from "never".
	pristine *topology.Graph
	// maxIsland is the largest NVLink-connected clique of the machine.
	maxIsland int
	// logCapability is the log of what the machine can offer (capability
	// conservation, CapabilityOf); islandOf[i] is GPU i's NVLink island
	// (island best fit).
	logCapability float64
	islandOf      []topology.Mask
	// id numbers the entry (entries are never removed), for the
	// evaluator's per-request cache.
	id uint64
}

// Node is one node as filter and score see it, read through its accessors
// inside Read or Reserve. The fields every request reads come first and
// are plain values, so that a request touches one small block per node
// rather than chasing the graph.
type Node struct {
	// size is the number of GPUs (0 without a valid topology).
	size int
	// freeMask is the healthy GPUs nobody holds; usedCount counts held ones.
	freeMask  topology.Mask
	usedCount int
	// unknownHeld counts GPUs held whose identity is not known: pods bound
	// without an assignment, or UUIDs not in the node's topology.
	unknownHeld int
	// observedNs is the topology's observedTime in Unix nanoseconds, 0 when
	// unset.
	observedNs int64
	// telemetryNs is the telemetry time in Unix nanoseconds, 0 when unset.
	telemetryNs int64
	// allocatable is the Node's nvidia.com/gpu allocatable, -1 when no Node
	// object has been seen.
	allocatable int
	// capacity is the Node's status.capacity of the resource, -1 when the
	// Node reports none (or no Node object has been seen).
	capacity int
	// utilFree sums the telemetry utilization of healthy GPUs not held.
	utilFree    int32
	hasTopology bool
	stale       bool
	graph       *topology.Graph // nil when the topology is missing or invalid
	topo        *Topo
	// tel is the telemetry prioritize scores by, by GPU index; nil: none.
	// Up to len(telInline) GPUs it points into telInline, so that scoring
	// a node reads the node's own block instead of another allocation.
	tel       []GPUTelemetry
	telInline [8]GPUTelemetry
	util      []int32 // compute utilization by GPU index for the allocator; nil: none

	// statusTel and statusTelTime are the NodeGPUTopology telemetry.
	// applyTelemetryLocked picks it or the external samples into tel and
	// util; telSource and fallback say which and why.
	statusTel     []v1alpha1.Telemetry
	statusTelTime time.Time
	telSource     string
	fallback      string

	name        string
	topoErr     string
	staleReason string
	observed    time.Time
	clique      string
	// topoSig is the signature of the GPUs and links the graph was built
	// from (Ledger.signature).
	topoSig uint64
	// claimed are the UUIDs of the valid topology's GPUs; dupGPU is one of
	// them that node dupFirst's topology listed first (see trust.go).
	claimed          []string
	dupGPU, dupFirst string
	// distrust says why the topology is not trusted (trustLocked); ""
	// when it is.
	distrust string

	holdings map[types.UID]*holding
	// used is the union of the known GPUs held on this node.
	used topology.Mask
	// heldCount and reservedCount are the GPUs held by bound pods and
	// reserved by binds in flight, each GPU counted once (held wins).
	heldCount, reservedCount int
	// doubleHeld lists the GPUs that more than one holding names, sorted
	// by UUID; nil when none (the usual case).
	doubleHeld []DoubleHold
}

func (n *Node) empty() bool {
	return n.allocatable < 0 && !n.hasTopology && len(n.holdings) == 0
}

// GPUTelemetry is one GPU's utilization (0..100), temperature (°C), power
// draw and power limit (W; 0: none known).
type GPUTelemetry struct {
	Util, TempC, PowerW, LimitW int32
}

// holding is the GPUs one pod holds or has been promised.
type holding struct {
	uid     types.UID
	pod     types.NamespacedName
	node    string
	uuids   []string
	unknown int // GPUs held whose identity is not known
	// reserved: made by bind and not yet confirmed by the API (in flight,
	// or outcome unknown); such a holding expires after the reservation TTL.
	reserved  bool
	since     time.Time
	placement v1alpha1.Placement
}

// PodInfo is what the ledger keeps of a GPU pod, read from the pod object.
type PodInfo struct {
	UID  types.UID
	Key  types.NamespacedName
	Node string
	// GPUs is the pod's GPU demand (see GPUCount).
	GPUs int
	// Job is namespace/job label, "" without one.
	Job string
	// Requirement is the requirement annotation as written;
	// HasRequirement says whether the pod has one.
	Requirement    string
	HasRequirement bool
	// Assigned is allocated-gpus, else assigned-gpus.
	Assigned []string
	// AssignedRaw is the assigned-gpus annotation as written.
	AssignedRaw string
	// AssignErr is why the GPU annotation could not be read.
	AssignErr string
	// DemandErr is why the pod's GPU demand could not be read (a negative,
	// fractional or oversized count, naming the field); GPUs is then 0
	// and must not be taken for "no GPUs".
	DemandErr string
}

// GPUCount is the number of devices of resource (the configuration's
// GPUResource) the pod needs, by v1alpha1.PodGPUDemand: app containers and
// sidecars summed, one-shot init containers the largest, limits over
// requests. A negative, fractional or oversized count is an error naming
// the container's field.
func GPUCount(pod *corev1.Pod, resource corev1.ResourceName) (int, error) {
	n, err := v1alpha1.PodGPUDemand(&pod.Spec, resource)
	if err != nil {
		return 0, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if n > math.MaxInt32 {
		return 0, fmt.Errorf("pod %s/%s: spec: Invalid value: %d %s in all: must be at most %d", pod.Namespace, pod.Name, n, resource, math.MaxInt32)
	}
	return int(n), nil
}

// NewPodInfo reads what the ledger keeps of pod p, counting resource.
func NewPodInfo(p *corev1.Pod, resource corev1.ResourceName) *PodInfo {
	info := &PodInfo{
		UID:  p.UID,
		Key:  types.NamespacedName{Namespace: p.Namespace, Name: p.Name},
		Node: p.Spec.NodeName,
	}
	if n, err := GPUCount(p, resource); err != nil {
		info.DemandErr = err.Error()
	} else {
		info.GPUs = n
	}
	if j := p.Labels[v1alpha1.LabelJob]; j != "" {
		info.Job = p.Namespace + "/" + j
	}
	info.Requirement, info.HasRequirement = p.Annotations[v1alpha1.AnnotationRequirement]
	info.AssignedRaw = p.Annotations[v1alpha1.AnnotationAssignedGPUs]
	for _, key := range []string{v1alpha1.AnnotationAllocatedGPUs, v1alpha1.AnnotationAssignedGPUs} {
		v, ok := p.Annotations[key]
		if !ok {
			continue
		}
		uuids, err := v1alpha1.ParseGPUList(key, v)
		if err != nil {
			info.AssignErr = err.Error()
			continue
		}
		if len(uuids) > 0 {
			info.Assigned = uuids
			break
		}
	}
	return info
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// UpsertTopology records a NodeGPUTopology. The graph is rebuilt whenever
// the GPUs or links it is built from changed, whatever topologyHash the
// object carries (the graph never reads it), and not on a telemetry round
// that changed neither.
func (l *Ledger) UpsertTopology(obj *v1alpha1.NodeGPUTopology) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodeLocked(obj.Name)
	st := &obj.Status
	had := n.hasTopology
	n.hasTopology = true
	if sig := l.signature(st); !had || sig != n.topoSig {
		g, err := topology.FromStatus(st)
		var uuids []string
		if err != nil {
			n.graph, n.topo = nil, nil
			n.topoErr = err.Error()
		} else {
			n.graph, n.topoErr = g, ""
			n.topo = l.topoLocked(g, st)
			uuids = claimedUUIDs(st.GPUs)
		}
		n.topoSig = sig
		l.setClaimsLocked(n, uuids)
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
	n.allocatable, n.capacity = 0, -1
	if q, ok := node.Status.Allocatable[l.resource]; ok {
		n.allocatable = int(min(q.Value(), 1<<16))
	}
	if q, ok := node.Status.Capacity[l.resource]; ok {
		n.capacity = int(min(max(q.Value(), 0), 1<<16))
	}
	l.trustLocked(n)
}

// DeleteNode forgets a Node object (its topology and holdings stay until
// their own objects go).
func (l *Ledger) DeleteNode(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n, ok := l.nodes[name]; ok {
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
	}
	return n
}

func (l *Ledger) dropIfEmptyLocked(n *Node) {
	if n.empty() {
		delete(l.nodes, n.name)
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
}

// DoubleHold is a GPU that more than one pod holds (or has been promised)
// at once.
type DoubleHold struct {
	Node string
	// GPU is the UUID.
	GPU string
	// Holders are the pods naming it, sorted by namespace/name.
	Holders []GPUHolder
}

// GPUHolder is one pod of a DoubleHold.
type GPUHolder struct {
	PodUID types.UID
	Pod    types.NamespacedName
	// Reserved: a bind in flight, not yet a bound pod.
	Reserved bool
}

func (d *DoubleHold) key() string {
	k := d.Node + "\x00" + d.GPU
	for _, h := range d.Holders {
		k += "\x00" + string(h.PodUID)
	}
	return k
}

// noteDoubleHeldLocked rebuilds n's list of GPUs held more than once from
// the duplicates recompute found, and reports what changed.
func (l *Ledger) noteDoubleHeldLocked(n *Node, dup topology.Mask, unresolved []string) {
	var gpus []string
	if !dup.Empty() {
		all := n.graph.GPUs()
		for _, i := range dup.Indices() {
			gpus = append(gpus, all[i].UUID)
		}
	}
	gpus = append(gpus, unresolved...)
	slices.Sort(gpus)
	gpus = slices.Compact(gpus)
	var now []DoubleHold
	for _, g := range gpus {
		d := DoubleHold{Node: n.name, GPU: g}
		for _, h := range n.holdings {
			if slices.Contains(h.uuids, g) {
				d.Holders = append(d.Holders, GPUHolder{PodUID: h.uid, Pod: h.pod, Reserved: h.reserved})
			}
		}
		if len(d.Holders) < 2 {
			continue
		}
		slices.SortFunc(d.Holders, func(a, b GPUHolder) int {
			if c := strings.Compare(a.Pod.String(), b.Pod.String()); c != 0 {
				return c
			}
			return strings.Compare(string(a.PodUID), string(b.PodUID))
		})
		now = append(now, d)
	}
	before := make(map[string]bool, len(n.doubleHeld))
	for i := range n.doubleHeld {
		before[n.doubleHeld[i].key()] = true
	}
	after := make(map[string]bool, len(now))
	var added, cleared []DoubleHold
	for i := range now {
		k := now[i].key()
		after[k] = true
		if !before[k] {
			added = append(added, now[i])
		}
	}
	for i := range n.doubleHeld {
		if !after[n.doubleHeld[i].key()] {
			cleared = append(cleared, n.doubleHeld[i])
		}
	}
	n.doubleHeld = now
	if (len(added) > 0 || len(cleared) > 0) && l.onDoubleHeld != nil {
		l.onDoubleHeld(added, cleared)
	}
}

// DoubleHolds lists the GPUs that more than one pod holds now, sorted by
// node then GPU. Empty in a healthy cluster.
func (l *Ledger) DoubleHolds() []DoubleHold {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []DoubleHold
	for _, n := range l.nodes {
		for _, d := range n.doubleHeld {
			d.Holders = slices.Clone(d.Holders)
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b DoubleHold) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return strings.Compare(a.GPU, b.GPU)
	})
	return out
}

// UpsertPod records a pod from the informer (or from the rebuild list).
func (l *Ledger) UpsertPod(p *corev1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.gone[p.UID]; ok {
		return // a stale copy of a pod already deleted or finished
	}
	if terminal(p) {
		l.gone[p.UID] = l.now()
		l.forgetPodLocked(p.UID, types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		return
	}
	info := NewPodInfo(p, l.resource)
	if info.GPUs == 0 && len(info.Assigned) == 0 && info.DemandErr == "" {
		l.forgetPodLocked(p.UID, info.Key)
		return
	}
	if old, ok := l.pods[info.Key]; ok {
		l.jobDeltaLocked(old, -1)
	}
	l.pods[info.Key] = info
	l.jobDeltaLocked(info, +1)
	if info.Node == "" {
		return // a reservation, if any, stays: its bind may be in flight
	}
	h := l.holdings[info.UID]
	switch {
	case len(info.Assigned) > 0:
		if h != nil && h.node == info.Node && !h.reserved && slices.Equal(h.uuids, info.Assigned) {
			return
		}
		nh := &holding{uid: info.UID, pod: info.Key, node: info.Node, uuids: info.Assigned, since: l.now()}
		if h != nil {
			nh.placement = h.placement
		}
		l.setHoldingLocked(nh)
	case h != nil && h.node == info.Node:
		// Bound by our Binding but seen without the annotation: keep the
		// GPUs we reserved, now confirmed.
		if h.reserved {
			h.reserved = false
			l.recomputeLocked(l.nodeLocked(h.node))
		}
	case info.DemandErr != "":
		// Bound with a demand that cannot be read (kube-apiserver admits
		// none such): nothing to count; filter and bind report the error.
		return
	default:
		if h != nil && h.uuids == nil && h.node == info.Node && h.unknown == info.GPUs {
			return
		}
		// Bound by someone else with no record of which GPUs: they count
		// against the node's capacity until the node agent records them.
		l.setHoldingLocked(&holding{uid: info.UID, pod: info.Key, node: info.Node, unknown: info.GPUs, since: l.now()})
	}
}

// DeletePod forgets a deleted pod and frees what it held. It accepts the
// informer's tombstones.
func (l *Ledger) DeletePod(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.UID != "" {
		l.gone[p.UID] = l.now()
	}
	l.forgetPodLocked(p.UID, types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
}

func (l *Ledger) forgetPodLocked(uid types.UID, key types.NamespacedName) {
	if info, ok := l.pods[key]; ok && info.UID == uid {
		l.jobDeltaLocked(info, -1)
		delete(l.pods, key)
	}
	l.releaseLocked(uid)
}

func (l *Ledger) jobDeltaLocked(info *PodInfo, d int) {
	if info.Job == "" || info.Node == "" {
		return
	}
	m := l.jobs[info.Job]
	if m == nil {
		if d < 0 {
			return
		}
		m = make(map[string]int)
		l.jobs[info.Job] = m
	}
	m[info.Node] += d
	if m[info.Node] <= 0 {
		delete(m, info.Node)
	}
	if len(m) == 0 {
		delete(l.jobs, info.Job)
	}
}

func (l *Ledger) setHoldingLocked(h *holding) {
	l.releaseLocked(h.uid)
	l.holdings[h.uid] = h
	n := l.nodeLocked(h.node)
	n.holdings[h.uid] = h
	l.recomputeLocked(n)
}

func (l *Ledger) releaseLocked(uid types.UID) {
	h, ok := l.holdings[uid]
	if !ok {
		return
	}
	delete(l.holdings, uid)
	if n, ok := l.nodes[h.node]; ok {
		delete(n.holdings, uid)
		l.recomputeLocked(n)
		l.dropIfEmptyLocked(n)
	}
}

// Release frees whatever pod uid holds or was promised.
func (l *Ledger) Release(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(uid)
}

// ReleaseReserved frees what pod uid was promised, unless its Binding was
// written (the holding is confirmed): then the informer decides.
func (l *Ledger) ReleaseReserved(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.holdings[uid]; ok && h.reserved {
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

// Reserve chooses and holds pod uid's GPUs on node, under the ledger's
// write lock: two reservations on one node never get the same GPU, since
// nothing changes the ledger between choose and the hold. choose sees the
// node as it is (nil when the ledger does not know it) and the rest of the
// ledger through v; its error is returned as is and nothing is held.
//
// A pod that already holds GPUs on node (a retry of a bind, a second
// Reserve in one scheduling cycle) gets the same GPUs without choose being
// called. A reservation on another node (kube-scheduler retried elsewhere)
// is released first. A bound pod holding other GPUs is an
// *AlreadyHeldError.
func (l *Ledger) Reserve(uid types.UID, pod types.NamespacedName, node string, choose func(v View, n *Node) (Choice, error)) (Choice, error) {
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
	c, err := choose(View{l}, l.nodes[node])
	if err != nil {
		return Choice{}, err
	}
	l.setHoldingLocked(&holding{uid: uid, pod: pod, node: node, uuids: c.UUIDs, reserved: true, since: l.now(), placement: c.Placement})
	return c, nil
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
		if h.reserved && h.since.Before(cutoff) {
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

// Holding is one pod's GPUs, as the ledger reports it for audits.
type Holding struct {
	PodUID   types.UID
	Pod      types.NamespacedName
	Node     string
	GPUs     []string
	Unknown  int
	Reserved bool
	// DoubleHeld are the UUIDs in GPUs that another pod also holds (see
	// Ledger.DoubleHolds); nil when none.
	DoubleHeld []string
}

// Holdings lists every holding, sorted by node then pod.
func (l *Ledger) Holdings() []Holding {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]Holding, 0, len(l.holdings))
	for _, h := range l.holdings {
		a := Holding{PodUID: h.uid, Pod: h.pod, Node: h.node, GPUs: append([]string(nil), h.uuids...), Unknown: h.unknown, Reserved: h.reserved}
		if n := l.nodes[h.node]; n != nil {
			for _, d := range n.doubleHeld {
				if slices.ContainsFunc(d.Holders, func(g GPUHolder) bool { return g.PodUID == h.uid }) {
					a.DoubleHeld = append(a.DoubleHeld, d.GPU)
				}
			}
		}
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].Pod.String() < out[j].Pod.String()
	})
	return out
}

// Counts are GPU totals over the nodes with a valid topology.
type Counts struct {
	// Total GPUs.
	Total int
	// Free: healthy and neither held nor reserved.
	Free int
	// Held by live pods (bound), Reserved by binds in flight; a GPU that
	// several pods name counts once (held before reserved).
	Held, Reserved int
	// Unhealthy GPUs (whether held or not).
	Unhealthy int
	// DoubleHeld GPUs are named by more than one pod's holding (see
	// Ledger.DoubleHolds); 0 in a healthy cluster.
	DoubleHeld int
}

// Topology states, as TopologyStates counts nodes.
const (
	TopologyFresh      = "fresh"
	TopologyMissing    = "missing"
	TopologyInvalid    = "invalid"
	TopologyAgentStale = "agent_stale"
	TopologyOld        = "old"
	TopologyUntrusted  = "untrusted"
)

// TopologyStates counts the nodes the ledger knows by the state of their
// NodeGPUTopology at now, judged as filter judges it (maxAge 0 or less:
// no age check): missing (a Node advertising GPUs with none), invalid,
// agent_stale (the agent marked it stale), old (observedTime missing,
// older than maxAge, or further ahead than the clock-skew allowance),
// untrusted (its GPU count disagrees with the Node's, or it lists a GPU
// another node listed first) or fresh.
func (l *Ledger) TopologyStates(now time.Time, maxAge time.Duration) map[string]int {
	out := make(map[string]int, len(topoStateNames))
	for _, name := range topoStateNames {
		out[name] = 0
	}
	w := NewFreshWindow(now, maxAge)
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, n := range l.nodes {
		st := n.State(w)
		if st == TopoMissing && n.allocatable <= 0 {
			continue // a Node without GPUs, or a topology whose Node is gone
		}
		out[topoStateNames[st]]++
	}
	return out
}

// Counts totals the ledger.
func (l *Ledger) Counts() Counts {
	l.mu.RLock()
	defer l.mu.RUnlock()
	var c Counts
	for _, n := range l.nodes {
		c.Held += n.heldCount
		c.Reserved += n.reservedCount
		c.DoubleHeld += len(n.doubleHeld)
		if n.graph == nil {
			continue
		}
		c.Total += n.size
		c.Unhealthy += n.graph.All().Minus(n.graph.Healthy()).Count()
		c.Free += max(n.freeMask.Count()-n.unknownHeld, 0)
	}
	return c
}

// String summarises the ledger for logs and test failures.
func (c Counts) String() string {
	s := fmt.Sprintf("total=%d free=%d held=%d reserved=%d unhealthy=%d", c.Total, c.Free, c.Held, c.Reserved, c.Unhealthy)
	if c.DoubleHeld > 0 {
		s += fmt.Sprintf(" doubleHeld=%d", c.DoubleHeld)
	}
	return s
}
