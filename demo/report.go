package demo

import (
	"github.com/gputopo/gputopo/internal/picture"
)

// NodeView is one node as the report shows it.
type NodeView = picture.NodeView

// PodView is one placed pod.
type PodView = picture.PodView

// Placed is a placed pod, the job it belongs to, and the group its
// placement record names.
type Placed struct {
	PodView
	// Job is the workload the pod belongs to (Workload.Name), UUIDs its
	// GPUs.
	Job   string
	UUIDs []string
	// Evicted says a later workload (EvictedBy) preempted the pod.
	Evicted   bool
	EvictedBy string
	// Group is the pod's group (namespace/name) and Domain the fabric
	// domain the whole group was placed in, from the pod's placement
	// record; both empty for a pod placed alone, and under plain
	// kube-scheduler.
	Group, Domain string
}

// live are the pods of placed still bound (not preempted), as pictured.
func live(placed []Placed) []PodView {
	var out []PodView
	for _, p := range placed {
		if !p.Evicted {
			out = append(out, p.PodView)
		}
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
