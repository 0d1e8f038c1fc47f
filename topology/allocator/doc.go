// Package allocator chooses exact GPUs for a request on a topology.Graph:
// the strategies' lexicographic objectives (Score, Objective), feasibility
// with reasons a person can act on, the exact branch-and-bound search
// within a work budget (SearchBudget) and the heuristic that answers when
// the budget runs out, windows over nodes of more than topology.WindowGPUs
// GPUs, a memo shared by identical nodes (Allocator), and BruteForce, the
// reference it is tested against.
//
// It imports the model (topology) and api/v1alpha1 only, besides the
// standard library: never topology/machine (its tests do, for fixtures),
// NVML, client-go, or any gputopo component.
package allocator
