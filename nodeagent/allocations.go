package nodeagent

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Why an allocation log exists: kubelet's PodResources API reports the
// devices of app containers and sidecars (restartable init containers),
// never those of one-shot init containers. Yet kubelet's device manager
// keeps a one-shot init container's devices with the pod until the pod
// ends, and hands them on to the containers after it: a pod with an init
// container of 4 GPUs and an app container of 2 holds 4, of which
// PodResources shows 2. Only the device plugin sees the other 2, in the
// Allocate call for the init container. The device plugin API does not say
// which pod a call is for, so the log matches every call to a pod and to
// that pod's next container (see resolve), and the reconciler unions it
// with PodResources.
//
// Nothing is persisted here: once the reconciler has written a pod's
// allocated-gpus, that annotation is the record that survives a restart.

// preferenceTTL bounds how long a GetPreferredAllocation answer names the
// pod of the Allocate that follows it. kubelet calls the two back to back
// for one container, under its admission loop.
const preferenceTTL = 5 * time.Second

// forgetPreference drops the last GetPreferredAllocation's answer: the
// Allocate it was for failed, so no later Allocate may be read as its.
func (l *AllocationLog) forgetPreference() {
	l.mu.Lock()
	l.pref = nil
	l.mu.Unlock()
}

// PendingPod is a pod bound to this node that kubelet may be admitting:
// Pending, not being deleted, with a demand for the resource.
type PendingPod struct {
	// Plan is the pod's assignment; its GPUs are empty when the pod has
	// none (the extender was bypassed).
	Plan
	// Demand is the pod's v1alpha1.PodGPUDemand.
	Demand int
	// Recorded are the GPUs its allocated-gpus annotation names.
	Recorded []string
	// Containers are the pod's containers that ask for the resource, in
	// the order kubelet allocates them.
	Containers []ContainerGPUs
}

// ContainerGPUs is one container of a pod that asks for the resource.
type ContainerGPUs struct {
	Name string
	GPUs int
	// OneShot is a one-shot init container: kubelet keeps its devices
	// for the pod's later containers to reuse first.
	OneShot bool
}

// PodContainerGPUs lists the containers of spec that ask for resource in
// kubelet's allocation order (pkg/kubelet/cm/topologymanager: init
// containers, sidecars among them, in spec order, then app containers),
// each with its count by the demand rule (v1alpha1.PodGPUDemand of the
// container alone).
func PodContainerGPUs(spec *corev1.PodSpec, resource corev1.ResourceName) ([]ContainerGPUs, error) {
	var out []ContainerGPUs
	add := func(c corev1.Container, oneShot bool) error {
		n, err := v1alpha1.PodGPUDemand(&corev1.PodSpec{Containers: []corev1.Container{c}}, resource)
		if err != nil {
			return err
		}
		if n > 0 {
			out = append(out, ContainerGPUs{Name: c.Name, GPUs: int(n), OneShot: oneShot})
		}
		return nil
	}
	for _, c := range spec.InitContainers {
		if err := add(c, c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways); err != nil {
			return nil, err
		}
	}
	for _, c := range spec.Containers {
		if err := add(c, false); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// PodSource lists the pods kubelet may be admitting. live asks for a read
// that does not trust a cache (used when the cache has no pod that fits: a
// pod kubelet already sees may not have reached the cache yet).
type PodSource interface {
	PendingPods(ctx context.Context, resource corev1.ResourceName, live bool) ([]PendingPod, error)
}

// AllocationLog is the device plugin's record of the devices kubelet
// allocated, by pod, including those of one-shot init containers that
// PodResources never reports, and of how far kubelet got through each
// pod's GPU containers. A device belongs to at most one pod in the log:
// kubelet hands a device to a new pod only after its holder ended, so the
// latest allocation wins.
type AllocationLog struct {
	logger klog.Logger
	now    func() time.Time

	mu   sync.Mutex
	pods map[types.UID]*podAllocation
	// pref is the pod and container the last GetPreferredAllocation was
	// for, until the Allocate that follows it.
	pref *preference
	// kubelet is kubelet's PodResources API, read to tell which pending
	// pod kubelet is admitting; nil when unknown.
	kubelet PodResourcesLister
}

type podAllocation struct {
	pod     string // namespace/name
	devices map[string]bool
	at      time.Time
	// done counts the pod's GPU containers kubelet has allocated (in
	// PodContainerGPUs order); reuse is the devices kubelet takes first
	// for the next ones: what its one-shot init containers got, less what
	// sidecars and app containers took since (devicemanager.Allocate).
	done  int
	reuse map[string]bool
}

type preference struct {
	uid     types.UID
	pod     string
	step    ContainerGPUs
	offered map[string]bool // available and must-include devices
	at      time.Time
}

func newAllocationLog(logger klog.Logger) *AllocationLog {
	return &AllocationLog{logger: logger, now: time.Now, pods: map[types.UID]*podAllocation{}}
}

// Allocations is the plugin's record of Allocate calls by pod, for the
// reconciler.
func (p *DevicePlugin) Allocations() *AllocationLog { return p.allocs }

// UsePodResources lets the log read kubelet's PodResources API to tell
// which pending pod kubelet is admitting (Reconciler.UseAllocations passes
// the reconciler's client). A lister already set is kept.
func (l *AllocationLog) UsePodResources(pr PodResourcesLister) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kubelet == nil && pr != nil {
		l.kubelet = pr
	}
}

// Devices returns the devices logged for the pod, sorted; nil when none.
func (l *AllocationLog) Devices(uid types.UID) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.pods[uid]
	if a == nil || len(a.devices) == 0 {
		return nil
	}
	return setList(a.devices)
}

// Has reports whether any pod of that namespace/name has devices logged.
func (l *AllocationLog) Has(pod string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.pods {
		if a.pod == pod && len(a.devices) > 0 {
			return true
		}
	}
	return false
}

// Forget drops the pods not in live whose last allocation was before
// (when kubelet's pod list was taken: a pod allocated after it may not be
// in that list yet). It returns how many were dropped.
func (l *AllocationLog) Forget(live map[types.UID]bool, before time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for uid, a := range l.pods {
		if !live[uid] && a.at.Before(before) {
			delete(l.pods, uid)
			n++
		}
	}
	return n
}

// record logs devices for the pod and takes them from any other pod.
func (l *AllocationLog) record(uid types.UID, pod string, devices []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recordLocked(uid, pod, devices)
}

func (l *AllocationLog) recordLocked(uid types.UID, pod string, devices []string) *podAllocation {
	for other, a := range l.pods {
		if other == uid {
			continue
		}
		for _, id := range devices {
			delete(a.devices, id)
			delete(a.reuse, id)
		}
		if len(a.devices) == 0 {
			delete(l.pods, other)
		}
	}
	a := l.pods[uid]
	if a == nil {
		a = &podAllocation{pod: pod, devices: map[string]bool{}, reuse: map[string]bool{}}
		l.pods[uid] = a
	}
	for _, id := range devices {
		a.devices[id] = true
	}
	a.at = l.now()
	return a
}

// advance logs the Allocate of the pod's container step: its devices
// become the pod's, and kubelet's reuse set moves as devicemanager moves
// it (a one-shot init container's devices join it; a sidecar's or app
// container's leave it).
func (l *AllocationLog) advance(uid types.UID, pod string, step ContainerGPUs, devices []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.recordLocked(uid, pod, devices)
	a.done++
	for _, id := range devices {
		if step.OneShot {
			a.reuse[id] = true
		} else {
			delete(a.reuse, id)
		}
	}
}

// notePreference remembers which pod and container a
// GetPreferredAllocation was for (nil: none), so that the Allocate that
// follows is logged against them.
func (p *DevicePlugin) notePreference(cr *pluginapi.ContainerPreferredAllocationRequest, c *candidate, how string) {
	l := p.allocs
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pref = nil
	if c == nil {
		return
	}
	step, _ := c.next()
	offered := setOf(cr.AvailableDeviceIDs)
	for _, id := range cr.MustIncludeDeviceIDs {
		offered[id] = true
	}
	l.pref = &preference{uid: c.UID, pod: c.Pod, step: step, offered: offered, at: l.now()}
	l.logger.V(2).Info("Preferred allocation matched", "pod", c.Pod, "container", step.Name, "by", how)
}

// noteAllocation logs one container's devices against the pod and
// container kubelet is allocating: those of the GetPreferredAllocation
// just before it, when the devices were among those offered and are as
// many as that container asks for; else those resolve finds for the
// Allocate itself (a container that reuses its pod's devices only, for
// which kubelet asks no preference, is the pod's in progress whose
// reusable devices hold them all). An allocation no pending pod can take
// is logged and left to PodResources.
func (p *DevicePlugin) noteAllocation(ctx context.Context, devices []string) {
	if len(devices) == 0 {
		return
	}
	l := p.allocs
	l.mu.Lock()
	pr := l.pref
	l.pref = nil
	l.mu.Unlock()
	if pr != nil && l.now().Sub(pr.at) < preferenceTTL && pr.step.GPUs == len(devices) && all(devices, pr.offered) {
		l.advance(pr.uid, pr.pod, pr.step, devices)
		p.logger.V(1).Info("Allocation attributed", "pod", pr.pod, "container", pr.step.Name, "devices", devices, "by", "preference")
		return
	}
	c, how, _ := p.resolve(ctx, kubeletCall{size: len(devices), devices: devices})
	if c == nil {
		p.logger.Info("Allocation not attributed to a pod; PodResources is its only record", "devices", devices)
		return
	}
	step, _ := c.next()
	l.advance(c.UID, c.Pod, step, devices)
	p.logger.V(1).Info("Allocation attributed", "pod", c.Pod, "container", step.Name, "devices", devices, "by", how)
}

func all(ids []string, in map[string]bool) bool {
	for _, id := range ids {
		if !in[id] {
			return false
		}
	}
	return true
}

func setOf(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

func setList(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
