// Package placement is gputopo's decision core: which nodes can take a GPU
// pod now and why not, how well each would place it, and which GPUs bind
// writes, for every front end alike.
//
//   - Request is a pod's GPU request, parsed once per pod and decision
//     (ParseRequest, over ledger.NewPodInfo).
//   - Filter, Score and Explain answer over candidate node names; a Cycle
//     answers node by node, from parallel goroutines, for the scheduling
//     framework. The evaluator behind them is lock-free: the ledger's read
//     lock, then the allocator memo's lock inside it, is the core's one
//     lock order.
//   - Bind is one transaction (read the pod, check it, Reserve its GPUs,
//     write one Binding, settle an unknown answer) with one outcome:
//     Bound, Released, Unknown or Unchanged; the ledger changes in one
//     place, after it. Reserve and Unreserve split it for the framework.
//   - Refused nodes carry a Reason, a bounded code that metrics label by.
//   - The ledger (package ledger) is fed through Feed, whose deletes take
//     keys: by the cluster runtime's informers (package placement/cluster)
//     or, without a cluster, by the caller (kubectl gputopo explain and the
//     simulator, which binds through an API of its own).
//   - What connects it to a cluster comes in through Options: API (bind's
//     reads and writes), Recorder (Events) and Gate (informers synced,
//     leadership, the decider Lease: one gputopo scheduler decides a GPU
//     resource per cluster). Package placement/cluster provides all three.
//   - Counts leave through an Observer (package metrics exports them).
//
// It speaks no front end's wire types: the HTTP extender (package
// extender) and the scheduler plugin (package schedplugin) translate.
// It imports the model (topology), its allocator, api and its ledger;
// no front end, no test double, and nothing of client-go's clients, REST,
// leader election or Event recording, controller-runtime or the
// Prometheus client, not even indirectly (test/layering enforces it).
package placement
