package ledger

import (
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What is expected to free, and who waits for it: the evidence a pod's
// patience (placement/patience.go) weighs before it refuses slower GPUs.
// Two kinds of evidence count: GPUs that pods which ran gave back lately
// on a node when they ended (the measured churn), and the GPUs of pods
// whose activeDeadlineSeconds ends them soon. A pod that never started (a
// bind no kubelet ran, a pod deleted while it waited for its containers)
// and a preemption victim are no evidence that more GPUs will free.
//
// An informer cannot tell a pod that ran to its end from one deleted
// while it ran: both leave a watch that skips finished pods as a delete
// carrying the pod's last running state. Both count: either way a
// running job's GPUs turned over.

// finished is what one pod that ran gave back when it ended.
type finished struct {
	node string
	at   time.Time
	gpus int
}

// finishedTTL is how long an ended pod's GPUs are remembered (the longest
// patience.bandwidthWait the configuration accepts); callers ask
// for a window of their own within it (Finished).
const finishedTTL = 24 * time.Hour

// maxFinished bounds the remembered finished pods.
const maxFinished = 8192

// noteEndedLocked remembers the GPUs of pod info, which is going, with
// its holding h: when it had started and was not preempted.
func (l *Ledger) noteEndedLocked(info *PodInfo, h *holding) {
	if h == nil || h.reserved || h.node == "" || info.Started.IsZero() || info.Preempted {
		return
	}
	gpus := len(h.uuids) + h.unknown
	if gpus == 0 {
		return
	}
	now := l.now()
	cut := 0
	for cut < len(l.finished) && now.Sub(l.finished[cut].at) > finishedTTL {
		cut++
	}
	if over := len(l.finished) - cut - maxFinished + 1; over > 0 {
		cut += over
	}
	l.finished = append(slices.Delete(l.finished, 0, cut), finished{node: h.node, at: now, gpus: gpus})
}

// Finished calls fn with each node (that the ledger still has) and the
// GPUs that pods which ran gave back there, when they ended, since since.
func (v View) Finished(since time.Time, fn func(n *Node, gpus int)) {
	f := v.l.finished
	i, _ := slices.BinarySearchFunc(f, since, func(e finished, t time.Time) int { return e.at.Compare(t) })
	for _, e := range f[i:] {
		if n := v.node(e.node); n != nil {
			fn(n, e.gpus)
		}
	}
}

// Ending calls fn with each node and the GPUs held there by a bound pod
// whose activeDeadlineSeconds ends it by by (it started, or it starts
// now, that long before).
func (v View) Ending(by time.Time, fn func(n *Node, gpus int)) {
	now := v.l.now()
	for _, info := range v.l.pods {
		if info.Node == "" || info.Deadline <= 0 {
			continue
		}
		start := info.Started
		if start.IsZero() {
			start = now
		}
		if start.Add(info.Deadline).After(by) {
			continue
		}
		h := v.l.holdings[info.UID]
		n := v.node(info.Node)
		if h == nil || n == nil {
			continue
		}
		if gpus := len(h.uuids) + h.unknown; gpus > 0 {
			fn(n, gpus)
		}
	}
}

// WaitingAhead is the GPUs asked by the pods that wait ahead of a pod
// created at created with key key for the same kind of set: pending GPU
// pods outside groups that ask for bandwidth between their GPUs, created
// since since and before it (ties by namespace/name), the pod itself left
// out.
func (v View) WaitingAhead(created, since time.Time, key types.NamespacedName) int {
	sum := 0
	for k, info := range v.l.pods {
		if info.Node != "" || !info.AsksBandwidth || info.Group != "" || k == key || info.Created.Before(since) {
			continue
		}
		switch c := info.Created.Compare(created); {
		case c > 0:
			continue
		case c == 0 && strings.Compare(k.String(), key.String()) > 0:
			continue
		}
		sum += info.GPUs
	}
	return sum
}

// Usable says whether n's topology is valid, not marked stale by its agent
// and trusted (the nodes View.Shapes counts).
func (n *Node) Usable() bool { return n.shape != nil }

// Object is n's Node object (nil before kube-scheduler's Node is seen).
func (n *Node) Object() *corev1.Node { return n.obj }
