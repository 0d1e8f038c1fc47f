package placement

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// BindRequest is one pod to bind to a node.
type BindRequest struct {
	Key  types.NamespacedName
	UID  types.UID
	Node string
	// Request is the pod's request as its scheduling cycle parsed it;
	// nil: bind parses the pod it reads.
	Request *Request
}

// Outcome is what a bind did to the pod's GPUs.
type Outcome uint8

const (
	// Bound: the Binding was written; the GPUs are the pod's.
	Bound Outcome = iota
	// Released: the bind failed for certain; whatever the core held for
	// the pod is dropped (the informer restores what it really holds).
	Released
	// Unknown: the Binding may still land; the GPUs stay reserved for the
	// retry until the reservation TTL.
	Unknown
	// Unchanged: the bind was refused before anything was promised; the
	// ledger is as it was.
	Unchanged
)

// BindResult is a bind's one outcome; Err says why when it is not Bound
// (and Kind labels it), and Placement is the GPUs it wrote.
type BindResult struct {
	Outcome   Outcome
	Err       error
	Kind      ErrorKind
	UUIDs     []string
	Placement v1alpha1.Placement
}

// failed is a result that is not Bound.
func failed(o Outcome, kind ErrorKind, format string, a ...any) BindResult {
	return BindResult{Outcome: o, Kind: kind, Err: fmt.Errorf(format, a...)}
}

// Bind picks the pod's GPUs on the node, reserves them in the ledger and
// writes one Binding carrying assigned-gpus and placement; kube-apiserver
// copies its annotations onto the pod in the same write that sets
// nodeName. The ledger changes in one place, after the transaction has its
// outcome: confirmed when Bound, dropped when Released, kept when Unknown.
func (x *Core) Bind(ctx context.Context, b BindRequest) BindResult {
	// Counted before the decider check in reserve, so that a decider
	// stopping after the check waits for this Binding (decider.drain).
	x.binding.Add(1)
	defer x.binding.Add(-1)
	res := x.bind(ctx, b)
	switch res.Outcome {
	case Bound:
		if len(res.UUIDs) > 0 {
			x.ledger.Confirm(b.UID, b.Node, res.UUIDs)
		}
	case Released:
		x.ledger.Release(b.UID)
	}
	if res.Err != nil {
		x.obs.Failed(PhaseBind, res.Kind)
		klog.FromContext(ctx).V(2).Info("bind failed", "pod", b.Key, "node", b.Node, "err", res.Err)
	}
	return res
}

// bind is the transaction: read the pod, check it, reserve its GPUs,
// write the Binding, settle an unknown answer.
func (x *Core) bind(ctx context.Context, b BindRequest) BindResult {
	key := b.Key
	p, err := x.api.Pod(ctx, key, b.UID)
	switch {
	case apierrors.IsNotFound(err):
		return failed(Released, ErrBadRequest, "pod %s not found: it was deleted before binding", key)
	case err != nil:
		return failed(Unknown, ErrAPIUnknown, "read pod %s: %w", key, err)
	case p.UID != b.UID:
		return failed(Released, ErrConflict, "pod %s has UID %s, not %s: it was deleted and recreated; the scheduler will retry with the new pod", key, p.UID, b.UID)
	}
	info := ledger.NewPodInfo(p, x.cfg.GPUResource())
	if info.DemandErr != nil {
		return failed(Unchanged, ErrBadRequest, "%w", info.DemandErr)
	}
	if info.Node != "" {
		if info.Node == b.Node && (info.AssignedRaw != "" || info.GPUs == 0 && len(p.Spec.ResourceClaims) > 0) {
			return BindResult{Outcome: Bound} // bound by an earlier attempt whose answer was lost
		}
		return failed(Unchanged, ErrConflict, "pod %s is already bound to node %s", key, info.Node)
	}
	gpus := info.GPUs
	if gpus == 0 && b.Request != nil && b.Request.claims {
		gpus = b.Request.Count // through ResourceClaims, read by the front end this cycle
	}
	// A pod that asks through ResourceClaims, bound without the cycle's
	// request (the HTTP extender): kube-scheduler's DynamicResources
	// allocated its claims' devices before this bind (PreBind); the
	// ledger takes them from the claims, and the Binding carries none.
	allocated := false
	if gpus == 0 && b.Request == nil {
		ledger.AddClaimGPUs(p, info, x.opts.ClaimGPUs)
		gpus, allocated = info.GPUs, info.ViaClaims
	}
	if res := x.admitBind(ctx, p, gpus, b.Node); res.Err != nil {
		return res
	}
	pr := b.Request
	if pr == nil {
		r, err := requestOf(info, p.CreationTimestamp.Time, x.now())
		if err != nil {
			return failed(Released, ErrBadRequest, "%w", err)
		}
		pr = &r
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, UID: b.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: b.Node},
	}
	var res BindResult
	if pr.Count > 0 && !allocated {
		if res = x.reserve(ctx, key, b.UID, b.Node, *pr); res.Err != nil {
			return res
		}
		binding.Annotations = map[string]string{
			v1alpha1.AnnotationAssignedGPUs: v1alpha1.FormatGPUList(res.UUIDs),
			v1alpha1.AnnotationPlacement:    res.Placement.String(),
		}
	}
	bctx, cancel := context.WithTimeout(ctx, x.cfg.BindTimeout.Duration)
	err = x.api.Bind(bctx, binding)
	cancel()
	switch {
	case err == nil:
	case definiteFailure(err):
		return failed(Released, ErrAPIDefinite, "bind pod %s to node %s: %w", key, b.Node, err)
	default:
		if res = x.settle(ctx, b, res, err); res.Err != nil {
			return res
		}
	}
	if allocated {
		klog.FromContext(ctx).V(2).Info("pod bound; its GPUs are its ResourceClaims' allocation", "pod", b.Key, "node", b.Node, "gpus", gpus)
		return res
	}
	x.bound(ctx, b, *pr, res)
	return res
}

// settle decides a bind whose outcome is unknown (timeout, 5xx, conflict)
// by reading the pod back.
func (x *Core) settle(ctx context.Context, b BindRequest, res BindResult, bindErr error) BindResult {
	key := b.Key
	gctx, cancel := context.WithTimeout(ctx, x.cfg.BindTimeout.Duration)
	p, err := x.api.FreshPod(gctx, key)
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		return failed(Released, ErrAPIDefinite, "bind pod %s to node %s: %v; the pod is gone", key, b.Node, bindErr)
	case err != nil:
		return failed(Unknown, ErrAPIUnknown, "bind pod %s to node %s: outcome unknown (%v) and reading the pod failed: %w; its GPUs stay reserved for the retry", key, b.Node, bindErr, err)
	case p.UID != b.UID:
		return failed(Released, ErrConflict, "bind pod %s: pod has UID %s, not %s: it was deleted and recreated", key, p.UID, b.UID)
	case p.Spec.NodeName == b.Node && p.Annotations[v1alpha1.AnnotationAssignedGPUs] == v1alpha1.FormatGPUList(res.UUIDs):
		return res
	case p.Spec.NodeName != "":
		return failed(Released, ErrConflict, "bind pod %s to node %s: %v; the pod is bound to node %s with GPUs %q instead", key, b.Node, bindErr, p.Spec.NodeName, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
	case apierrors.IsConflict(bindErr):
		return failed(Released, ErrConflict, "bind pod %s to node %s: %w", key, b.Node, bindErr)
	}
	// Unbound and the write may still land: keep the reservation so the
	// retry gets the same GPUs; it expires after the reservation TTL.
	return failed(Unknown, ErrAPIUnknown, "bind pod %s to node %s: outcome unknown (%v) and the pod is not bound yet; its GPUs stay reserved for the retry", key, b.Node, bindErr)
}

// bound reports a written Binding: counts, log and Events.
func (x *Core) bound(ctx context.Context, b BindRequest, pr Request, res BindResult) {
	if pr.Count == 0 {
		return
	}
	p := res.Placement
	x.obs.Bound(requestedTier(pr), p)
	klog.FromContext(ctx).V(2).Info("pod bound", "pod", b.Key, "node", b.Node, "gpus", p.GPUIndices, "tier", p.Tier)
	x.recordBound(b, res.UUIDs, p)
	// GPUs that preemption freed of pods of lower priority: say whose. The
	// pod's nomination is not checked: the pod a cycle binds may be a copy
	// read before kube-scheduler recorded it.
	if freed := x.ledger.TakeFreed(b.Node, res.UUIDs, pr.priority); len(freed) > 0 {
		x.recordFreed(ctx, b, freed)
	}
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

// Reserve chooses the pod's GPUs on node and holds them in the ledger,
// exactly as bind would before writing the Binding (the plugin build's
// Reserve): within the scheduling cycle no other pod can be given them. A
// second call for the same pod and node returns the same GPUs.
func (x *Core) Reserve(ctx context.Context, pr Request, node string) BindResult {
	if pr.Count == 0 {
		return BindResult{Outcome: Bound}
	}
	res := x.reserve(ctx, pr.Key, pr.UID, node, pr)
	if res.Err != nil {
		x.obs.Failed(PhaseBind, res.Kind)
		return res
	}
	klog.FromContext(ctx).V(4).Info("GPUs reserved", "pod", pr.Key, "node", node, "gpus", res.Placement.GPUIndices)
	return res
}

// Unreserve drops the pod's reservation (a scheduling cycle that failed
// after Reserve); a pod whose Binding was written keeps its GPUs.
func (x *Core) Unreserve(uid types.UID) { x.ledger.ReleaseReserved(uid) }

// reserve chooses the pod's GPUs on node and holds them in the ledger
// (ledger.Reserve): two binds to one node never get the same GPU, and a
// pod that already holds a reservation on node gets the same GPUs. Its
// refusals leave the ledger unchanged.
func (x *Core) reserve(ctx context.Context, key types.NamespacedName, uid types.UID, node string, pr Request) BindResult {
	// Checked right before GPUs are promised: a scheduler that has lost
	// the decider Lease since filter promises none.
	if msg := x.deciderRefusal(); msg != "" {
		return failed(Unchanged, ErrNotDecider, "pod %s: %s", key, msg)
	}
	if pr.group != "" {
		// A group's pod takes its slot again if it gave it back (the
		// framework's pod-group cycle reserves and unreserves every pod
		// of each placement it tries, then reserves the chosen one's
		// again); its slot on node is then held for it as before.
		x.ledger.ClaimSlot(pr.group, uid, key, node, pr.slice())
	}
	var refusal BindResult
	c, err := x.ledger.Reserve(uid, key, node, func(lv ledger.View, n *ledger.Node) (ledger.Choice, error) {
		e := x.evaluatorIn(ctx, lv, pr)
		v := e.check(n)
		if !v.ok {
			refusal = failed(Unchanged, ErrInfeasible, "pod %s cannot bind to node %s: %s", key, node, v.reason)
			return ledger.Choice{}, refusal.Err
		}
		merit, _ := e.merit(n, v, lv.Affinity(pr.job), soloCohort(n, v))
		return ledger.Choice{UUIDs: uuidsOf(n, v.res.GPUs), Placement: pr.placementOf(node, v, merit)}, nil
	})
	var held *ledger.AlreadyHeldError
	switch {
	case err == nil:
		return BindResult{Outcome: Bound, UUIDs: c.UUIDs, Placement: c.Placement}
	case refusal.Err != nil:
		return refusal
	case errors.As(err, &held):
		return BindResult{Outcome: Unchanged, Kind: ErrConflict, Err: err}
	}
	return BindResult{Outcome: Unchanged, Kind: ErrInternal, Err: err}
}

// placementOf is the placement record of verdict v on node.
func (pr Request) placementOf(node string, v *verdict, merit float64) v1alpha1.Placement {
	m := v.res.Metrics
	p := v1alpha1.Placement{
		Node:                 node,
		Strategy:             pr.req.EffectiveStrategy(),
		GPUIndices:           append([]int(nil), v.res.GPUs...),
		Tier:                 m.Tier,
		MinPairBandwidthGBps: m.MinPairGBps,
		RingBandwidthGBps:    m.RingGBps,
		Score:                int(absoluteScore(merit)),
		Heuristic:            v.res.Heuristic,
	}
	p.Degraded, p.DegradedReason = pr.degraded(m)
	return p
}

// uuidsOf are the UUIDs of n's GPUs at indices.
func uuidsOf(n *ledger.Node, indices []int) []string {
	gpus := n.Graph().GPUs()
	uuids := make([]string, len(indices))
	for i, idx := range indices {
		uuids[i] = gpus[idx].UUID
	}
	return uuids
}
