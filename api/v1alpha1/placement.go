package v1alpha1

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// LinkTier classifies the weakest connection inside a chosen GPU set, from
// best to worst. It is what a user asks about a placement: "are my GPUs all
// on NVLink?".
type LinkTier string

const (
	// TierSingleGPU: one GPU, no interconnect involved.
	TierSingleGPU LinkTier = "single-gpu"
	// TierNVSwitch: every pair joined through an NVSwitch fabric.
	TierNVSwitch LinkTier = "nvswitch"
	// TierNVLink: every pair joined by direct NVLink.
	TierNVLink LinkTier = "nvlink"
	// TierPCIeSwitch: some pair only shares a PCIe switch.
	TierPCIeSwitch LinkTier = "pcie-switch"
	// TierPCIeHostBridge: some pair crosses a host bridge within a socket.
	TierPCIeHostBridge LinkTier = "pcie-host-bridge"
	// TierCrossSocket: some pair crosses the CPU socket interconnect.
	TierCrossSocket LinkTier = "cross-socket"
)

// TierRank orders tiers from best (0) to worst.
func TierRank(t LinkTier) int {
	switch t {
	case TierSingleGPU:
		return 0
	case TierNVSwitch:
		return 1
	case TierNVLink:
		return 2
	case TierPCIeSwitch:
		return 3
	case TierPCIeHostBridge:
		return 4
	case TierCrossSocket:
		return 5
	}
	return 6
}

// Placement is the value of AnnotationPlacement: what the extender chose and
// why, so that a user (and the drift audit) can read it off the pod.
type Placement struct {
	// Node the pod was bound to.
	Node string `json:"node"`
	// Strategy that chose the GPUs.
	Strategy Strategy `json:"strategy"`
	// GPUIndices are the NVML indices of the assigned GPUs, in the order of
	// AnnotationAssignedGPUs.
	GPUIndices []int `json:"gpuIndices"`
	// Tier is the weakest link tier inside the set.
	Tier LinkTier `json:"tier"`
	// MinPairBandwidthGBps is the lowest bandwidth between any two chosen
	// GPUs, GB/s bidirectional (0 for one GPU).
	MinPairBandwidthGBps int `json:"minPairBandwidthGBps"`
	// RingBandwidthGBps is the bottleneck link of the best ring through the
	// chosen GPUs, GB/s bidirectional (0 for one GPU).
	RingBandwidthGBps int `json:"ringBandwidthGBps"`
	// Score is the node's prioritize score, 0..10.
	Score int `json:"score"`
	// Heuristic is true when the allocator's exact search ran out of its
	// work budget and the set is the documented heuristic's (it meets the
	// requirement, but a better set may exist); see docs/topology.md.
	Heuristic bool `json:"heuristic,omitempty"`
	// Degraded says the pod fell back (requirement fallbackAfter) and the
	// set does not meet its NVLink or bandwidth requirement;
	// DegradedReason says why, for a person.
	Degraded       bool   `json:"degraded,omitempty"`
	DegradedReason string `json:"degradedReason,omitempty"`
	// Group is the pod's group (namespace/name) when it was placed as one
	// of a group, and Domain the fabric domain the whole group was placed
	// in ("label=value", "node=NAME" for one node, "cluster").
	Group  string `json:"group,omitempty"`
	Domain string `json:"domain,omitempty"`
	// Slice is the pod's slice of a sliced group (0 to slices-1) and
	// SliceDomain the fabric domain the slice was placed in; SliceDomain
	// is "" for a group without slices.
	Slice       int    `json:"slice,omitempty"`
	SliceDomain string `json:"sliceDomain,omitempty"`
}

// String encodes p as compact JSON.
func (p Placement) String() string {
	b, _ := json.Marshal(p) // plain fields always encode
	return string(b)
}

// ParsePlacement decodes a placement annotation.
func ParsePlacement(value string) (Placement, error) {
	var p Placement
	if err := json.Unmarshal([]byte(value), &p); err != nil {
		return Placement{}, fmt.Errorf("annotation %s: %w", AnnotationPlacement, err)
	}
	return p, nil
}

// FormatGPUList renders UUIDs as the value of AnnotationAssignedGPUs or
// AnnotationAllocatedGPUs.
func FormatGPUList(uuids []string) string { return strings.Join(uuids, ",") }

// ParseGPUList parses AnnotationAssignedGPUs or AnnotationAllocatedGPUs.
// Empty entries, duplicates and whitespace inside a UUID are errors.
func ParseGPUList(key, value string) ([]string, error) {
	if strings.TrimSpace(value) == "" {
		return nil, nil
	}
	parts := strings.Split(value, ",")
	seen := make(map[string]bool, len(parts))
	out := make([]string, 0, len(parts))
	for i, p := range parts {
		p = strings.TrimSpace(p)
		switch {
		case p == "":
			return nil, fmt.Errorf("annotation %s: entry %d is empty; want comma-separated GPU UUIDs", key, i)
		case strings.ContainsAny(p, " \t\n"):
			return nil, fmt.Errorf("annotation %s: entry %d %q contains whitespace", key, i, p)
		case seen[p]:
			return nil, fmt.Errorf("annotation %s: GPU %s listed twice", key, p)
		}
		seen[p] = true
		out = append(out, p)
	}
	return out, nil
}

// SortedGPUList returns a sorted copy, for comparing plan and truth.
func SortedGPUList(uuids []string) []string {
	out := append([]string(nil), uuids...)
	sort.Strings(out)
	return out
}
