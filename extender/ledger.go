package extender

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Ledger is the extender's memory of the cluster's GPUs: every node's
// topology and telemetry, and which pod holds which GPU. It is fed by
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
	nodes    map[string]*nodeState
	topos    map[string]*topoEntry
	holdings map[types.UID]*holding
	pods     map[types.NamespacedName]*podInfo
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
	// resource is the extended resource counted (Configuration's
	// resourceName).
	resource corev1.ResourceName
	// onDoubleHeld, when set, is told of GPUs that became held by more
	// than one pod (added) and of those that no longer are (cleared). It
	// is called under the ledger's lock: it must not block or call back
	// into the ledger.
	onDoubleHeld func(added, cleared []DoubleHold)
}

// NewLedger returns an empty ledger counting nvidia.com/gpu; the extender
// sets the configured resourceName.
func NewLedger() *Ledger {
	return &Ledger{
		nodes:    make(map[string]*nodeState),
		topos:    make(map[string]*topoEntry),
		holdings: make(map[types.UID]*holding),
		pods:     make(map[types.NamespacedName]*podInfo),
		jobs:     make(map[string]map[string]int),
		now:      time.Now,
		resource: v1alpha1.ResourceGPU,
	}
}

// topoEntry is shared by every node of one topology hash.
type topoEntry struct {
	// pristine is the topology with every GPU healthy and free: what the
	// node could ever offer, used to tell "not now" from "never".
	pristine *topology.Graph
	// maxIsland is the largest NVLink-connected clique of the machine.
	maxIsland int
	// logCapability is the log of what the machine can offer (capability
	// conservation, capabilityOf); islandOf[i] is GPU i's NVLink island
	// (island best fit).
	logCapability float64
	islandOf      []topology.Mask
	// id numbers the entry (entries are never removed), for the
	// evaluator's per-request cache.
	id uint64
}

// nodeState is one node as the requests see it. The fields every request
// reads come first and are plain values, so that a request touches one
// small block per node rather than chasing the graph.
type nodeState struct {
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
	// utilFree sums the telemetry utilization of healthy GPUs not held.
	utilFree    int32
	hasTopology bool
	stale       bool
	graph       *topology.Graph // nil when the topology is missing or invalid
	topo        *topoEntry
	// tel is the telemetry prioritize scores by, by GPU index; nil: none.
	// Up to len(telInline) GPUs it points into telInline, so that scoring
	// a node reads the node's own block instead of another allocation.
	tel       []gpuTelemetry
	telInline [8]gpuTelemetry
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
	statusHash  string
	gpuSig      string
	staleReason string
	observed    time.Time
	clique      string

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

func (n *nodeState) empty() bool {
	return n.allocatable < 0 && !n.hasTopology && len(n.holdings) == 0
}

// free is the healthy GPUs nobody holds.
func (n *nodeState) free() topology.Mask { return n.freeMask }

// gpuTelemetry is one GPU's utilization (0..100), temperature and power.
type gpuTelemetry struct {
	util, tempC, powerW, limitW int32
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

// podInfo is what the extender keeps of a GPU pod.
type podInfo struct {
	uid         types.UID
	key         types.NamespacedName
	node        string
	gpus        int
	job         string // namespace/job label, "" without one
	requirement string
	hasReq      bool
	assigned    []string // allocated-gpus, else assigned-gpus
	assignedRaw string   // the assigned-gpus annotation as written
	assignErr   string   // why the GPU annotation could not be read
	// demandErr is why the pod's GPU demand could not be read (a negative,
	// fractional or oversized count, naming the field); gpus is then 0
	// and must not be taken for "no GPUs".
	demandErr string
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

func newPodInfo(p *corev1.Pod, resource corev1.ResourceName) *podInfo {
	info := &podInfo{
		uid:  p.UID,
		key:  types.NamespacedName{Namespace: p.Namespace, Name: p.Name},
		node: p.Spec.NodeName,
	}
	if n, err := GPUCount(p, resource); err != nil {
		info.demandErr = err.Error()
	} else {
		info.gpus = n
	}
	if j := p.Labels[v1alpha1.LabelJob]; j != "" {
		info.job = p.Namespace + "/" + j
	}
	info.requirement, info.hasReq = p.Annotations[v1alpha1.AnnotationRequirement]
	info.assignedRaw = p.Annotations[v1alpha1.AnnotationAssignedGPUs]
	for _, key := range []string{v1alpha1.AnnotationAllocatedGPUs, v1alpha1.AnnotationAssignedGPUs} {
		v, ok := p.Annotations[key]
		if !ok {
			continue
		}
		uuids, err := v1alpha1.ParseGPUList(key, v)
		if err != nil {
			info.assignErr = err.Error()
			continue
		}
		if len(uuids) > 0 {
			info.assigned = uuids
			break
		}
	}
	return info
}

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// UpsertTopology records a NodeGPUTopology. The graph is rebuilt only when
// the topology or the GPUs' health changed, not on every telemetry round.
func (l *Ledger) UpsertTopology(obj *v1alpha1.NodeGPUTopology) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodeLocked(obj.Name)
	st := &obj.Status
	n.hasTopology = true
	sig := gpuSignature(st.GPUs)
	if n.graph == nil || st.TopologyHash == "" || st.TopologyHash != n.statusHash || sig != n.gpuSig {
		g, err := topology.FromStatus(st)
		if err != nil {
			n.graph, n.topo = nil, nil
			n.topoErr = err.Error()
		} else {
			n.graph, n.topoErr = g, ""
			n.topo = l.topoLocked(g, st)
		}
		n.statusHash, n.gpuSig = st.TopologyHash, sig
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
}

func gpuSignature(gpus []v1alpha1.GPU) string {
	b := make([]byte, 0, len(gpus)*64)
	for i := range gpus {
		b = strconv.AppendInt(b, int64(gpus[i].Index), 10)
		b = append(b, ' ')
		b = append(b, gpus[i].UUID...)
		b = append(b, ' ')
		b = append(b, gpus[i].Health...)
		b = append(b, ' ')
		b = append(b, gpus[i].FabricClique...)
		b = append(b, '\n')
	}
	return string(b)
}

// topoLocked returns the shared entry for g's topology hash.
func (l *Ledger) topoLocked(g *topology.Graph, st *v1alpha1.NodeGPUTopologyStatus) *topoEntry {
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
	e := &topoEntry{pristine: p, maxIsland: maxIsland, logCapability: math.Log(capabilityOf(p, maxIsland)), islandOf: make([]topology.Mask, p.Len()), id: uint64(len(l.topos))}
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
	n.statusHash, n.gpuSig = "", ""
	n.statusTel, n.statusTelTime = nil, time.Time{}
	l.applyTelemetryLocked(n)
	l.dropIfEmptyLocked(n)
}

// UpsertNode records a Node's GPU allocatable.
func (l *Ledger) UpsertNode(node *corev1.Node) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodeLocked(node.Name)
	n.allocatable = 0
	if q, ok := node.Status.Allocatable[l.resource]; ok {
		n.allocatable = int(min(q.Value(), 1<<16))
	}
}

// DeleteNode forgets a Node object (its topology and holdings stay until
// their own objects go).
func (l *Ledger) DeleteNode(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n, ok := l.nodes[name]; ok {
		n.allocatable = -1
		l.dropIfEmptyLocked(n)
	}
}

func (l *Ledger) nodeLocked(name string) *nodeState {
	n, ok := l.nodes[name]
	if !ok {
		n = &nodeState{name: name, allocatable: -1, holdings: make(map[types.UID]*holding)}
		l.nodes[name] = n
	}
	return n
}

func (l *Ledger) dropIfEmptyLocked(n *nodeState) {
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
func (l *Ledger) recomputeLocked(n *nodeState) {
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
		for _, i := range n.free().Indices() {
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
func (l *Ledger) noteDoubleHeldLocked(n *nodeState, dup topology.Mask, unresolved []string) {
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
	if terminal(p) {
		l.forgetPodLocked(p.UID, types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		return
	}
	info := newPodInfo(p, l.resource)
	if info.gpus == 0 && len(info.assigned) == 0 && info.demandErr == "" {
		l.forgetPodLocked(p.UID, info.key)
		return
	}
	if old, ok := l.pods[info.key]; ok {
		l.jobDeltaLocked(old, -1)
	}
	l.pods[info.key] = info
	l.jobDeltaLocked(info, +1)
	if info.node == "" {
		return // a reservation, if any, stays: its bind may be in flight
	}
	h := l.holdings[info.uid]
	switch {
	case len(info.assigned) > 0:
		if h != nil && h.node == info.node && !h.reserved && equalStrings(h.uuids, info.assigned) {
			return
		}
		nh := &holding{uid: info.uid, pod: info.key, node: info.node, uuids: info.assigned, since: l.now()}
		if h != nil {
			nh.placement = h.placement
		}
		l.setHoldingLocked(nh)
	case h != nil && h.node == info.node:
		// Bound by our Binding but seen without the annotation: keep the
		// GPUs we reserved, now confirmed.
		if h.reserved {
			h.reserved = false
			l.recomputeLocked(l.nodeLocked(h.node))
		}
	case info.demandErr != "":
		// Bound with a demand that cannot be read (kube-apiserver admits
		// none such): nothing to count; filter and bind report the error.
		return
	default:
		if h != nil && h.uuids == nil && h.node == info.node && h.unknown == info.gpus {
			return
		}
		// Bound by someone else with no record of which GPUs: they count
		// against the node's capacity until the node agent records them.
		l.setHoldingLocked(&holding{uid: info.uid, pod: info.key, node: info.node, unknown: info.gpus, since: l.now()})
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
	l.forgetPodLocked(p.UID, types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
}

func (l *Ledger) forgetPodLocked(uid types.UID, key types.NamespacedName) {
	if info, ok := l.pods[key]; ok && info.uid == uid {
		l.jobDeltaLocked(info, -1)
		delete(l.pods, key)
	}
	l.releaseLocked(uid)
}

func (l *Ledger) jobDeltaLocked(info *podInfo, d int) {
	if info.job == "" || info.node == "" {
		return
	}
	m := l.jobs[info.job]
	if m == nil {
		if d < 0 {
			return
		}
		m = make(map[string]int)
		l.jobs[info.job] = m
	}
	m[info.node] += d
	if m[info.node] <= 0 {
		delete(m, info.node)
	}
	if len(m) == 0 {
		delete(l.jobs, info.job)
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

// releaseReserved frees what pod uid was promised, unless its Binding was
// written (the holding is confirmed): then the informer decides.
func (l *Ledger) releaseReserved(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.holdings[uid]; ok && h.reserved {
		l.releaseLocked(uid)
	}
}

// confirm marks a reservation as bound: the Binding was written.
func (l *Ledger) confirm(uid types.UID, node string, uuids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.holdings[uid]; ok && h.node == node && equalStrings(h.uuids, uuids) && h.reserved {
		h.reserved = false
		l.recomputeLocked(l.nodeLocked(node))
	}
}

// SweepReservations frees reservations older than ttl (binds whose outcome
// stayed unknown and were never retried) and returns how many it freed.
func (l *Ledger) SweepReservations(ttl time.Duration) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	cutoff := l.now().Add(-ttl)
	var freed int
	for uid, h := range l.holdings {
		if h.reserved && h.since.Before(cutoff) {
			l.releaseLocked(uid)
			freed++
		}
	}
	return freed
}

// pod returns what the ledger knows of a pod.
func (l *Ledger) pod(key types.NamespacedName) (podInfo, bool) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	p, ok := l.pods[key]
	if !ok {
		return podInfo{}, false
	}
	return *p, true
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
)

// TopologyStates counts the nodes the ledger knows by the state of their
// NodeGPUTopology at now, judged as filter judges it (maxAge 0 or less:
// no age check): missing (a Node advertising GPUs with none), invalid,
// agent_stale (the agent marked it stale), old (observedTime missing,
// older than maxAge, or further ahead than the clock-skew allowance) or
// fresh.
func (l *Ledger) TopologyStates(now time.Time, maxAge time.Duration) map[string]int {
	out := make(map[string]int, len(topoStateNames))
	for _, name := range topoStateNames {
		out[name] = 0
	}
	w := newFreshWindow(now, maxAge)
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, n := range l.nodes {
		st := n.topologyState(w)
		if st == topoMissing && n.allocatable <= 0 {
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
		c.Free += max(n.free().Count()-n.unknownHeld, 0)
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

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// nodeList is a request's candidate nodes resolved to their state, nil for
// unknown names; v, m and c hold prioritize's verdicts, merits and log
// capabilities per node.
type nodeList struct {
	s    []*nodeState
	v    []*verdict
	m, c []float64
}

var nodeListPool = sync.Pool{New: func() any { return new(nodeList) }}

// lookupLocked resolves names in one pass before any node is evaluated:
// the lookups do not depend on each other, so the CPU overlaps their cache
// misses, and the evaluation pass then finds the nodes' state warm. The
// caller holds the read lock and calls release when done.
func (l *Ledger) lookupLocked(names []string) *nodeList {
	nl := nodeListPool.Get().(*nodeList)
	if cap(nl.s) < len(names) {
		nl.s = make([]*nodeState, len(names))
	}
	nl.s = nl.s[:len(names)]
	for i, name := range names {
		nl.s[i] = l.nodes[name]
	}
	return nl
}

// release returns the list to the pool, dropping its pointers.
func (nl *nodeList) release() {
	clear(nl.s)
	clear(nl.v)
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
