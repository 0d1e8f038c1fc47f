package placement

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// Patience (docs/extender.md, "Waiting for a faster set"): a pod that asks
// for bandwidth between its GPUs, outside a group, is refused for
// patience.bandwidthWait after its creation every set whose ring is below
// patience.bandwidthPercent of the best ring the cluster's machines could
// give it with every GPU free. Placing a model-parallel pod on a set
// several times slower than the cluster's fast machines offer, because
// they are busy this minute, slows it for its whole run; waiting a few
// minutes for them to free costs less. Groups are planned whole and wait
// for their domain already; they are left out.

// patience is what the evaluator refuses for patience: sets whose ring is
// below floor GB/s, while left of the wait remains; best is the cluster's
// best ring for the pod. A zero floor refuses nothing.
type patience struct {
	floor, best int
	percent     int32
	left        time.Duration
}

// evaluatorFor is newEvaluator for pr with its patience.
func (x *Core) evaluatorFor(ctx context.Context, pr Request) *evaluator {
	e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
	e.patience = x.patienceFor(ctx, pr, e.now)
	return e
}

// patienceFor is pr's patience at now.
func (x *Core) patienceFor(ctx context.Context, pr Request, now time.Time) patience {
	wait, share := x.cfg.BandwidthPatience()
	if wait <= 0 || !pr.wantsBandwidth() || pr.group != "" || pr.created.IsZero() || pr.rules == nil || pr.fallback {
		return patience{}
	}
	if fa := pr.strict.FallbackAfter; fa != nil && fa.Duration < wait {
		// The requirement says how long the pod waits for the links it
		// asks for; it does not wait longer for faster ones.
		wait = fa.Duration
	}
	left := pr.created.Add(wait).Sub(now)
	if left <= 0 {
		return patience{}
	}
	var best int
	x.ledger.Read(func(v ledger.View) {
		// A pod that could preempt takes the best free set at once:
		// waiting would make kube-scheduler evict lower-priority pods
		// for a faster set, where without patience it evicts no one.
		if !v.HoldersBelow(pr.priority) {
			best = x.bestRing(ctx, v, pr)
		}
	})
	floor := int(float64(best) * share)
	if floor <= 0 {
		return patience{}
	}
	return patience{floor: floor, best: best, percent: *x.cfg.Patience.BandwidthPercent, left: left}
}

// bestRing is the highest ring that a machine shape of the cluster with a
// node the pod's own rules allow (nodeSelector, required node affinity,
// taints) gives pr with every GPU free and healthy; 0 when none can hold
// it. The allocator's memo answers each shape after the first time, and
// the nodes of a shape are read only until one is allowed.
func (x *Core) bestRing(ctx context.Context, v ledger.View, pr Request) int {
	req := topology.Request{Count: pr.Count, Requirement: pr.req}
	shapes := v.Shapes()
	rings := make([]int, len(shapes))
	order := make([]int, 0, len(shapes))
	for i, s := range shapes {
		g := s.Topo.Pristine()
		if g.Len() < pr.Count {
			continue
		}
		if res, err := x.alloc.Allocate(g, g.All(), req); err == nil && res.Metrics.RingGBps > 0 {
			rings[i] = res.Metrics.RingGBps
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return rings[b] - rings[a] })
	for _, i := range order {
		allowed := shapes[i].AnyNode(func(n *corev1.Node) bool {
			why, err := pr.rules.Excludes(ctx, n)
			return err == nil && why == ""
		})
		if allowed {
			return rings[i]
		}
	}
	return 0
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
		reason: fmt.Sprintf("the best free set here has a %d GB/s ring, under %d%% of the %d GB/s this cluster's fastest machines give the pod; it waits %s more for a faster set, then takes the best free (patience.bandwidthWait)",
			v.res.Metrics.RingGBps, p.percent, p.best, p.left.Round(time.Second)),
	}
}
