package ledger

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Holding is one pod's GPUs, as the ledger reports it for audits.
type Holding struct {
	PodUID   types.UID
	Pod      types.NamespacedName
	Node     string
	GPUs     []string
	Unknown  int
	Reserved bool
	// DoubleHeld are the UUIDs in GPUs that another pod also holds (see
	// Ledger.DoubleHolds); nil when none.
	DoubleHeld []string
}

// Holdings lists every holding, sorted by node then pod.
func (r Report) Holdings() []Holding {
	l := r.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]Holding, 0, len(l.holdings))
	for _, h := range l.holdings {
		a := Holding{PodUID: h.uid, Pod: h.pod, Node: h.node, GPUs: append([]string(nil), h.uuids...), Unknown: h.unknown, Reserved: h.reserved}
		if n := l.nodes[h.node]; n != nil {
			for _, d := range n.doubleHeld {
				if slices.ContainsFunc(d.Holders, func(g GPUHolder) bool { return g.PodUID == h.uid }) {
					a.DoubleHeld = append(a.DoubleHeld, d.GPU)
				}
			}
		}
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node != out[j].Node {
			return out[i].Node < out[j].Node
		}
		return out[i].Pod.String() < out[j].Pod.String()
	})
	return out
}

// Counts are GPU totals over the nodes with a valid topology.
type Counts struct {
	// Total GPUs.
	Total int
	// Free: healthy and neither held nor reserved.
	Free int
	// Held by live pods (bound), Reserved by binds in flight; a GPU that
	// several pods name counts once (held before reserved).
	Held, Reserved int
	// Unhealthy GPUs (whether held or not).
	Unhealthy int
	// DoubleHeld GPUs are named by more than one pod's holding (see
	// Ledger.DoubleHolds); 0 in a healthy cluster.
	DoubleHeld int
}

// Topology states, as TopologyStates counts nodes.
const (
	TopologyFresh      = "fresh"
	TopologyMissing    = "missing"
	TopologyInvalid    = "invalid"
	TopologyAgentStale = "agent_stale"
	TopologyOld        = "old"
	TopologyUntrusted  = "untrusted"
)

// TopologyStates counts the nodes the ledger knows by the state of their
// NodeGPUTopology at now, judged as filter judges it (maxAge 0 or less:
// no age check): missing (a Node advertising GPUs with none), invalid,
// agent_stale (the agent marked it stale), old (observedTime missing,
// older than maxAge, or further ahead than the clock-skew allowance),
// untrusted (its GPU count disagrees with the Node's, or it lists a GPU
// another node listed first) or fresh.
func (r Report) TopologyStates(now time.Time, maxAge time.Duration) map[string]int {
	l := r.l
	out := make(map[string]int, len(topoStateNames))
	for _, name := range topoStateNames {
		out[name] = 0
	}
	w := NewFreshWindow(now, maxAge)
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, n := range l.nodes {
		st := n.State(w)
		if st == TopoMissing && n.allocatable <= 0 {
			continue // a Node without GPUs, or a topology whose Node is gone
		}
		out[topoStateNames[st]]++
	}
	return out
}

// Counts totals the ledger.
func (r Report) Counts() Counts {
	l := r.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	var c Counts
	for _, n := range l.nodes {
		c.Held += n.heldCount
		c.Reserved += n.reservedCount
		c.DoubleHeld += len(n.doubleHeld)
		if n.graph == nil {
			continue
		}
		c.Total += n.size
		c.Unhealthy += n.graph.All().Minus(n.graph.Healthy()).Count()
		c.Free += max(n.freeMask.Count()-n.unknownHeld, 0)
	}
	return c
}

// String summarises the ledger for logs and test failures.
func (c Counts) String() string {
	s := fmt.Sprintf("total=%d free=%d held=%d reserved=%d unhealthy=%d", c.Total, c.Free, c.Held, c.Reserved, c.Unhealthy)
	if c.DoubleHeld > 0 {
		s += fmt.Sprintf(" doubleHeld=%d", c.DoubleHeld)
	}
	return s
}
