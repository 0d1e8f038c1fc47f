package nodeagent

import (
	"context"
	"slices"
	"sort"
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

// inProgressWindow is how long after its last allocation a pod still
// counts as the one kubelet is admitting: kubelet allocates a pod's GPU
// containers back to back, so a pod it stopped at (admission refused
// after some containers, a container kubelet does not ask for) must not
// keep winning the next pod's calls.
const inProgressWindow = 10 * time.Second

// kubeletViewTimeout bounds the PodResources read made while kubelet
// waits for a GetPreferredAllocation or Allocate answer.
const kubeletViewTimeout = 2 * time.Second

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

// kubeletCall is one call of kubelet's device manager for one container.
type kubeletCall struct {
	// preferred is a GetPreferredAllocation, with available (the free
	// devices and the must-include ones) and mustInclude (the devices
	// kubelet already took for the container: reused ones of the pod's
	// one-shot init containers, or NUMA-aligned ones); otherwise an
	// Allocate of devices.
	preferred   bool
	size        int
	available   []string
	mustInclude []string
	devices     []string
}

// candidate is a pending pod with where kubelet stands in its GPU
// containers, as the log knows it.
type candidate struct {
	PendingPod
	done  int
	reuse map[string]bool
	held  map[string]bool
	// recent: the pod's last allocation is within inProgressWindow.
	recent bool
}

// inProgress reports whether kubelet is in the middle of this pod's GPU
// containers: some are allocated, the last one lately.
func (c *candidate) inProgress() bool { return c.done > 0 && c.recent }

// next is the pod's next GPU container kubelet will allocate.
func (c *candidate) next() (ContainerGPUs, bool) {
	if c.done >= len(c.Containers) {
		return ContainerGPUs{}, false
	}
	return c.Containers[c.done], true
}

// fits reports whether call can be kubelet's call for the pod's next
// container. kubelet first takes the pod's reusable devices; it asks for a
// preference only when they do not cover the container, with all of them
// as must-include, and then allocates them with the rest
// (devicemanager.devicesToAllocate).
func (c *candidate) fits(call kubeletCall) bool {
	step, ok := c.next()
	if !ok || step.GPUs != call.size {
		return false
	}
	reuse := setList(c.reuse)
	if call.preferred {
		return len(reuse) < step.GPUs && all(reuse, setOf(call.mustInclude))
	}
	if len(reuse) >= step.GPUs {
		return all(call.devices, c.reuse)
	}
	return all(reuse, setOf(call.devices))
}

// planServes reports whether the pod's plan can answer call: for a
// preference, the plan has size of the offered devices; for an Allocate,
// the plan holds every device not reused.
func (c *candidate) planServes(call kubeletCall) bool {
	if len(c.GPUs) == 0 {
		return false
	}
	plan := setOf(c.GPUs)
	if call.preferred {
		offered := setOf(call.available)
		for _, id := range call.mustInclude {
			offered[id] = true
		}
		n := 0
		for id := range offered {
			if plan[id] {
				n++
			}
		}
		return n >= call.size
	}
	for _, id := range call.devices {
		if !plan[id] && !c.reuse[id] {
			return false
		}
	}
	return true
}

// kubeletView is one PodResources List: the pods kubelet has taken in
// (kubelet adds a pod to its pod manager right before admitting it, and
// List reads the pod manager), each with the devices of the resource it
// shows (app containers and sidecars allocated so far).
type kubeletView map[string][]string

// candidates are the pending pods kubelet may still be allocating, in
// kubelet's admission order, with the log's progress for each. A pod whose
// every GPU container the log has seen is not one; neither is a pod the log
// has not seen at all whose allocated-gpus already covers its demand
// (recorded before this process started).
func (l *AllocationLog) candidates(pending []PendingPod, kubeletStart time.Time) []*candidate {
	pending = slices.Clone(pending)
	sort.SliceStable(pending, func(i, j int) bool { return admittedBefore(pending[i].Plan, pending[j].Plan, kubeletStart) })
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*candidate
	for _, pp := range pending {
		c := &candidate{PendingPod: pp, reuse: map[string]bool{}, held: map[string]bool{}}
		if a := l.pods[pp.UID]; a != nil {
			c.done = a.done
			c.recent = l.now().Sub(a.at) < inProgressWindow
			for id := range a.reuse {
				c.reuse[id] = true
			}
			for id := range a.devices {
				c.held[id] = true
			}
		}
		if c.done >= len(c.Containers) || c.done == 0 && len(c.held) == 0 && len(pp.Recorded) >= pp.Demand {
			continue
		}
		out = append(out, c)
	}
	return out
}

// reuses reports whether call names devices the pod holds for reuse (the
// must-include devices of a preference, the devices of an Allocate):
// kubelet gives those to no other pod while the pod lives.
func (c *candidate) reuses(call kubeletCall) bool {
	ids := call.devices
	if call.preferred {
		ids = call.mustInclude
	}
	for _, id := range ids {
		if c.reuse[id] {
			return true
		}
	}
	return false
}

// choose is the pod a call is for, among the candidates that fit it (in
// admission order), with how it was told:
//
//  1. a pod whose reusable devices the call names is the pod;
//  2. with kubelet's view, only pods kubelet has taken in and whose shown
//     devices the log accounts for (a pod kubelet has not reached cannot
//     be admitted now; one with devices the log did not see was admitted
//     before);
//  3. a single one left is the pod;
//  4. a pod kubelet is in the middle of beats those it has not started
//     (kubelet admits one pod at a time and allocates its containers back
//     to back);
//  5. a pod whose plan can serve the call beats those whose cannot;
//  6. then, with the view, the latest in admission order (the pod kubelet
//     took in last); without it, the first.
func choose(fit []*candidate, call kubeletCall, view kubeletView) (*candidate, string) {
	if f := filter(fit, func(c *candidate) bool { return c.reuses(call) }); len(f) == 1 {
		return f[0], "reuse"
	}
	how := "only fit"
	if view != nil {
		fit = filter(fit, func(c *candidate) bool {
			shown, ok := view[c.Pod]
			return ok && all(shown, c.held)
		})
		how = "only fit kubelet lists"
	}
	switch len(fit) {
	case 0:
		return nil, ""
	case 1:
		return fit[0], how
	}
	if f := filter(fit, func(c *candidate) bool { return c.inProgress() }); len(f) > 0 {
		fit, how = f, "in progress"
		if len(fit) == 1 {
			return fit[0], how
		}
	}
	if f := filter(fit, func(c *candidate) bool { return c.planServes(call) }); len(f) > 0 {
		fit, how = f, "plan fits"
		if len(fit) == 1 {
			return fit[0], how
		}
	}
	if view != nil {
		return fit[len(fit)-1], "latest kubelet lists"
	}
	return fit[0], "admission order"
}

func filter(cs []*candidate, keep func(*candidate) bool) []*candidate {
	var out []*candidate
	for _, c := range cs {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// resolve finds the pod and container a call of kubelet's is for (nil
// when no pending pod can be), with how it was told and the other
// candidates (whose plans a pod without one should not take). The pods
// come from the cache, and once more from a live read when no pod the
// cache holds is one kubelet can be admitting. kubelet's PodResources is
// read at most once per call, and not when the call names a pod's
// reusable devices or fits exactly one pod, already in progress.
func (p *DevicePlugin) resolve(ctx context.Context, call kubeletCall) (*candidate, string, []*candidate) {
	var view kubeletView
	viewRead := false
	var others []*candidate
	for _, live := range []bool{false, true} {
		pending, err := p.pods.PendingPods(ctx, corev1.ResourceName(p.opts.ResourceName), live)
		if err != nil {
			p.logger.Error(err, "Listing pending pods failed", "live", live)
			continue
		}
		p.mu.Lock()
		start := p.kubeletStart
		p.mu.Unlock()
		cands := p.allocs.candidates(pending, start)
		others = cands
		fit := filter(cands, func(c *candidate) bool { return c.fits(call) })
		if f := filter(fit, func(c *candidate) bool { return c.reuses(call) }); len(f) == 1 {
			return f[0], "reuse", without(cands, f[0])
		}
		if len(fit) == 1 && fit[0].inProgress() {
			return fit[0], "in progress", without(cands, fit[0])
		}
		if len(fit) == 0 {
			continue
		}
		if !viewRead {
			view, viewRead = p.kubeletView(ctx), true
		}
		if c, how := choose(fit, call, view); c != nil {
			return c, how, without(cands, c)
		}
	}
	return nil, "", others
}

func without(cs []*candidate, c *candidate) []*candidate {
	return filter(cs, func(o *candidate) bool { return o != c })
}

// kubeletView reads kubelet's PodResources; nil when the log has no
// lister or the read fails (the matcher then goes without it).
func (p *DevicePlugin) kubeletView(ctx context.Context) kubeletView {
	p.allocs.mu.Lock()
	pr := p.allocs.kubelet
	p.allocs.mu.Unlock()
	if pr == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, kubeletViewTimeout)
	defer cancel()
	list, err := pr.List(ctx)
	if err != nil {
		p.logger.Info("Reading kubelet's pod resources failed; matching the request without them", "err", err.Error())
		return nil
	}
	view := kubeletView{}
	for _, pr := range list {
		key := pr.Namespace + "/" + pr.Name
		if _, ok := view[key]; !ok {
			view[key] = []string{}
		}
		for _, c := range pr.Containers {
			for _, d := range c.Devices {
				if d.ResourceName == p.opts.ResourceName {
					view[key] = append(view[key], d.DeviceIds...)
				}
			}
		}
	}
	return view
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
