package placement

import (
	"context"
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
}

// NewCycle starts the cycle of pr, a pod that requests GPUs.
func (x *Core) NewCycle(ctx context.Context, pr Request) *Cycle {
	return &Cycle{x: x, pr: pr, e: newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())}
}

// Request is the cycle's pod request.
func (c *Cycle) Request() Request { return c.pr }

// FilterNode is filter's verdict on one node: passed, or the reason (with
// ReasonPrefix) and whether no change of the node's GPU use could fix it
// (unresolvable).
func (c *Cycle) FilterNode(node string) (passed, unresolvable bool, reason string) {
	v := c.x.checkNode(c.e, node, c.pr)
	if v.ok {
		c.x.obs.Filtered(ReasonNone, 1)
		return true, false, ""
	}
	c.x.obs.Filtered(v.code, 1)
	return false, v.unresolvable, filterReason(c.pr, v)
}

// Score is prioritize's 0..MaxScore for each of names (the feasible
// nodes), with the cycle's evaluator: the verdicts Filter reached are not
// recomputed.
func (c *Cycle) Score(names []string) []int64 {
	scores, _ := c.x.score(c.e, c.pr, names, false)
	return scores
}
