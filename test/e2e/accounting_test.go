//go:build integration

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/test/kubelet"
)

// oneShotPrefix names the one-shot init containers of the accounting
// pods: the fake runtime never ends a container by itself, so the test
// ends these (exit 0) once they run, as a real init container would.
const oneShotPrefix = "init-"

// gpuShape is a pod's GPU containers, in the order kubelet runs them.
type gpuShape struct {
	// init are init containers: sidecar ones keep running beside the app
	// containers (restartPolicy Always), the others run to completion
	// first.
	init []initGPUs
	app  []int64
}

type initGPUs struct {
	gpus    int64
	sidecar bool
}

// shapedPod is a pod (not created) in nsTeam with the shape's containers.
func shapedPod(name string, s gpuShape) *corev1.Pod {
	p := gpuPod(nsTeam, name, 0)
	limits := func(n int64) corev1.ResourceRequirements {
		if n == 0 {
			return corev1.ResourceRequirements{}
		}
		q := *resource.NewQuantity(n, resource.DecimalSI)
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{v1alpha1.ResourceGPU: q}, Limits: corev1.ResourceList{v1alpha1.ResourceGPU: q}}
	}
	image := p.Spec.Containers[0].Image
	p.Spec.Containers = nil
	for i, n := range s.app {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("app-%d", i), Image: image, Resources: limits(n)})
	}
	for i, c := range s.init {
		ic := corev1.Container{Name: fmt.Sprintf("%s%d", oneShotPrefix, i), Image: image, Resources: limits(c.gpus)}
		if c.sidecar {
			ic.Name = fmt.Sprintf("sidecar-%d", i)
			ic.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, ic)
	}
	return p
}

// TestAccounting runs pods of every GPU shape through the whole system on
// the real kubelet and checks, after each, that the node agent and the
// extender account for exactly what kubelet holds: one-shot init
// containers' GPUs, which kubelet keeps with the pod until it ends and its
// PodResources API never reports, included.
func TestAccounting(t *testing.T) {
	start := time.Now()
	e := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.endOneShotInitContainers(ctx)

	scenarios := []struct {
		name string
		pods map[string]gpuShape // created together, in name order
		// restartAgent restarts the node agent once the pods run and
		// checks again: its in-memory allocation log is gone, the
		// annotations must carry what PodResources cannot show.
		restartAgent bool
	}{
		{name: "GPUs only in a one-shot init container", pods: map[string]gpuShape{
			"init-only": {init: []initGPUs{{gpus: 2}}, app: []int64{0}},
		}},
		{name: "init container 4 GPUs, app container 2", pods: map[string]gpuShape{
			"init4-app2": {init: []initGPUs{{gpus: 4}}, app: []int64{2}},
		}},
		{name: "sidecar 1 GPU, app container 2", pods: map[string]gpuShape{
			"sidecar1-app2": {init: []initGPUs{{gpus: 1, sidecar: true}}, app: []int64{2}},
		}},
		{name: "two app containers 2 + 2", pods: map[string]gpuShape{
			"app2-app2": {app: []int64{2, 2}},
		}},
		{name: "a mix created together filling the node, then a node agent restart", restartAgent: true, pods: map[string]gpuShape{
			"mix-a-init-only":     {init: []initGPUs{{gpus: 1}}, app: []int64{0}},
			"mix-b-init2-app1":    {init: []initGPUs{{gpus: 2}}, app: []int64{1}},
			"mix-c-sidecar1-app2": {init: []initGPUs{{gpus: 1, sidecar: true}}, app: []int64{2}},
			"mix-d-app1-app1":     {app: []int64{1, 1}},
		}},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			names := make([]string, 0, len(sc.pods))
			for name := range sc.pods {
				names = append(names, name)
			}
			slices.Sort(names)
			// Also after a failure, so that the next scenario finds the
			// node free.
			t.Cleanup(func() { e.deletePods(t, nsTeam, names...) })
			var desc []string
			for _, name := range names {
				p := shapedPod(name, sc.pods[name])
				demand, err := v1alpha1.PodGPUDemand(&p.Spec, v1alpha1.ResourceGPU)
				if err != nil {
					t.Fatal(err)
				}
				desc = append(desc, fmt.Sprintf("%s (%s; demand %d)", name, shapeString(sc.pods[name]), demand))
				e.create(t, p)
			}
			t.Logf("injected: %s", strings.Join(desc, ", "))
			for _, name := range names {
				e.waitPod(t, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsTeam, Name: name}}, 2*time.Minute, name+" to run", isRunning)
			}
			e.checkAccounting(t, names)
			// The drift audit every scenario of the suites ends with
			// judges these shapes too: every GPU container's devices, the
			// init containers' included.
			e.audit(t)
			if sc.restartAgent {
				e.stopAgent(t)
				e.startAgent(t)
				e.waitKubeletGPUs(t, nodeGPUs)
				// The accounting is judged once the restarted agent's
				// reconciler has passed over the running pods twice (its
				// loop does every 2s): a pass that fails is tried again.
				passes := 0
				harness.Poll(t, time.Minute, "two reconcile passes of the restarted node agent", func() (bool, string) {
					if err := e.agent.Reconciler.Reconcile(harness.Context(t)); err != nil {
						return false, fmt.Sprintf("%d passes; last: %v", passes, err)
					}
					passes++
					return passes == 2, fmt.Sprintf("%d passes", passes)
				})
				t.Logf("injected: node agent restarted with the pods running")
				e.checkAccounting(t, names)
				e.audit(t)
			}
		})
	}
	t.Logf("suite: %v in all", time.Since(start).Round(time.Second))
}

func shapeString(s gpuShape) string {
	var parts []string
	for _, c := range s.init {
		kind := "init"
		if c.sidecar {
			kind = "sidecar"
		}
		parts = append(parts, fmt.Sprintf("%s %d", kind, c.gpus))
	}
	for _, n := range s.app {
		parts = append(parts, fmt.Sprintf("app %d", n))
	}
	return strings.Join(parts, " + ")
}

// endOneShotInitContainers makes every running one-shot init container of
// the fake runtime exit 0, as a real one would when its work is done;
// kubelet then starts the next container of the pod.
func (e *env) endOneShotInitContainers(ctx context.Context) {
	rs := e.k.Runtime.Fake.RuntimeService
	_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		rs.Lock()
		defer rs.Unlock()
		for _, c := range rs.Containers {
			if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING && strings.HasPrefix(c.GetMetadata().GetName(), oneShotPrefix) {
				c.State = runtimeapi.ContainerState_CONTAINER_EXITED
				c.ExitCode = 0
				c.Reason = "Completed"
				c.FinishedAt = time.Now().UnixNano()
			}
		}
		return false, nil
	})
}

// checkAccounting waits until every source agrees with what kubelet holds
// for the named pods and fails with the differences of the last round:
//   - what kubelet holds for a pod is what its PodResources shows (app
//     containers and sidecars) plus the devices its one-shot init
//     containers got (from the container configs kubelet sent the
//     runtime), and has the size of the pod's v1alpha1.PodGPUDemand;
//   - allocated-gpus names exactly that, sorted;
//   - the extender's ledger holds that for the pod, and its free count is
//     the node's allocatable GPUs less the union of what kubelet holds;
//   - no GPU is in containers of two live pods;
//   - no GPUAssignmentDrift Event was raised for the pods.
func (e *env) checkAccounting(t *testing.T, names []string) {
	t.Helper()
	var diffs []string
	var summary string
	_ = wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 45*time.Second, true, func(ctx context.Context) (bool, error) {
		diffs, summary = e.accountingDiffs(ctx, names)
		return len(diffs) == 0, nil
	})
	if len(diffs) > 0 {
		t.Fatalf("accounting: %d differences:\n  %s", len(diffs), strings.Join(diffs, "\n  "))
	}
	t.Logf("checked: %s", summary)
}

func (e *env) accountingDiffs(ctx context.Context, names []string) ([]string, string) {
	var diffs []string
	add := func(format string, a ...any) { diffs = append(diffs, fmt.Sprintf(format, a...)) }

	prs, err := e.pr.List(ctx)
	if err != nil {
		return []string{"kubelet PodResources: " + err.Error()}, ""
	}
	shown := map[string][]string{}
	for _, p := range prs {
		for _, c := range p.Containers {
			for _, d := range c.Devices {
				if d.ResourceName == v1alpha1.ResourceGPU {
					shown[p.Namespace+"/"+p.Name] = append(shown[p.Namespace+"/"+p.Name], d.DeviceIds...)
				}
			}
		}
	}
	ledger := map[types.UID][]string{}
	for _, h := range e.ext.Core().Report().Holdings() {
		if h.Reserved || h.Unknown > 0 {
			add("ledger: %s holds %d unnamed GPUs, reserved %v", h.Pod, h.Unknown, h.Reserved)
		}
		ledger[h.PodUID] = v1alpha1.SortedGPUList(h.GPUs)
	}
	node := &corev1.Node{}
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Name: nodeName}, node); err != nil {
		return []string{"get node: " + err.Error()}, ""
	}
	allocatable := node.Status.Allocatable[corev1.ResourceName(v1alpha1.ResourceGPU)]

	owner := map[string]string{} // GPU -> live pod, from the containers kubelet created
	union := map[string]bool{}   // every GPU kubelet holds for a live pod
	var parts []string
	list := &corev1.PodList{}
	if err := e.cp.Client.List(ctx, list); err != nil {
		return []string{"list pods: " + err.Error()}, ""
	}
	for i := range list.Items {
		p := &list.Items[i]
		key := p.Namespace + "/" + p.Name
		if p.Spec.NodeName != nodeName || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		held := map[string]bool{}
		for _, id := range shown[key] {
			held[id] = true
		}
		for _, c := range e.k.Runtime.ContainersOf(p.Namespace, p.Name) {
			if c.PodUID != string(p.UID) {
				continue
			}
			for _, id := range kubelet.EnvList(c.Env[v1alpha1.EnvVisibleDevices]) {
				if o, ok := owner[id]; ok && o != key {
					add("GPU %s is visible to containers of two live pods: %s and %s", id, o, key)
				}
				owner[id] = key
				if strings.HasPrefix(c.Name, oneShotPrefix) {
					held[id] = true
				}
			}
		}
		for id := range held {
			union[id] = true
		}
		if !slices.Contains(names, p.Name) {
			continue
		}
		kubeletHeld := make([]string, 0, len(held))
		for id := range held {
			kubeletHeld = append(kubeletHeld, id)
		}
		kubeletHeld = v1alpha1.SortedGPUList(kubeletHeld)
		demand, err := v1alpha1.PodGPUDemand(&p.Spec, v1alpha1.ResourceGPU)
		if err != nil {
			add("pod %s: %v", key, err)
		}
		if int64(len(kubeletHeld)) != demand {
			add("pod %s: kubelet holds %d GPUs %v, its demand is %d", key, len(kubeletHeld), kubeletHeld, demand)
		}
		allocated := gpuListOrNote(p, v1alpha1.AnnotationAllocatedGPUs, add)
		if !slices.Equal(allocated, kubeletHeld) {
			add("pod %s: allocated-gpus %v, kubelet holds %v (PodResources shows %v)", key, allocated, kubeletHeld, v1alpha1.SortedGPUList(shown[key]))
		}
		if got := ledger[p.UID]; !slices.Equal(got, kubeletHeld) {
			add("pod %s: extender ledger holds %v, kubelet %v", key, got, kubeletHeld)
		}
		if e.driftRecorded(ctx, p) {
			add("pod %s: %s Event raised (assigned-gpus %v, allocated-gpus %v)", key, nodeagent.ReasonAssignmentDrift,
				gpuListOrNote(p, v1alpha1.AnnotationAssignedGPUs, add), allocated)
		}
		parts = append(parts, fmt.Sprintf("%s holds %d (PodResources shows %d)", p.Name, len(kubeletHeld), len(shown[key])))
	}
	c := e.ext.Core().Report().Counts()
	if want := int(allocatable.Value()) - len(union); c.Free != want {
		add("ledger free %d, want allocatable %d less the %d GPUs kubelet holds = %d (%s)", c.Free, allocatable.Value(), len(union), want, c)
	}
	return diffs, fmt.Sprintf("%s; ledger %s, allocatable %s, kubelet holds %d", strings.Join(parts, ", "), c, allocatable.String(), len(union))
}

func gpuListOrNote(p *corev1.Pod, key string, add func(string, ...any)) []string {
	l, err := v1alpha1.ParseGPUList(key, p.Annotations[key])
	if err != nil {
		add("pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return v1alpha1.SortedGPUList(l)
}
