package placement

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/placement/ledger"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// ReasonGPUsBound is the reason of the Normal Event a pod gets when the
// extender binds it: the GPUs, their link tier and bandwidths, so that
// `kubectl describe pod` answers "which GPUs did I get, and how well are
// they connected" without reading annotations.
const ReasonGPUsBound = "GPUsBound"

// ReasonPlacementFellBack is the reason of the Warning Event a pod gets,
// besides GPUsBound, when it was bound after its requirement's
// fallbackAfter to GPUs that miss its NVLink or bandwidth requirement.
const ReasonPlacementFellBack = "PlacementFellBack"

// ReasonPreemptionFreedGPUs is the reason of the Normal Event a pod gets
// when it is bound to GPUs that pods of lower priority held until
// preemption evicted them (in the last 10 minutes): it names each of those
// pods and the GPUs it freed.
const ReasonPreemptionFreedGPUs = "PreemptionFreedGPUs"

// recordFreed gives the pod, bound to GPUs preemption freed, its
// PreemptionFreedGPUs Event and logs it.
func (x *Core) recordFreed(ctx context.Context, b BindRequest, freed []ledger.Freed) {
	var victims, shown []string
	other, otherGPUs := 0, []string{}
	for _, f := range freed {
		idx := make([]string, len(f.Indices))
		for j, g := range f.Indices {
			idx[j] = fmt.Sprint(g)
		}
		v := fmt.Sprintf("%s (GPUs %s: %s)", f.Pod, strings.Join(idx, ","), strings.Join(f.UUIDs, ", "))
		victims = append(victims, v)
		// The event is the pod's, readable in its namespace: pods of other
		// namespaces are counted, not named (their owners see
		// kube-scheduler's Preempted event on each).
		if f.Pod.Namespace == b.Key.Namespace {
			shown = append(shown, v)
		} else {
			other++
			otherGPUs = append(otherGPUs, idx...)
		}
	}
	if other > 0 {
		shown = append(shown, fmt.Sprintf("%d pods of other namespaces (GPUs %s)", other, strings.Join(otherGPUs, ",")))
	}
	msg := fmt.Sprintf("node %s: preemption freed the GPUs of %s", b.Node, strings.Join(shown, "; "))
	klog.FromContext(ctx).V(2).Info("pod bound to GPUs preemption freed", "pod", b.Key, "node", b.Node, "victims", victims)
	if x.recorder == nil || !x.Leading() {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: b.Key.Namespace, Name: b.Key.Name, UID: b.UID}
	x.recorder.Event(ref, corev1.EventTypeNormal, ReasonPreemptionFreedGPUs, msg)
}

// recordBound gives the pod its GPUsBound Event (events.gpusBound), and a PlacementFellBack
// Warning when the placement is degraded. Only the serving replica
// (the leader) binds, and it records through the same rate-limited
// broadcaster as GPUDoubleHeld; without a cluster (the simulator) there is
// no recorder and nothing is recorded.
func (x *Core) recordBound(b BindRequest, uuids []string, p v1alpha1.Placement) {
	if x.recorder == nil || !x.Leading() {
		return
	}
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: b.Key.Namespace, Name: b.Key.Name, UID: b.UID}
	if x.cfg.GPUsBoundEvent() {
		x.recorder.Event(ref, corev1.EventTypeNormal, ReasonGPUsBound, boundMessage(b.Node, uuids, p))
	}
	if p.Degraded {
		x.recorder.Event(ref, corev1.EventTypeWarning, ReasonPlacementFellBack, p.DegradedReason)
	}
}

// boundMessage is the GPUsBound Event's text: "node n1: GPUs 0,1 (GPU-a,
// GPU-b), tier nvlink, ring 100 GB/s, min pair 100 GB/s (bidirectional),
// strategy highest_bandwidth".
func boundMessage(node string, uuids []string, p v1alpha1.Placement) string {
	idx := make([]string, len(p.GPUIndices))
	for i, g := range p.GPUIndices {
		idx[i] = fmt.Sprint(g)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node %s: GPUs %s (%s), tier %s", node, strings.Join(idx, ","), strings.Join(uuids, ", "), p.Tier)
	if len(p.GPUIndices) > 1 {
		fmt.Fprintf(&b, ", ring %d GB/s, min pair %d GB/s (bidirectional)", p.RingBandwidthGBps, p.MinPairBandwidthGBps)
	}
	fmt.Fprintf(&b, ", strategy %s", p.Strategy)
	if p.Heuristic {
		b.WriteString(" (heuristic choice: the exact search ran out of its work budget)")
	}
	return b.String()
}
