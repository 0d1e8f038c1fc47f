package ledger

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Freed is a preemption victim's GPUs, freed when it went: the pod, the
// node, and its GPUs by UUID and index.
type Freed struct {
	Pod     types.NamespacedName
	Node    string
	UUIDs   []string
	Indices []int
	At      time.Time
	// Priority is the victim's: only a pod of higher priority preempts.
	Priority int32
}

// freedTTL is how long a victim's freed GPUs are remembered for the pod
// that preempted it: its victims terminate within their grace period
// (30 s by default), and it is bound within seconds of that.
const freedTTL = 10 * time.Minute

// maxFreed bounds the remembered victims (a burst of preemptions whose
// preemptors never bind).
const maxFreed = 4096

// preemptedBy says whether kube-scheduler is preempting the pod: it marks
// a victim with the DisruptionTarget condition, reason
// PreemptionByScheduler, before it deletes it.
func preemptedBy(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue && c.Reason == corev1.PodReasonPreemptionByScheduler {
			return true
		}
	}
	return false
}

// noteFreedLocked remembers the GPUs of victim h, which is going.
func (l *Ledger) noteFreedLocked(info *PodInfo, h *holding) {
	if info == nil || !info.Preempted || h == nil || len(h.uuids) == 0 {
		return
	}
	now := l.now()
	l.freed = slices.DeleteFunc(l.freed, func(f Freed) bool { return now.Sub(f.At) > freedTTL })
	if len(l.freed) >= maxFreed {
		l.freed = slices.Delete(l.freed, 0, len(l.freed)-maxFreed+1)
	}
	f := Freed{Pod: h.pod, Node: h.node, UUIDs: slices.Clone(h.uuids), At: now, Priority: info.Priority}
	if n := l.nodes[h.node]; n != nil && n.graph != nil {
		for _, u := range h.uuids {
			if i, ok := n.graph.IndexOf(u); ok {
				f.Indices = append(f.Indices, i)
			}
		}
	}
	l.freed = append(l.freed, f)
}

// TakeFreed returns, and forgets, the preemption victims of the last
// freedTTL on node, of priority below prio, whose GPUs include one of
// uuids: the pods whose eviction freed GPUs a pod of priority prio was
// bound to.
func (l *Ledger) TakeFreed(node string, uuids []string, prio int32) []Freed {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	var out []Freed
	l.freed = slices.DeleteFunc(l.freed, func(f Freed) bool {
		if now.Sub(f.At) > freedTTL {
			return true
		}
		if f.Node != node || f.Priority >= prio || !slices.ContainsFunc(f.UUIDs, func(u string) bool { return slices.Contains(uuids, u) }) {
			return false
		}
		out = append(out, f)
		return true
	})
	return out
}
