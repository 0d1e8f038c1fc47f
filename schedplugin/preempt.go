package schedplugin

import (
	"context"
	"fmt"
	"sync"

	"github.com/gputopo/gputopo/placement"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
)

// preemption removes the pods it would evict (and adds back those it
// reprieves, and the pods nominated to a node) through AddPod and
// RemovePod, and asks Filter again; Filter then decides on the node as
// those changes leave its GPUs, so preemption evicts only pods whose GPUs
// the chosen set needs.
func (p *Plugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// AddPod counts pod on the node in the cycle's what-if: a victim given
// back holds its GPUs again; a pod nominated to the node, which holds none
// yet, holds as many as it requests, through its resources or its
// ResourceClaims not allocated yet.
func (p *Plugin) AddPod(_ context.Context, state fwk.CycleState, _ *corev1.Pod, pod fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	c, node := p.preemptionCycle(state, nodeInfo)
	if c == nil {
		return nil
	}
	if p.h != nil {
		if n, _, err := claimGPUs(pod.GetPod(), p.h.SharedDRAManager(), p.x.Config().DRA); err == nil && n > 0 {
			c.whatIf(node).Add(pod.GetPod().UID, n)
			return nil
		}
	}
	c.whatIf(node).AddPod(pod.GetPod(), p.x.Config().GPUResource())
	return nil
}

// RemovePod takes pod's GPUs off the node in the cycle's what-if.
func (p *Plugin) RemovePod(_ context.Context, state fwk.CycleState, _ *corev1.Pod, pod fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	if c, node := p.preemptionCycle(state, nodeInfo); c != nil {
		c.whatIf(node).Remove(pod.GetPod().UID)
	}
	return nil
}

// preemptionCycle is the cycle AddPod and RemovePod change, nil when the
// pod's cycle has none (PreFilter skipped it or refused it).
func (p *Plugin) preemptionCycle(state fwk.CycleState, nodeInfo fwk.NodeInfo) (*cycle, string) {
	d, err := state.Read(cycleKey)
	if err != nil || nodeInfo.Node() == nil {
		return nil, ""
	}
	c := d.(*cycle)
	if c.c == nil && c.group == nil {
		return nil, ""
	}
	return c, nodeInfo.Node().Name
}

// whatIf is node's what-if in the cycle, made on first use.
func (c *cycle) whatIf(node string) *placement.WhatIf {
	w := c.over[node]
	if w == nil {
		if c.over == nil {
			c.over = make(map[string]*placement.WhatIf)
		}
		w = &placement.WhatIf{}
		c.over[node] = w
	}
	return w
}

// groupPreempt is a waiting group's preemption, for one of its pods: the
// core plans it once per cycle, when kube-scheduler's preemption first
// asks Filter.
type groupPreempt struct {
	uid  types.UID
	once sync.Once
	plan func() *placement.GroupPreemption
	got  *placement.GroupPreemption
}

// filter passes node, with w's pods gone, only where the group's
// preemption plan keeps this pod's place and w evicts every pod the plan
// needs gone there; kube-scheduler's reprieve then gives back every other
// pod. Every other node is refused, so preemption evicts nothing in vain.
func (g *groupPreempt) filter(node string, w *placement.WhatIf) *fwk.Status {
	g.once.Do(func() { g.got = g.plan() })
	p := g.got
	if p == nil {
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, placement.ReasonPrefix+"no eviction of lower-priority pods places the whole group")
	}
	slot := p.Slot(g.uid)
	if slot != node {
		return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("%sgroup %s's preemption frees %s for this pod (domain %s)", placement.ReasonPrefix, p.Group, slot, p.Domain))
	}
	for _, uid := range p.Victims[node] {
		if !w.Removes(uid) {
			return fwk.NewStatus(fwk.Unschedulable, fmt.Sprintf("%sgroup %s needs the GPUs of more pods on %s", placement.ReasonPrefix, p.Group, node))
		}
	}
	return nil
}
