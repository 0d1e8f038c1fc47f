//go:build integration

package extender_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/schedplugin"
	"github.com/gputopo/gputopo/test/harness"
)

// TestPluginRecordsGPUsBoundThroughTheScheduler: in plugin mode the core
// records its Events through kube-scheduler's own recorder. With
// events.gpusBound on, a bound pod gets a Normal GPUsBound Event whose
// reporting controller is the scheduler profile and whose note names the
// node and the GPUs its annotations name, found the way `kubectl describe
// pod` finds a pod's Events.
func TestPluginRecordsGPUsBoundThroughTheScheduler(t *testing.T) {
	e := newEnv(t, 1)
	ctx := harness.Context(t)
	if err := localcluster.GrantExtenderRole(ctx, e.cp.Client, harness.SchedulerUser); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "gputopo.yaml")
	if err := os.WriteFile(cfgFile, []byte("apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nevents:\n  gpusBound: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sched := e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin,
		PluginArgs: schedplugin.Args{ConfigFile: cfgFile, SchedulerNames: []string{v1alpha1.DefaultSchedulerName}}})
	harness.WaitCore(t, sched, localcluster.TotalGPUs(len(e.nodes)*gpusPerNode))

	p, err := e.cp.Clientset.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, gpuPod("evented", 2, ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var bound *corev1.Pod
	harness.Poll(t, time.Minute, "the pod to be bound with its GPUs", func() (bool, string) {
		got, err := e.cp.Clientset.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		bound = got
		return got.Spec.NodeName != "" && got.Annotations[v1alpha1.AnnotationAssignedGPUs] != "", "node " + got.Spec.NodeName + "\n" + sched.Tail(20)
	})
	sel := fields.Set{
		"involvedObject.kind": "Pod", "involvedObject.name": bound.Name,
		"involvedObject.namespace": bound.Namespace, "involvedObject.uid": string(bound.UID),
	}.AsSelector()
	var ev *corev1.Event
	harness.Poll(t, time.Minute, "the GPUsBound event", func() (bool, string) {
		list, err := e.cp.Clientset.CoreV1().Events(bound.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
		if err != nil {
			return false, err.Error()
		}
		var reasons []string
		for i := range list.Items {
			reasons = append(reasons, list.Items[i].Reason)
			if list.Items[i].Reason == placement.ReasonGPUsBound {
				ev = &list.Items[i]
				return true, ""
			}
		}
		return false, "events: " + strings.Join(reasons, ", ")
	})
	if ev.Type != corev1.EventTypeNormal || ev.ReportingController != v1alpha1.DefaultSchedulerName || ev.Action != "Binding" {
		t.Errorf("event type %s from %q action %q; want Normal from %s, action Binding", ev.Type, ev.ReportingController, ev.Action, v1alpha1.DefaultSchedulerName)
	}
	for _, want := range append([]string{"node " + bound.Spec.NodeName}, strings.Split(bound.Annotations[v1alpha1.AnnotationAssignedGPUs], ",")...) {
		if !strings.Contains(ev.Message, want) {
			t.Errorf("event note %q does not name %q", ev.Message, want)
		}
	}
}
