package nodeagent

import (
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
// which pod an Allocate is for, so the log attributes each call to a pod
// (see attribute), and the reconciler unions it with PodResources.
//
// Nothing is persisted here: once the reconciler has written a pod's
// allocated-gpus, that annotation is the record that survives a restart.

// preferenceTTL bounds how long a GetPreferredAllocation answer names the
// pod of the Allocate that follows it. kubelet calls the two back to back
// for one container, under its admission loop.
const preferenceTTL = 30 * time.Second

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
}

// PendingPodSource lists the pods kubelet may be admitting. A PlanSource
// that also implements it (PodCache does) lets the device plugin attribute
// allocations to pods that have no plan.
type PendingPodSource interface {
	PendingPods(resource corev1.ResourceName) ([]PendingPod, error)
}

// AllocationLog is the device plugin's record of the devices kubelet
// allocated, by pod, including those of one-shot init containers that
// PodResources never reports. A device belongs to at most one pod in the
// log: kubelet hands a device to a new pod only after its holder ended, so
// the latest allocation wins.
type AllocationLog struct {
	logger klog.Logger
	now    func() time.Time

	mu   sync.Mutex
	pods map[types.UID]*podAllocation
	// pref is the pod the last GetPreferredAllocation was for, until the
	// Allocate that follows it.
	pref *preference
	// current is the pod of the last attributed Allocate: kubelet admits
	// one pod at a time, allocating its containers in order.
	current types.UID
}

type podAllocation struct {
	pod     string // namespace/name
	devices map[string]bool
	at      time.Time
}

type preference struct {
	uid     types.UID
	pod     string
	offered map[string]bool // available and must-include devices
	at      time.Time
}

func newAllocationLog(logger klog.Logger) *AllocationLog {
	return &AllocationLog{logger: logger, now: time.Now, pods: map[types.UID]*podAllocation{}}
}

// Allocations is the plugin's record of Allocate calls by pod, for the
// reconciler.
func (p *DevicePlugin) Allocations() *AllocationLog { return p.allocs }

// Devices returns the devices logged for the pod, sorted; nil when none.
func (l *AllocationLog) Devices(uid types.UID) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.pods[uid]
	if a == nil {
		return nil
	}
	return setList(a.devices)
}

// Has reports whether any pod of that namespace/name has devices logged.
func (l *AllocationLog) Has(pod string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.pods {
		if a.pod == pod {
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
	if l.pods[l.current] == nil {
		l.current = ""
	}
	return n
}

// notePreference remembers which pod a GetPreferredAllocation request is
// for, so that the Allocate that follows is attributed to it: the pod that
// already holds the must-include devices (kubelet reuses a one-shot init
// container's devices for the next containers of the same pod only), else
// the pod whose plan answered, else the first pending pod, in admission
// order, that still needs devices.
func (p *DevicePlugin) notePreference(cr *pluginapi.ContainerPreferredAllocationRequest, chosen *Plan) {
	l := p.allocs
	uid, pod, how := l.ownerOf(cr.MustIncludeDeviceIDs), "", "must-include"
	if uid != "" {
		pod = l.podName(uid)
	} else if chosen != nil && chosen.UID != "" {
		uid, pod, how = chosen.UID, chosen.Pod, "plan"
	} else if pp, ok := p.nextPending(nil); ok {
		uid, pod, how = pp.UID, pp.Pod, "pending"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if uid == "" {
		l.pref = nil
		return
	}
	offered := map[string]bool{}
	for _, id := range cr.AvailableDeviceIDs {
		offered[id] = true
	}
	for _, id := range cr.MustIncludeDeviceIDs {
		offered[id] = true
	}
	l.pref = &preference{uid: uid, pod: pod, offered: offered, at: l.now()}
	l.logger.V(2).Info("Preferred allocation attributed", "pod", pod, "by", how)
}

// noteAllocation logs one container's devices against the pod kubelet is
// admitting: the pod of the GetPreferredAllocation just before it, if the
// devices were among those offered; else, when every device is already the
// pod allocated just before (a container reusing its one-shot init
// containers' devices: kubelet asks for no preference then), that pod;
// else the first pending pod, in admission order, that still needs
// devices and whose plan holds them all, else the first that still needs
// devices. An allocation no pod fits is logged and left to PodResources.
func (p *DevicePlugin) noteAllocation(devices []string) {
	if len(devices) == 0 {
		return
	}
	l := p.allocs
	l.mu.Lock()
	uid, pod, how := types.UID(""), "", ""
	if pr := l.pref; pr != nil && l.now().Sub(pr.at) < preferenceTTL && all(devices, pr.offered) {
		uid, pod, how = pr.uid, pr.pod, "preference"
	} else if cur := l.pods[l.current]; cur != nil && l.now().Sub(cur.at) < preferenceTTL && all(devices, cur.devices) {
		uid, pod, how = l.current, cur.pod, "reuse"
	}
	l.pref = nil
	l.mu.Unlock()
	if uid == "" {
		if pp, ok := p.nextPending(devices); ok {
			uid, pod, how = pp.UID, pp.Pod, "pending"
		}
	}
	if uid == "" {
		p.logger.Info("Allocation not attributed to a pod; PodResources is its only record", "devices", devices)
		return
	}
	l.record(uid, pod, devices)
	p.logger.V(1).Info("Allocation attributed", "pod", pod, "devices", devices, "by", how)
}

// record logs devices for the pod and takes them from any other pod.
func (l *AllocationLog) record(uid types.UID, pod string, devices []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for other, a := range l.pods {
		if other == uid {
			continue
		}
		for _, id := range devices {
			delete(a.devices, id)
		}
		if len(a.devices) == 0 {
			delete(l.pods, other)
		}
	}
	a := l.pods[uid]
	if a == nil {
		a = &podAllocation{pod: pod, devices: map[string]bool{}}
		l.pods[uid] = a
	}
	for _, id := range devices {
		a.devices[id] = true
	}
	a.at = l.now()
	l.current = uid
}

// ownerOf is the pod that holds every one of ids in the log; "" when ids
// is empty or they are not all one pod's.
func (l *AllocationLog) ownerOf(ids []string) types.UID {
	if len(ids) == 0 {
		return ""
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for uid, a := range l.pods {
		if all(ids, a.devices) {
			return uid
		}
	}
	return ""
}

func (l *AllocationLog) podName(uid types.UID) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.pods[uid]; a != nil {
		return a.pod
	}
	return ""
}

// needs is how many more devices the pod needs than the log and its
// allocated-gpus account for.
func (l *AllocationLog) needs(pp PendingPod) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	have := map[string]bool{}
	if a := l.pods[pp.UID]; a != nil {
		for id := range a.devices {
			have[id] = true
		}
	}
	for _, id := range pp.Recorded {
		have[id] = true
	}
	return pp.Demand - len(have)
}

// nextPending is the first pending pod, in kubelet's admission order, that
// still needs devices; with devices given, one whose plan holds them all
// comes first.
func (p *DevicePlugin) nextPending(devices []string) (PendingPod, bool) {
	src, ok := p.plans.(PendingPodSource)
	if !ok {
		return PendingPod{}, false
	}
	pending, err := src.PendingPods(corev1.ResourceName(p.opts.ResourceName))
	if err != nil {
		p.logger.Error(err, "Listing pending pods failed")
		return PendingPod{}, false
	}
	plans := make([]Plan, len(pending))
	byPod := make(map[string]PendingPod, len(pending))
	for i, pp := range pending {
		plans[i] = pp.Plan
		byPod[pp.Pod] = pp
	}
	p.mu.Lock()
	start := p.kubeletStart
	p.mu.Unlock()
	SortPlans(plans, start)
	var first *PendingPod
	for _, pl := range plans {
		pp := byPod[pl.Pod]
		if p.allocs.needs(pp) <= 0 {
			continue
		}
		if len(devices) == 0 || all(devices, setOf(pl.GPUs)) {
			return pp, true
		}
		if first == nil {
			first = &pp
		}
	}
	if first == nil {
		return PendingPod{}, false
	}
	return *first, true
}

// PendingPods implements PendingPodSource from the cache: pods bound here,
// Pending, not being deleted, needing the resource.
func (c *PodCache) PendingPods(resource corev1.ResourceName) ([]PendingPod, error) {
	pods, err := c.lister.List(everything)
	if err != nil {
		return nil, err
	}
	var out []PendingPod
	for _, p := range pods {
		if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" || p.DeletionTimestamp != nil {
			continue
		}
		demand, err := v1alpha1.PodGPUDemand(&p.Spec, resource)
		if err != nil || demand <= 0 {
			continue
		}
		// Malformed annotations count as empty: the webhook keeps such
		// values out, and the plan only orders candidates.
		gpus, _ := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
		recorded, _ := v1alpha1.ParseGPUList(v1alpha1.AnnotationAllocatedGPUs, p.Annotations[v1alpha1.AnnotationAllocatedGPUs])
		out = append(out, PendingPod{Plan: planOf(p, gpus), Demand: int(demand), Recorded: recorded})
	}
	return out, nil
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

// planHolding is the plan pickPlan answered from: the first, in the order
// given, that holds every one of ids (an earlier plan holding them all
// would have answered itself).
func planHolding(plans []Plan, ids []string) *Plan {
	for i := range plans {
		if all(ids, setOf(plans[i].GPUs)) {
			return &plans[i]
		}
	}
	return nil
}
