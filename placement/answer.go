package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// FilterAnswer is filter's answer for a pod over its candidate nodes.
type FilterAnswer struct {
	// Passed are the nodes that can take the pod now, in the candidates'
	// order.
	Passed []string
	// Failed and Unresolvable give each other node's reason (with
	// ReasonPrefix); Unresolvable are the nodes no change of their GPU use
	// could fix, so that kube-scheduler does not preempt for them.
	Failed, Unresolvable map[string]string
}

// Filter keeps the nodes whose currently free healthy GPUs satisfy the
// pod; every other node gets a reason a person can act on. A pod that
// requests no GPUs passes everywhere. The error is a refusal to decide
// (another gputopo scheduler holds the decider Lease).
func (x *Core) Filter(ctx context.Context, pr Request, names []string) (FilterAnswer, error) {
	if pr.Count == 0 {
		x.obs.Filtered(ReasonNone, len(names))
		return FilterAnswer{Passed: names}, nil
	}
	if msg := x.deciderRefusal(); msg != "" {
		x.obs.Failed(PhaseFilter, ErrNotDecider)
		return FilterAnswer{}, fmt.Errorf("%s", msg)
	}
	var ans0 FilterAnswer
	// kube-scheduler passes only the nodes its own filters let through,
	// so nodes full now are not among names: a waiting group's GPUs are
	// kept over every node (docs/groups.md, "A group that waits").
	slot, err := x.groupSlot(ctx, pr, names, nil)
	if err != nil {
		return x.groupRefusal(names, err)
	}
	if slot != nil {
		names = slot.restrict(names, &ans0)
	}
	ans := FilterAnswer{Passed: make([]string, 0, len(names)), Failed: ans0.Failed}
	var failed [NumReasons]int
	failed[ReasonGroup] = len(ans0.Failed)
	e := x.evaluatorFor(ctx, pr)
	x.ledger.Read(func(lv ledger.View) {
		nodes := lookup(lv, pr.UID, names)
		defer nodes.release()
		for i, name := range names {
			n := nodes.s[i]
			if name == pr.nominated {
				n = x.victimsGone(lv, n, pr.priority)
			}
			v := e.check(n)
			switch {
			case v.ok:
				ans.Passed = append(ans.Passed, name)
				continue
			case v.unresolvable:
				if ans.Unresolvable == nil {
					ans.Unresolvable = make(map[string]string)
				}
				ans.Unresolvable[name] = filterReason(pr, v)
			default:
				if ans.Failed == nil {
					ans.Failed = make(map[string]string)
				}
				ans.Failed[name] = filterReason(pr, v)
			}
			failed[v.code]++
		}
	})
	for code, n := range failed {
		if n > 0 {
			x.obs.Filtered(Reason(code), n)
		}
	}
	if len(ans.Passed) > 0 {
		x.obs.Filtered(ReasonNone, len(ans.Passed))
	}
	return ans, nil
}

// groupRefusal is filter's answer for a group's pod that cannot be placed
// now (err a *GroupWait: every node gets its reason) or not decided (any
// other error).
func (x *Core) groupRefusal(names []string, err error) (FilterAnswer, error) {
	var gw *GroupWait
	if !errors.As(err, &gw) {
		return FilterAnswer{}, err
	}
	m := make(map[string]string, len(names))
	for _, name := range names {
		m[name] = ReasonPrefix + gw.Msg
	}
	x.obs.Filtered(ReasonGroup, len(names))
	if gw.Unresolvable {
		return FilterAnswer{Unresolvable: m}, nil
	}
	return FilterAnswer{Failed: m}, nil
}

// restrict keeps of names the slot's node, giving the others their reason
// in ans.Failed.
func (s *GroupSlot) restrict(names []string, ans *FilterAnswer) []string {
	var keep []string
	for _, name := range names {
		if name == s.Node {
			keep = append(keep, name)
			continue
		}
		if ans.Failed == nil {
			ans.Failed = make(map[string]string)
		}
		ans.Failed[name] = s.OtherNodeReason()
	}
	return keep
}

// filterReason is the reason filter gives for a node the pod failed on.
func filterReason(pr Request, v *verdict) string {
	if pr.fallbackIn > 0 && (v.code == ReasonNVLink || v.code == ReasonBandwidth) {
		return ReasonPrefix + v.reason + fallbackNote(pr)
	}
	return ReasonPrefix + v.reason
}

// fallbackNote tells a pod waiting for NVLink when it will fall back.
func fallbackNote(pr Request) string {
	return fmt.Sprintf(" (falls back to the best set without it in %s: fallbackAfter %s)",
		pr.fallbackIn.Round(time.Second), pr.strict.FallbackAfter.Duration)
}

// Pick is a top-ranked node and the GPUs a bind there would take.
type Pick struct {
	Node  string `json:"node"`
	Score int64  `json:"score"`
	GPUs  []int  `json:"gpus"`
}

// Score is prioritize's 0..MaxScore for the placement bind would make on
// each of names, in dst (grown to len(names) when shorter); nodes that
// would not pass filter score 0. With track it also returns the top node
// (ties broken by name) and the GPUs bind would take there.
func (x *Core) Score(ctx context.Context, pr Request, names []string, track bool, dst []int64) ([]int64, *Pick) {
	if pr.Count == 0 {
		dst = scoreSlice(dst, len(names))
		clear(dst)
		return dst, nil
	}
	return x.score(x.evaluatorFor(ctx, pr), pr, names, track, dst)
}

// scoreSlice is dst with length n, grown when shorter.
func scoreSlice(dst []int64, n int) []int64 {
	if cap(dst) < n {
		return make([]int64, n)
	}
	return dst[:n]
}

// score is Score with the evaluator e (fresh per request, or a plugin
// cycle's, whose verdicts from Filter it reuses).
func (x *Core) score(e *evaluator, pr Request, names []string, track bool, dst []int64) ([]int64, *Pick) {
	scores := scoreSlice(dst, len(names))
	nl, bestMerit := x.evaluate(e, pr, names)
	var counts [MaxScore + 1]uint64
	best, bestGPUs := -1, []int(nil)
	for i, name := range names {
		scores[i] = 0
		if v := nl.v[i]; v != nil {
			scores[i] = packedScore(relativeScore(nl.m[i], bestMerit), nl.over, i)
			if track && (best < 0 || scores[i] > scores[best] || scores[i] == scores[best] && name < names[best]) {
				best, bestGPUs = i, v.res.GPUs
			}
		}
		counts[scores[i]]++
	}
	nl.release()
	x.obs.Scored(&counts)
	var top *Pick
	if best >= 0 {
		top = &Pick{Node: names[best], Score: scores[best], GPUs: slices.Clone(bestGPUs)}
	}
	return scores, top
}

// evaluate decides the pod on every node of names: in the returned list,
// v[i] is the verdict of node i when it passes filter (nil otherwise) and
// m[i] its merit (0..1); best is the best merit (-1 when no node passes).
// Two passes: the cross-node terms compare each node with every node that
// passed (the cohort), so the verdicts come first. The caller releases the
// list.
func (x *Core) evaluate(e *evaluator, pr Request, names []string) (nl *nodeList, best float64) {
	e.read(x.ledger, func(lv ledger.View) {
		aff := lv.Affinity(pr.job)
		nl = lookup(lv, pr.UID, names)
		nl.evalSlices()
		// Pass one touches each node once: verdict, the terms local to
		// the node, and what the cross-node terms need. Pass two finishes
		// the merits from the slices alone.
		var co cohort
		for i, n := range nl.s {
			if v := e.check(n); v.ok {
				nl.v[i] = v
				co.add(n, v)
				c := e.components(n, v, aff.Of(n), cohort{})
				nl.m[i], nl.c[i] = e.local(c, aff), n.Topo().LogCapability()
			}
		}
		best = -1
		for i, v := range nl.v {
			if v != nil {
				bf, cons := crossTerms(v.res.Metrics.RingGBps, nl.c[i], co)
				nl.m[i] = e.combine(nl.m[i], bf, cons, aff)
				best = max(best, nl.m[i])
			}
		}
		nl.over = packDomains(lv, pr, nl.s, nl.m, best, func(i int) bool { return nl.v[i] != nil })
		clear(nl.s) // the nodes are not to be read past the lock
	})
	return nl, best
}

// NodeExplanation is one node's outcome for a pod, as filter, prioritize
// and bind would decide it.
type NodeExplanation struct {
	Node string
	// Passed is filter's verdict; Reason says why not, as filter writes it
	// (with ReasonPrefix).
	Passed bool
	Reason string
	// Score is prioritize's 0..10, Merit the weighted mean of its terms
	// (0..1) before it is made relative to the best node, Components the
	// terms, and Result the GPUs bind would take, in ring order, with
	// their tier and bandwidths; set only when Passed.
	Score      int64
	Merit      float64
	Components Components
	Result     topology.Result
	// PackedOver says the node would score MaxScore but domain packing
	// passed over it: another node as good lies in a fuller fabric domain.
	PackedOver bool
}

// Explain evaluates the pod on every node of names with the code filter,
// prioritize and bind run, as if the pod held no GPUs yet and were not yet
// counted in its job (the decision made before it was bound), keeping
// each node's verdict, score and GPU choice: what `kubectl gputopo
// explain` shows and the shadow compares.
func (x *Core) Explain(ctx context.Context, pr Request, names []string) []NodeExplanation {
	out := make([]NodeExplanation, len(names))
	if pr.Count == 0 {
		for i, name := range names {
			out[i] = NodeExplanation{Node: name, Passed: true}
		}
		return out
	}
	e := x.evaluatorFor(ctx, pr)
	merits := make([]float64, len(names))
	verdicts := make([]*verdict, len(names))
	x.ledger.Read(func(lv ledger.View) {
		ownNode, owns := lv.HolderNode(pr.UID)
		aff := lv.AffinityExcluding(pr.job, pr.Key, pr.UID)
		states := make([]*ledger.Node, len(names))
		var co cohort
		for i, name := range names {
			n := lv.Node(name)
			if owns && n != nil && ownNode == name {
				n = lv.Without(n, pr.UID)
			}
			v := e.check(n)
			states[i], verdicts[i] = n, v
			out[i] = NodeExplanation{Node: name, Passed: v.ok}
			if v.ok {
				co.add(n, v)
			} else {
				out[i].Reason = ReasonPrefix + v.reason
			}
		}
		top := -1.0
		for i, v := range verdicts {
			if v.ok {
				merits[i], out[i].Components = e.merit(states[i], v, aff, co)
				top = max(top, merits[i])
			}
		}
		over := packDomains(lv, pr, states, merits, top, func(i int) bool { return verdicts[i].ok })
		for i, v := range verdicts {
			if v.ok {
				out[i].Score, out[i].Merit = packedScore(relativeScore(merits[i], top), over, i), merits[i]
				out[i].PackedOver = over != nil && over[i] && out[i].Score == MaxScore-1
				out[i].Result = v.res
				out[i].Result.GPUs = slices.Clone(v.res.GPUs)
			}
		}
	})
	return out
}
