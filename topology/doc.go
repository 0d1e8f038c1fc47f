// Package topology is gputopo's pure model of a node's GPUs: the graph of
// GPUs and pairwise links (Graph, built and validated by NewGraph or
// FromStatus), sets of GPUs (Mask, and Bitset on graphs of at most
// WindowGPUs GPUs), the metrics of a set (bandwidths, ring, domains
// crossed, tier, what it leaves free), NVLink islands, and the contract an
// allocation is asked and answered in (Request, Result, InfeasibleError).
//
// It also exports the primitives set searches are built from, so that the
// allocator searches the graph's own tables: Work (the metered budget), the
// clique, ring and pair-count kernels (LargestClique, CountCliques,
// RingWithin, HamiltonCycle, ...) and the dense tables of a graph of at
// most WindowGPUs GPUs (BW, NVAdjacency, DomainBit), and windows of larger
// graphs (Window).
//
// Two packages build on it: topology/allocator chooses GPUs for a request,
// topology/machine describes real machines (fixtures, machine files,
// importers) as graphs. This package works over plain values and imports
// only api/v1alpha1 (besides the standard library): never its two
// subpackages, NVML, client-go, or any gputopo component.
package topology
