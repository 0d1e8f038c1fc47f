package placement

import (
	"context"
	"sync/atomic"

	"github.com/gputopo/gputopo/placement/ledger"
)

// Cycle is one pod's filter in progress for a front end that asks node by
// node (the scheduling framework calls Filter per node, from parallel
// goroutines, and stops once it has found enough feasible nodes): the
// pod's request is parsed once, and nodes of one topology with the same
// free GPUs share one answer, as within one extender filter call. Safe for
// concurrent use, without a lock of its own: FilterNode takes the
// ledger's read lock, then (inside the allocator) the allocator memo's
// lock, the core's one lock order.
type Cycle struct {
	x  *Core
	pr Request
	e  *evaluator
	// counts are FilterNode's verdicts by reason, striped by node so
	// that parallel filters do not contend on one counter; flush hands
	// them to the observer once.
	counts  [countStripes]cycleCounts
	flushed atomic.Bool
}

// countStripes spreads a cycle's counts over cache lines, by node name
// (countStripe).
const countStripes = 8

// countStripe is node's stripe of the counts: by its last byte, since the
// names of one cluster's nodes differ at the end (gpu-node-0042).
func countStripe(node string) int {
	if node == "" {
		return 0
	}
	return int(node[len(node)-1]) % countStripes
}

type cycleCounts struct {
	n [NumReasons]atomic.Int32
	_ [64 - (4*int(NumReasons))%64]byte
}

// newCycle starts the cycle of pr, a pod that requests GPUs.
// The previous cycle's counts, if it was never scored (no node passed),
// are handed to the observer now.
func (x *Core) newCycle(ctx context.Context, pr Request) *Cycle {
	c := &Cycle{x: x, pr: pr, e: x.evaluatorOn(ctx, pr, x.ledger.Snapshot(pr.job, pr.UID))}
	c.e.concurrent = true
	if prev := x.lastCycle.Swap(c); prev != nil {
		prev.flush()
	}
	return c
}

// flush hands the cycle's filter counts to the observer, once.
func (c *Cycle) flush() {
	if c.flushed.Swap(true) {
		return
	}
	var total [NumReasons]int
	for i := range c.counts {
		for r := range c.counts[i].n {
			total[r] += int(c.counts[i].n[r].Load())
		}
	}
	for r, n := range total {
		if n > 0 {
			c.x.obs.Filtered(Reason(r), n)
		}
	}
}

// Request is the cycle's pod request.
func (c *Cycle) Request() Request { return c.pr }

// FilterNode is filter's verdict on one node: passed, or the reason (with
// ReasonPrefix) and whether no change of the node's GPU use could fix it
// (unresolvable).
func (c *Cycle) FilterNode(node string) (passed, unresolvable bool, reason string) {
	v := c.x.checkNode(c.e, node, c.pr)
	c.counts[countStripe(node)].n[v.code].Add(1)
	if v.ok {
		return true, false, ""
	}
	return false, v.unresolvable, filterReason(c.pr, v)
}

// Choice is the GPUs, by UUID, that the pod would get on node as the
// ledger has it now (the set Reserve would hold), or nil when it does not
// fit there. A front end whose device allocator is another's (DRA's)
// offers it exactly these devices.
func (c *Cycle) Choice(node string) []string {
	var out []string
	// GPUs the pod holds there already (a group's slot, a reservation
	// from an earlier attempt) are what Reserve gives it again.
	c.x.ledger.Read(func(v ledger.View) { out = v.HeldOn(c.pr.UID, node) })
	if out != nil {
		return out
	}
	c.e.readNode(c.x.ledger, node, func(lv ledger.View) {
		n := lv.NodeFor(node, c.pr.UID)
		if n == nil {
			return
		}
		if v := c.e.check(n); v.ok {
			out = uuidsOf(n, v.res.GPUs)
		}
	})
	return out
}

// Score is prioritize's 0..MaxScore for each of names (the feasible
// nodes), with the cycle's evaluator: the verdicts Filter reached are not
// recomputed.
func (c *Cycle) Score(names []string) []int64 {
	c.flush()
	scores, _ := c.x.score(c.e, c.pr, names, false, nil)
	return scores
}
