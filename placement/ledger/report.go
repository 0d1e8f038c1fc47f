package ledger

import (
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Report is what the ledger tells outside the decision core: counts and
// lists for audits, metrics, `kubectl gputopo` and the runtime's
// publisher, each read under the ledger's read lock into a copy; and two
// subscriptions. Nothing in it changes what a node holds.
type Report struct{ l *Ledger }

// Report is the ledger's report.
func (l *Ledger) Report() Report { return Report{l: l} }

// OnTelemetry sets the function told of every node's telemetry as
// prioritize reads it (nil graph and telemetry: none), so that metrics
// follow the ledger. Set it before the ledger is fed.
func (r Report) OnTelemetry(fn func(node string, g *topology.Graph, tel []v1alpha1.Telemetry)) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	r.l.onTelemetry = fn
}

// OnUsable sets the function told when a node comes to offer GPUs it did
// not, from its topology's or its Node's side: a node that joins, a
// topology published, valid, trusted, no longer marked stale or no longer
// too old (Options.TopologyMaxAge) again, a larger allocatable, GPUs a
// waiting group kept given back, a pending group member newly pinned to a
// node by its nodeSelector. Nothing kube-scheduler watches says so
// (the topology is gputopo's own object), so the plugin build tries its
// waiting pods again on it. It is called under the ledger's lock: it must
// not block or call back into the ledger.
func (r Report) OnUsable(fn func()) {
	r.l.mu.Lock()
	defer r.l.mu.Unlock()
	r.l.onUsable = fn
}
