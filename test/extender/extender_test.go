//go:build integration

// Package extender_test runs gputopo's extender against the real
// kube-apiserver and the real kube-scheduler binary configured with the
// chart's scheduler config. Run: go test -tags integration ./test/extender/...
package extender_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
)

// TestModelParallelPodsLandOnNVLinkedSets: on DGX-1 V100 nodes only 2 of
// the 70 4-GPU sets are fully NVLinked. Eight model-parallel pods fill
// exactly those sets on four nodes; a pod no node can ever satisfy stays
// Pending with the extender's reason on it.
// It runs in both modes: the extender under kube-scheduler, and the
// gputopo-scheduler plugin build.
func TestModelParallelPodsLandOnNVLinkedSets(t *testing.T) {
	eachMode(t, 4, testModelParallelPodsLandOnNVLinkedSets)
}

func testModelParallelPodsLandOnNVLinkedSets(t *testing.T, e *env, s system) {
	ctx := harness.Context(t)

	// First the impossible pod, while every node has all 8 GPUs free (so
	// that kube-scheduler's own GPU count passes and the extender decides).
	createAll(t, e, []*corev1.Pod{gpuPod("impossible", 8, modelParallel)})
	var msg string
	harness.Poll(t, time.Minute, "the impossible pod to be marked unschedulable", func() (bool, string) {
		p, err := e.cp.Clientset.CoreV1().Pods("default").Get(ctx, "impossible", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				msg = c.Message
				return strings.Contains(msg, "gputopo:"), "condition: " + msg
			}
		}
		return false, fmt.Sprintf("conditions %v", p.Status.Conditions)
	})
	// The extender answers node by node; the plugin build refuses the
	// pod in PreFilter, from its fit index, in one sentence.
	wants, eventWant := []string{"0/4 nodes are available", "gputopo: can never fit this node", "needs NVLink between 8 GPUs; largest free NVLink-connected set has 4"}, "needs NVLink between 8 GPUs"
	if _, plugin := s.(*pluginSystem); plugin {
		eventWant = "gputopo: no node could ever hold 8 GPUs joined by NVLink, even with every GPU free (the most any machine here offers is 4)"
		wants = []string{"0/4 nodes are available", eventWant, "kubectl gputopo explain -n default impossible"}
	}
	for _, want := range wants {
		if !strings.Contains(msg, want) {
			t.Errorf("PodScheduled message %q lacks %q", msg, want)
		}
	}
	events, err := e.cp.Clientset.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=impossible"})
	if err != nil {
		t.Fatal(err)
	}
	var sawEvent bool
	for _, ev := range events.Items {
		sawEvent = sawEvent || ev.Reason == "FailedScheduling" && strings.Contains(ev.Message, eventWant)
	}
	if !sawEvent {
		t.Errorf("no FailedScheduling event carries the extender's reason; events: %v", events.Items)
	}
	if err := e.cp.Clientset.CoreV1().Pods("default").Delete(ctx, "impossible", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	var pods []*corev1.Pod
	for i := range 8 {
		pods = append(pods, gpuPod(fmt.Sprintf("mp-%d", i), 4, modelParallel))
	}
	createAll(t, e, pods)
	harness.Poll(t, 2*time.Minute, "8 model-parallel pods bound", func() (bool, string) {
		n := boundGPUs(listPods(t, e))
		return n == 32, fmt.Sprintf("%d of 32 GPUs bound; ledger %s", n, fmtGauges(s.gauges(t)))
	})
	live := listPods(t, e)
	auditPods(t, live)
	g := mustFixture(t)
	for i := range live {
		p := &live[i]
		graph := g.Graph(p.Spec.NodeName)
		uuids, _ := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
		var idx []int
		for _, u := range uuids {
			i, _ := graph.IndexOf(u)
			idx = append(idx, i)
		}
		for a := range idx {
			for b := a + 1; b < len(idx); b++ {
				if !graph.NVLinked(idx[a], idx[b]) {
					t.Errorf("pod %s on %s: GPUs %d and %d are not NVLinked (set %v)", p.Name, p.Spec.NodeName, idx[a], idx[b], idx)
				}
			}
		}
		pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement])
		if err != nil || pl.Tier != v1alpha1.TierNVLink || pl.Node != p.Spec.NodeName {
			t.Errorf("pod %s placement %+v (err %v), want nvlink tier on %s", p.Name, pl, err, p.Spec.NodeName)
		}
	}

	// Every GPU is bound now: a model-parallel pair fits nowhere until a
	// pod ends. The plugin build says so in gputopo's words from
	// PreFilter; under the extender, kube-scheduler's own GPU count
	// refuses every node before the extender is asked.
	createAll(t, e, []*corev1.Pod{gpuPod("late", 2, modelParallel)})
	want := "Insufficient " + string(v1alpha1.ResourceGPU)
	if _, plugin := s.(*pluginSystem); plugin {
		want = "gputopo: no node has 2 free GPUs joined by NVLink; no node has a free GPU (kubectl gputopo explain -n default late gives each node's reason)"
	}
	harness.Poll(t, time.Minute, "a FailedScheduling event for the late pod", func() (bool, string) {
		evs, err := e.cp.Clientset.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=late"})
		if err != nil {
			return false, err.Error()
		}
		var msgs []string
		for _, ev := range evs.Items {
			if ev.Reason == "FailedScheduling" && strings.Contains(ev.Message, want) {
				return true, ""
			}
			msgs = append(msgs, ev.Message)
		}
		return false, fmt.Sprintf("want %q; events %q", want, msgs)
	})
	if t.Failed() {
		t.Logf("scheduler log:\n%s", s.tail())
	}
}

// stormPods is three times more GPU pods than the cluster's GPUs: 1- and
// 2-GPU pods, a third of them model-parallel pairs.
func stormPods(prefix string, gpus int) []*corev1.Pod {
	var pods []*corev1.Pod
	for i := range 3 * gpus {
		var p *corev1.Pod
		switch i % 3 {
		case 0:
			p = gpuPod(fmt.Sprintf("%s-%03d", prefix, i), 1, "")
		case 1:
			p = gpuPod(fmt.Sprintf("%s-%03d", prefix, i), 2, `{"requireNVLink":true}`)
		default:
			p = gpuPod(fmt.Sprintf("%s-%03d", prefix, i), 1, `{"strategy":"numa_local"}`)
		}
		pods = append(pods, p)
	}
	return pods
}

// TestBindStorm creates all pods at once. No GPU may be issued twice and no
// node go over capacity; once every pod is deleted the ledger is whole. It
// runs in both modes.
func TestBindStorm(t *testing.T) {
	eachMode(t, 4, func(t *testing.T, e *env, s system) {
		total := 4 * gpusPerNode
		createAll(t, e, stormPods("storm", total))
		harness.Poll(t, 3*time.Minute, "every GPU bound", func() (bool, string) {
			n := boundGPUs(listPods(t, e))
			return n == total, fmt.Sprintf("%d of %d GPUs bound; ledger %s", n, total, fmtGauges(s.gauges(t)))
		})
		owner := auditPods(t, listPods(t, e))
		if len(owner) != total {
			t.Errorf("%d distinct GPUs assigned, want %d", len(owner), total)
		}
		ledgerFollowsPods(t, e, s, total)
	})
}

// TestCrashMidStorm SIGKILLs the process that holds the ledger (the
// extender binary, or gputopo-scheduler in plugin mode) while the real
// scheduler is binding a storm (some pods bound, binds in flight), and
// starts a new one. The new one rebuilds its ledger from the pods before
// it decides: no GPU is issued twice, no node goes over capacity, and
// every pod ends bound with assigned-gpus or Pending with a reason.
func TestCrashMidStorm(t *testing.T) {
	// Eight nodes: a storm of 64 GPUs takes long enough to be killed
	// mid-way on a loaded machine (with 32, the plugin build sometimes
	// bound every pod before the first /metrics read showed one).
	const nodes = 8
	eachMode(t, nodes, func(t *testing.T, e *env, s system) {
		ctx := harness.Context(t)
		total := nodes * gpusPerNode
		created := make(chan error, 1)
		go func() { created <- createAllErr(ctx, e, stormPods("crash", total)) }()
		// SIGKILL as soon as the ledger (its /metrics, read in a tight
		// loop) shows the storm under way, so that binds are still queued
		// or in flight.
		var last string
		if err := wait.PollUntilContextTimeout(ctx, 2*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			c := s.gauges(t)
			last = fmtGauges(c)
			return c["held"]+c["reserved"] >= 1, nil
		}); err != nil {
			t.Fatalf("timed out waiting for the storm to start: %s", last)
		}
		s.kill(t)
		before := boundGPUs(listPods(t, e))
		if before == total {
			t.Errorf("every GPU was bound before the kill: the test did not kill it mid-storm")
		}
		t.Logf("killed with %d of %d GPUs bound", before, total)
		if err := <-created; err != nil {
			t.Fatal(err)
		}

		s.restart(t)
		// Deciding means rebuilt: the ledger already holds every GPU bound
		// before the restart (binds the killed process had sent may have
		// landed since).
		if c := s.gauges(t); c["held"]+c["reserved"] < float64(before) {
			t.Errorf("restarted ledger %s holds fewer than the %d GPUs bound before it started", fmtGauges(c), before)
		}
		harness.Poll(t, 3*time.Minute, "every GPU bound after the restart", func() (bool, string) {
			n := boundGPUs(listPods(t, e))
			return n == total, fmt.Sprintf("%d of %d GPUs bound (%d before the crash)", n, total, before)
		})
		auditPods(t, listPods(t, e))
		harness.Poll(t, 2*time.Minute, "every unbound pod Pending with a reason", func() (bool, string) {
			for _, p := range listPods(t, e) {
				if p.Spec.NodeName != "" {
					continue
				}
				if p.Status.Phase != corev1.PodPending || scheduledFalseMessage(&p) == "" {
					return false, fmt.Sprintf("pod %s: phase %s, conditions %v", p.Name, p.Status.Phase, p.Status.Conditions)
				}
			}
			return true, ""
		})
		ledgerFollowsPods(t, e, s, total)
		if t.Failed() {
			t.Logf("scheduler log:\n%s", s.tail())
		}
	})
}

// TestTwoReplicasExactlyOneReady: with leader election only the Lease
// holder is Ready; when it goes, the other takes over.
func TestTwoReplicasExactlyOneReady(t *testing.T) {
	e := newEnv(t, 1)
	a := startExtender(t, e, 0, true)
	b := startExtender(t, e, 0, true)
	ready := func() (n int, who *runningExtender) {
		for _, r := range []*runningExtender{a, b} {
			if readyz(r) {
				n++
				who = r
			}
		}
		return n, who
	}
	var leader *runningExtender
	harness.Poll(t, time.Minute, "one replica Ready", func() (bool, string) {
		n, who := ready()
		leader = who
		return n == 1, fmt.Sprintf("%d Ready", n)
	})
	// Stays exactly one over several lease renewals: nothing here ends the
	// wait, which must run out its 5s with the same single leader at every
	// look.
	err := wait.PollUntilContextTimeout(harness.Context(t), 250*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		if n, who := ready(); n != 1 || who != leader {
			return false, fmt.Errorf("%d replicas Ready (leader changed: %v); want exactly the first leader", n, who != leader)
		}
		return false, nil
	})
	if !wait.Interrupted(err) {
		t.Fatal(err)
	}
	other := a
	if leader == a {
		other = b
	}
	if err := leader.stop(); err != nil {
		t.Fatalf("stop leader: %v", err)
	}
	harness.Poll(t, 30*time.Second, "the standby to take over", func() (bool, string) {
		return readyz(other), "standby not Ready"
	})
	if n, _ := ready(); n != 1 {
		t.Errorf("%d replicas Ready after failover, want 1", n)
	}
}

// ledgerFollowsPods checks that the deciding ledger holds exactly the total
// GPUs the pods were bound to, with nothing reserved, and that once every
// pod is deleted all of them are free again.
func ledgerFollowsPods(t *testing.T, e *env, s system, total int) {
	t.Helper()
	harness.Poll(t, 30*time.Second, "the ledger to match the pods", func() (bool, string) {
		c := s.gauges(t)
		return c["held"] == float64(total) && c["free"] == 0 && c["reserved"] == 0, fmtGauges(c)
	})
	deleteAll(t, e)
	harness.Poll(t, time.Minute, "every GPU free after deleting the pods", func() (bool, string) {
		c := s.gauges(t)
		return c["total"] == float64(total) && c["free"] == c["total"] && c["held"] == 0 && c["reserved"] == 0, fmtGauges(c)
	})
}
