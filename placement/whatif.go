package placement

import (
	"cmp"
	"context"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/placement/ledger"
)

// WhatIf is one node as preemption asks about it: some pods gone (the
// victims it would evict) and some added (pods nominated to the node,
// whose GPUs are not chosen yet, and victims given back while it
// reprieves them). It changes nothing in the ledger: a decision reads the
// node through it, as a view. The zero value changes nothing. Not safe for
// concurrent use; the scheduling framework gives each node's preemption
// check its own copy (Clone).
type WhatIf struct {
	gone  map[types.UID]bool
	added map[types.UID]int
}

// Remove takes pod uid's GPUs off the node, or undoes its Add.
func (w *WhatIf) Remove(uid types.UID) {
	if _, ok := w.added[uid]; ok {
		delete(w.added, uid)
		return
	}
	if w.gone == nil {
		w.gone = make(map[types.UID]bool)
	}
	w.gone[uid] = true
}

// Add puts pod uid back on the node: a victim given back holds its GPUs
// again, and a pod that holds none there yet (a nominated pod) counts as
// holding gpus GPUs whose identity is not chosen.
func (w *WhatIf) Add(uid types.UID, gpus int) {
	if w.gone[uid] {
		delete(w.gone, uid)
		return
	}
	if gpus <= 0 {
		return
	}
	if w.added == nil {
		w.added = make(map[types.UID]int)
	}
	w.added[uid] = gpus
}

// AddPod is Add for pod, which requests GPUs of resource; a pod whose
// request cannot be read counts none, as the ledger counts it.
func (w *WhatIf) AddPod(pod *corev1.Pod, resource corev1.ResourceName) {
	gpus, err := ledger.GPUCount(pod, resource)
	if err != nil {
		gpus = 0
	}
	w.Add(pod.UID, gpus)
}

// Removes says whether w takes pod uid off the node.
func (w *WhatIf) Removes(uid types.UID) bool { return w != nil && w.gone[uid] }

// Empty says whether w changes nothing.
func (w *WhatIf) Empty() bool { return w == nil || len(w.gone) == 0 && len(w.added) == 0 }

// Clone is an independent copy of w.
func (w *WhatIf) Clone() *WhatIf {
	if w == nil {
		return nil
	}
	return &WhatIf{gone: maps.Clone(w.gone), added: maps.Clone(w.added)}
}

// Gone lists the pods w takes off the node, in no order.
func (w *WhatIf) Gone() []types.UID {
	if w == nil {
		return nil
	}
	out := make([]types.UID, 0, len(w.gone))
	for uid := range w.gone {
		out = append(out, uid)
	}
	return out
}

// on is node n (as pod uid sees it) changed by w, read inside lv's Read.
func (w *WhatIf) on(lv ledger.View, n *ledger.Node) *ledger.Node {
	if w.Empty() {
		return n
	}
	var gone func(types.UID) bool
	if len(w.gone) > 0 {
		gone = func(uid types.UID) bool { return w.gone[uid] }
	}
	return lv.As(n, gone, w.added)
}

// FilterNodeIf is FilterNode on the node as w changes it: would the pod
// fit there with w's victims gone and its nominated pods added. Nodes the
// pod could never fit stay unresolvable, so preemption is not tried in
// vain.
func (c *Cycle) FilterNodeIf(node string, w *WhatIf) (passed, unresolvable bool, reason string) {
	if w.Empty() {
		return c.FilterNode(node)
	}
	var v *verdict
	c.e.readNode(c.x.ledger, node, func(lv ledger.View) {
		v = c.e.check(w.on(lv, lv.NodeFor(node, c.pr.UID)))
	})
	if v.ok {
		return true, false, ""
	}
	return false, v.unresolvable, filterReason(c.pr, v)
}

// PreemptionMayHelp says whether a pod of priority prio could free GPUs
// by preemption anywhere: whether some pod of lower priority holds GPUs.
func (p Preemption) MayHelp(prio int32) bool {
	x := p.x
	var may bool
	x.ledger.Read(func(v ledger.View) { may = v.HoldersBelow(prio) })
	return may
}

// Lagging adds to w (nil: a new what-if) the pods the ledger counts on
// node, bound, that present says the caller's own view of the node no
// longer has: kube-scheduler's snapshot sees a preemption's victims leave
// before the ledger's informer handler does, and a pod nominated there
// would otherwise fail its node for those few milliseconds and preempt
// again elsewhere. Reserve still decides on the ledger, so a pod placed
// through such a view waits (Reserve refuses) until the ledger agrees.
func (p Preemption) Lagging(w *WhatIf, node string, present func(types.UID) bool) *WhatIf {
	x := p.x
	x.ledger.Read(func(lv ledger.View) {
		for _, h := range lv.Holders(lv.Node(node)) {
			if !h.Reserved && !present(h.UID) {
				if w == nil {
					w = &WhatIf{}
				}
				w.Remove(h.UID)
			}
		}
	})
	return w
}

// victimsGone is node n as the pod of priority prio that preemption
// nominated to it will find it: without the lower-priority pods
// kube-scheduler is evicting there (their DisruptionTarget condition is
// seen). kube-scheduler tries the pod again as soon as it has deleted
// them, often before the ledger's informer has seen the deletes; filter
// would fail the node for those milliseconds, and kube-scheduler preempt
// again elsewhere, evicting pods in vain. Bind still decides on the
// ledger, so the pod is bound once the ledger agrees. The caller holds
// the ledger's read lock (v).
func (x *Core) victimsGone(v ledger.View, n *ledger.Node, prio int32) *ledger.Node {
	var w *WhatIf
	for _, h := range v.Holders(n) {
		if h.Preempted && !h.Reserved && h.Priority < prio {
			if w == nil {
				w = &WhatIf{}
			}
			w.Remove(h.UID)
		}
	}
	if w == nil {
		return n
	}
	return w.on(v, n)
}

// Protected says, for pods a preemption would evict on one node (most
// important first), which of them their PodDisruptionBudgets do not allow
// to be disrupted, counting the budgets down in that order as
// kube-scheduler's preemption does; nil: none is.
type Protected func(pods []types.NamespacedName) []bool

// Victims answers the extender's preempt question for pr (a pod of
// priority priority) on node: which pods to evict so that it fits there,
// by kube-scheduler's own rule with gputopo's fit (the plugin build gets
// the same from kube-scheduler's preemption asking its Filter). When pr
// does not fit with the proposed victims gone (kube-scheduler chose them
// by count), every lower-priority GPU pod of the node is taken off. Then
// the GPU pods among the victims are given back, most important first
// (higher priority, then earlier start; among equals, the one holding more
// GPUs: reprieveFirst), those whose eviction would breach
// a PodDisruptionBudget (protected; nil: none) before the others, each
// kept when pr still fits without it. Victims that hold no GPUs on the
// node stay victims: kube-scheduler chose them for other resources.
// violations counts the protected victims (for those without GPUs,
// kube-scheduler's count ksViolations, at most one each). ok is false
// when pr cannot fit on the node even with every lower-priority pod gone:
// kube-scheduler then drops the node rather than evict in vain.
func (p Preemption) Victims(ctx context.Context, pr Request, priority int32, node string, proposed []types.UID, ksViolations int, protected Protected) (victims []types.UID, violations int, ok bool) {
	x := p.x
	e := x.evaluatorFor(ctx, pr)
	var order []ledger.Holder // the GPU pods among the victims
	var gone map[types.UID]bool
	var kept map[types.UID]bool
	x.ledger.Read(func(lv ledger.View) {
		n := lv.NodeFor(node, pr.UID)
		holders := lv.Holders(n)
		gpu := make(map[types.UID]ledger.Holder, len(holders))
		for _, h := range holders {
			gpu[h.UID] = h
		}
		w := &WhatIf{}
		fits := func() bool { return e.check(w.on(lv, n)).ok }
		gone = make(map[types.UID]bool, len(proposed))
		for _, uid := range proposed {
			w.Remove(uid)
			gone[uid] = true
			if h, holds := gpu[uid]; holds {
				order = append(order, h)
			}
		}
		if !fits() {
			for _, h := range holders {
				if !gone[h.UID] && !h.Reserved && h.Priority < priority {
					w.Remove(h.UID)
					gone[h.UID] = true
					order = append(order, h)
				}
			}
			if !fits() {
				return
			}
		}
		ok = true
		slices.SortStableFunc(order, reprieveFirst)
		var breach []bool
		if protected != nil && len(order) > 0 {
			keys := make([]types.NamespacedName, len(order))
			for i, h := range order {
				keys[i] = h.Pod
			}
			breach = protected(keys)
		}
		kept = make(map[types.UID]bool, len(order))
		for _, first := range []bool{true, false} {
			for i, h := range order {
				if (i < len(breach) && breach[i]) != first {
					continue
				}
				w.Add(h.UID, 0)
				if fits() {
					kept[h.UID] = true
					continue
				}
				w.Remove(h.UID)
				if first {
					violations++
				}
			}
		}
	})
	if !ok {
		return nil, 0, false
	}
	others := 0
	for _, uid := range proposed {
		if !kept[uid] {
			victims = append(victims, uid)
			if !slices.ContainsFunc(order, func(h ledger.Holder) bool { return h.UID == uid }) {
				others++
			}
		}
	}
	for _, h := range order {
		if !kept[h.UID] && !slices.Contains(proposed, h.UID) {
			victims = append(victims, h.UID)
		}
	}
	return victims, violations + min(ksViolations, others), true
}

// reprieveFirst orders the victims of one node as Victims gives them back:
// the more important first (moreImportant); among pods kube-scheduler
// ranks equal, whose order its preemption leaves open, the one holding
// more GPUs first, so that the fewest GPUs' work is lost.
func reprieveFirst(a, b ledger.Holder) int {
	if c := moreImportant(a, b); c != 0 {
		return c
	}
	return cmp.Compare(len(b.UUIDs)+b.Unknown, len(a.UUIDs)+a.Unknown)
}

// moreImportant orders a before b (-1) when a is the more important pod,
// as kube-scheduler's preemption judges it: higher priority, then the one
// that started earlier (a pod not started yet counts as starting now).
func moreImportant(a, b ledger.Holder) int {
	if a.Priority != b.Priority {
		return cmp.Compare(b.Priority, a.Priority)
	}
	switch {
	case a.Started.IsZero() && b.Started.IsZero():
		return 0
	case a.Started.IsZero():
		return 1
	case b.Started.IsZero():
		return -1
	}
	return a.Started.Compare(b.Started)
}

// Preemption is what a front end asks the core when kube-scheduler
// preempts: the victims of one node (Victims), the nodes and victims that
// free room for a whole group (PlanGroup, PlanGroupIf), and how far the
// ledger lags kube-scheduler's snapshot of a node (Lagging).
type Preemption struct{ x *Core }

// Preemption is the core's preemption planner.
func (x *Core) Preemption() Preemption { return Preemption{x: x} }
