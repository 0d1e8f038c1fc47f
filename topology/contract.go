package topology

import (
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// This file fixes the contract of an allocation, which topology/allocator
// answers and the extender, the node agent, the simulator and the demo are
// written against.

// MaxGPUs is the largest number of GPUs one Graph may hold (one Mask).
// Graphs of up to WindowGPUs GPUs are searched directly; larger ones
// through a window of their free GPUs (wide.go, allocator/wide.go).
const MaxGPUs = 128

// Request asks for Count GPUs under a requirement.
type Request struct {
	// Count of GPUs; must be >= 1.
	Count int
	// Requirement from the pod (strategy defaulted by the allocator).
	Requirement v1alpha1.Requirement
	// Utilization is the per-GPU compute utilization 0..100 indexed by GPU
	// index; optional, read by balanced_utilization only.
	Utilization []int32
}

// SetMetrics describe one chosen set and what it leaves behind.
type SetMetrics struct {
	// MinPairGBps is the lowest pair bandwidth inside the set (0 for k=1).
	MinPairGBps int
	// RingGBps is the bottleneck bandwidth of the best ring order through
	// the set (0 for k=1).
	RingGBps int
	// SumGBps is the sum of pair bandwidths inside the set.
	SumGBps int
	// DomainsCrossed counts PCIe-switch, NUMA and socket boundaries the set
	// spans (0 when all GPUs share one PCIe switch).
	DomainsCrossed int
	// Tier is the weakest link tier inside the set.
	Tier v1alpha1.LinkTier
	// LeftLargestIsland is the size of the largest NVLink-connected clique
	// among the free GPUs left after the allocation.
	LeftLargestIsland int
	// LeftNVLinkPairs and LeftNVLinkQuads count the fully NVLink-connected
	// sets of 2 and 4 among the free GPUs left.
	LeftNVLinkPairs, LeftNVLinkQuads int
}

// Result is an allocation: GPU indices in ring order, and their metrics.
type Result struct {
	GPUs    []int
	Metrics SetMetrics
	// Heuristic is true when the exact search's work budget
	// (allocator.SearchBudget) ran out before it proved its set optimal,
	// and the set (or, rarely, only its ring order and RingGBps) is the
	// documented heuristic's instead: it still meets every constraint of
	// the request, but a better set may exist. False means the answer is
	// the exact optimum that allocator.BruteForce would give.
	Heuristic bool
}

// InfeasibleError is returned when no set of the free GPUs satisfies the
// request. Reason is written for a person ("needs NVLink between 4 GPUs;
// largest free NVLink-connected set has 2"); Kind says which part of the
// request failed, for code that counts reasons without reading them.
type InfeasibleError struct {
	Kind   InfeasibleKind
	Reason string
}

// InfeasibleKind is the part of a request that no free set meets.
type InfeasibleKind uint8

const (
	// InfeasibleOther: no set meets the requirement as a whole.
	InfeasibleOther InfeasibleKind = iota
	// InfeasibleTooFewFree: fewer free healthy GPUs than requested.
	InfeasibleTooFewFree
	// InfeasibleMemory: too few free GPUs with the memory asked for.
	InfeasibleMemory
	// InfeasibleNVLink: no NVLink-connected set that large.
	InfeasibleNVLink
	// InfeasibleBandwidth: no set with the pair bandwidth asked for.
	InfeasibleBandwidth
)

func (e *InfeasibleError) Error() string { return e.Reason }
