package ledger_test

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/placement/ledger"
)

// preempting is p as kube-scheduler marks a victim before deleting it.
func preempting(p *corev1.Pod) *corev1.Pod {
	q := p.DeepCopy()
	q.Status.Conditions = append(q.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: corev1.PodReasonPreemptionByScheduler})
	return q
}

// A victim of preemption leaves its GPUs to the pod that preempted it:
// TakeFreed names the victim and its GPUs once, for a bind that takes one
// of them; a pod that simply ended frees nothing to report, and the
// record expires.
func TestPreemptionVictimsGPUsAreRememberedForThePreemptor(t *testing.T) {
	clock := now
	l := ledger.New(ledger.Options{Clock: func() time.Time { return clock }})
	l.UpsertTopology(topo(t, "dgx1-v100", "a"))
	victim := makePod("victim").gpus(2).node("a").assigned(uuidsOn("a", 2, 3)...).obj()
	ended := makePod("ended").gpus(1).node("a").assigned(uuidsOn("a", 4)...).obj()
	later := makePod("later").gpus(1).node("a").assigned(uuidsOn("a", 5)...).obj()
	for _, p := range []*corev1.Pod{victim, ended, later} {
		l.UpsertPod(p)
	}
	l.UpsertPod(preempting(victim))
	l.DeletePod(types.NamespacedName{Namespace: "default", Name: "victim"}, victim.UID)
	l.DeletePod(types.NamespacedName{Namespace: "default", Name: "ended"}, ended.UID)

	if got := l.TakeFreed("a", uuidsOn("a", 0, 1), 1000); len(got) != 0 {
		t.Errorf("TakeFreed of GPUs no victim held = %+v, want none", got)
	}
	if got := l.TakeFreed("b", uuidsOn("a", 2), 1000); len(got) != 0 {
		t.Errorf("TakeFreed on another node = %+v, want none", got)
	}
	if same := l.TakeFreed("a", uuidsOn("a", 2, 3), 0); len(same) != 0 {
		t.Errorf("TakeFreed for a pod of the victims' priority = %+v, want none: it did not preempt them", same)
	}
	got := l.TakeFreed("a", uuidsOn("a", 1, 2, 3, 4), 1000)
	if len(got) != 1 || got[0].Pod.Name != "victim" || len(got[0].Indices) != 2 || got[0].Indices[0] != 2 || got[0].Indices[1] != 3 {
		t.Fatalf("TakeFreed = %+v, want the victim with GPUs 2 and 3 (the pod that ended was no victim)", got)
	}
	if again := l.TakeFreed("a", uuidsOn("a", 2, 3), 1000); len(again) != 0 {
		t.Errorf("TakeFreed a second time = %+v, want none: it was taken", again)
	}

	// A victim that finishes (its phase goes Failed) counts too.
	l.UpsertPod(preempting(later))
	done := preempting(later)
	done.Status.Phase = corev1.PodFailed
	l.UpsertPod(done)
	if got := l.TakeFreed("a", uuidsOn("a", 5), 1000); len(got) != 1 || got[0].Pod.Name != "later" {
		t.Errorf("TakeFreed after the victim failed = %+v, want it", got)
	}

	// The record expires.
	last := makePod("last").gpus(1).node("a").assigned(uuidsOn("a", 6)...).obj()
	l.UpsertPod(preempting(last))
	l.DeletePod(types.NamespacedName{Namespace: "default", Name: "last"}, last.UID)
	clock = clock.Add(11 * time.Minute)
	if got := l.TakeFreed("a", uuidsOn("a", 6), 1000); len(got) != 0 {
		t.Errorf("TakeFreed after 11 minutes = %+v, want the record expired", got)
	}
}
