// Package topology is gputopo's pure model of a node's GPUs and the
// allocator that chooses exact GPUs for a request: the graph of GPUs and
// pairwise links, fixtures of real machines, the placement strategies, set
// metrics and feasibility with reasons a person can act on.
//
// It works over plain values. It must never import NVML, client-go, or any
// gputopo component; it imports api/v1alpha1 for the wire types and, for
// machine files, sigs.k8s.io/yaml, sigs.k8s.io/json and apimachinery's
// field validation.
package topology
