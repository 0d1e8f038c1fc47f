package schedplugin

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	clusterrt "github.com/gputopo/gputopo/placement/cluster"
)

// GPUs through DRA (docs/dra.md). A pod may ask for GPUs with a
// ResourceClaim whose request names a DeviceClass of the configured DRA
// driver (dra.deviceClasses) for an exact count, instead of the device
// plugin's resource. gputopo then decides its node and GPUs as for any GPU
// pod (requirement, patience, the ledger), and kube-scheduler's
// DynamicResources plugin allocates the claim with upstream's allocator,
// unchanged, over a view of the driver's ResourceSlices in which each
// node offers only the GPUs gputopo chose there for the pod
// (DeviceView). What upstream checks still holds: the claim's and the
// class's selectors and constraints, admin access, other drivers'
// devices in the same claim. gputopo-scheduler registers DynamicResources
// over the view as GPUTopologyDynamicResources (cmd/gputopo-scheduler).

// claimGPUs is how many GPUs pod asks through its ResourceClaims: the sum
// of the exact counts of its claims' requests of a served DeviceClass, in
// claims not allocated yet (an allocated claim's devices are chosen). A
// request gputopo cannot choose for (all devices of a class, a
// firstAvailable list that names a served class) is an error that names
// the claim and the fix. only says that the pod's claims ask for nothing
// else: every claim exists, none is allocated or has constraints (which
// gputopo does not model), and each of their requests is an exact count
// of a served class without admin access.
func claimGPUs(pod *corev1.Pod, dra fwk.SharedDRAManager, cfg configv1alpha1.DRA) (gpus int, only bool, err error) {
	if len(pod.Spec.ResourceClaims) == 0 || dra == nil {
		return 0, false, nil
	}
	only = true
	for _, pc := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pc)
		if err != nil || name == nil {
			only = false
			continue // a claim not created yet: DynamicResources' PreEnqueue holds the pod until it is
		}
		c, err := dra.ResourceClaims().Get(pod.Namespace, *name)
		if err != nil || c.Status.Allocation != nil {
			only = false
			continue
		}
		n, err := configv1alpha1.ServedGPUs(c.Spec.Devices.Requests, cfg.DeviceClasses)
		if err != nil {
			return 0, false, fmt.Errorf("ResourceClaim %s/%s %w", c.Namespace, c.Name, err)
		}
		gpus += n
		only = only && len(c.Spec.Devices.Constraints) == 0 && !slices.ContainsFunc(c.Spec.Devices.Requests, func(r resourceapi.DeviceRequest) bool {
			return r.Exactly == nil || !slices.Contains(cfg.DeviceClasses, r.Exactly.DeviceClassName) || ptr.Deref(r.Exactly.AdminAccess, false)
		})
	}
	return gpus, only && gpus > 0, nil
}

// claimSelected returns which of a node's GPUs (UUIDs) the CEL selectors
// of pod's one served request allow (the request's and its
// DeviceClass's), evaluated as upstream's allocator evaluates them, once
// per node; nil when no selector narrows them, or when the pod has more
// than one served request (each is then left to upstream as it is).
func claimSelected(ctx context.Context, pod *corev1.Pod, dra fwk.SharedDRAManager, cfg configv1alpha1.DRA) func(node string) ([]string, bool) {
	if len(pod.Spec.ResourceClaims) == 0 || dra == nil {
		return nil
	}
	var req *resourceapi.ExactDeviceRequest
	for _, pc := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pc)
		if err != nil || name == nil {
			continue
		}
		c, err := dra.ResourceClaims().Get(pod.Namespace, *name)
		if err != nil || c.Status.Allocation != nil {
			continue
		}
		for _, r := range c.Spec.Devices.Requests {
			if r.Exactly != nil && slices.Contains(cfg.DeviceClasses, r.Exactly.DeviceClassName) {
				if req != nil {
					return nil
				}
				req = r.Exactly
			}
		}
	}
	if req == nil {
		return nil
	}
	selectors := slices.Clone(req.Selectors)
	if class, err := dra.DeviceClasses().Get(req.DeviceClassName); err == nil {
		selectors = append(selectors, class.Spec.Selectors...)
	}
	narrows := slices.ContainsFunc(selectors, func(s resourceapi.DeviceSelector) bool { return s.CEL != nil })
	if !narrows {
		return nil
	}
	all, err := dra.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return nil
	}
	uuid := clusterrt.UUIDReader(cfg)
	// Filter asks from parallel goroutines.
	var mu sync.Mutex
	memo := map[string][]string{}
	return func(node string) ([]string, bool) {
		mu.Lock()
		defer mu.Unlock()
		if got, ok := memo[node]; ok {
			return got, true
		}
		allowed := []string{}
		for _, s := range all {
			if s.Spec.Driver != cfg.Driver || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
				continue
			}
			for i := range s.Spec.Devices {
				d := &s.Spec.Devices[i]
				if u := uuid(d); u != "" && deviceMatches(ctx, cfg.Driver, d, selectors) {
					allowed = append(allowed, u)
				}
			}
		}
		memo[node] = allowed
		return allowed, true
	}
}

// deviceMatches says whether every CEL selector matches device d of
// driver (an expression that fails to compile or evaluate does not).
func deviceMatches(ctx context.Context, driver string, d *resourceapi.Device, selectors []resourceapi.DeviceSelector) bool {
	for _, s := range selectors {
		if s.CEL == nil {
			continue
		}
		r := claimCELCache.GetOrCompile(s.CEL.Expression)
		if r.Error != nil {
			return false
		}
		ok, _, err := r.DeviceMatches(ctx, cel.Device{Driver: driver, Attributes: d.Attributes, Capacity: d.Capacity})
		if err != nil || !ok {
			return false
		}
	}
	return true
}

// DeviceView is a SharedDRAManager for a DynamicResources plugin: its
// ResourceSlices, while a pod that asks for GPUs through claims is in its
// PreFilter (Begin to End), list on each node only the driver's devices
// whose UUIDs are the GPUs gputopo chose there for the pod; every other
// slice, and every slice outside that window, is listed as it is.
// DynamicResources reads the slices once, in PreFilter, to build the
// cycle's allocator.
type DeviceView struct {
	fwk.SharedDRAManager
	mu  sync.Mutex
	cur *viewCycle
}

type viewCycle struct {
	driver string
	uuid   func(*resourceapi.Device) string
	choice func(node string) []string
}

// NewDeviceView wraps m.
func NewDeviceView(m fwk.SharedDRAManager) *DeviceView { return &DeviceView{SharedDRAManager: m} }

// Begin makes the slices listed until End those of the pod whose cycle
// state is state: restricted when GPUTopology's PreFilter decided to
// choose its GPUs through claims, as listed otherwise.
func (v *DeviceView) Begin(state fwk.CycleState) {
	var cur *viewCycle
	if d, err := state.Read(cycleKey); err == nil {
		if cy := d.(*cycle); cy.c != nil && cy.dra != nil {
			cur = &viewCycle{driver: cy.dra.Driver, uuid: clusterrt.UUIDReader(*cy.dra), choice: cy.c.Choice}
		}
	}
	v.mu.Lock()
	v.cur = cur
	v.mu.Unlock()
}

// End ends the window Begin opened.
func (v *DeviceView) End() {
	v.mu.Lock()
	v.cur = nil
	v.mu.Unlock()
}

// ResourceSlices implements fwk.SharedDRAManager.
func (v *DeviceView) ResourceSlices() fwk.ResourceSliceLister {
	return viewLister{v: v, inner: v.SharedDRAManager.ResourceSlices()}
}

type viewLister struct {
	v     *DeviceView
	inner fwk.ResourceSliceLister
}

// ListWithDeviceTaintRules implements fwk.ResourceSliceLister.
func (l viewLister) ListWithDeviceTaintRules() ([]*resourceapi.ResourceSlice, error) {
	all, err := l.inner.ListWithDeviceTaintRules()
	l.v.mu.Lock()
	cur := l.v.cur
	l.v.mu.Unlock()
	if err != nil || cur == nil {
		return all, err
	}
	return restrict(all, cur), nil
}

// restrict lists slices with the driver's devices on each node cut to
// the UUIDs cur chose there (none where the pod does not fit).
func restrict(all []*resourceapi.ResourceSlice, cur *viewCycle) []*resourceapi.ResourceSlice {
	chosen := map[string]sets.Set[string]{}
	out := make([]*resourceapi.ResourceSlice, 0, len(all))
	for _, s := range all {
		if s.Spec.Driver != cur.driver || s.Spec.NodeName == nil {
			out = append(out, s)
			continue
		}
		node := *s.Spec.NodeName
		keep, ok := chosen[node]
		if !ok {
			keep = sets.New(cur.choice(node)...)
			chosen[node] = keep
		}
		cp := s.DeepCopy()
		cp.Spec.Devices = slices.DeleteFunc(cp.Spec.Devices, func(d resourceapi.Device) bool {
			return !keep.Has(cur.uuid(&d))
		})
		out = append(out, cp)
	}
	return out
}

// PreemptsForClaims says whether kube-scheduler's preemption may take the
// verdict on a node for the pod of state's cycle from GPUTopology's
// what-if alone, leaving DynamicResources' Filter out: gputopo chooses
// the pod's GPUs through its claims, and the claims ask for nothing else
// (no other driver's devices, no admin access, none allocated yet).
// Upstream's allocator, built in PreFilter, counts the devices of the
// victims' claims as allocated whatever preemption removes, so without
// this a claim pod could never preempt. The real cycle after the
// eviction, victims' claims deallocated, runs upstream's Filter and
// allocator in full (docs/dra.md).
func PreemptsForClaims(state fwk.CycleState) bool {
	d, err := state.Read(cycleKey)
	if err != nil {
		return false
	}
	c := d.(*cycle)
	return c.c != nil && c.dra != nil && c.onlyGPUs
}
