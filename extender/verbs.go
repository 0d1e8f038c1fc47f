package extender

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender/ledger"
	"github.com/gputopo/gputopo/topology"
)

// Filter keeps the nodes whose currently free healthy GPUs satisfy the pod.
// Every other node gets a reason a person can act on; nodes that could not
// take the pod even with all their GPUs free and healthy go to
// FailedAndUnresolvableNodes, so that kube-scheduler does not preempt for
// them. A malformed requirement is an Error naming the field.
func (x *Extender) Filter(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	names := nodeNames(args)
	pr, err := parsePodRequest(args.Pod, x.cfg.GPUResource(), x.now())
	if err != nil {
		x.metrics.errors.WithLabelValues(phaseFilter, errBadRequest).Inc()
		return &extenderv1.ExtenderFilterResult{Error: err.Error()}
	}
	passed := names
	res := &extenderv1.ExtenderFilterResult{}
	if pr.count > 0 {
		if msg := x.DeciderRefusal(); msg != "" {
			x.metrics.errors.WithLabelValues(phaseFilter, errNotDecider).Inc()
			return &extenderv1.ExtenderFilterResult{Error: msg}
		}
		passed = make([]string, 0, len(names))
		var failed [numReasonCodes]int
		e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
		reason := func(v *verdict) string { return filterReason(pr, v) }
		x.ledger.Read(func(lv ledger.View) {
			nodes := lookup(lv, pr.uid, names)
			defer nodes.release()
			for i, name := range names {
				v := e.check(nodes.s[i])
				switch {
				case v.ok:
					passed = append(passed, name)
				case v.unresolvable:
					if res.FailedAndUnresolvableNodes == nil {
						res.FailedAndUnresolvableNodes = make(extenderv1.FailedNodesMap)
					}
					res.FailedAndUnresolvableNodes[name] = reason(v)
					failed[v.code]++
				default:
					if res.FailedNodes == nil {
						res.FailedNodes = make(extenderv1.FailedNodesMap)
					}
					res.FailedNodes[name] = reason(v)
					failed[v.code]++
				}
			}
		})
		for code, n := range failed {
			if n > 0 {
				x.metrics.filterResults.WithLabelValues("failed", reasonNames[code]).Add(float64(n))
			}
		}
	}
	if len(passed) > 0 {
		x.metrics.filterResults.WithLabelValues("passed", "").Add(float64(len(passed)))
	}
	if args.NodeNames != nil {
		res.NodeNames = &passed
	} else {
		res.Nodes = filteredNodes(args, passed)
	}
	return res
}

// filterReason is the reason filter gives for a node the pod failed on.
func filterReason(pr podRequest, v *verdict) string {
	if pr.fallbackIn > 0 && (v.code == reasonNVLink || v.code == reasonBandwidth) {
		return ReasonPrefix + v.reason + fallbackNote(pr)
	}
	return ReasonPrefix + v.reason
}

// fallbackNote tells a pod waiting for NVLink when it will fall back.
func fallbackNote(pr podRequest) string {
	return fmt.Sprintf(" (falls back to the best set without it in %s: fallbackAfter %s)",
		pr.fallbackIn.Round(time.Second), pr.strict.FallbackAfter.Duration)
}

// Prioritize scores each node 0..10 for the placement bind would make
// there. Nodes that would not pass filter score 0.
func (x *Extender) Prioritize(ctx context.Context, args *extenderv1.ExtenderArgs) (extenderv1.HostPriorityList, error) {
	list, _, err := x.prioritize(ctx, args, false)
	return list, err
}

// prioritize scores the nodes and, with track, also returns the top node
// (ties broken by name) and the GPUs bind would take there, for the
// shadow mirror.
func (x *Extender) prioritize(ctx context.Context, args *extenderv1.ExtenderArgs, track bool) (extenderv1.HostPriorityList, *ShadowPick, error) {
	names := nodeNames(args)
	pr, err := parsePodRequest(args.Pod, x.cfg.GPUResource(), x.now())
	if err != nil {
		return nil, nil, err
	}
	if pr.count == 0 {
		list := make(extenderv1.HostPriorityList, len(names))
		for i, name := range names {
			list[i] = extenderv1.HostPriority{Host: name}
		}
		return list, nil, nil
	}
	list, top := x.score(newEvaluator(ctx, x.alloc, x.cfg, pr, x.now()), pr, names, track)
	return list, top, nil
}

// score is prioritize's scoring with the evaluator e (fresh per request,
// or a plugin cycle's, whose verdicts from Filter it reuses).
func (x *Extender) score(e *evaluator, pr podRequest, names []string, track bool) (extenderv1.HostPriorityList, *ShadowPick) {
	list := make(extenderv1.HostPriorityList, len(names))
	nl, bestMerit := x.evaluate(e, pr, names)
	var counts [extenderv1.MaxExtenderPriority + 1]uint64
	best, bestGPUs := -1, []int(nil)
	for i, name := range names {
		list[i].Host = name
		if v := nl.v[i]; v != nil {
			list[i].Score = relativeScore(nl.m[i], bestMerit)
			if track && (best < 0 || list[i].Score > list[best].Score || list[i].Score == list[best].Score && name < list[best].Host) {
				best, bestGPUs = i, v.res.GPUs
			}
		}
		counts[list[i].Score]++
	}
	nl.release()
	x.metrics.scores.add(&counts)
	var top *ShadowPick
	if best >= 0 {
		top = &ShadowPick{Node: list[best].Host, Score: list[best].Score, GPUs: slices.Clone(bestGPUs)}
	}
	return list, top
}

// evaluate decides the pod on every node of names: in the returned list,
// v[i] is the verdict of node i when it passes filter (nil otherwise) and
// m[i] its merit (0..1); best is the best merit (-1 when no node passes).
// Two passes: the cross-node terms compare each node with every node that
// passed (the cohort), so the verdicts come first. The caller releases the
// list.
func (x *Extender) evaluate(e *evaluator, pr podRequest, names []string) (nl *nodeList, best float64) {
	x.ledger.Read(func(lv ledger.View) {
		aff := lv.Affinity(pr.job)
		nl = lookup(lv, pr.uid, names)
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
		clear(nl.s) // the nodes are not to be read past the lock
	})
	return nl, best
}

// Bind picks the pod's GPUs on the node, reserves them in the ledger and
// writes one Binding carrying assigned-gpus and placement; kube-apiserver
// copies its annotations onto the pod in the same write that sets nodeName.
func (x *Extender) Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) *extenderv1.ExtenderBindingResult {
	if err := x.bind(ctx, args); err != nil {
		x.metrics.errors.WithLabelValues(phaseBind, errKind(err)).Inc()
		klog.FromContext(ctx).V(2).Info("bind failed", "pod", klog.KRef(args.PodNamespace, args.PodName), "node", args.Node, "err", err)
		return &extenderv1.ExtenderBindingResult{Error: err.Error()}
	}
	return &extenderv1.ExtenderBindingResult{}
}

// bindError carries an error type for the errors metric.
type bindError struct {
	kind string
	err  error
}

func (e *bindError) Error() string { return e.err.Error() }
func (e *bindError) Unwrap() error { return e.err }

func bindErr(kind string, format string, a ...any) error {
	return &bindError{kind: kind, err: fmt.Errorf(format, a...)}
}

func (x *Extender) bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) error {
	// Counted before the decider check in reserve, so that a decider
	// stopping after the check waits for this Binding (decider.drain).
	x.binding.Add(1)
	defer x.binding.Add(-1)
	key := types.NamespacedName{Namespace: args.PodNamespace, Name: args.PodName}
	// The informer cache when it holds this very pod, else the API server:
	// besides settling, the only read bind makes.
	p, err := x.bindPod(ctx, key, args.PodUID)
	switch {
	case apierrors.IsNotFound(err):
		x.ledger.Release(args.PodUID)
		return bindErr(errBadRequest, "pod %s not found: it was deleted before binding", key)
	case err != nil:
		return bindErr(errAPIUnknown, "read pod %s: %w", key, err)
	case p.UID != args.PodUID:
		x.ledger.Release(args.PodUID)
		return bindErr(errConflict, "pod %s has UID %s, not %s: it was deleted and recreated; the scheduler will retry with the new pod", key, p.UID, args.PodUID)
	}
	info := ledger.NewPodInfo(p, x.cfg.GPUResource())
	if info.DemandErr != "" {
		return bindErr(errBadRequest, "%s", info.DemandErr)
	}
	if info.Node != "" {
		if info.Node == args.Node && info.AssignedRaw != "" {
			return nil // bound by an earlier attempt whose answer was lost
		}
		return bindErr(errConflict, "pod %s is already bound to node %s", key, info.Node)
	}
	if err := x.admitBind(ctx, p, info.GPUs, args.Node); err != nil {
		x.ledger.Release(args.PodUID)
		return err
	}
	pr := podRequest{count: info.GPUs, job: info.Job}
	if info.HasRequirement {
		req, err := v1alpha1.ParseRequirement(info.Requirement)
		if err != nil {
			x.ledger.Release(args.PodUID)
			return bindErr(errBadRequest, "pod %s: %w", key, err)
		}
		pr.setRequirement(req, p.CreationTimestamp.Time, x.now())
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: args.PodName, Namespace: args.PodNamespace, UID: args.PodUID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
	}
	var uuids []string
	var placement v1alpha1.Placement
	if pr.count > 0 {
		var err error
		if uuids, placement, err = x.reserve(ctx, args.PodUID, key, args.Node, pr); err != nil {
			return err
		}
		binding.Annotations = map[string]string{
			v1alpha1.AnnotationAssignedGPUs: v1alpha1.FormatGPUList(uuids),
			v1alpha1.AnnotationPlacement:    placement.String(),
		}
	}
	bctx, cancel := context.WithTimeout(ctx, x.cfg.BindTimeout.Duration)
	err = x.client.CoreV1().Pods(args.PodNamespace).Bind(bctx, binding, metav1.CreateOptions{})
	cancel()
	if err == nil {
		x.bound(ctx, args, pr, uuids, placement)
		return nil
	}
	if definiteFailure(err) {
		x.ledger.Release(args.PodUID)
		return bindErr(errAPIDefinite, "bind pod %s to node %s: %w", key, args.Node, err)
	}
	return x.settle(ctx, args, pr, uuids, placement, err)
}

// settle decides a bind whose outcome is unknown (timeout, 5xx, conflict)
// by reading the pod back.
func (x *Extender) settle(ctx context.Context, args *extenderv1.ExtenderBindingArgs, pr podRequest, uuids []string, placement v1alpha1.Placement, bindErrIn error) error {
	key := types.NamespacedName{Namespace: args.PodNamespace, Name: args.PodName}
	p, err := x.getPod(ctx, key)
	switch {
	case apierrors.IsNotFound(err):
		x.ledger.Release(args.PodUID)
		return bindErr(errAPIDefinite, "bind pod %s to node %s: %v; the pod is gone", key, args.Node, bindErrIn)
	case err != nil:
		return bindErr(errAPIUnknown, "bind pod %s to node %s: outcome unknown (%v) and reading the pod failed: %w; its GPUs stay reserved for the retry", key, args.Node, bindErrIn, err)
	case p.UID != args.PodUID:
		x.ledger.Release(args.PodUID)
		return bindErr(errConflict, "bind pod %s: pod has UID %s, not %s: it was deleted and recreated", key, p.UID, args.PodUID)
	case p.Spec.NodeName == args.Node && p.Annotations[v1alpha1.AnnotationAssignedGPUs] == v1alpha1.FormatGPUList(uuids):
		x.bound(ctx, args, pr, uuids, placement)
		return nil
	case p.Spec.NodeName != "":
		x.ledger.Release(args.PodUID)
		return bindErr(errConflict, "bind pod %s to node %s: %v; the pod is bound to node %s with GPUs %q instead", key, args.Node, bindErrIn, p.Spec.NodeName, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
	case apierrors.IsConflict(bindErrIn):
		x.ledger.Release(args.PodUID)
		return bindErr(errConflict, "bind pod %s to node %s: %w", key, args.Node, bindErrIn)
	}
	// Unbound and the write may still land: keep the reservation so the
	// retry gets the same GPUs; it expires after the reservation TTL.
	return bindErr(errAPIUnknown, "bind pod %s to node %s: outcome unknown (%v) and the pod is not bound yet; its GPUs stay reserved for the retry", key, args.Node, bindErrIn)
}

func (x *Extender) bound(ctx context.Context, args *extenderv1.ExtenderBindingArgs, pr podRequest, uuids []string, placement v1alpha1.Placement) {
	if pr.count == 0 {
		return
	}
	x.ledger.Confirm(args.PodUID, args.Node, uuids)
	x.metrics.placements.WithLabelValues(requestedTier(pr), string(placement.Tier)).Inc()
	if placement.Heuristic {
		x.metrics.heuristic.Inc()
	}
	klog.FromContext(ctx).V(2).Info("pod bound", "pod", klog.KRef(args.PodNamespace, args.PodName), "node", args.Node, "gpus", placement.GPUIndices, "tier", placement.Tier)
	x.recordBound(args, uuids, placement)
}

func (x *Extender) getPod(ctx context.Context, key types.NamespacedName) (*corev1.Pod, error) {
	gctx, cancel := context.WithTimeout(ctx, x.cfg.BindTimeout.Duration)
	defer cancel()
	return x.client.CoreV1().Pods(key.Namespace).Get(gctx, key.Name, metav1.GetOptions{})
}

// definiteFailure reports whether the API server certainly did not apply
// the Binding: it answered with a client error. Conflicts (the pod may
// already be bound by an earlier attempt), timeouts and server errors are
// settled by reading the pod.
func definiteFailure(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	code := int(st.Status().Code)
	switch {
	case code == http.StatusConflict, code == http.StatusRequestTimeout, code >= 500:
		return false
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return false
	}
	return code >= 400
}

// reserve chooses the pod's GPUs on node and holds them in the ledger
// (ledger.Reserve): two binds to one node never get the same GPU, and a
// pod that already holds a reservation on node gets the same GPUs.
func (x *Extender) reserve(ctx context.Context, uid types.UID, key types.NamespacedName, node string, pr podRequest) ([]string, v1alpha1.Placement, error) {
	// Checked right before GPUs are promised: a scheduler that has lost
	// the decider Lease since filter promises none.
	if msg := x.DeciderRefusal(); msg != "" {
		return nil, v1alpha1.Placement{}, bindErr(errNotDecider, "pod %s: %s", key, msg)
	}
	c, err := x.ledger.Reserve(uid, key, node, func(lv ledger.View, n *ledger.Node) (ledger.Choice, error) {
		e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
		v := e.check(n)
		if !v.ok {
			return ledger.Choice{}, bindErr(errInfeasible, "pod %s cannot bind to node %s: %s", key, node, v.reason)
		}
		merit, _ := e.merit(n, v, lv.Affinity(pr.job), soloCohort(n, v))
		gpus := n.Graph().GPUs()
		uuids := make([]string, len(v.res.GPUs))
		for i, idx := range v.res.GPUs {
			uuids[i] = gpus[idx].UUID
		}
		m := v.res.Metrics
		placement := v1alpha1.Placement{
			Node:                 node,
			Strategy:             pr.req.EffectiveStrategy(),
			GPUIndices:           append([]int(nil), v.res.GPUs...),
			Tier:                 m.Tier,
			MinPairBandwidthGBps: m.MinPairGBps,
			RingBandwidthGBps:    m.RingGBps,
			Score:                int(absoluteScore(merit)),
			Heuristic:            v.res.Heuristic,
		}
		placement.Degraded, placement.DegradedReason = pr.degraded(m)
		return ledger.Choice{UUIDs: uuids, Placement: placement}, nil
	})
	var held *ledger.AlreadyHeldError
	if errors.As(err, &held) {
		return nil, v1alpha1.Placement{}, &bindError{kind: errConflict, err: err}
	}
	return c.UUIDs, c.Placement, err
}

// NodeExplanation is one node's outcome for a pod, as filter, prioritize
// and bind would decide it.
type NodeExplanation struct {
	Node string
	// Passed is filter's verdict; Reason says why not, as filter writes it
	// (with ReasonPrefix).
	Passed bool
	Reason string
	// Score is prioritize's 0..10 and Result the GPUs bind would take, in
	// ring order, with their tier and bandwidths; set only when Passed.
	Score  int64
	Result topology.Result
}

// Explain evaluates the pod on every node of args with the code the verbs
// run, as if the pod held no GPUs yet, keeping each node's verdict, score
// and GPU choice: what `kubectl gputopo explain` shows.
func (x *Extender) Explain(ctx context.Context, args *extenderv1.ExtenderArgs) ([]NodeExplanation, error) {
	evals, err := x.evaluateAll(ctx, args)
	if err != nil {
		return nil, err
	}
	out := make([]NodeExplanation, len(evals))
	for i, ev := range evals {
		out[i] = NodeExplanation{Node: ev.name, Passed: ev.ok, Score: ev.score, Result: ev.res}
		if !ev.ok {
			out[i].Reason = ReasonPrefix + ev.reason
		}
	}
	return out, nil
}
