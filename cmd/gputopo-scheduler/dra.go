package main

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/schedplugin"
)

// draName is upstream's DynamicResources plugin, unchanged, over
// gputopo's view of the DRA driver's ResourceSlices (schedplugin.DeviceView):
// for a pod that asks for GPUs through ResourceClaims, each node offers
// only the GPUs gputopo chose there, so that upstream's allocator, with
// every check it makes, allocates exactly those. A profile enables it in
// place of DynamicResources, after GPUTopology at preFilter
// (docs/dra.md).
const draName = "GPUTopologyDynamicResources"

// draPlugin is upstream's plugin with PreFilter opening the view's
// window around its own.
type draPlugin struct {
	*dynamicresources.DynamicResources
	view *schedplugin.DeviceView
}

// Name implements fwk.Plugin.
func (p *draPlugin) Name() string { return draName }

// PreFilter lists the slices for this pod's cycle through the view.
func (p *draPlugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	p.view.Begin(state)
	defer p.view.End()
	return p.DynamicResources.PreFilter(ctx, state, pod, nodes)
}

// PreFilterExtensions makes kube-scheduler's preemption tell the plugin
// which pods its dry run removes from a node (and gives back), so that
// Filter can leave the verdict there to GPUTopology's what-if for a pod
// whose claims ask for GPUs only (schedplugin.PreemptsForClaims).
// Upstream's DynamicResources has no extensions (v1.37.2).
func (p *draPlugin) PreFilterExtensions() fwk.PreFilterExtensions { return p }

// RemovePod records that preemption's dry run took victim off its node.
func (p *draPlugin) RemovePod(_ context.Context, state fwk.CycleState, _ *corev1.Pod, victim fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	if nodeInfo.Node() == nil || !schedplugin.PreemptsForClaims(state) {
		return nil
	}
	r := removedIn(state)
	node := nodeInfo.Node().Name
	if r[node] == nil {
		r[node] = sets.New[types.UID]()
	}
	r[node].Insert(victim.GetPod().UID)
	state.Write(removedKey, r)
	return nil
}

// AddPod records that preemption gave a victim back (a pod nominated to
// the node, never removed, changes nothing).
func (p *draPlugin) AddPod(_ context.Context, state fwk.CycleState, _ *corev1.Pod, pod fwk.PodInfo, nodeInfo fwk.NodeInfo) *fwk.Status {
	if nodeInfo.Node() != nil {
		removedIn(state)[nodeInfo.Node().Name].Delete(pod.GetPod().UID)
	}
	return nil
}

// Filter is upstream's, except inside preemption's dry run on a node it
// took pods off, for a pod whose claims ask for GPUs only: there
// GPUTopology's Filter, which sees the victims' GPUs freed, decides
// alone. Upstream's allocator, built in PreFilter, would count the
// victims' devices as still allocated.
func (p *draPlugin) Filter(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	if nodeInfo.Node() != nil && removedIn(state)[nodeInfo.Node().Name].Len() > 0 {
		return nil
	}
	return p.DynamicResources.Filter(ctx, state, pod, nodeInfo)
}

// removedKey holds, per node, the pods preemption's dry run took off it
// in this cycle state (a copy per candidate node).
const removedKey fwk.StateKey = draName + "/preemption-removed"

type removed map[string]sets.Set[types.UID]

func (r removed) Clone() fwk.StateData {
	out := make(removed, len(r))
	for node, uids := range r {
		out[node] = uids.Clone()
	}
	return out
}

// removedIn is state's record, empty when preemption removed nothing.
func removedIn(state fwk.CycleState) removed {
	if d, err := state.Read(removedKey); err == nil {
		return d.(removed)
	}
	return removed{}
}

// draHandle is the framework's handle with the view as its DRA manager.
type draHandle struct {
	fwk.Handle
	view *schedplugin.DeviceView
}

func (h draHandle) SharedDRAManager() fwk.SharedDRAManager { return h.view }

// newDRA builds upstream's DynamicResources over the view, with the
// feature gates of this kube-scheduler and upstream's default arguments
// (filterTimeout 10s, bindingTimeout 10m); it takes no arguments of its
// own.
func newDRA(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	if u, ok := obj.(*runtime.Unknown); obj != nil && (!ok || len(u.Raw) > 0 && string(u.Raw) != "{}" && string(u.Raw) != "null") {
		return nil, fmt.Errorf("plugin %s takes no args; configure DynamicResources' timeouts there is not supported: remove its pluginConfig entry", draName)
	}
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	args := &config.DynamicResourcesArgs{
		FilterTimeout:  &metav1.Duration{Duration: config.DynamicResourcesFilterTimeoutDefault},
		BindingTimeout: &metav1.Duration{Duration: config.DynamicResourcesBindingTimeoutDefault},
	}
	if h.SharedDRAManager() == nil {
		return nil, fmt.Errorf("plugin %s: the scheduler serves no DRA objects (feature gate DynamicResourceAllocation off?)", draName)
	}
	view := schedplugin.NewDeviceView(h.SharedDRAManager())
	pl, err := dynamicresources.New(ctx, args, draHandle{Handle: h, view: view}, fts)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", draName, err)
	}
	inner, ok := pl.(*dynamicresources.DynamicResources)
	if !ok {
		return nil, fmt.Errorf("plugin %s: upstream's DynamicResources is %T", draName, pl)
	}
	return &draPlugin{DynamicResources: inner, view: view}, nil
}
