//go:build integration

package extender_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/kubectlplugin"
	"github.com/gputopo/gputopo/schedplugin"
	"github.com/gputopo/gputopo/test/harness"
)

// reserveConfig turns reservations for waiting groups on after 3 s.
const reserveConfig = `apiVersion: config.gputopo.io/v1alpha1
kind: ExtenderConfiguration
fabric:
  reserveAfter: 3s
  reserveMaxPercent: 100
  reserveMaxDuration: 2h
`

// TestWaitingGroupIsStartedAheadOfAStreamOfSmallPods, on a real control
// plane in both modes, with fabric.reserveAfter 3s: dgx-0 and dgx-1 are
// full of 1-GPU pods (dgx-1's declare activeDeadlineSeconds, so they end
// first), dgx-2 is empty. A group of two 8-GPU pods waits for two whole
// nodes; past 3 s it keeps dgx-2 and dgx-1 (where it fits soonest),
// holding nothing. Then, eight times, one pod ends on each of dgx-0 and
// dgx-1 and a new 1-GPU pod comes: each new pod is placed on dgx-0, never
// on the GPUs dgx-1 frees, so once dgx-1 is empty the group is bound
// there and on dgx-2, and its reservation ends. Without the reservation
// the new pods would take dgx-1's GPUs as often as dgx-0's (the two nodes
// score alike) and the group would wait on.
func TestWaitingGroupIsStartedAheadOfAStreamOfSmallPods(t *testing.T) {
	for _, mode := range []string{"extender", "plugin"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, 3)
			cfg := filepath.Join(t.TempDir(), "extender.yaml")
			if err := os.WriteFile(cfg, []byte(reserveConfig), 0o600); err != nil {
				t.Fatal(err)
			}
			var s system
			if mode == "extender" {
				s = startExtenderSystemWith(t, e, "--config", cfg)
			} else {
				if err := localcluster.GrantExtenderRole(harness.Context(t), e.cp.Client, harness.SchedulerUser); err != nil {
					t.Fatal(err)
				}
				ps := &pluginSystem{e: e, sched: e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin, PluginArgs: schedplugin.Args{ConfigFile: cfg}})}
				harness.WaitCore(t, ps.sched, localcluster.TotalGPUs(len(e.nodes)*gpusPerNode))
				s = ps
			}
			testWaitingGroupIsStartedAhead(t, e, s)
		})
	}
}

func testWaitingGroupIsStartedAhead(t *testing.T, e *env, s system) {
	ctx := harness.Context(t)
	labelLeaves(t, e) // every node under leaf a, with its hostname label
	var fill0, fill1 []*corev1.Pod
	for i := range gpusPerNode {
		fill0 = append(fill0, pinned(fmt.Sprintf("fill-0-%d", i), 1, "dgx-0"))
		p := pinned(fmt.Sprintf("fill-1-%d", i), 1, "dgx-1")
		p.Spec.ActiveDeadlineSeconds = ptr.To[int64](3600)
		fill1 = append(fill1, p)
	}
	createAll(t, e, append(append([]*corev1.Pod(nil), fill0...), fill1...))
	harness.Poll(t, time.Minute, "dgx-0 and dgx-1 full", func() (bool, string) {
		g := s.gauges(t)
		return g["held"]+g["reserved"] == 2*gpusPerNode, fmtGauges(g)
	})
	group := groupPods("big", 2, gpusPerNode, "")
	createAll(t, e, group)
	// Past reserveAfter, the group's next try keeps GPUs for it; a Node
	// update is a cluster event that makes kube-scheduler try it again.
	touch := 0
	harness.Poll(t, time.Minute, "a reservation for the waiting group", func() (bool, string) {
		touch++
		n, err := e.cp.Clientset.CoreV1().Nodes().Get(ctx, "dgx-2", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		n.Labels["touch"] = fmt.Sprint(touch)
		if _, err := e.cp.Clientset.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			return false, err.Error()
		}
		g := s.gauges(t)
		return g["group_reservations"] == 1, fmtGauges(g) + fmt.Sprintf(" reservations=%v", g["group_reservations"])
	})
	// The reservation is published, and kubectl gputopo shows its GPUs.
	waitGroupPlan(t, e, "big", v1alpha1.GroupKept)
	for i := range gpusPerNode {
		if _, bound := groupNodes(t, e, "big"); bound != 0 {
			t.Fatalf("%d of the group's pods bound while dgx-1 still has %d pods", bound, gpusPerNode-i)
		}
		deletePods(t, e, []*corev1.Pod{fill0[i], fill1[i]})
		stream := gpuPod(fmt.Sprintf("stream-%d", i), 1, "")
		createAll(t, e, []*corev1.Pod{stream})
		harness.Poll(t, time.Minute, stream.Name+" bound", func() (bool, string) {
			p, err := e.cp.Clientset.CoreV1().Pods("default").Get(ctx, stream.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return p.Spec.NodeName != "", scheduledFalseMessage(p) + "; " + fmtGauges(s.gauges(t))
		})
		p, err := e.cp.Clientset.CoreV1().Pods("default").Get(ctx, stream.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "dgx-0" {
			t.Fatalf("%s bound to %s; the waiting group keeps dgx-1 and dgx-2, so want dgx-0", stream.Name, p.Spec.NodeName)
		}
	}
	harness.Poll(t, 2*time.Minute, "the group bound once dgx-1 drained", func() (bool, string) {
		nodes, bound := groupNodes(t, e, "big")
		return bound == 2, fmt.Sprintf("%d bound on %v; %s", bound, nodes, fmtGauges(s.gauges(t)))
	})
	if nodes, _ := groupNodes(t, e, "big"); len(nodes) != 2 || nodes[0] != "dgx-1" || nodes[1] != "dgx-2" {
		t.Errorf("group on %v, want dgx-1 and dgx-2", nodes)
	}
	harness.Poll(t, time.Minute, "the reservation ended", func() (bool, string) {
		g := s.gauges(t)
		return g["group_reservations"] == 0, fmt.Sprintf("reservations=%v", g["group_reservations"])
	})
	waitGroupPlan(t, e, "big", "")
}

// waitGroupPlan waits until the GroupPlan of group name (namespace
// default) is in state, and kubectl gputopo nodes names the group on the
// nodes it lists; state "": until it is deleted.
func waitGroupPlan(t *testing.T, e *env, name string, state v1alpha1.GroupPlanState) {
	t.Helper()
	ctx := harness.Context(t)
	what := "GroupPlan " + name + " " + string(state)
	if state == "" {
		what = "GroupPlan " + name + " deleted"
	}
	harness.Poll(t, 30*time.Second, what, func() (bool, string) {
		o := &v1alpha1.GroupPlan{}
		err := e.cp.Client.Get(ctx, types.NamespacedName{Namespace: metav1.NamespaceDefault, Name: name}, o)
		if state == "" {
			return apierrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
		}
		if err != nil || o.Spec.State != state {
			return false, fmt.Sprintf("state %q, err %v", o.Spec.State, err)
		}
		snap, err := kubectlplugin.LoadWith(ctx, e.cp.Client, kubectlplugin.ConfigFrom{})
		if err != nil {
			return false, err.Error()
		}
		nodes := map[string]bool{}
		for _, sl := range o.Spec.Slots {
			nodes[sl.Node] = true
		}
		for _, r := range snap.NodeSummaries() {
			if !nodes[r.Name] {
				continue
			}
			if len(r.HeldFor) == 0 || !strings.HasPrefix(r.HeldFor[0], "default/"+name+" "+strings.ToLower(string(state))) {
				return false, fmt.Sprintf("kubectl gputopo nodes: %s for %v", r.Name, r.HeldFor)
			}
		}
		return true, ""
	})
}

// TestWaitingGroupIsKeptForOnASaturatedCluster, in extender mode, with
// fabric.reserveAfter 3s: every GPU of two (then three) nodes is held by a
// 1-GPU pod, so kube-scheduler's own filters refuse every node for a pod
// of a group of two 8-GPU pods and never ask the extender about it. The
// group still gets its reservation (the decider looks for waiting groups
// itself); then, one at a time, a 1-GPU pod ends and a new one comes. The
// new pods may not take the GPUs kept for the group, so the group is bound
// once its nodes drain: within reserveAfter, the stream's run and 30 s.
func TestWaitingGroupIsKeptForOnASaturatedCluster(t *testing.T) {
	for _, nodes := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d nodes", nodes), func(t *testing.T) {
			e := newEnv(t, nodes)
			cfg := filepath.Join(t.TempDir(), "extender.yaml")
			if err := os.WriteFile(cfg, []byte(reserveConfig), 0o600); err != nil {
				t.Fatal(err)
			}
			testWaitingGroupOnASaturatedCluster(t, e, startExtenderSystemWith(t, e, "--config", cfg))
		})
	}
}

func testWaitingGroupOnASaturatedCluster(t *testing.T, e *env, s system) {
	labelLeaves(t, e)
	var fill []*corev1.Pod
	for i := range gpusPerNode {
		for n, node := range e.nodes {
			fill = append(fill, pinned(fmt.Sprintf("fill-%d-%d", n, i), 1, node))
		}
	}
	createAll(t, e, fill)
	harness.Poll(t, time.Minute, "every GPU held", func() (bool, string) {
		g := s.gauges(t)
		return int(g["held"]+g["reserved"]) == len(fill), fmtGauges(g)
	})
	start := time.Now()
	createAll(t, e, groupPods("big", 2, gpusPerNode, ""))
	harness.Poll(t, 30*time.Second, "a reservation for the waiting group, without its pods tried", func() (bool, string) {
		g := s.gauges(t)
		return g["group_reservations"] == 1, fmtGauges(g) + fmt.Sprintf(" reservations=%v", g["group_reservations"])
	})
	waitGroupPlan(t, e, "big", v1alpha1.GroupKept)
	const step = 250 * time.Millisecond
	for i, p := range fill {
		deletePods(t, e, []*corev1.Pod{p})
		createAll(t, e, []*corev1.Pod{gpuPod(fmt.Sprintf("stream-%d", i), 1, "")})
		time.Sleep(step)
		if _, bound := groupNodes(t, e, "big"); bound == 2 {
			break
		}
	}
	limit := 3*time.Second + time.Duration(len(fill))*step + 30*time.Second
	harness.Poll(t, limit-time.Since(start), "the group bound", func() (bool, string) {
		nodes, bound := groupNodes(t, e, "big")
		return bound == 2, fmt.Sprintf("%d bound on %v; %s", bound, nodes, fmtGauges(s.gauges(t)))
	})
	t.Logf("group bound %s after it was created", time.Since(start).Round(100*time.Millisecond))
	waitGroupPlan(t, e, "big", "")
}
