package placement

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// ReasonGPUDoubleHeld is the reason of the Warning Event each pod gets when
// the ledger finds one of its GPUs held by another live pod too.
const ReasonGPUDoubleHeld = "GPUDoubleHeld"

// onDoubleHeld is the ledger's report of GPUs that more than one pod
// holds (added) or no longer does (cleared). It runs under the ledger's
// lock, so it only counts, logs and hands Events to the recorder, which
// never blocks. Every replica counts and logs; only the serving one (the
// leader) records Events, so that standbys do not repeat them.
func (x *Core) onDoubleHeld(added, cleared []ledger.DoubleHold) {
	if len(added) > 0 {
		x.obs.DoubleHeld(len(added))
	}
	for _, d := range added {
		x.log.Error(nil, "GPU held by more than one pod; the ledger keeps every holding and counts the GPU once",
			"node", d.Node, "gpu", d.GPU, "pods", holderNames(d.Holders), "podUIDs", holderUIDs(d.Holders))
		if x.Leading() {
			x.recordDoubleHeld(d)
		}
	}
	for _, d := range cleared {
		x.log.Info("GPU no longer held by more than one pod", "node", d.Node, "gpu", d.GPU, "pods", holderNames(d.Holders))
	}
}

// AnnounceDoubleHolds records Events for every GPU held more than once
// now: a replica that starts serving (its runtime calls it) reports the
// conflicts it found while it was not yet the leader.
func (u Upkeep) AnnounceDoubleHolds() {
	x := u.x
	for _, d := range x.ledger.Report().DoubleHolds() {
		x.recordDoubleHeld(d)
	}
}

// recordDoubleHeld gives each pod of d a Warning Event naming the GPU, the
// node and the other pods.
func (x *Core) recordDoubleHeld(d ledger.DoubleHold) {
	if x.recorder == nil {
		return
	}
	for i, h := range d.Holders {
		others := make([]string, 0, len(d.Holders)-1)
		for j, o := range d.Holders {
			if j != i {
				others = append(others, o.Pod.String())
			}
		}
		ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: h.Pod.Namespace, Name: h.Pod.Name, UID: h.PodUID}
		x.recorder.Eventf(ref, corev1.EventTypeWarning, ReasonGPUDoubleHeld,
			"GPU %s on node %s is also held by pod %s; the scheduler extender keeps both holdings and will not give the GPU to a third pod. Compare the pods' %s annotations with what kubelet allocated",
			d.GPU, d.Node, strings.Join(others, ", "), v1alpha1.AnnotationAllocatedGPUs)
	}
}

func holderNames(hs []ledger.GPUHolder) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Pod.String()
	}
	return out
}

func holderUIDs(hs []ledger.GPUHolder) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = string(h.PodUID)
	}
	return out
}
