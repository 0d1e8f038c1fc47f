//go:build integration

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/webhook"
)

// podResourcesOf is what kubelet's PodResources API says the pod holds.
func (e *env) podResourcesOf(namespace, name string) ([]string, bool, error) {
	prs, err := e.pr.List(context.Background())
	if err != nil {
		return nil, false, err
	}
	for _, p := range prs {
		if p.Namespace == namespace && p.Name == name {
			var ids []string
			for _, c := range p.Containers {
				for _, d := range c.Devices {
					if d.ResourceName == v1alpha1.ResourceGPU {
						ids = append(ids, d.DeviceIds...)
					}
				}
			}
			return v1alpha1.SortedGPUList(ids), true, nil
		}
	}
	return nil, false, nil
}

// keepsGPUs waits until kubelet reports the pod's GPUs as gpus again and
// checks the pod is the same incarnation, Running, with allocated-gpus gpus.
func (e *env) keepsGPUs(t *testing.T, pod *corev1.Pod, gpus []string) {
	t.Helper()
	harness.Poll(t, time.Minute, "kubelet to report "+pod.Name+"'s GPUs", func() (bool, string) {
		got, ok, err := e.podResourcesOf(pod.Namespace, pod.Name)
		if err != nil {
			return false, err.Error()
		}
		return ok && slices.Equal(gpus, got), fmt.Sprintf("PodResources %v (listed %v)", got, ok)
	})
	p := e.getPod(t, pod.Namespace, pod.Name)
	if p.UID != pod.UID || !isRunning(p) || !slices.Equal(gpus, harness.PodGPUs(t, p, v1alpha1.AnnotationAllocatedGPUs)) {
		t.Errorf("%s is %s (uid %s, was %s) with allocated-gpus %q; want Running on %v",
			p.Name, p.Status.Phase, p.UID, pod.UID, p.Annotations[v1alpha1.AnnotationAllocatedGPUs], gpus)
	}
	t.Logf("checked: %s still Running, PodResources and allocated-gpus %v", p.Name, gpus)
}

// runsApart creates a GPU pod, waits until it runs and checks that its
// GPUs are its own: assigned = allocated = container env, none of taken.
func (e *env) runsApart(t *testing.T, name string, gpus int64, taken []string) *corev1.Pod {
	t.Helper()
	p := gpuPod(nsTeam, name, gpus)
	e.create(t, p)
	p = e.waitPod(t, p, 90*time.Second, name+" to run", isRunning)
	p = e.waitPod(t, p, 30*time.Second, name+"'s allocated-gpus", func(p *corev1.Pod) bool {
		return p.Annotations[v1alpha1.AnnotationAllocatedGPUs] != ""
	})
	assigned := harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs)
	vis, _ := e.visible(p)
	if int64(len(assigned)) != gpus || !slices.Equal(assigned, harness.PodGPUs(t, p, v1alpha1.AnnotationAllocatedGPUs)) || !slices.Equal(assigned, vis) {
		t.Errorf("%s: assigned %v, allocated %v, container env %v; want the same %d GPUs", name, assigned, harness.PodGPUs(t, p, v1alpha1.AnnotationAllocatedGPUs), vis, gpus)
	}
	for _, u := range assigned {
		if slices.Contains(taken, u) {
			t.Errorf("%s got GPU %s, which a running pod holds", name, u)
		}
	}
	t.Logf("checked: new pod %s runs on its own GPUs %v", name, assigned)
	return p
}

// kubeletRestart restarts kubelet under the running train pod.
func (e *env) kubeletRestart(t *testing.T, train *corev1.Pod) {
	before := e.agent.Plugin.Registrations()
	held := harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs)
	t.Logf("injected: kubelet restarted (SIGTERM, started again on the same root dir) with %s running on %v", train.Name, held)
	e.k.Restart(t)
	harness.Poll(t, time.Minute, "the node agent to re-register with the new kubelet", func() (bool, string) {
		return e.agent.Plugin.Registrations() > before, fmt.Sprintf("registrations %d", e.agent.Plugin.Registrations())
	})
	e.waitKubeletGPUs(t, nodeGPUs)
	e.keepsGPUs(t, train, held)
	next := e.runsApart(t, "after-kubelet-restart", 2, held)
	e.audit(t)
	e.deletePods(t, nsTeam, next.Name)
}

// nodeAgentRestart stops and starts the node agent (device plugin,
// reconciler, publisher) under the running train pod.
func (e *env) nodeAgentRestart(t *testing.T, train *corev1.Pod) {
	held := harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs)
	e.stopAgent(t)
	t.Logf("injected: node agent stopped (device plugin socket gone) with %s running on %v", train.Name, held)
	if p := e.getPod(t, train.Namespace, train.Name); !isRunning(p) {
		t.Errorf("%s is %s with the node agent down; kubelet must keep it running", p.Name, p.Status.Phase)
	}
	e.startAgent(t)
	t.Logf("injected: node agent started again")
	e.waitKubeletGPUs(t, nodeGPUs)
	e.keepsGPUs(t, train, held)
	next := e.runsApart(t, "after-agent-restart", 1, held)
	e.audit(t)
	e.deletePods(t, nsTeam, next.Name)
}

// extenderDown stops the extender, creates a GPU pod, checks it waits
// with the scheduler's reason, then brings the extender back on the same
// address and checks the pod runs and the rebuilt ledger knows train.
func (e *env) extenderDown(t *testing.T, train *corev1.Pod) {
	e.stopExtender(t)
	addr := "127.0.0.1:" + strconv.Itoa(e.extPort)
	t.Logf("injected: extender stopped (nothing listens on %s); the scheduler's extender is ignorable=false", addr)
	p := gpuPod(nsTeam, "while-extender-down", 2)
	e.create(t, p)
	p = e.waitPod(t, p, time.Minute, "PodScheduled=False naming the extender", func(p *corev1.Pod) bool {
		c, ok := scheduledFalse(p)
		return ok && strings.Contains(c.Message, addr)
	})
	c, _ := scheduledFalse(p)
	t.Logf("checked: pod waits unbound: PodScheduled=False %s: %s", c.Reason, short(c.Message))
	// It keeps waiting through further attempts: for 3s, through the
	// scheduler's retries, it must stay unbound with no assigned-gpus at
	// every look, so this wait must run out.
	err := wait.PollUntilContextTimeout(harness.Context(t), 200*time.Millisecond, 3*time.Second, true, func(context.Context) (bool, error) {
		p = e.getPod(t, p.Namespace, p.Name)
		return p.Spec.NodeName != "" || p.Annotations[v1alpha1.AnnotationAssignedGPUs] != "", nil
	})
	if !wait.Interrupted(err) {
		t.Fatalf("pod bound to %q with assigned-gpus %q while the extender was down (%v)", p.Spec.NodeName, p.Annotations[v1alpha1.AnnotationAssignedGPUs], err)
	}

	t.Logf("injected: extender started again on %s (ledger rebuilt from pods)", addr)
	e.startExtender(t)
	// The waiting pod may be bound by now; every other holding must be
	// train's, rebuilt from its annotations.
	var rebuilt []string
	for _, h := range e.ext.Core().Report().Holdings() {
		switch h.PodUID {
		case train.UID:
			rebuilt = v1alpha1.SortedGPUList(h.GPUs)
		case p.UID:
		default:
			t.Errorf("rebuilt ledger holds %v for %s, which is gone", h.GPUs, h.Pod)
		}
	}
	if want := harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs); !slices.Equal(want, rebuilt) {
		t.Errorf("rebuilt ledger holds %v for %s; want %v", rebuilt, train.Name, want)
	}
	p = e.waitPod(t, p, 2*time.Minute, "the waiting pod to run once the extender is back", isRunning)
	if got := harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs); len(got) != 2 {
		t.Errorf("the waiting pod ran with assigned-gpus %v; want 2 GPUs chosen by the extender", got)
	}
	t.Logf("checked: rebuilt ledger holds %s's GPUs; the waiting pod ran on %s", train.Name, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
	e.audit(t)
	e.deletePods(t, nsTeam, p.Name)
}

// extenderKilled stops the extender in the middle of a bind (see
// faultMode) and starts a fresh one on the same address: the pod must end
// up running on GPUs nobody else holds, bound exactly once.
func (e *env) extenderKilled(t *testing.T, train *corev1.Pod, mode faultMode) {
	name := map[faultMode]string{killBeforeWrite: "killed-before-binding", killAfterWrite: "killed-after-binding"}[mode]
	fault := newBindFault(mode)
	defer fault.free()
	e.injectBindFault(fault)
	p := gpuPod(nsTeam, name, 2)
	e.create(t, p)
	select {
	case <-fault.hit:
	case <-time.After(time.Minute):
		t.Fatal("the extender never bound the pod")
	}
	dying := e.ext
	p = e.getPod(t, p.Namespace, p.Name)
	var boundTo []string
	switch mode {
	case killBeforeWrite:
		var reserved []string
		for _, h := range dying.Core().Report().Holdings() {
			if h.PodUID == p.UID && h.Reserved {
				reserved = h.GPUs
			}
		}
		if len(reserved) != 2 || p.Spec.NodeName != "" {
			t.Fatalf("at the kill: reserved %v, pod bound to %q; want 2 GPUs reserved and nothing written", reserved, p.Spec.NodeName)
		}
		t.Logf("injected: extender killed after reserving %v for %s, before its Binding reached the apiserver", reserved, p.Name)
	case killAfterWrite:
		<-fault.done
		if fault.result != nil || p.Spec.NodeName != nodeName {
			t.Fatalf("at the kill: Binding answered %v, pod bound to %q; want it written", fault.result, p.Spec.NodeName)
		}
		boundTo = harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs)
		t.Logf("injected: extender killed after the apiserver wrote %s's Binding (%v), before it replied to kube-scheduler", p.Name, boundTo)
	}
	e.stopExtender(t)
	e.startExtender(t)
	t.Logf("injected: extender started again on the same address")
	fault.free()

	p = e.waitPod(t, p, 2*time.Minute, p.Name+" to run", isRunning)
	got := harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs)
	if boundTo != nil && !slices.Equal(boundTo, got) {
		t.Errorf("%s was bound to %v before the kill and now has %v; a written bind must stand", p.Name, boundTo, got)
	}
	for _, u := range got {
		if slices.Contains(harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs), u) {
			t.Errorf("%s got GPU %s, which %s holds", p.Name, u, train.Name)
		}
	}
	t.Logf("checked: %s runs on %v; the new extender's ledger holds it (audit below)", p.Name, got)
	e.audit(t)
	e.deletePods(t, nsTeam, p.Name)
}

// recreatedDuringBind holds the extender's Binding for a pod, deletes the
// pod and creates another of the same name, then lets the Binding go: it
// must not land on the new pod.
func (e *env) recreatedDuringBind(t *testing.T, train *corev1.Pod) {
	ctx := context.Background()
	fault := newBindFault(hold)
	defer fault.free()
	e.injectBindFault(fault)
	first := gpuPod(nsTeam, "reborn", 1)
	e.create(t, first)
	select {
	case <-fault.hit:
	case <-time.After(time.Minute):
		t.Fatal("the extender never bound the pod")
	}
	if err := e.cp.Client.Delete(ctx, first, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	harness.Poll(t, 30*time.Second, "the first pod to be gone", func() (bool, string) {
		err := e.cp.Client.Get(ctx, client.ObjectKeyFromObject(first), &corev1.Pod{})
		return err != nil && client.IgnoreNotFound(err) == nil, fmt.Sprint(err)
	})
	second := gpuPod(nsTeam, "reborn", 2)
	e.create(t, second)
	t.Logf("injected: %s (uid %s, 1 GPU) deleted and recreated (uid %s, 2 GPUs) while the extender's Binding for it was held", first.Name, first.UID, second.UID)
	fault.free()
	select {
	case <-fault.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the held Binding never completed")
	}
	if fault.result == nil {
		t.Errorf("the Binding for the deleted pod (uid %s) was accepted; it must not bind the recreated pod", first.UID)
	} else {
		t.Logf("checked: the stale Binding was refused: %v", fault.result)
	}
	p := e.waitPod(t, second, 2*time.Minute, "the recreated pod to run", isRunning)
	got := harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs)
	if p.UID != second.UID || len(got) != 2 {
		t.Errorf("recreated pod runs as uid %s with assigned-gpus %v; want uid %s with 2 GPUs of its own", p.UID, got, second.UID)
	}
	for _, u := range got {
		if slices.Contains(harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs), u) {
			t.Errorf("recreated pod got GPU %s, which %s holds", u, train.Name)
		}
	}
	t.Logf("checked: the recreated pod runs on its own 2 GPUs %v", got)
	e.audit(t)
	e.deletePods(t, nsTeam, p.Name)
}

// extenderIgnored runs kube-scheduler with the extender ignorable and the
// extender down: the pod runs anyway, on GPUs the node agent chose, and
// the truth it records is what the extender rebuilds from.
func (e *env) extenderIgnored(t *testing.T, train *corev1.Pod) {
	held := harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs)
	e.startScheduler(t, true)
	defer e.startScheduler(t, false)
	e.stopExtender(t)
	t.Logf("injected: kube-scheduler restarted with the extender ignorable=true; extender stopped")
	p := gpuPod(nsTeam, "while-extender-ignored", 2)
	e.create(t, p)
	p = e.waitPod(t, p, 90*time.Second, "the pod to run without the extender", isRunning)
	p = e.waitPod(t, p, 30*time.Second, "allocated-gpus", func(p *corev1.Pod) bool {
		return p.Annotations[v1alpha1.AnnotationAllocatedGPUs] != ""
	})
	allocated := harness.PodGPUs(t, p, v1alpha1.AnnotationAllocatedGPUs)
	vis, _ := e.visible(p)
	if p.Annotations[v1alpha1.AnnotationAssignedGPUs] != "" || len(allocated) != 2 || !slices.Equal(allocated, vis) {
		t.Errorf("pod ran with assigned-gpus %q, allocated-gpus %v, container env %v; want no assignment and the same 2 GPUs recorded and visible",
			p.Annotations[v1alpha1.AnnotationAssignedGPUs], allocated, vis)
	}
	for _, u := range allocated {
		if slices.Contains(held, u) {
			t.Errorf("pod got GPU %s, which %s holds", u, train.Name)
		}
	}
	t.Logf("checked: pod ran without the extender on %v, recorded as allocated-gpus", allocated)

	e.startExtender(t)
	t.Logf("injected: extender started again")
	var found []string
	for _, h := range e.ext.Core().Report().Holdings() {
		if h.PodUID == p.UID {
			found = v1alpha1.SortedGPUList(h.GPUs)
		}
	}
	if !slices.Equal(allocated, found) {
		t.Errorf("rebuilt ledger holds %v for the pod; want its allocated-gpus %v", found, allocated)
	}
	next := e.runsApart(t, "after-extender-ignored", 2, append(slices.Clone(held), allocated...))
	e.audit(t)
	e.deletePods(t, nsTeam, p.Name, next.Name)
}

// gpuLost fails a GPU that no pod holds and checks it leaves the pool:
// the node's other free GPUs fill a pod, which never gets the lost one; a
// further pod waits with a reason; train keeps running. It ends by
// deleting the train Job and every pod.
func (e *env) gpuLost(t *testing.T, train *corev1.Pod) {
	ctx := context.Background()
	held := harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs)
	lost := slices.IndexFunc(e.sim.UUIDs(), func(u string) bool { return !slices.Contains(held, u) })
	lostUUID := e.sim.UUIDs()[lost]
	if err := e.sim.InjectXID(lost, 79); err != nil {
		t.Fatal(err)
	}
	t.Logf("injected: XID 79 (GPU fallen off the bus) on GPU %d (%s); %s runs on %v", lost, lostUUID, train.Name, held)

	harness.Poll(t, time.Minute, "NodeGPUTopology to mark the GPU unhealthy", func() (bool, string) {
		obj := &v1alpha1.NodeGPUTopology{}
		if err := e.cp.Client.Get(ctx, client.ObjectKey{Name: nodeName}, obj); err != nil {
			return false, err.Error()
		}
		for _, g := range obj.Status.GPUs {
			if g.UUID == lostUUID {
				return g.Health == v1alpha1.GPUUnhealthy, fmt.Sprintf("health %s", g.Health)
			}
		}
		return false, "GPU not listed"
	})
	harness.Poll(t, 30*time.Second, "the extender to count the GPU unhealthy", func() (bool, string) {
		c := e.ext.Core().Report().Counts()
		return c.Unhealthy == 1, c.String()
	})
	e.waitKubeletGPUs(t, nodeGPUs-1)
	t.Logf("checked: NodeGPUTopology marks GPU %d Unhealthy, the extender counts it, kubelet allocatable is %d", lost, nodeGPUs-1)

	free := int64(nodeGPUs - len(held) - 1)
	fill := e.runsApart(t, "fill-healthy", free, held)
	if got := harness.PodGPUs(t, fill, v1alpha1.AnnotationAssignedGPUs); slices.Contains(got, lostUUID) {
		t.Errorf("pod %s got the lost GPU %s", fill.Name, lostUUID)
	}
	t.Logf("checked: a %d-GPU pod took exactly the healthy free GPUs, not the lost one", free)

	extra := gpuPod(nsTeam, "one-too-many", 1)
	e.create(t, extra)
	extra = e.waitPod(t, extra, time.Minute, "the extra pod to wait with a reason", func(p *corev1.Pod) bool {
		_, ok := scheduledFalse(p)
		return ok
	})
	c, _ := scheduledFalse(extra)
	if extra.Spec.NodeName != "" {
		t.Errorf("pod %s was bound to %s although no healthy GPU is free", extra.Name, extra.Spec.NodeName)
	}
	t.Logf("checked: a further 1-GPU pod waits: %s: %s", c.Reason, short(c.Message))

	p := e.getPod(t, train.Namespace, train.Name)
	if !isRunning(p) || !slices.Equal(held, harness.PodGPUs(t, p, v1alpha1.AnnotationAllocatedGPUs)) {
		t.Errorf("%s is %s with allocated-gpus %q after the GPU loss; want Running on %v", p.Name, p.Status.Phase, p.Annotations[v1alpha1.AnnotationAllocatedGPUs], held)
	}
	t.Logf("checked: %s keeps running on %v", p.Name, held)
	e.audit(t)
	e.deleteJob(t, nsTeam, "train")
	e.deletePods(t, nsTeam)
}

// webhookDown stops the webhook server: the apiserver must refuse pods
// the webhook would have judged and admit those it never sees.
func (e *env) webhookDown(t *testing.T, _ *corev1.Pod) {
	ctx := context.Background()
	e.stopWebhook(t)
	t.Logf("injected: webhook server stopped; registrations stay, failurePolicy Fail")
	err := e.cp.Client.Create(ctx, gpuPod(nsTeam, "while-webhook-down", 1))
	switch {
	case err == nil:
		t.Errorf("a GPU pod was admitted in %s with the webhook down", nsTeam)
	case !strings.Contains(err.Error(), "failed calling webhook") || !strings.Contains(err.Error(), webhook.WebhookMutatePod):
		t.Errorf("creation refused with %q; want the apiserver's failed-calling-webhook error for %s", short(err.Error()), webhook.WebhookMutatePod)
	default:
		t.Logf("checked: GPU pod in %s refused: %s", nsTeam, short(err.Error()))
	}
	sys := gpuPod(metav1.NamespaceSystem, "system-gpu-pod", 1)
	if err := e.cp.Client.Create(ctx, sys); err != nil {
		t.Errorf("a pod in kube-system was refused with the webhook down: %v", err)
	} else {
		t.Logf("checked: a GPU pod in kube-system was admitted")
	}
	e.deletePods(t, metav1.NamespaceSystem, sys.Name)

	t.Logf("injected: webhook server started again")
	e.startWebhook(t)
	t.Logf("checked: GPU pods in %s are mutated again", nsTeam)
}
