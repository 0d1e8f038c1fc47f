package schedplugin

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
)

// A group's pods are planned in PreFilter, on the nodes the pod's own
// rules allow (schedulable), before kube-scheduler's DynamicResources
// filter runs; a pod that also asks for devices through ResourceClaims
// would otherwise get a slot on a node where its claims cannot be
// allocated, and wait there. claimsFit keeps the nodes where upstream's
// structured allocator (the one DynamicResources runs; no copy of it) can
// allocate the pod's claims that are not allocated yet, and where those
// allocated already are usable. DynamicResources still allocates, on the
// node gputopo chose.
//
// It judges each pod's claims alone: two pods of a group placed on one
// node are not checked against each other's devices (DynamicResources
// then refuses the second there, which waits), and it trusts no claim it
// cannot read (a claim from a template not created yet keeps every node).

// claimCELCache is the CEL cache claimsFit compiles selectors into.
var claimCELCache = cel.NewCache(10, cel.Features{})

// claimsFit returns whether node may hold pod's claims; nil when the pod
// has none or the handle serves no DRA objects (every node fits).
func (p *Plugin) claimsFit(ctx context.Context, pod *corev1.Pod) func(*corev1.Node) bool {
	if len(pod.Spec.ResourceClaims) == 0 || p.h == nil || p.h.SharedDRAManager() == nil {
		return nil
	}
	log := klog.FromContext(ctx)
	dra := p.h.SharedDRAManager()
	var pending, allocated []*resourceapi.ResourceClaim
	for _, pc := range pod.Spec.ResourceClaims {
		name, mustCheck, err := resourceclaim.Name(pod, &pc)
		if err != nil || name == nil {
			if err != nil {
				log.V(4).Info("claim not resolvable yet; no node excluded for it", "pod", klog.KObj(pod), "claim", pc.Name, "err", err)
			}
			if mustCheck || err != nil {
				return nil
			}
			continue
		}
		c, err := dra.ResourceClaims().Get(pod.Namespace, *name)
		if err != nil {
			return nil
		}
		if c.Status.Allocation != nil {
			allocated = append(allocated, c)
		} else {
			pending = append(pending, c)
		}
	}
	var alloc structured.Allocator
	if len(pending) > 0 {
		devices, err := dra.ResourceClaims().ListAllAllocatedDevices()
		if err != nil {
			return nil
		}
		slices, err := dra.ResourceSlices().ListWithDeviceTaintRules()
		if err != nil {
			return nil
		}
		state := structured.AllocatedState{AllocatedDevices: devices, AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity: structured.NewConsumedCapacityCollection()}
		if alloc, err = structured.NewAllocator(ctx, structured.Features{}, state, dra.DeviceClasses(), slices, claimCELCache); err != nil {
			log.V(4).Info("claims cannot be judged; no node excluded", "pod", klog.KObj(pod), "err", err)
			return nil
		}
	}
	return func(node *corev1.Node) bool {
		for _, c := range allocated {
			if sel := c.Status.Allocation.NodeSelector; sel != nil {
				ns, err := nodeaffinity.NewNodeSelector(sel)
				if err == nil && !ns.Match(node) {
					return false
				}
			}
		}
		if alloc == nil {
			return true
		}
		res, err := alloc.Allocate(ctx, node, pending)
		return err != nil || res != nil
	}
}

// claimsLeftOut says why n nodes were left out of a group's planning for
// its claims ("" for none), for the pod's waiting reason.
func claimsLeftOut(n int) string {
	switch n {
	case 0:
		return ""
	case 1:
		return "1 node was left out because the pod's ResourceClaims cannot be allocated there"
	}
	return fmt.Sprintf("%d nodes were left out because the pod's ResourceClaims cannot be allocated there", n)
}
