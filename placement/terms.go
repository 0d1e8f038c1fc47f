package placement

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// The evaluator's terms that what is kept for waiting groups
// (groupreserve.go) and patience (patience.go) feed: the evaluator reads
// the GPUs kept on a node and the patience floor it was built with, and
// these turn them into verdicts. They sit beside the evaluator
// (decide.go), below the code that decides what to keep and how long to
// wait, so that deciding never reaches up into it.

// freeFor is the GPUs of n free for the evaluator's pod: free, less those
// kept for waiting groups that the pod must leave alone.
func (e *evaluator) freeFor(n *ledger.Node) topology.Mask {
	free := n.Free()
	if len(n.Reservations()) == 0 {
		return free
	}
	return free.Minus(n.ReservedAgainst(e.pr.priority, e.pr.group, e.ends()))
}

// ends is when the evaluator's pod would be gone at the latest if it
// started now (its activeDeadlineSeconds); zero when it does not say.
func (e *evaluator) ends() time.Time {
	if e.pr.deadline <= 0 {
		return time.Time{}
	}
	return e.now.Add(e.pr.deadline)
}

// keptForGroups is filter's verdict on n for a pod that would fit there
// but for the GPUs kept for waiting groups; the reason names them. It is
// made per node, not remembered: another node with the same free GPUs
// may keep none.
func (e *evaluator) keptForGroups(n *ledger.Node) *verdict {
	var groups []string
	for _, r := range n.Reservations() {
		if r.Priority >= e.pr.priority && r.Group != e.pr.group {
			g := fmt.Sprintf("%s (since %s)", r.Group, r.Since.UTC().Format(time.RFC3339))
			if !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
	}
	kept := n.Free().Intersect(n.ReservedAgainst(e.pr.priority, e.pr.group, e.ends()))
	return &verdict{code: ReasonReserved, reason: fmt.Sprintf("GPUs %s are kept for group %s, which has waited longer for room (fabric.reserveAfter); pods of its priority or lower are placed on other GPUs, or on these when their activeDeadlineSeconds ends them before the group can start",
		kept, strings.Join(groups, ", "))}
}

// patient refuses v, a set that fits node n, when its ring is below the
// pod's patience floor: unresolvable when even the node's best set with
// every GPU free is below it (no eviction makes the node faster).
func (e *evaluator) patient(n *ledger.Node, v *verdict) *verdict {
	p := e.patience
	if p.floor == 0 || !v.ok || v.res.Metrics.RingGBps >= p.floor {
		return v
	}
	// v is the evaluator's answer for the node's (topology, free GPUs),
	// shared by every node that has them: so is the refusal.
	if r, ok := e.refusals.Load(v); ok {
		return r.(*verdict)
	}
	r := e.refuseForPatience(n, v)
	e.refusals.Store(v, r)
	return r
}

// refuseForPatience is patient's refusal of v on node n.
func (e *evaluator) refuseForPatience(n *ledger.Node, v *verdict) *verdict {
	p := e.patience
	pristine := e.allocate(n, n.Topo().Pristine().All(), true)
	return &verdict{
		code:         ReasonPatience,
		unresolvable: !pristine.ok || pristine.res.Metrics.RingGBps < p.floor,
		reason: fmt.Sprintf("the best free set here has a %d GB/s ring, under %d%% of the %d GB/s that machines expected to free give the pod (%d GPUs expected to free there in time, %d asked by pods waiting ahead); it waits %s more for a faster set, then takes the best free (patience.bandwidthWait)",
			v.res.Metrics.RingGBps, p.percent, p.best, p.soon, p.ahead, p.left.Round(time.Second)),
	}
}
