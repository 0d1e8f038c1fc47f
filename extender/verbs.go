package extender

import (
	"context"
	"errors"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
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
	return x.core.ParsePod(args.Pod)
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

// Preempt answers kube-scheduler's preempt verb: for each candidate node
// and the victims kube-scheduler chose there by count, the victims whose
// eviction frees a GPU set the pod's requirement accepts, chosen by
// kube-scheduler's own rule with gputopo's fit, and the
// PodDisruptionBudgets they breach counted as kube-scheduler counts them
// (placement.Core.Victims), so that kube-scheduler prefers the node whose
// eviction breaches none; a node where no eviction of lower-priority pods
// makes the pod fit is dropped, so that nothing is evicted in vain. A pod without GPUs keeps kube-scheduler's victims. A
// pod of a group that waits gets at most one node, the one the group's
// preemption plan keeps for it (placement.Core.PlanGroupPreemption), with
// the pods that plan needs gone there: a group is placed whole or not at
// all, so its pods evict only inside the one domain the plan chose.
func (x *Extender) Preempt(ctx context.Context, args *extenderv1.ExtenderPreemptionArgs) (*extenderv1.ExtenderPreemptionResult, error) {
	meta := args.NodeNameToMetaVictims
	if meta == nil {
		meta = make(map[string]*extenderv1.MetaVictims, len(args.NodeNameToVictims))
		for node, v := range args.NodeNameToVictims {
			if v == nil {
				continue
			}
			mv := &extenderv1.MetaVictims{NumPDBViolations: v.NumPDBViolations}
			for _, p := range v.Pods {
				if p != nil {
					mv.Pods = append(mv.Pods, &extenderv1.MetaPod{UID: string(p.UID)})
				}
			}
			meta[node] = mv
		}
	}
	pr, err := x.request(&extenderv1.ExtenderArgs{Pod: args.Pod})
	if err != nil {
		x.metrics.Failed(placement.PhasePreempt, placement.ErrBadRequest)
		return nil, err
	}
	out := &extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}
	priority := corev1helpers.PodPriority(args.Pod)
	switch {
	case pr.Count == 0:
		out.NodeNameToMetaVictims = meta
		return out, nil
	case pr.Group() != "":
		// A group is placed whole: the group's preemption plan keeps one
		// node for this pod, and only the pods that plan needs gone there
		// are evicted; the group's other pods preempt on theirs.
		gp := x.core.Preemption().PlanGroup(ctx, pr, priority, nil)
		node := gp.Slot(args.Pod.UID)
		if mv := meta[node]; mv != nil && len(gp.Victims[node]) > 0 {
			res := &extenderv1.MetaVictims{NumPDBViolations: mv.NumPDBViolations}
			for _, uid := range gp.Victims[node] {
				res.Pods = append(res.Pods, &extenderv1.MetaPod{UID: string(uid)})
			}
			out.NodeNameToMetaVictims[node] = res
		}
		if gp != nil {
			klog.FromContext(ctx).V(2).Info("group preemption: the pod's place in its group's plan", "pod", klog.KObj(args.Pod), "group", gp.Group, "node", node,
				"domain", gp.Domain, "victims", len(gp.Victims[node]), "candidate", meta[node] != nil)
		}
		return out, nil
	}
	var protected placement.Protected
	if x.rt != nil {
		protected = x.rt.Protected()
	}
	for node, mv := range meta {
		if mv == nil {
			continue
		}
		proposed := make([]types.UID, 0, len(mv.Pods))
		for _, p := range mv.Pods {
			if p != nil {
				proposed = append(proposed, types.UID(p.UID))
			}
		}
		victims, violations, ok := x.core.Preemption().Victims(ctx, pr, priority, node, proposed, int(mv.NumPDBViolations), protected)
		if !ok {
			continue
		}
		res := &extenderv1.MetaVictims{NumPDBViolations: int64(violations), Pods: make([]*extenderv1.MetaPod, len(victims))}
		for i, uid := range victims {
			res.Pods[i] = &extenderv1.MetaPod{UID: string(uid)}
		}
		out.NodeNameToMetaVictims[node] = res
	}
	return out, nil
}

// scoreBuffers hold the core's scores between prioritize's calls.
var scoreBuffers = sync.Pool{New: func() any { return new([]int64) }}
