package placement

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
)

// PreFilterInput is what a front end that asks node by node (the
// scheduler plugin) knows when a pod's cycle starts.
type PreFilterInput struct {
	Pod *corev1.Pod
	// Nodes is how many nodes the cycle considers.
	Nodes int
	// Allowed are the nodes the pod may go to by its own rules
	// (nodeSelector, required node affinity, taints); asked only for a
	// group's pod, whose group is planned on them.
	Allowed func() []string
	// LeftOut, when not nil, says after Allowed why nodes the pod's own
	// rules allow were left out of Allowed ("" for none): a group that
	// waits says it beside its own reason.
	LeftOut func() string
	// EachNode calls fn with every node of the cycle and whether a pod
	// is on it in the front end's snapshot: a pod-group preemption's dry
	// run takes its candidate victims out of that snapshot, and the group
	// is planned as the snapshot has the nodes. Nil: no snapshot.
	EachNode func(fn func(node string, present func(types.UID) bool))
	// ClaimGPUs is how many GPUs the pod asks through ResourceClaims of a
	// device class gputopo serves (docs/dra.md), as the front end read
	// them from the claims; 0: none. The core decides such a pod's node
	// and GPUs as for the device plugin's resource; it may not ask both
	// ways.
	ClaimGPUs int
	// ClaimSelected, when not nil, says which of a node's GPUs (UUIDs) the
	// pod's claims' CEL selectors (the request's and its DeviceClass's)
	// allow; ok false: every one. The core then chooses the best set
	// among them, so that upstream's allocator can take it.
	ClaimSelected func(node string) (uuids []string, ok bool)
}

// PreFilterPlan is the core's one answer at the start of a pod's cycle:
// whether the core decides for it, the nodes worth filtering, and what
// the rest of the cycle reads. The front end only translates it into its
// host's statuses.
type PreFilterPlan struct {
	// Skip: the pod asks for no GPUs; the core has nothing to say.
	Skip bool
	// Err is not a verdict on nodes (the core is not ready, another
	// scheduler decides, the ledger failed): the pod is retried with
	// backoff.
	Err error
	// Refusal, when not empty, ends the cycle: no node can take the pod
	// now, for this reason; Unresolvable when preemption cannot help.
	Refusal      string
	Unresolvable bool
	// Cycle answers the cycle's filters and score; nil when the pod's
	// group waits (every node then fails with Waiting).
	Cycle *Cycle
	// Waiting is the reason every node fails with while the pod's group
	// waits (Cycle nil); GroupPreemption, when not nil, plans on demand
	// which nodes and victims free room for the whole group.
	Waiting         string
	GroupPreemption func() *GroupPreemption
	// Nodes are the only nodes worth filtering; nil: every node.
	Nodes sets.Set[string]
	// Over is, per node, what the snapshot's dry run took away (a
	// pod-group preemption trying its victims): filters decide on the
	// node as it leaves it.
	Over map[string]*WhatIf
	// Activate are the pod's group's other pods, not bound yet, to try
	// now: the group was just planned.
	Activate []types.NamespacedName
}

// PreFilter starts a pod's cycle for a front end that asks node by node:
// it reads the pod's request, plans or claims its group's slot, narrows
// the nodes to those that can hold it now, and returns the cycle that
// answers the node filters and the score.
func (x *Core) PreFilter(ctx context.Context, in PreFilterInput) PreFilterPlan {
	pr, err := ParseRequest(in.Pod, x.cfg.GPUResource(), x.now())
	if err != nil {
		x.obs.Failed(PhaseFilter, ErrBadRequest)
		return PreFilterPlan{Refusal: err.Error(), Unresolvable: true}
	}
	if in.ClaimGPUs > 0 {
		if pr.Count > 0 {
			x.obs.Failed(PhaseFilter, ErrBadRequest)
			return PreFilterPlan{Refusal: fmt.Sprintf("pod %s asks %d %s and %d GPUs through ResourceClaims: ask for GPUs one way, the resource or the claims (docs/dra.md)", pr.Key, pr.Count, x.cfg.GPUResource(), in.ClaimGPUs), Unresolvable: true}
		}
		pr.Count, pr.claims, pr.selected = in.ClaimGPUs, true, in.ClaimSelected
	}
	if pr.Count == 0 {
		return PreFilterPlan{Skip: true}
	}
	if msg := x.NotReady(); msg != "" {
		return PreFilterPlan{Err: errors.New(ReasonPrefix + msg)}
	}
	// Only the scheduling replica gets here: the first GPU pod starts the
	// decider Lease election. Not holding it is an error, not a verdict
	// on nodes, so the pod is retried with backoff and the event names
	// the scheduler that decides instead.
	if msg := x.deciderRefusal(); msg != "" {
		return PreFilterPlan{Err: errors.New(ReasonPrefix + msg)}
	}
	var allowed []string
	if pr.Group() != "" && in.Allowed != nil {
		allowed = in.Allowed()
	}
	slot, err := x.slot(ctx, pr, allowed)
	var wait *GroupWait
	switch {
	case errors.As(err, &wait):
		if in.LeftOut != nil {
			if why := in.LeftOut(); why != "" {
				w := *wait
				w.Msg += "; " + why
				wait = &w
			}
		}
		return x.groupWaits(ctx, in, pr, allowed, wait)
	case err != nil:
		return PreFilterPlan{Err: fmt.Errorf("%s%w", ReasonPrefix, err)}
	case slot != nil:
		// The group is planned: its other pods, which may wait as
		// unschedulable from before, are tried now rather than on the
		// next cluster event.
		plan := PreFilterPlan{Cycle: x.newCycle(ctx, pr), Nodes: sets.New(slot.Node)}
		for _, key := range x.groupPending(slot.Group) {
			if key != pr.Key {
				plan.Activate = append(plan.Activate, key)
			}
		}
		return plan
	}
	// Only the nodes that can hold the pod now need the host's filters;
	// when none can, the cycle ends here with gputopo's reason.
	c := x.fits(pr, in.Nodes)
	plan := PreFilterPlan{Cycle: x.newCycle(ctx, pr)}
	pod := in.Pod
	if pod.Status.NominatedNodeName != "" {
		// Nominated by a preemption: the ledger may not have seen its
		// victims leave yet, so the fit index may not show the node;
		// Filter decides on it as the host's snapshot sees it.
		return plan
	}
	if c.Reason != "" {
		// Not unresolvable unless no machine could ever hold the pod:
		// kube-scheduler's preemption may still ask Filter whether
		// evicting lower-priority pods makes room.
		plan.Refusal, plan.Unresolvable = c.Reason, c.Unresolvable
		return plan
	}
	// A pod found unschedulable before that may preempt (some pod of
	// lower priority holds GPUs) is not narrowed: kube-scheduler's
	// preemption treats the nodes a PreFilterResult leaves out as
	// unresolvable, and a node with lower-priority pods to evict may be
	// among them. Its first cycle is narrowed; when that fails (the nodes
	// that can hold its GPUs failed other filters), the retry considers
	// every node.
	if c.Nodes == nil || mayPreempt(pod) && foundUnschedulable(pod) && x.Preemption().MayHelp(corev1helpers.PodPriority(pod)) {
		return plan
	}
	plan.Nodes = c.Nodes
	return plan
}

// groupWaits is PreFilter's plan for a pod whose group cannot be placed
// now.
func (x *Core) groupWaits(ctx context.Context, in PreFilterInput, pr Request, allowed []string, wait *GroupWait) PreFilterPlan {
	if !wait.Unresolvable && in.EachNode != nil {
		// kube-scheduler's pod-group preemption tries the group on a
		// snapshot with its candidate victims taken out, through a fresh
		// cycle: plan it as that snapshot has the nodes, and send each
		// pod to its place there.
		if node, over := x.planOnSnapshot(ctx, in, pr, allowed); node != "" {
			return PreFilterPlan{Cycle: x.newCycle(ctx, pr), Nodes: sets.New(node), Over: over}
		}
	}
	// A group's pod waits for its whole group. kube-scheduler's
	// preemption may still evict lower-priority pods for it, but only on
	// the node the group's preemption plan keeps for this pod, and only
	// the pods that plan needs gone (docs/scheduler-plugin.md,
	// "Preemption").
	plan := PreFilterPlan{Refusal: ReasonPrefix + wait.Msg, Unresolvable: wait.Unresolvable, Waiting: ReasonPrefix + wait.Msg}
	if !wait.Unresolvable {
		prio := corev1helpers.PodPriority(in.Pod)
		plan.GroupPreemption = func() *GroupPreemption {
			return x.Preemption().PlanGroup(ctx, pr, prio, allowed)
		}
	}
	return plan
}

// planOnSnapshot plans pr's waiting group on nodes as the front end's
// snapshot has them, when it lacks pods the ledger still counts (the
// pod-group preemption's try with its victims taken out; or the ledger
// lagging a moment behind): the node the plan keeps for the pod, and the
// per-node what-ifs Filter decides on. "" when the snapshot takes no pod
// out or the group does not fit even so.
func (x *Core) planOnSnapshot(ctx context.Context, in PreFilterInput, pr Request, allowed []string) (string, map[string]*WhatIf) {
	over := map[string]*WhatIf{}
	pe := x.Preemption()
	in.EachNode(func(name string, present func(types.UID) bool) {
		if w := pe.Lagging(nil, name, present); !w.Empty() {
			over[name] = w
		}
	})
	if len(over) == 0 {
		return "", nil
	}
	gp := pe.PlanGroupIf(ctx, pr, allowed, over)
	if gp == nil {
		return "", nil
	}
	return gp.Slot(in.Pod.UID), over
}

// mayPreempt says whether pod's preemptionPolicy lets it preempt.
func mayPreempt(pod *corev1.Pod) bool {
	return pod.Spec.PreemptionPolicy == nil || *pod.Spec.PreemptionPolicy != corev1.PreemptNever
}

// foundUnschedulable says whether kube-scheduler found pod unschedulable
// before (its PodScheduled condition is False, reason Unschedulable).
func foundUnschedulable(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable
		}
	}
	return false
}
