package nodeagent

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// kubeletModel follows kubelet's device manager for one resource
// (pkg/kubelet/cm/devicemanager/manager.go: Allocate, devicesToAllocate):
// at admission it allocates a pod's init containers, then its app
// containers, one at a time. A container first takes the devices the
// pod's one-shot init containers left for reuse, then asks
// GetPreferredAllocation for the rest (the reused ones as must-include,
// offered with the free ones), takes the preferred free devices, fills up
// from the free ones, and calls Allocate with them all; with reuse alone
// enough it asks no preference. A one-shot init container's devices stay
// reusable; an app container's or sidecar's leave the reusable set. Its
// PodResources List, like kubelet's, shows app containers and sidecars
// only.
type kubeletModel struct {
	t      *testing.T
	plugin *DevicePlugin
	all    []string
	inUse  map[string]bool
	pods   []*kubeletPod
	// ignorePlan makes it take free devices from the end, whatever the
	// plugin prefers.
	ignorePlan bool
	// afterContainer runs after each container's Allocate.
	afterContainer func()
}

type kubeletPod struct {
	namespace, name string
	containers      []kubeletContainer
}

type kubeletContainer struct {
	name    string
	shown   bool // app container or sidecar: PodResources reports it
	devices []string
}

var _ PodResourcesLister = (*kubeletModel)(nil)

func (k *kubeletModel) List(context.Context) ([]*podresourcesapi.PodResources, error) {
	var out []*podresourcesapi.PodResources
	for _, p := range k.pods {
		pr := &podresourcesapi.PodResources{Namespace: p.namespace, Name: p.name}
		for _, c := range p.containers {
			if !c.shown {
				continue
			}
			cr := &podresourcesapi.ContainerResources{Name: c.name}
			if len(c.devices) > 0 {
				cr.Devices = []*podresourcesapi.ContainerDevices{{ResourceName: v1alpha1.ResourceGPU, DeviceIds: c.devices}}
			}
			pr.Containers = append(pr.Containers, cr)
		}
		out = append(out, pr)
	}
	return out, nil
}

// admit allocates every container of pod and returns the devices kubelet
// holds for it.
func (k *kubeletModel) admit(pod *corev1.Pod) []string {
	k.t.Helper()
	kp := &kubeletPod{namespace: pod.Namespace, name: pod.Name}
	k.pods = append(k.pods, kp)
	reuse := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		got := k.allocate(kp, c, sidecar, reuse)
		for _, id := range got {
			if sidecar {
				delete(reuse, id)
			} else {
				reuse[id] = true
			}
		}
	}
	for _, c := range pod.Spec.Containers {
		for _, id := range k.allocate(kp, c, true, reuse) {
			delete(reuse, id)
		}
	}
	return k.held(kp)
}

func (k *kubeletModel) allocate(kp *kubeletPod, c corev1.Container, shown bool, reuse map[string]bool) []string {
	k.t.Helper()
	ctx := context.Background()
	q := c.Resources.Limits[v1alpha1.ResourceGPU]
	need := int(q.Value())
	var got []string
	if need > 0 {
		// kubelet ranges over a map here; take the reusable devices from
		// the end so that nothing depends on the plan's order.
		reusable := setList(reuse)
		for i := len(reusable) - 1; i >= 0 && len(got) < need; i-- {
			got = append(got, reusable[i])
		}
		var free []string
		for _, id := range k.all {
			if !k.inUse[id] {
				free = append(free, id)
			}
		}
		if len(got) < need {
			resp, err := k.plugin.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: append(slices.Clone(free), got...), MustIncludeDeviceIDs: slices.Clone(got), AllocationSize: int32(need),
			}}})
			if err != nil {
				k.t.Fatalf("GetPreferredAllocation: %v", err)
			}
			if !k.ignorePlan {
				for _, id := range resp.ContainerResponses[0].DeviceIDs {
					if len(got) < need && !k.inUse[id] && !slices.Contains(got, id) {
						got = append(got, id)
					}
				}
			}
			for i := len(free) - 1; i >= 0 && len(got) < need; i-- {
				if !slices.Contains(got, free[i]) {
					got = append(got, free[i])
				}
			}
			if len(got) < need {
				k.t.Fatalf("container %s/%s: %d devices free, needs %d", kp.name, c.Name, len(got), need)
			}
		}
		for _, id := range got {
			k.inUse[id] = true
		}
		if _, err := k.plugin.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: got}}}); err != nil {
			k.t.Fatalf("Allocate: %v", err)
		}
	}
	kp.containers = append(kp.containers, kubeletContainer{name: c.Name, shown: shown, devices: got})
	if need > 0 && k.afterContainer != nil {
		k.afterContainer()
	}
	return got
}

func (k *kubeletModel) held(kp *kubeletPod) []string {
	set := map[string]bool{}
	for _, c := range kp.containers {
		for _, id := range c.devices {
			set[id] = true
		}
	}
	return setList(set)
}

// end removes the pod and frees its devices, as kubelet does once it ends.
func (k *kubeletModel) end(name string) {
	for i, p := range k.pods {
		if p.name == name {
			for _, id := range k.held(p) {
				delete(k.inUse, id)
			}
			k.pods = slices.Delete(k.pods, i, i+1)
			return
		}
	}
}

// shape is a pod's GPU containers: one-shot init containers, sidecars
// (restartable init containers, started before the init containers that
// follow them in the list) and app containers.
type shape struct {
	init []ctr
	app  []int
}

type ctr struct {
	gpus    int
	sidecar bool
}

func gpuLimits(n int) corev1.ResourceRequirements {
	if n == 0 {
		return corev1.ResourceRequirements{}
	}
	q := *resource.NewQuantity(int64(n), resource.DecimalSI)
	return corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: q}}
}

// shapedPod is a pod bound to the node at boundAt, Pending, with the plan
// (nil for none).
func shapedPod(name string, s shape, plan []string, boundAt time.Time) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(boundAt)},
		Spec:       corev1.PodSpec{NodeName: testNode},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(boundAt)},
		}},
	}
	for i, c := range s.init {
		ic := corev1.Container{Name: fmt.Sprintf("init%d", i), Resources: gpuLimits(c.gpus)}
		if c.sidecar {
			ic.Name = fmt.Sprintf("sidecar%d", i)
			ic.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, ic)
	}
	for i, n := range s.app {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("app%d", i), Resources: gpuLimits(n)})
	}
	if plan != nil {
		p.Annotations = map[string]string{v1alpha1.AnnotationAssignedGPUs: v1alpha1.FormatGPUList(plan)}
	}
	return p
}

// agentUnderTest is the device plugin and reconciler of one node agent
// process, over the shared API and kubelet.
type agentUnderTest struct {
	plugin *DevicePlugin
	rec    *Reconciler
	pods   *PodCache
	events *record.FakeRecorder
	stop   context.CancelFunc
}

func startAgentUnderTest(t *testing.T, cs *fake.Clientset, k *kubeletModel) *agentUnderTest {
	t.Helper()
	return startAgentUnderTestWith(t, cs, k, true)
}

// startAgentUnderTestWith is startAgentUnderTest whose device plugin, with
// podResources false, cannot read kubelet's PodResources (the reconciler
// still can).
func startAgentUnderTestWith(t *testing.T, cs *fake.Clientset, k *kubeletModel, podResources bool) *agentUnderTest {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pods := NewPodCache(cs, testNode)
	if err := pods.Start(ctx); err != nil {
		t.Fatal(err)
	}
	plugin := NewDevicePlugin(DevicePluginOptions{PluginDir: t.TempDir()}, pods, nil, logr.Discard())
	plugin.SetTopology(fixture(t, "dgx-a100").Graph(testNode).Status())
	events := record.NewFakeRecorder(100)
	rec := NewReconciler(cs, pods, k, v1alpha1.ResourceGPU, events, NewMetrics(prometheus.NewRegistry(), testNode), logr.Discard(), 0)
	if !podResources {
		plugin.Allocations().UsePodResources(failingPodResources{})
	}
	rec.UseAllocations(plugin.Allocations())
	k.plugin = plugin
	return &agentUnderTest{plugin: plugin, rec: rec, pods: pods, events: events, stop: cancel}
}

// reconcileSynced reconciles once the cache holds what the API holds.
func (a *agentUnderTest) reconcileSynced(t *testing.T, cs *fake.Clientset) {
	t.Helper()
	waitCache(t, cs, a.pods)
	if err := a.rec.Reconcile(context.Background()); err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	waitCache(t, cs, a.pods)
}

// waitCache waits until every pod in the API is in the cache as it is in
// the API.
func waitCache(t *testing.T, cs *fake.Clientset, pods *PodCache) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			api := &list.Items[i]
			got, ok := pods.Get(api.Namespace, api.Name)
			if !ok || !apiequality.Semantic.DeepEqual(got, api) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pod cache did not catch up: %v", err)
	}
}

func setPhase(t *testing.T, cs *fake.Clientset, name string, phase corev1.PodPhase) {
	t.Helper()
	ctx := context.Background()
	p, err := cs.CoreV1().Pods("ns").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = phase
	if _, err := cs.CoreV1().Pods("ns").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func allocatedOf(t *testing.T, cs *fake.Clientset, name string) string {
	t.Helper()
	p, err := cs.CoreV1().Pods("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Annotations[v1alpha1.AnnotationAllocatedGPUs]
}

func drainEvents(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case ev := <-r.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// TestReconcilerWholePodAccounting admits pods of every shape through a kubelet that
// allocates as kubelet's device manager does, with node agent restarts at
// the moments that lose the in-memory log, and checks that allocated-gpus
// names every GPU kubelet holds for the pod and that following a plan the
// size of the pod's demand raises no drift.
func TestReconcilerWholePodAccounting(t *testing.T) {
	gpus := make([]string, 8)
	for i := range gpus {
		gpus[i] = machine.FixtureUUID(testNode, i)
	}
	type podCase struct {
		name string
		s    shape
		plan []int // GPU indices; nil for a pod the extender did not plan
	}
	shapes := map[string]podCase{
		"init-only":         {"init-only", shape{init: []ctr{{gpus: 1}}, app: []int{0}}, []int{0}},
		"init4-app2":        {"init4-app2", shape{init: []ctr{{gpus: 4}}, app: []int{2}}, []int{4, 1, 2, 3}},
		"sidecar1-app2":     {"sidecar1-app2", shape{init: []ctr{{gpus: 1, sidecar: true}}, app: []int{2}}, []int{7, 5, 6}},
		"app2-app2":         {"app2-app2", shape{app: []int{2, 2}}, []int{4, 5, 6, 7}},
		"init2-app4":        {"init2-app4", shape{init: []ctr{{gpus: 2}}, app: []int{4}}, []int{0, 1, 2, 3}},
		"sidecar1-init4":    {"sidecar1-init4", shape{init: []ctr{{gpus: 1, sidecar: true}, {gpus: 4}}, app: []int{2}}, []int{0, 1, 2, 3, 4}},
		"init1-init3":       {"init1-init3", shape{init: []ctr{{gpus: 1}, {gpus: 3}}, app: []int{1}}, []int{5, 6, 7}},
		"init-only-noplan":  {"init-only-noplan", shape{init: []ctr{{gpus: 2}}, app: []int{0}}, nil},
		"init4-app2-noplan": {"init4-app2-noplan", shape{init: []ctr{{gpus: 4}}, app: []int{2}}, nil},
	}
	// restart is when the node agent restarts: never, after every pod was
	// recorded, or after admission but before any record (the in-memory
	// log is lost, allocated-gpus not yet written).
	type restart int
	const (
		noRestart restart = iota
		restartAfterRecord
		restartBeforeRecord
	)
	for _, tc := range []struct {
		name string
		pods []string
		// together: admitted one after the other while all are still
		// Pending (one kubelet batch), rather than each running before
		// the next is admitted.
		together bool
		restart  restart
		// midAdmission reconciles after every container's Allocate,
		// while the pod is still Pending.
		midAdmission bool
		ignorePlan   bool
	}{
		{name: "init-only GPUs are the pod's", pods: []string{"init-only"}},
		{name: "init 4 + app 2 holds 4, as planned", pods: []string{"init4-app2"}},
		{name: "sidecar 1 + app 2 holds 3", pods: []string{"sidecar1-app2"}},
		{name: "two app containers 2 + 2 hold 4", pods: []string{"app2-app2"}},
		{name: "init 2 + app 4 reuses the init GPUs and adds 2", pods: []string{"init2-app4"}},
		{name: "sidecar 1 then init 4 + app 2 holds 5", pods: []string{"sidecar1-init4"}},
		{name: "init 1 then init 3 + app 1 holds 3", pods: []string{"init1-init3"}},
		{name: "pods one after another keep apart", pods: []string{"init-only", "init4-app2", "sidecar1-app2"}},
		{name: "pods admitted together keep apart", pods: []string{"init-only", "init4-app2", "sidecar1-app2"}, together: true},
		{name: "reconciled in the middle of admission: no partial record", pods: []string{"init4-app2", "sidecar1-app2", "init-only"}, midAdmission: true},
		{name: "no plan: init-only GPUs attributed to the pending pod", pods: []string{"init-only-noplan"}},
		{name: "no plan: init 4 + app 2 attributed to the pending pod", pods: []string{"init4-app2-noplan"}},
		{name: "kubelet off the plan: truth recorded, drift raised once", pods: []string{"init4-app2"}, ignorePlan: true},
		{name: "agent restart after the record: allocated-gpus kept whole", pods: []string{"init-only", "init4-app2", "sidecar1-app2"}, restart: restartAfterRecord},
		{name: "agent restart after the record: two app containers", pods: []string{"app2-app2"}, restart: restartAfterRecord},
		{name: "agent restart before the record: init GPUs taken from the plan", pods: []string{"init-only", "init4-app2", "sidecar1-app2"}, restart: restartBeforeRecord},
		{name: "agent restart before the record: two app containers", pods: []string{"app2-app2"}, restart: restartBeforeRecord},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := time.Now().Add(-time.Hour).Truncate(time.Second)
			var objs []*corev1.Pod
			for i, name := range tc.pods {
				pc := shapes[name]
				var plan []string
				if pc.plan != nil {
					plan = pick(gpus, pc.plan...)
				}
				objs = append(objs, shapedPod(name, pc.s, plan, base.Add(time.Duration(i)*time.Second)))
			}
			cs := fake.NewClientset()
			for _, p := range objs {
				if _, err := cs.CoreV1().Pods("ns").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			k := &kubeletModel{t: t, all: gpus, inUse: map[string]bool{}, ignorePlan: tc.ignorePlan}
			agent := startAgentUnderTest(t, cs, k)
			waitCache(t, cs, agent.pods)
			if tc.midAdmission {
				k.afterContainer = func() {
					if err := agent.rec.Reconcile(context.Background()); err != nil {
						t.Fatalf("Reconcile: %v", err)
					}
				}
			}
			truth := map[string]string{}
			for _, p := range objs {
				truth[p.Name] = v1alpha1.FormatGPUList(k.admit(p))
				if tc.midAdmission {
					waitCache(t, cs, agent.pods)
					if got := allocatedOf(t, cs, p.Name); got != "" && got != truth[p.Name] {
						t.Errorf("pod %s: partial allocated-gpus %q written while kubelet was admitting it (holds %q)", p.Name, got, truth[p.Name])
					}
				}
				if !tc.together {
					setPhase(t, cs, p.Name, corev1.PodRunning)
					waitCache(t, cs, agent.pods)
				}
			}
			k.afterContainer = nil
			for _, p := range objs {
				if tc.together {
					setPhase(t, cs, p.Name, corev1.PodRunning)
				}
			}
			if tc.restart == restartBeforeRecord {
				agent.stop()
				agent = startAgentUnderTest(t, cs, k)
			}
			agent.reconcileSynced(t, cs)
			if tc.restart == restartAfterRecord {
				agent.stop()
				agent = startAgentUnderTest(t, cs, k)
				agent.reconcileSynced(t, cs)
			}
			agent.reconcileSynced(t, cs) // a second pass changes nothing

			got := map[string]string{}
			for _, p := range objs {
				got[p.Name] = allocatedOf(t, cs, p.Name)
			}
			if diff := cmp.Diff(truth, got); diff != "" {
				t.Errorf("allocated-gpus against what kubelet holds (-kubelet +annotation):\n%s", diff)
			}
			held := map[string]string{}
			for _, name := range tc.pods {
				for _, id := range gpuNames(got[name]) {
					if other, ok := held[id]; ok {
						t.Errorf("GPU %s recorded for both %s and %s", id, other, name)
					}
					held[id] = name
				}
			}
			events := drainEvents(agent.events)
			if tc.ignorePlan {
				if len(events) != 1 {
					t.Errorf("kubelet off the plan: got events %q, want one %s", events, ReasonAssignmentDrift)
				}
			} else if len(events) > 0 {
				t.Errorf("kubelet followed the whole-pod plan, yet events %q", events)
			}
		})
	}
}

func gpuNames(list string) []string {
	l, _ := v1alpha1.ParseGPUList(v1alpha1.AnnotationAllocatedGPUs, list)
	return l
}

// TestAllocationLogFollowsEndedPods: when a pod ends, kubelet drops it from
// PodResources and hands its devices on; the log forgets the ended pod and
// the next pod's record holds only its own devices.
func TestAllocationLogFollowsEndedPods(t *testing.T) {
	gpus := make([]string, 8)
	for i := range gpus {
		gpus[i] = machine.FixtureUUID(testNode, i)
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	first := shapedPod("first", shape{init: []ctr{{gpus: 4}}, app: []int{2}}, pick(gpus, 0, 1, 2, 3), base)
	cs := fake.NewClientset(first)
	k := &kubeletModel{t: t, all: gpus, inUse: map[string]bool{}}
	agent := startAgentUnderTest(t, cs, k)
	waitCache(t, cs, agent.pods)
	k.admit(first)
	setPhase(t, cs, "first", corev1.PodRunning)
	agent.reconcileSynced(t, cs)
	if got, want := allocatedOf(t, cs, "first"), v1alpha1.FormatGPUList(v1alpha1.SortedGPUList(pick(gpus, 0, 1, 2, 3))); got != want {
		t.Fatalf("first: allocated-gpus %q, want %q", got, want)
	}

	k.end("first")
	setPhase(t, cs, "first", corev1.PodSucceeded)
	agent.reconcileSynced(t, cs)
	if got := agent.plugin.Allocations().Devices(first.UID); got != nil {
		t.Errorf("log still holds %v for the ended pod", got)
	}
	second := shapedPod("second", shape{init: []ctr{{gpus: 2}}, app: []int{1}}, pick(gpus, 2, 3), base.Add(time.Second))
	if _, err := cs.CoreV1().Pods("ns").Create(context.Background(), second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCache(t, cs, agent.pods)
	held := k.admit(second)
	setPhase(t, cs, "second", corev1.PodRunning)
	agent.reconcileSynced(t, cs)
	if got, want := allocatedOf(t, cs, "second"), v1alpha1.FormatGPUList(held); got != want {
		t.Errorf("second: allocated-gpus %q, want what kubelet holds %q", got, want)
	}
	if got, want := allocatedOf(t, cs, "first"), v1alpha1.FormatGPUList(v1alpha1.SortedGPUList(pick(gpus, 0, 1, 2, 3))); got != want {
		t.Errorf("ended pod's allocated-gpus changed to %q, want %q kept", got, want)
	}
}

// TestReconcilerTrustsPodResourcesOverTheLog: a device the log or an old
// allocated-gpus names for one pod but PodResources shows in another pod's
// container is not counted for the first; the rest of the log is.
func TestReconcilerTrustsPodResourcesOverTheLog(t *testing.T) {
	a := plannedPod("a", "GPU-1,GPU-3")
	a.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: gpuLimits(2)}}
	a.Spec.Containers = []corev1.Container{{Name: "app", Resources: gpuLimits(1)}}
	a.Status.Phase = corev1.PodRunning
	b := plannedPod("b", "GPU-4")
	b.Spec.Containers = []corev1.Container{{Name: "app", Resources: gpuLimits(1)}}
	b.Status.Phase = corev1.PodRunning
	b.Annotations[v1alpha1.AnnotationAllocatedGPUs] = "GPU-3,GPU-4"
	cs := fake.NewClientset(a, b)
	ctx := context.Background()
	pods := NewPodCache(cs, testNode)
	if err := pods.Start(ctx); err != nil {
		t.Fatal(err)
	}
	pr := &fakePodResources{pods: []*podresourcesapi.PodResources{
		podRes("ns", "a", []string{"GPU-3"}),
		podRes("ns", "b", []string{"GPU-4"}),
	}}
	log := newAllocationLog(logr.Discard())
	log.record(a.UID, "ns/a", []string{"GPU-1", "GPU-3"})
	log.record(b.UID, "ns/b", []string{"GPU-3", "GPU-4"}) // misattributed: kubelet shows GPU-3 in a
	rec := record.NewFakeRecorder(10)
	r := NewReconciler(cs, pods, pr, v1alpha1.ResourceGPU, rec, NewMetrics(prometheus.NewRegistry(), testNode), logr.Discard(), 0)
	r.UseAllocations(log)
	if err := r.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{"a": allocatedOf(t, cs, "a"), "b": allocatedOf(t, cs, "b")}
	want := map[string]string{"a": "GPU-1,GPU-3", "b": "GPU-4"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("allocated-gpus (-want +got):\n%s", diff)
	}
	if events := drainEvents(rec); len(events) > 0 {
		t.Errorf("both pods hold their plans, yet events %q", events)
	}
}

// mixes are pods of mixed GPU shapes that fill an 8-GPU node together,
// each with a plan of its demand (GPU indices), putting same-size
// containers of different pods side by side.
var mixes = []struct {
	name string
	pods []struct {
		name string
		s    shape
		plan []int
	}
}{
	{"init 2 + sidecar 1 + app 2, plain 2, app 1 + app 2", []struct {
		name string
		s    shape
		plan []int
	}{
		{"mixed", shape{init: []ctr{{gpus: 2}, {gpus: 1, sidecar: true}}, app: []int{2}}, []int{5, 0, 3}},
		{"plain", shape{app: []int{2}}, []int{7, 1}},
		{"multi", shape{app: []int{1, 2}}, []int{6, 2, 4}},
	}},
	{"sidecar 1 + init 2 + app 2, plain 2, app 2 + app 1", []struct {
		name string
		s    shape
		plan []int
	}{
		{"sidecar-first", shape{init: []ctr{{gpus: 1, sidecar: true}, {gpus: 2}}, app: []int{2}}, []int{2, 4, 6}},
		{"plain", shape{app: []int{2}}, []int{0, 7}},
		{"multi", shape{app: []int{2, 1}}, []int{1, 3, 5}},
	}},
	{"init 4 + app 2, two plain 2", []struct {
		name string
		s    shape
		plan []int
	}{
		{"init4", shape{init: []ctr{{gpus: 4}}, app: []int{2}}, []int{7, 0, 5, 2}},
		{"plain-a", shape{app: []int{2}}, []int{1, 6}},
		{"plain-b", shape{app: []int{2}}, []int{3, 4}},
	}},
	{"four plain 2", []struct {
		name string
		s    shape
		plan []int
	}{
		{"plain-a", shape{app: []int{2}}, []int{6, 1}},
		{"plain-b", shape{app: []int{2}}, []int{0, 5}},
		{"plain-c", shape{app: []int{2}}, []int{3, 7}},
		{"plain-d", shape{app: []int{2}}, []int{2, 4}},
	}},
	{"init-only 2, init 1 + init 2 + app 1, init 2 + sidecar 1 + app 2, single 1", []struct {
		name string
		s    shape
		plan []int
	}{
		{"init-only", shape{init: []ctr{{gpus: 2}}, app: []int{0}}, []int{3, 6}},
		{"two-inits", shape{init: []ctr{{gpus: 1}, {gpus: 2}}, app: []int{1}}, []int{0, 4}},
		{"mixed", shape{init: []ctr{{gpus: 2}, {gpus: 1, sidecar: true}}, app: []int{2}}, []int{7, 2, 5}},
		{"single", shape{app: []int{1}}, []int{1}},
	}},
	{"app 2 + app 2, init 2 + app 2 (reuses both), plain 2", []struct {
		name string
		s    shape
		plan []int
	}{
		{"app2-app2", shape{app: []int{2, 2}}, []int{0, 3, 4, 7}},
		{"init2-app2", shape{init: []ctr{{gpus: 2}}, app: []int{2}}, []int{1, 6}},
		{"plain", shape{app: []int{2}}, []int{2, 5}},
	}},
}

// permutations of 0..n-1, in lexicographic order.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{nil}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int(nil), p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	slices.SortFunc(out, slices.Compare)
	return out
}

// failingPodResources is a PodResources API that cannot be read.
type failingPodResources struct{}

func (failingPodResources) List(context.Context) ([]*podresourcesapi.PodResources, error) {
	return nil, fmt.Errorf("connection refused")
}

// TestConcurrentAdmissionEveryInterleaving creates the pods of each mix at
// once (one creation and bind second, so the admission order cannot be
// inferred from them), then has kubelet's device manager admit them in
// every order, and checks that every container is served from its own
// pod's plan: each pod holds exactly its plan, the log attributes to each
// pod exactly what kubelet holds for it (one-shot init containers
// included), and the reconciler records allocated-gpus = assigned-gpus
// with no drift. Without kubelet's PodResources the matcher has only the
// shapes and the inferred order; it is exact when kubelet follows that
// order (checked), and may swap same-size pods otherwise
// (docs/nodeagent.md).
func TestConcurrentAdmissionEveryInterleaving(t *testing.T) {
	gpus := make([]string, 8)
	for i := range gpus {
		gpus[i] = machine.FixtureUUID(testNode, i)
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, mix := range mixes {
		for _, withView := range []bool{true, false} {
			orders := permutations(len(mix.pods))
			if !withView {
				// Name order: the one the matcher infers from pods
				// created and bound in one second.
				byName := make([]int, len(mix.pods))
				for i := range byName {
					byName[i] = i
				}
				slices.SortFunc(byName, func(a, b int) int { return strings.Compare(mix.pods[a].name, mix.pods[b].name) })
				orders = [][]int{byName}
			}
			for _, order := range orders {
				name := fmt.Sprintf("%s/order %v", mix.name, order)
				if !withView {
					name += "/without PodResources"
				}
				t.Run(name, func(t *testing.T) {
					cs := fake.NewClientset()
					var objs []*corev1.Pod
					plans := map[string][]string{}
					for _, m := range mix.pods {
						plans[m.name] = pick(gpus, m.plan...)
						p := shapedPod(m.name, m.s, plans[m.name], base)
						if d, _ := v1alpha1.PodGPUDemand(&p.Spec, v1alpha1.ResourceGPU); int(d) != len(m.plan) {
							t.Fatalf("pod %s: plan of %d for a demand of %d", m.name, len(m.plan), d)
						}
						if _, err := cs.CoreV1().Pods("ns").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
							t.Fatal(err)
						}
						objs = append(objs, p)
					}
					k := &kubeletModel{t: t, all: gpus, inUse: map[string]bool{}}
					agent := startAgentUnderTestWith(t, cs, k, withView)
					waitCache(t, cs, agent.pods)
					truth := map[string]string{}
					for _, i := range order {
						truth[objs[i].Name] = v1alpha1.FormatGPUList(k.admit(objs[i]))
					}
					for _, p := range objs {
						want := v1alpha1.FormatGPUList(v1alpha1.SortedGPUList(plans[p.Name]))
						if truth[p.Name] != want {
							t.Errorf("pod %s: kubelet holds %s, its plan is %s", p.Name, truth[p.Name], want)
						}
						if got := v1alpha1.FormatGPUList(agent.plugin.Allocations().Devices(p.UID)); got != truth[p.Name] {
							t.Errorf("pod %s: the log attributes %s, kubelet holds %s", p.Name, got, truth[p.Name])
						}
						setPhase(t, cs, p.Name, corev1.PodRunning)
					}
					agent.reconcileSynced(t, cs)
					for _, p := range objs {
						if got := allocatedOf(t, cs, p.Name); got != truth[p.Name] {
							t.Errorf("pod %s: allocated-gpus %q, kubelet holds %q", p.Name, got, truth[p.Name])
						}
					}
					if events := drainEvents(agent.events); len(events) > 0 {
						t.Errorf("every pod followed its plan, yet events %q", events)
					}
				})
			}
		}
	}
}

// TestMatcherRules checks each rule of fits and choose on one call.
func TestMatcherRules(t *testing.T) {
	// pod builds a candidate: its GPU containers ("init2" one-shot,
	// "sidecar1", "app2"), how many kubelet allocated, its reusable and
	// held devices, its plan.
	pod := func(name string, containers []string, done int, reuse, held, plan []string) *candidate {
		c := &candidate{PendingPod: PendingPod{Plan: Plan{Pod: "ns/" + name, UID: types.UID(name), GPUs: plan}}, done: done,
			reuse: setOf(reuse), held: setOf(held), recent: done > 0}
		for _, s := range containers {
			kind := strings.TrimRight(s, "0123456789")
			n, err := strconv.Atoi(strings.TrimPrefix(s, kind))
			if err != nil {
				t.Fatalf("container %q: %v", s, err)
			}
			c.Containers = append(c.Containers, ContainerGPUs{Name: s, GPUs: n, OneShot: kind == "init"})
		}
		return c
	}
	gpa := func(size int, available, must []string) kubeletCall {
		return kubeletCall{preferred: true, size: size, available: available, mustInclude: must}
	}
	alloc := func(devices ...string) kubeletCall { return kubeletCall{size: len(devices), devices: devices} }
	free := []string{"g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"}
	for _, tc := range []struct {
		name  string
		pods  []*candidate // in admission order
		call  kubeletCall
		view  kubeletView
		want  string // pod name; "" for none
		wantH string
	}{
		{
			name: "size tells a 1-GPU sidecar from a 2-GPU pod",
			pods: []*candidate{pod("plain", []string{"app2"}, 0, nil, nil, nil), pod("mixed", []string{"sidecar1", "init2", "app2"}, 0, nil, nil, nil)},
			call: gpa(1, free, nil), want: "mixed", wantH: "only fit",
		},
		{
			name: "a one-shot init container of 2 and a plain pod of 2: kubelet lists only the one it admits",
			pods: []*candidate{pod("plain", []string{"app2"}, 0, nil, nil, []string{"g0", "g1"}), pod("mixed", []string{"init2", "sidecar1", "app2"}, 0, nil, nil, []string{"g2", "g3", "g4"})},
			call: gpa(2, free, nil), view: kubeletView{"ns/mixed": {}}, want: "mixed", wantH: "only fit kubelet lists",
		},
		{
			name: "a pod kubelet shows devices for that the log did not see was admitted before",
			pods: []*candidate{pod("old", []string{"app2"}, 0, nil, nil, nil), pod("new", []string{"app2"}, 0, nil, nil, nil)},
			call: gpa(2, free, nil), view: kubeletView{"ns/old": {"g6", "g7"}, "ns/new": {}}, want: "new", wantH: "only fit kubelet lists",
		},
		{
			name: "kubelet lists none of the pods that fit: no pod",
			pods: []*candidate{pod("a", []string{"app2"}, 0, nil, nil, nil)},
			call: gpa(2, free, nil), view: kubeletView{"ns/other": {}}, want: "",
		},
		{
			name: "the sidecar's Allocate from its init container's devices fits only that pod",
			pods: []*candidate{pod("mixed", []string{"init2", "sidecar1", "app2"}, 1, []string{"g2", "g3"}, []string{"g2", "g3"}, nil), pod("single", []string{"app1"}, 0, nil, nil, nil)},
			call: alloc("g3"), want: "mixed", wantH: "reuse",
		},
		{
			name: "must-include devices are the pod's reusable ones",
			pods: []*candidate{pod("plain", []string{"app2"}, 0, nil, nil, nil), pod("mixed", []string{"init2", "sidecar1", "app2"}, 2, []string{"g2"}, []string{"g2", "g3"}, nil)},
			call: gpa(2, free, []string{"g2"}), want: "mixed", wantH: "reuse",
		},
		{
			name: "reuse covering the container: kubelet asks no preference, so a preference is not that pod's",
			pods: []*candidate{pod("init4", []string{"init4", "app2"}, 1, []string{"g0", "g1", "g2", "g3"}, []string{"g0", "g1", "g2", "g3"}, nil), pod("plain", []string{"app2"}, 0, nil, nil, nil)},
			call: gpa(2, free, nil), view: kubeletView{"ns/init4": {}, "ns/plain": {}}, want: "plain", wantH: "only fit kubelet lists",
		},
		{
			name: "an Allocate of fresh devices is not a container that must reuse",
			pods: []*candidate{pod("init4", []string{"init4", "app2"}, 1, []string{"g0", "g1", "g2", "g3"}, []string{"g0", "g1", "g2", "g3"}, nil), pod("plain", []string{"app2"}, 0, nil, nil, nil)},
			call: alloc("g6", "g7"), want: "plain", wantH: "only fit",
		},
		{
			name: "without the view: the pod kubelet is in the middle of",
			pods: []*candidate{pod("plain", []string{"app2"}, 0, nil, nil, nil), pod("multi", []string{"app1", "app2"}, 1, nil, []string{"g5"}, nil)},
			call: gpa(2, free, nil), want: "multi", wantH: "in progress",
		},
		{
			name: "without the view: a pod kubelet stopped at long ago is not in progress",
			pods: []*candidate{pod("plain", []string{"app2"}, 0, nil, nil, nil), func() *candidate {
				c := pod("refused", []string{"app1", "app2"}, 1, nil, []string{"g5"}, nil)
				c.recent = false
				return c
			}()},
			call: gpa(2, free, nil), want: "plain", wantH: "admission order",
		},
		{
			name: "without the view: a pod whose plan is free beats one whose plan is taken",
			pods: []*candidate{pod("a", []string{"app2"}, 0, nil, nil, []string{"g6", "g7"}), pod("b", []string{"app2"}, 0, nil, nil, []string{"g2", "g3"})},
			call: gpa(2, free[:6], nil), want: "b", wantH: "plan fits",
		},
		{
			name: "without the view and nothing else to tell: the first in admission order",
			pods: []*candidate{pod("a", []string{"app2"}, 0, nil, nil, []string{"g6", "g7"}), pod("b", []string{"app2"}, 0, nil, nil, []string{"g2", "g3"})},
			call: gpa(2, free, nil), want: "a", wantH: "admission order",
		},
		{
			name: "with the view and two pods listed: the one kubelet took in last",
			pods: []*candidate{pod("a", []string{"app2"}, 0, nil, nil, []string{"g6", "g7"}), pod("b", []string{"app2"}, 0, nil, nil, []string{"g2", "g3"})},
			call: gpa(2, free, nil), view: kubeletView{"ns/a": {}, "ns/b": {}}, want: "b", wantH: "latest kubelet lists",
		},
		{
			name: "a pod whose containers are all allocated fits nothing",
			pods: []*candidate{pod("done", []string{"app2"}, 1, nil, []string{"g0", "g1"}, nil)},
			call: gpa(2, free, nil), want: "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fit := filter(tc.pods, func(c *candidate) bool { return c.fits(tc.call) })
			c, how := choose(fit, tc.call, tc.view)
			got := ""
			if c != nil {
				got = strings.TrimPrefix(c.Pod, "ns/")
			}
			if got != tc.want || tc.want != "" && how != tc.wantH {
				t.Errorf("chose %q by %q; want %q by %q", got, how, tc.want, tc.wantH)
			}
		})
	}
}
