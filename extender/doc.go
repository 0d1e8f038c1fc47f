// Package extender is gputopo's kube-scheduler extender: the HTTP verbs
// filter, prioritize and bind over the k8s.io/kube-scheduler/extender/v1
// types, bind made atomic and idempotent over the GPU ledger (package
// extender/ledger), the scoring, metrics, and leader election. Its
// versioned ExtenderConfiguration is in package api/config/v1alpha1.
//
// Every decision is made from informer state kept in memory: topology,
// telemetry, nodes and GPU pods arrive as events, per-node state (graph,
// free mask, telemetry sums) is precomputed on those events, and a request
// never reads the API server. Only bind writes (one Binding) and, when the
// outcome of that write is unknown, reads the pod back.
//
// It imports topology and api/v1alpha1. It must never import another gputopo
// component (webhook, nodeagent) nor the test harness; cmd wires it.
package extender
