//go:build integration

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gputopo/gputopo/placement"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
)

// TestEndToEnd runs the scenarios in order on one system: they share the
// control plane and the one real node, and each leaves the node as the
// next expects (the Job's pod from the full flow runs through all but the
// last few). Each logs what it injected and what it checked, and ends with
// the drift audit.
func TestEndToEnd(t *testing.T) {
	start := time.Now()
	e := setup(t)
	var train *corev1.Pod

	t.Run("full flow: labelled namespace, annotated Job, webhook, scheduler, extender bind, kubelet, node agent, container env, allocated-gpus", func(t *testing.T) {
		train = e.fullFlow(t)
		e.audit(t)
	})
	if train == nil {
		t.Fatal("the full flow did not produce a running pod; the fault scenarios build on it")
	}
	scenarios := []struct {
		name string
		run  func(*testing.T, *corev1.Pod)
	}{
		{"hostile input is denied through the real apiserver, naming the field", e.hostileInput},
		{"a pod no node can ever take waits with gputopo's reason", e.unmeetable},
		{"kubelet restarted with a running pod: the pod keeps its GPUs", e.kubeletRestart},
		{"node agent restarted with a running pod: the pod keeps its GPUs, new pods are admitted", e.nodeAgentRestart},
		{"extender unreachable with ignorable false: GPU pods wait with a reason, then run when it is back", e.extenderDown},
		{"extender killed between reservation and binding, then restarted", func(t *testing.T, p *corev1.Pod) { e.extenderKilled(t, p, killBeforeWrite) }},
		{"extender killed between binding and its reply, then restarted", func(t *testing.T, p *corev1.Pod) { e.extenderKilled(t, p, killAfterWrite) }},
		{"pod deleted and recreated under the same name while its bind is in flight", e.recreatedDuringBind},
		{"extender unreachable with ignorable true: pods run, the node agent records the truth", e.extenderIgnored},
		{"leader failover in the middle of a burst, two replicas: no GPU issued twice", e.leaderFailover},
		{"a GPU lost (XID 79): no new pod gets it, running pods keep running", e.gpuLost},
		{"webhook down with failurePolicy Fail: GPU pods refused in opted-in namespaces, kube-system unaffected", e.webhookDown},
		{"serving certificate replaced: the webhook keeps serving", e.certReplaced},
	}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			s.run(t, train)
			e.audit(t)
		})
	}
	t.Logf("suite: %v in all", time.Since(start).Round(time.Second))
}

// TestEndToEndPluginMode runs the flow in plugin mode: gputopo-scheduler
// (kube-scheduler with the GPUTopology plugin) decides in-process, with no
// HTTP extender. The scenarios that concern the extender's HTTP front end
// (unreachable, ignorable, killed around its Binding, leader failover of
// extender replicas) are extender mode's; the plugin build's own crash is
// here, its leader failover in test/extender.
func TestEndToEndPluginMode(t *testing.T) {
	start := time.Now()
	e := setupMode(t, v1alpha1.ResourceGPU, true)
	var train *corev1.Pod
	t.Run("full flow through gputopo-scheduler: webhook, plugin bind, kubelet, node agent, container env, allocated-gpus", func(t *testing.T) {
		train = e.fullFlow(t)
		e.audit(t)
	})
	if train == nil {
		t.Fatal("the full flow did not produce a running pod; the scenarios build on it")
	}
	for _, s := range []struct {
		name string
		run  func(*testing.T, *corev1.Pod)
	}{
		{"a pod no node can ever take waits with gputopo's reason", e.unmeetable},
		{"hostile input is denied through the real apiserver, naming the field", e.hostileInput},
		{"kubelet restarted with a running pod: the pod keeps its GPUs", e.kubeletRestart},
		{"node agent restarted with a running pod: the pod keeps its GPUs, new pods are admitted", e.nodeAgentRestart},
		{"gputopo-scheduler killed in the middle of a burst, then restarted: no GPU issued twice", e.schedulerKilledMidBurst},
		{"a GPU lost (XID 79): no new pod gets it, running pods keep running", e.gpuLost},
	} {
		t.Run(s.name, func(t *testing.T) {
			s.run(t, train)
			e.audit(t)
		})
	}
	t.Logf("suite: %v in all", time.Since(start).Round(time.Second))
}

// unmeetable creates a pod whose requirement no node can ever meet: it
// waits, unbound, and its PodScheduled condition and FailedScheduling
// event carry the reason the core gives for the node (in extender mode
// from the extender's filter, in plugin mode from the plugin's), word for
// word.
func (e *env) unmeetable(t *testing.T, _ *corev1.Pod) {
	ctx := context.Background()
	p := gpuPod(nsTeam, "unmeetable", 2)
	p.Annotations = map[string]string{v1alpha1.AnnotationRequirement: `{"gpuMemoryMiB":10000000}`}
	e.create(t, p)
	var msg string
	p = e.waitPod(t, p, time.Minute, "PodScheduled=False with gputopo's reason", func(p *corev1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				msg = c.Message
			}
		}
		return strings.Contains(msg, placement.ReasonPrefix)
	})
	if p.Spec.NodeName != "" {
		t.Fatalf("the unmeetable pod was bound to %s", p.Spec.NodeName)
	}
	names := []string{nodeName}
	pr, err := placement.ParseRequest(p, e.ext.Core().Config().GPUResource(), e.ext.Core().Now())
	if err != nil {
		t.Fatal(err)
	}
	ex := e.ext.Core().Explain(context.Background(), pr, names)
	if len(ex) != 1 || ex[0].Passed {
		t.Fatalf("the core's explanation: %+v (err %v); want the node refused", ex, err)
	}
	if !strings.Contains(msg, ex[0].Reason) {
		t.Errorf("PodScheduled message %q lacks the core's reason %q", msg, ex[0].Reason)
	}
	harness.Poll(t, time.Minute, "a FailedScheduling event with the reason", func() (bool, string) {
		events := &corev1.EventList{}
		if err := e.cp.Client.List(ctx, events, client.InNamespace(nsTeam)); err != nil {
			return false, err.Error()
		}
		for _, ev := range events.Items {
			if ev.InvolvedObject.UID == p.UID && ev.Reason == "FailedScheduling" && strings.Contains(ev.Message, ex[0].Reason) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events in %s", len(events.Items), nsTeam)
	})
	t.Logf("checked: %s waits with %q", p.Name, ex[0].Reason)
	e.deletePods(t, nsTeam, p.Name)
}

// fullFlow follows one model-parallel Job from creation to the container's
// environment and returns its running pod.
func (e *env) fullFlow(t *testing.T) *corev1.Pod {
	ctx := context.Background()
	const gpus = 2
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: nsTeam, Name: "train",
			Annotations: map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel)}},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](1), Completions: ptr.To[int32](1), BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: podSpec(gpus)},
		},
	}
	e.create(t, job)
	t.Logf("injected: Job %s/%s annotated %s=model, 1 pod x %d GPUs, in namespace labelled %s=%s",
		nsTeam, job.Name, v1alpha1.AnnotationParallelism, gpus, v1alpha1.LabelInjection, v1alpha1.InjectionEnabled)

	// Hop 1: the webhook copied the intent into the Job's pod template.
	if got := job.Spec.Template.Annotations[v1alpha1.AnnotationParallelism]; got != string(v1alpha1.ParallelismModel) {
		t.Fatalf("Job template %s = %q, want model (the Job webhook copies the intent)", v1alpha1.AnnotationParallelism, got)
	}
	t.Logf("checked: the Job webhook copied the intent into the pod template")

	// Hop 2: the Job controller created the pod; the webhook mutated it.
	var pod *corev1.Pod
	harness.Poll(t, time.Minute, "the Job controller to create the pod", func() (bool, string) {
		list := &corev1.PodList{}
		if err := e.cp.Client.List(ctx, list, client.InNamespace(nsTeam), client.MatchingLabels{batchv1.JobNameLabel: job.Name}); err != nil {
			return false, err.Error()
		}
		if len(list.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(list.Items))
		}
		pod = &list.Items[0]
		return true, ""
	})
	req, err := v1alpha1.ParseRequirement(pod.Annotations[v1alpha1.AnnotationRequirement])
	if err != nil {
		t.Fatalf("pod %s requirement: %v", pod.Name, err)
	}
	type mutation struct {
		Requirement   v1alpha1.Requirement
		SchedulerName string
		JobLabel      string
	}
	want := mutation{configv1alpha1.DefaultWebhookConfiguration().PolicyTable.Model.Requirement(gpus), v1alpha1.DefaultSchedulerName, job.Name}
	if diff := cmp.Diff(want, mutation{req, pod.Spec.SchedulerName, pod.Labels[v1alpha1.LabelJob]}); diff != "" {
		t.Fatalf("pod %s as mutated by the webhook (-want +got):\n%s", pod.Name, diff)
	}
	if !req.RequireNVLink || req.EffectiveStrategy() != v1alpha1.StrategyHighestBandwidth {
		t.Errorf("model-parallel 2-GPU pod got requirement %+v, want requireNVLink and highest_bandwidth", req)
	}
	t.Logf("checked: pod %s created by the Job controller, mutated: requirement %s, schedulerName %s, label %s=%s",
		pod.Name, pod.Annotations[v1alpha1.AnnotationRequirement], pod.Spec.SchedulerName, v1alpha1.LabelJob, pod.Labels[v1alpha1.LabelJob])

	// Hop 3: gputopo-scheduler asked the extender, which bound the pod
	// with its GPUs in the same write.
	pod = e.waitPod(t, pod, time.Minute, "the pod to be bound", func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	assigned := harness.PodGPUs(t, pod, v1alpha1.AnnotationAssignedGPUs)
	if pod.Spec.NodeName != nodeName || len(assigned) != gpus {
		t.Fatalf("bound to %q with assigned-gpus %v; want %s and %d GPUs", pod.Spec.NodeName, assigned, nodeName, gpus)
	}
	for _, u := range assigned {
		if !slices.Contains(e.sim.UUIDs(), u) {
			t.Errorf("assigned GPU %s is not one of node %s's GPUs %v", u, nodeName, e.sim.UUIDs())
		}
	}
	pl, err := v1alpha1.ParsePlacement(pod.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		t.Fatal(err)
	}
	if pl.Node != nodeName || pl.Strategy != v1alpha1.StrategyHighestBandwidth || len(pl.GPUIndices) != gpus || pl.Tier != v1alpha1.TierNVSwitch || pl.MinPairBandwidthGBps != 600 {
		t.Errorf("placement %s; want node %s, highest_bandwidth, %d indices, tier nvswitch, 600 GB/s (DGX A100)", pl, nodeName, gpus)
	}
	for i, idx := range pl.GPUIndices {
		if u := e.sim.UUIDs()[idx]; !slices.Contains(assigned, u) {
			t.Errorf("placement index %d (GPU %d, %s) is not in assigned-gpus %v", i, idx, u, assigned)
		}
	}
	t.Logf("checked: bound by gputopo to %s with assigned-gpus %v and placement %s", pod.Spec.NodeName, assigned, pl)

	// Hop 4: kubelet ran it; the node agent's Allocate set the env.
	pod = e.waitPod(t, pod, 90*time.Second, "the pod to run", isRunning)
	vis, ok := e.visible(pod)
	if !ok {
		t.Fatalf("the runtime never created a container for %s", pod.Name)
	}
	if !slices.Equal(assigned, vis) {
		t.Errorf("%s in the container = %v, want assigned-gpus %v", v1alpha1.EnvVisibleDevices, vis, assigned)
	}
	t.Logf("checked: kubelet ran it; the runtime received %s=%v", v1alpha1.EnvVisibleDevices, vis)

	// Hop 5: the node agent recorded the truth.
	pod = e.waitPod(t, pod, 30*time.Second, "allocated-gpus", func(p *corev1.Pod) bool {
		return p.Annotations[v1alpha1.AnnotationAllocatedGPUs] != ""
	})
	if got := harness.PodGPUs(t, pod, v1alpha1.AnnotationAllocatedGPUs); !slices.Equal(assigned, got) {
		t.Errorf("allocated-gpus %v, want assigned-gpus %v", got, assigned)
	}
	t.Logf("checked: the node agent recorded allocated-gpus = assigned-gpus")
	return pod
}
