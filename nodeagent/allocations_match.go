package nodeagent

import (
	"context"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// inProgressWindow is how long after its last allocation a pod still
// counts as the one kubelet is admitting: kubelet allocates a pod's GPU
// containers back to back, so a pod it stopped at (admission refused
// after some containers, a container kubelet does not ask for) must not
// keep winning the next pod's calls.
const inProgressWindow = 10 * time.Second

// kubeletViewTimeout bounds the PodResources read made while kubelet
// waits for a GetPreferredAllocation or Allocate answer.
const kubeletViewTimeout = 2 * time.Second

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
