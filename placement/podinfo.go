package placement

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// What front ends read of pods and nodes the way the core reads them, so
// that no front end needs the ledger's package.

// PodInfo is what the core keeps of a pod: its GPU count, requirement,
// group and binding.
type PodInfo = ledger.PodInfo

// NewPodInfo reads what the core keeps of pod p, counting resource.
func NewPodInfo(p *corev1.Pod, resource corev1.ResourceName) *PodInfo {
	return ledger.NewPodInfo(p, resource)
}

// GPUCount is the number of devices of resource the pod needs, by
// v1alpha1.PodGPUDemand; a negative, fractional or oversized count is an
// error naming the container's field.
func GPUCount(pod *corev1.Pod, resource corev1.ResourceName) (int, error) {
	return ledger.GPUCount(pod, resource)
}

// CountDistrust is why topology g is not trusted given its Node's
// capacity and allocatable of res (-1: not reported), "" when the counts
// agree; the filter refuses the node with the same words.
func CountDistrust(g *topology.Graph, capacity, allocatable int, res corev1.ResourceName) string {
	return ledger.CountDistrust(g, capacity, allocatable, res)
}
