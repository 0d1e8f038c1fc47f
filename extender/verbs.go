package extender

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/placement"
)

// The verbs translate kube-scheduler's extender arguments into the core's
// request and its answers back; the decisions are package placement's.

// request parses the pod of args once for the verb.
func (x *Extender) request(args *extenderv1.ExtenderArgs) (placement.Request, error) {
	if args.Pod == nil {
		return placement.Request{}, errors.New("request has no pod")
	}
	return placement.ParseRequest(args.Pod, x.cfg.GPUResource(), x.core.Now())
}

// Filter keeps the nodes whose currently free healthy GPUs satisfy the pod.
// Every other node gets a reason a person can act on; nodes that could not
// take the pod even with all their GPUs free and healthy go to
// FailedAndUnresolvableNodes, so that kube-scheduler does not preempt for
// them. A malformed requirement is an Error naming the field.
func (x *Extender) Filter(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	pr, err := x.request(args)
	if err != nil {
		x.metrics.Failed(placement.PhaseFilter, placement.ErrBadRequest)
		return &extenderv1.ExtenderFilterResult{Error: err.Error()}
	}
	ans, err := x.core.Filter(ctx, pr, nodeNames(args))
	if err != nil {
		return &extenderv1.ExtenderFilterResult{Error: err.Error()}
	}
	res := &extenderv1.ExtenderFilterResult{FailedNodes: ans.Failed, FailedAndUnresolvableNodes: ans.Unresolvable}
	if args.NodeNames != nil {
		res.NodeNames = &ans.Passed
	} else {
		res.Nodes = filteredNodes(args, ans.Passed)
	}
	return res
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
func (x *Extender) prioritize(ctx context.Context, args *extenderv1.ExtenderArgs, track bool) (extenderv1.HostPriorityList, *placement.Pick, error) {
	pr, err := x.request(args)
	if err != nil {
		return nil, nil, err
	}
	names := nodeNames(args)
	buf := scoreBuffers.Get().(*[]int64)
	scores, top := x.core.Score(ctx, pr, names, track, *buf)
	list := make(extenderv1.HostPriorityList, len(names))
	for i, name := range names {
		list[i] = extenderv1.HostPriority{Host: name, Score: scores[i]}
	}
	*buf = scores
	scoreBuffers.Put(buf)
	return list, top, nil
}

// Bind picks the pod's GPUs on the node, reserves them in the ledger and
// writes one Binding carrying assigned-gpus and placement; kube-apiserver
// copies its annotations onto the pod in the same write that sets nodeName.
func (x *Extender) Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) *extenderv1.ExtenderBindingResult {
	res := x.core.Bind(ctx, placement.BindRequest{
		Key: types.NamespacedName{Namespace: args.PodNamespace, Name: args.PodName}, UID: args.PodUID, Node: args.Node,
	})
	if res.Err != nil {
		return &extenderv1.ExtenderBindingResult{Error: res.Err.Error()}
	}
	return &extenderv1.ExtenderBindingResult{}
}

// scoreBuffers hold the core's scores between prioritize's calls.
var scoreBuffers = sync.Pool{New: func() any { return new([]int64) }}
