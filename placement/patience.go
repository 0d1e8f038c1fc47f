package placement

import (
	"context"
	"time"

	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// Patience (docs/extender.md, "Waiting for a faster set"): a pod that asks
// for bandwidth between its GPUs, outside a group, may be refused for
// patience.bandwidthWait after its creation every set whose ring is below
// patience.bandwidthPercent of the best ring it could get soon, but only
// on evidence that such GPUs free in time for it. Placing a model-parallel
// pod on a set several times slower than a machine that is about to free,
// because it is busy this minute, slows it for its whole run; waiting a
// few minutes for it costs less. Waiting for GPUs that nothing says will
// free strands the pod, and a burst of such pods on a cluster with room.
//
// The evidence (ledger.View.Finished and Ending), on the machines the
// pod's own rules allow: the GPUs that pods which ran gave back there when
// they ended within the last bandwidthWait (the measured churn, expected
// to go on at that pace), and the GPUs of pods there whose
// activeDeadlineSeconds ends them within the time the pod has left. The best
// ring among those machines sets the bar; the pod waits only while the
// GPUs expected to free on machines at or above the bar cover its own
// count and what the pods waiting ahead of it ask (ledger.View.
// WaitingAhead): the tail of a burst takes the best free set at once.
// Groups are planned whole and wait for their domain already; they are
// left out.

// patience is what the evaluator refuses for patience: sets whose ring is
// below floor GB/s, while left of the wait remains; best is the best ring
// the pod could get soon, soon the GPUs expected to free at or above the
// floor within left, ahead those the pods waiting ahead of it ask. A zero
// floor refuses nothing.
type patience struct {
	floor, best int
	percent     int32
	left        time.Duration
	soon, ahead int
}

// evaluatorFor is newEvaluator for pr with its patience, read under the
// ledger's read lock. A caller that holds the ledger's lock already (bind's
// choice, under ledger.Reserve) uses evaluatorIn: taking the read lock
// again there would wait on a writer waiting on the caller.
func (x *Core) evaluatorFor(ctx context.Context, pr Request) *evaluator {
	return x.evaluatorOn(ctx, pr, nil)
}

// evaluatorOn is evaluatorFor deciding on snap (nil: the live ledger):
// the evaluator of a cycle, whose every answer reads the snapshot taken
// when it began.
func (x *Core) evaluatorOn(ctx context.Context, pr Request, snap *ledger.Snapshot) *evaluator {
	e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
	e.snap = snap
	if x.mayWait(pr) {
		e.read(x.ledger, func(v ledger.View) { e.patience = x.patienceIn(ctx, v, pr, e.now) })
		x.countPatience(e.patience)
	}
	return e
}

// evaluatorIn is evaluatorFor for a caller that holds the ledger's lock
// and reads it through v.
func (x *Core) evaluatorIn(ctx context.Context, v ledger.View, pr Request) *evaluator {
	e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
	if x.mayWait(pr) {
		e.patience = x.patienceIn(ctx, v, pr, e.now)
	}
	return e
}

// mayWait says whether pr is a pod patience applies to at all: one that
// asks for bandwidth, outside a group, read from the pod itself, not
// fallen back, with patience on.
func (x *Core) mayWait(pr Request) bool {
	wait, _ := x.cfg.BandwidthPatience()
	return wait > 0 && pr.wantsBandwidth() && pr.group == "" && !pr.created.IsZero() && pr.rules != nil && !pr.fallback
}

// countPatience tells the observer of a decision inside a pod's window
// with evidence: whether the pod waits.
func (x *Core) countPatience(p patience) {
	if p.best > 0 {
		x.obs.Patience(p.floor > 0)
	}
}

// patienceIn is pr's patience at now, read through v.
func (x *Core) patienceIn(ctx context.Context, v ledger.View, pr Request, now time.Time) patience {
	wait, share := x.cfg.BandwidthPatience()
	window := wait
	if fa := pr.strict.FallbackAfter; fa != nil && fa.Duration < wait {
		// The requirement says how long the pod waits for the links it
		// asks for; it does not wait longer for faster ones.
		wait = fa.Duration
	}
	left := pr.created.Add(wait).Sub(now)
	// A pod that could preempt takes the best free set at once: waiting
	// would make kube-scheduler evict lower-priority pods for a faster
	// set, where without patience it evicts no one.
	if left <= 0 || v.HoldersBelow(pr.priority) {
		return patience{}
	}
	p := patience{percent: *x.cfg.Patience.BandwidthPercent, left: left}
	o := x.outlook(ctx, v, pr, now, window, left)
	p.best = o.best
	p.floor = int(float64(o.best) * share)
	if p.floor <= 0 {
		return p
	}
	p.soon = o.above(p.floor)
	p.ahead = v.WaitingAhead(pr.created, now.Add(-wait), pr.Key)
	if p.soon < p.ahead+pr.Count {
		p.floor = 0
	}
	return p
}

// outlook is what is expected to free for a pod within its patience: per
// ring (of the pod's best set on the machine with every GPU free), the
// GPUs expected to free on machines with that ring.
type outlook struct {
	best  int
	gpus  map[int]int
	rings map[*ledger.Topo]int
}

// above is the GPUs expected to free on machines whose ring is at least
// floor.
func (o outlook) above(floor int) int {
	sum := 0
	for ring, g := range o.gpus {
		if ring >= floor {
			sum += g
		}
	}
	return sum
}

// outlook reads the evidence for pr at now: GPUs that pods which ran gave
// back when they ended within the last window, and GPUs of pods whose
// declared deadline falls within left, on usable nodes the pod's rules
// allow.
func (x *Core) outlook(ctx context.Context, v ledger.View, pr Request, now time.Time, window, left time.Duration) outlook {
	o := outlook{gpus: map[int]int{}, rings: map[*ledger.Topo]int{}}
	allowed := map[*ledger.Node]bool{}
	req := topology.Request{Count: pr.Count, Requirement: pr.req}
	ring := func(n *ledger.Node) int {
		if !n.Usable() || n.Object() == nil {
			return 0
		}
		ok, seen := allowed[n]
		if !seen {
			why, err := pr.rules.Excludes(ctx, n.Object())
			ok = err == nil && why == ""
			allowed[n] = ok
		}
		if !ok {
			return 0
		}
		t := n.Topo()
		r, seen := o.rings[t]
		if !seen {
			if g := t.Pristine(); g.Len() >= pr.Count {
				if res, err := x.alloc.Allocate(g, g.All(), req); err == nil {
					r = res.Metrics.RingGBps
				}
			}
			o.rings[t] = r
		}
		return r
	}
	add := func(n *ledger.Node, gpus int) {
		if r := ring(n); r > 0 {
			o.gpus[r] += gpus
			o.best = max(o.best, r)
		}
	}
	v.Finished(now.Add(-window), func(n *ledger.Node, gpus int) { add(n, gpus) })
	v.Ending(now.Add(left), func(n *ledger.Node, gpus int) { add(n, gpus) })
	return o
}
