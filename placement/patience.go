package placement

import (
	"context"
	"fmt"
	"time"

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
	e.patience = x.patienceFor(pr, e.now)
	return e
}

// patienceFor is pr's patience at now.
func (x *Core) patienceFor(pr Request, now time.Time) patience {
	wait, share := x.cfg.BandwidthPatience()
	if wait <= 0 || !pr.wantsBandwidth() || pr.group != "" || pr.created.IsZero() {
		return patience{}
	}
	if fa := pr.strict.FallbackAfter; fa != nil && fa.Duration < wait {
		// The requirement says how long the pod waits for the links it
		// asks for; it does not wait longer for faster ones.
		wait = fa.Duration
	}
	if pr.fallback {
		return patience{}
	}
	left := pr.created.Add(wait).Sub(now)
	if left <= 0 {
		return patience{}
	}
	var best int
	x.ledger.Read(func(v ledger.View) { best = x.bestRing(v, pr) })
	floor := int(float64(best) * share)
	if floor <= 0 {
		return patience{}
	}
	return patience{floor: floor, best: best, percent: *x.cfg.Patience.BandwidthPercent, left: left}
}

// bestRing is the highest ring any machine shape of the cluster gives pr
// with every GPU free and healthy (0 when none can hold it). The
// allocator's memo answers each shape after the first time.
func (x *Core) bestRing(v ledger.View, pr Request) int {
	req := topology.Request{Count: pr.Count, Requirement: pr.req}
	best := 0
	for _, t := range v.Shapes() {
		g := t.Pristine()
		if g.Len() < pr.Count {
			continue
		}
		if res, err := x.alloc.Allocate(g, g.All(), req); err == nil {
			best = max(best, res.Metrics.RingGBps)
		}
	}
	return best
}

// patient refuses v, a set that fits node n, when its ring is below the
// pod's patience floor: unresolvable when even the node's best set with
// every GPU free is below it (no eviction makes the node faster).
func (e *evaluator) patient(n *ledger.Node, v *verdict) *verdict {
	p := e.patience
	if p.floor == 0 || !v.ok || v.res.Metrics.RingGBps >= p.floor {
		return v
	}
	pristine := e.allocate(n, n.Topo().Pristine().All(), true)
	return &verdict{
		code:         ReasonPatience,
		unresolvable: !pristine.ok || pristine.res.Metrics.RingGBps < p.floor,
		reason: fmt.Sprintf("the best free set here has a %d GB/s ring, under %d%% of the %d GB/s this cluster's fastest machines give the pod; it waits %s more for a faster set, then takes the best free (patience.bandwidthWait)",
			v.res.Metrics.RingGBps, p.percent, p.best, p.left.Round(time.Second)),
	}
}
