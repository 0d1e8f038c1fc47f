//go:build integration

package kubectl

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/kubectlplugin"
)

// TestExplainWhatKubeSchedulerSays runs the real kube-scheduler with the
// chart's configuration against an extender address where nothing
// listens, and a Node that advertises 8 GPUs but has no NodeGPUTopology.
// explain, run as a user who holds only kubectlplugin.ViewerRules, must
// show the PodScheduled condition and the FailedScheduling event
// kube-scheduler really writes, say that a pod of another scheduler is
// never gputopo's, and nodes must show what the Node advertises.
func TestExplainWhatKubeSchedulerSays(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := localcluster.StartControlPlane(localcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	admin, err := client.New(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := localcluster.CreateGPUNode(ctx, admin, "legacy", 8, nil); err != nil {
		t.Fatal(err)
	}
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	port, err := localcluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := localcluster.ChartSchedulerConfig(fmt.Sprintf("http://127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	schedKubeconfig, err := cp.Kubeconfig("scheduler", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	sched, err := localcluster.StartScheduler(cfg, schedKubeconfig, cp.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Stop)

	// The plugin's user holds exactly the documented rules.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gputopo-viewer"}, Rules: kubectlplugin.ViewerRules()}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gputopo-viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "viewer"}}}
	for _, o := range []client.Object{role, binding} {
		if err := admin.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	viewer, err := cp.Kubeconfig("viewer")
	if err != nil {
		t.Fatal(err)
	}

	gputopos := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "train-0"}, Spec: localcluster.GPUPodSpec(2)}
	gputopos.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	others := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "batch-0"}, Spec: localcluster.GPUPodSpec(1)}
	others.Spec.SchedulerName = "volcano"
	for _, p := range []*corev1.Pod{gputopos, others} {
		if err := admin.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	var cond corev1.PodCondition
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(gputopos), gputopos); err != nil {
			return false, err
		}
		for _, c := range gputopos.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				cond = c
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("kube-scheduler set no PodScheduled=False on %s: %v\n%s", gputopos.Name, err, sched.Tail(20))
	}
	t.Logf("kube-scheduler: PodScheduled %s %s: %s", cond.Status, cond.Reason, cond.Message)
	if cond.Reason != kubectlplugin.ReasonSchedulerError || !strings.Contains(cond.Message, "connection refused") {
		t.Fatalf("PodScheduled %s: %s; want %s naming the refused connection", cond.Reason, cond.Message, kubectlplugin.ReasonSchedulerError)
	}
	var e kubectlplugin.Explanation
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		e = kubectlplugin.Explanation{}
		if err := json.Unmarshal([]byte(plugin(ctx, t, viewer, "explain", "-n", ns, gputopos.Name, "-o", "json")), &e); err != nil {
			return false, err
		}
		for _, ev := range e.Events.Items {
			if ev.Reason == "FailedScheduling" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("explain shows no FailedScheduling event: %v\n%+v", err, e)
	}
	if e.Events.Error != "" || !e.GputopoDecides || e.Scheduled == nil || e.Scheduled.Reason != kubectlplugin.ReasonSchedulerError || e.Scheduled.Message != cond.Message {
		t.Errorf("explain -o json: %+v; want the SchedulerError condition, gputopo deciding, events read", e)
	}
	text := plugin(ctx, t, viewer, "explain", "-n", ns, gputopos.Name)
	for _, want := range []string{"PodScheduled: False, SchedulerError", "connection refused", "cannot reach gputopo's extender", "FailedScheduling"} {
		if !strings.Contains(text, want) {
			t.Errorf("explain lacks %q:\n%s", want, text)
		}
	}
	t.Logf("explain %s:\n%s", gputopos.Name, text)

	text = plugin(ctx, t, viewer, "explain", "-n", ns, others.Name)
	for _, want := range []string{"volcano is not a gputopo profile", "PodScheduled: not set", "events:       none", "What gputopo would do"} {
		if !strings.Contains(text, want) {
			t.Errorf("explain of a volcano pod lacks %q:\n%s", want, text)
		}
	}
	text = plugin(ctx, t, viewer, "nodes")
	if !strings.Contains(text, "-/8") || !strings.Contains(text, "no-topology") {
		t.Errorf("nodes does not show legacy's 8 advertised GPUs without topology:\n%s", text)
	}
}
