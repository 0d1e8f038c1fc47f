// Package ledger is the decision core's (package placement) memory of the
// cluster's GPUs: every node's topology and telemetry, and which pod holds
// which GPU. The core decides from it, for every front end, through a
// narrow API:
//
//   - feeds (placement.Feed): UpsertTopology, DeleteTopology, UpsertNode,
//     DeleteNode, UpsertPod, DeletePod (informer events; deletes take
//     keys), TopologiesListed (the
//     initial list is in) and the external telemetry rounds; a topology
//     is checked against its Node's GPU counts and the other nodes' GPU
//     UUIDs on these events (trust.go);
//   - reads: Read hands a read-only View (nodes, job affinity) to a
//     function under the ledger's read lock, so that filter and score see
//     one consistent state without copying it;
//   - holds: Reserve chooses a pod's GPUs (and PlanGroup a group's slots)
//     under the read lock and holds them under a short write lock that
//     only checks they are still free and records them (choosing again
//     when they are not), Confirm marks the hold bound once the Binding is written, Release and
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
	"hash/maphash"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

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
	mu    stripedLock
	nodes map[string]*Node
	topos map[string]*Topo
	// shapes are the distinct topologies of the nodes (View.Shapes).
	shapes   shapeIndex
	holdings map[types.UID]*holding
	pods     map[types.NamespacedName]*PodInfo
	// claims maps an allocated ResourceClaim to the holding it made or
	// confirmed (claims.go); claimMismatches counts allocations that
	// named other GPUs than the ledger held for their pod.
	draClaims       map[types.UID]types.UID
	claimHolders    map[types.UID]types.UID // holder -> claim, the reverse of draClaims
	claimMismatches int
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
	// claimGPUs reads a pod's GPUs through ResourceClaims (Options).
	claimGPUs func(*corev1.Pod) int
	// onUsable, when set, is told when a node comes to offer GPUs it did
	// not from its topology's side (OnUsable); maxAge is the topology age
	// limit filter applies (SetTopologyMaxAge), for a topology that is
	// fresh again.
	onUsable func()
	maxAge   time.Duration
	// seed keys the topology signatures (signature).
	seed maphash.Seed
	// gone remembers, for goneTTL, the UIDs of pods that were deleted or
	// finished: a UID never comes back, so a stale copy of such a pod (a
	// rebuild's list taken before the delete arrived) is not counted again.
	gone map[types.UID]time.Time
	// claims lists, per GPU UUID, the nodes whose valid topology lists it
	// (see trust.go); duplicateGPUs counts the UUIDs with more than one.
	// (claimsOf): the one claim almost every UUID has in claims, and
	// every claim of a UUID claimed twice or more in moreClaims, so that
	// the common case costs no slice.
	claims        map[string]gpuClaim
	moreClaims    map[string][]gpuClaim
	duplicateGPUs int
	// claimsOrdered is set by TopologiesListed; claimSeq numbers the
	// claims seen after it.
	claimsOrdered bool
	claimSeq      uint64
	// fabric are the label keys of each fabric level, tightest first
	// (SetFabric); groups are the groups with live pods (groups.go).
	fabric [][]string
	groups map[string]*group
	// domainSets are the nodes' domain lists, one copy each
	// (domainSetLocked).
	domainSets map[string][]string
	// native are the Kubernetes PodGroups' specs, by namespace/name.
	native map[string]nativeGroup
	// index is, per GPU count, the nodes that can hold that many now
	// (index.go), kept current by every change to a node.
	index fitIndex
	// byPriority counts the holdings of pods by their priority
	// (HoldersBelow).
	byPriority map[int32]int
	// freed are the GPUs preemption victims freed lately, oldest first
	// (preempted.go).
	freed []Freed
	// finished are the GPUs that pods which ran to their end gave back
	// lately, oldest first (outlook.go).
	finished []finished
	// snaps are the snapshots' numbers, dirty and deleted nodes
	// (snapshot.go).
	snaps snapshots
}

// Options are a ledger's settings; every field may be left zero.
type Options struct {
	// Resource is the extended resource counted (the configuration's
	// resourceName); empty: nvidia.com/gpu.
	Resource corev1.ResourceName
	// Clock is the ledger's clock (reservation ages and TTLs, external
	// telemetry ages); nil: the wall clock. A simulation passes its
	// simulated time.
	Clock func() time.Time
	// Fabric are the label keys of each fabric level, tightest first.
	Fabric [][]string
	// TopologyMaxAge is the age limit of a topology's observedTime that
	// filter applies (the configuration's topologyMaxAge; 0: off), so
	// that OnUsable is told when an old topology is published fresh again.
	TopologyMaxAge time.Duration
	// ExternalTelemetryMaxAge > 0 prefers external (Prometheus) telemetry
	// no older than it; 0 reads NodeGPUTopology telemetry only.
	ExternalTelemetryMaxAge time.Duration
	// OnDoubleHeld is told of GPUs that became held by more than one pod
	// (added) and of those that no longer are (cleared). It is called
	// under the ledger's lock: it must not block or call back into the
	// ledger.
	OnDoubleHeld func(added, cleared []DoubleHold)
	// ClaimGPUs, when set, is how many GPUs a pod that asks none of
	// Resource asks through its ResourceClaims (claims.go).
	ClaimGPUs func(*corev1.Pod) int
}

// New returns an empty ledger with the settings o.
func New(o Options) *Ledger {
	if o.Resource == "" {
		o.Resource = v1alpha1.ResourceGPU
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	l := &Ledger{
		nodes:        make(map[string]*Node),
		topos:        make(map[string]*Topo),
		holdings:     make(map[types.UID]*holding),
		draClaims:    make(map[types.UID]types.UID),
		claimHolders: make(map[types.UID]types.UID),
		pods:         make(map[types.NamespacedName]*PodInfo),
		jobs:         make(map[string]map[string]int),
		now:          o.Clock,
		resource:     o.Resource,
		seed:         maphash.MakeSeed(),
		claims:       make(map[string]gpuClaim),
		moreClaims:   make(map[string][]gpuClaim),
		gone:         make(map[types.UID]time.Time),
		groups:       make(map[string]*group),
		byPriority:   make(map[int32]int),
		fabric:       o.Fabric,
		maxAge:       o.TopologyMaxAge,
		extMaxAge:    o.ExternalTelemetryMaxAge,
		onDoubleHeld: o.OnDoubleHeld,
		claimGPUs:    o.ClaimGPUs,
	}
	l.index.init()
	return l
}

// goneTTL is how long a deleted or finished pod's UID is remembered: far
// longer than a rebuild's list can be in flight.
const goneTTL = 10 * time.Minute

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
	// cliques remembers the largest NVLink-joined set of each free mask
	// seen (fitIndex), under the write lock.
	cliques map[topology.Mask]int
	// id numbers the entry (entries are never removed), for the
	// evaluator's per-request cache.
	id uint64
}

// Node is one node as filter and score see it, read through its accessors
// inside Read or Reserve. The fields every request reads come first and
// are plain values, so that a request touches one small block per node
// rather than chasing the graph.
type Node struct {
	// dirty says the node changed since a snapshot last froze it;
	// frozenAt is the number of the snapshot that froze its newest copy,
	// frozen (on a frozen copy: its own number, and older is the copy
	// before it); born is the first snapshot that froze the node
	// (snapshot.go). They are first, in the block every request reads.
	dirty    bool
	frozenAt uint64
	frozen   *Node
	older    *Node
	born     uint64
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
	// dra are the GPU UUIDs a DRA driver's ResourceSlices publish on the
	// node (draDriver's; SetDRADevices), nil when none do.
	dra       []string
	draDriver string
	// allocatable is the Node's nvidia.com/gpu allocatable, -1 when no Node
	// object has been seen.
	allocatable int
	// capacity is the Node's status.capacity of the resource, -1 when the
	// Node reports none (or no Node object has been seen).
	capacity int
	// utilFree sums the telemetry utilization of healthy GPUs not held.
	utilFree int32
	// obj is the Node object last seen (the informer's, read-only; nil
	// when none): its labels and taints, which a pod's node rules read.
	obj *corev1.Node
	// shape is the node's topology while it counts in View.Shapes (valid,
	// not marked stale, trusted), nil otherwise (shapeMemberLocked).
	shape       *Topo
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
	// domains are the node's fabric domains by level ("label=value", ""
	// for none), from its labels (SetFabric).
	domains []string
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
	// reservedFor is what waiting groups keep here (groupreserve.go); nil
	// when none (the usual case). It is replaced, never changed in place.
	reservedFor []NodeReservation
}

func (n *Node) empty() bool {
	return n.allocatable < 0 && !n.hasTopology && len(n.holdings) == 0 && n.dra == nil
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
	reserved bool
	// group is the group whose plan made the holding ("" for none): its
	// GPUs go back to the plan, not to the pool, when the pod gives them
	// up before it is bound (groups.go).
	group     string
	since     time.Time
	placement v1alpha1.Placement
	// prio is the pod's priority, counted in the ledger's byPriority
	// when counted (a pod the ledger knows; a plan's slot is not one).
	prio    int32
	counted bool
}
