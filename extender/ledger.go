package extender

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/extender/ledger"
)

// The GPU ledger is package ledger; these names keep the extender's API.

// Ledger is the decision core's memory of the cluster's GPUs (ledger.Ledger).
type Ledger = ledger.Ledger

// NewLedger returns an empty ledger counting nvidia.com/gpu.
func NewLedger() *Ledger { return ledger.New("") }

// Holding is one pod's GPUs, as the ledger reports it for audits.
type Holding = ledger.Holding

// Counts are GPU totals over the nodes with a valid topology.
type Counts = ledger.Counts

// DoubleHold is a GPU that more than one pod holds at once.
type DoubleHold = ledger.DoubleHold

// GPUHolder is one pod of a DoubleHold.
type GPUHolder = ledger.GPUHolder

// Topology states, as Ledger.TopologyStates counts nodes.
const (
	TopologyFresh      = ledger.TopologyFresh
	TopologyMissing    = ledger.TopologyMissing
	TopologyInvalid    = ledger.TopologyInvalid
	TopologyAgentStale = ledger.TopologyAgentStale
	TopologyOld        = ledger.TopologyOld
	TopologyUntrusted  = ledger.TopologyUntrusted
)

// GPUCount is the number of devices of resource (the configuration's
// GPUResource) the pod needs, by v1alpha1.PodGPUDemand: app containers and
// sidecars summed, one-shot init containers the largest, limits over
// requests. A negative, fractional or oversized count is an error naming
// the container's field.
func GPUCount(pod *corev1.Pod, resource corev1.ResourceName) (int, error) {
	return ledger.GPUCount(pod, resource)
}

// nodeList is a request's candidate nodes resolved to their state, nil for
// unknown names; v, m and c hold prioritize's verdicts, merits and log
// capabilities per node.
type nodeList struct {
	s    []*ledger.Node
	v    []*verdict
	m, c []float64
}

var nodeListPool = sync.Pool{New: func() any { return new(nodeList) }}

// lookup resolves names with v.Lookup into a pooled list; the caller
// calls release when done, and uses the list only inside v's Read.
func lookup(v ledger.View, uid types.UID, names []string) *nodeList {
	nl := nodeListPool.Get().(*nodeList)
	nl.s = v.Lookup(uid, names, nl.s)
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
