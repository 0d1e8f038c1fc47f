package extender

import (
	"context"
	"errors"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/extender/ledger"
)

// The in-process front end (the gputopo-scheduler plugin build) decides
// with the same core as the HTTP verbs: Filter and Prioritize take the same
// arguments without the JSON round trip, and ReservePod, BindPod and
// ReleasePod split bind into the scheduling framework's Reserve, Bind and
// Unreserve. Nothing here is reachable over the network.

// GPUCountOf is the number of GPUs (of the configured resource) the pod
// requests; a pod with none is not the core's to decide.
func (x *Extender) GPUCountOf(pod *corev1.Pod) (int, error) {
	return GPUCount(pod, x.cfg.GPUResource())
}

// NotReady says why the core cannot decide yet (informers syncing, ledger
// rebuild pending); empty when it can.
func (x *Extender) NotReady() string { return x.notReadyReason() }

// Cycle is one pod's filter in progress for a front end that asks node by
// node (the framework calls Filter per node, in parallel, and stops once
// it has found enough feasible nodes): the pod's request is parsed once,
// and nodes of one topology with the same free GPUs share one answer, as
// within one extender filter call. Safe for concurrent use.
type Cycle struct {
	x  *Extender
	pr podRequest
	mu sync.Mutex
	e  *evaluator
}

// NewCycle parses the pod's GPU request and requirement; an error names
// the field and the fix, as filter's Error does. A pod that requests no
// GPUs has a nil Cycle: it is not the core's to decide.
func (x *Extender) NewCycle(ctx context.Context, pod *corev1.Pod) (*Cycle, error) {
	pr, err := parsePodRequest(pod, x.cfg.GPUResource(), x.now())
	if err != nil {
		x.metrics.errors.WithLabelValues(phaseFilter, errBadRequest).Inc()
		return nil, err
	}
	if pr.count == 0 {
		return nil, nil
	}
	return &Cycle{x: x, pr: pr, e: newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())}, nil
}

// FilterNode is filter's verdict on one node: passed, or the reason (with
// ReasonPrefix) and whether no change of the node's GPU use could fix it
// (FailedAndUnresolvableNodes).
func (c *Cycle) FilterNode(node string) (passed, unresolvable bool, reason string) {
	var v *verdict
	c.x.ledger.Read(func(lv ledger.View) {
		c.mu.Lock()
		v = c.e.check(lv.NodeFor(node, c.pr.uid))
		c.mu.Unlock()
	})
	if v.ok {
		c.x.metrics.filterCounter(true, 0).Inc()
		return true, false, ""
	}
	c.x.metrics.filterCounter(false, v.code).Inc()
	return false, v.unresolvable, filterReason(c.pr, v)
}

// Score is prioritize's 0..10 for each of names (the feasible nodes), with
// the cycle's evaluator: the verdicts Filter reached are not recomputed.
func (c *Cycle) Score(names []string) extenderv1.HostPriorityList {
	c.mu.Lock()
	defer c.mu.Unlock()
	list, _ := c.x.score(c.e, c.pr, names, false)
	return list
}

// ReservePod chooses the pod's GPUs on node and holds them in the ledger,
// exactly as bind would before writing the Binding: within the scheduling
// cycle no other pod can be given them. A second call for the same pod and
// node returns the same GPUs.
func (x *Extender) ReservePod(ctx context.Context, pod *corev1.Pod, node string) error {
	pr, err := parsePodRequest(pod, x.cfg.GPUResource(), x.now())
	if err != nil {
		return err
	}
	if pr.count == 0 {
		return nil
	}
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	_, placement, err := x.reserve(ctx, pod.UID, key, node, pr)
	if err != nil {
		x.metrics.errors.WithLabelValues(phaseBind, errKind(err)).Inc()
		return err
	}
	klog.FromContext(ctx).V(4).Info("GPUs reserved", "pod", klog.KObj(pod), "node", node, "gpus", placement.GPUIndices)
	return nil
}

// BindPod writes the pod's Binding to node with its reserved GPUs, through
// the same checks and settling as the HTTP bind verb. Unknown reports an
// outcome that could not be settled (the write may still land): the
// reservation must then stay for the retry rather than be released.
func (x *Extender) BindPod(ctx context.Context, pod *corev1.Pod, node string) (unknown bool, err error) {
	args := &extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node}
	if err := x.bind(ctx, args); err != nil {
		kind := errKind(err)
		x.metrics.errors.WithLabelValues(phaseBind, kind).Inc()
		klog.FromContext(ctx).V(2).Info("bind failed", "pod", klog.KObj(pod), "node", node, "err", err)
		return kind == errAPIUnknown, err
	}
	return false, nil
}

// ReleasePod drops the pod's reservation (a scheduling cycle that failed
// after Reserve); a pod whose Binding was written keeps its GPUs.
func (x *Extender) ReleasePod(uid types.UID) { x.ledger.ReleaseReserved(uid) }

// errKind is the errors metric's label of a bind error.
func errKind(err error) string {
	var be *bindError
	if errors.As(err, &be) {
		return be.kind
	}
	return "internal"
}
