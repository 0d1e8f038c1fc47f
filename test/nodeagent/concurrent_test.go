//go:build integration

package nodeagent_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/test/kubelet"
)

// oneShotPrefix names the one-shot init containers of the shaped pods: the
// fake runtime never ends a container by itself, so the test ends these
// (exit 0) once they run, as a real init container would.
const oneShotPrefix = "init-"

// gpuContainer is one GPU container of a shaped pod, in spec order.
type gpuContainer struct {
	kind string // "init" (one-shot), "sidecar" (restartable init) or "app"
	gpus int64
}

// podShape is a pod's containers, init containers (one-shot and sidecars)
// first, as the spec lists them.
type podShape []gpuContainer

func (s podShape) String() string {
	parts := make([]string, len(s))
	for i, c := range s {
		parts[i] = fmt.Sprintf("%s %d", c.kind, c.gpus)
	}
	return strings.Join(parts, " + ")
}

// shapedPod is an unbound pod in namespace with the shape's containers.
func shapedPod(name string, s podShape) *corev1.Pod {
	p := harness.GPUPod(namespace, name, 1)
	p.Spec.AutomountServiceAccountToken = ptr.To(false)
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	image := p.Spec.Containers[0].Image
	p.Spec.Containers = nil
	limits := func(n int64) corev1.ResourceRequirements {
		if n == 0 {
			return corev1.ResourceRequirements{}
		}
		q := *resource.NewQuantity(n, resource.DecimalSI)
		return corev1.ResourceRequirements{Requests: corev1.ResourceList{v1alpha1.ResourceGPU: q}, Limits: corev1.ResourceList{v1alpha1.ResourceGPU: q}}
	}
	for i, c := range s {
		ctr := corev1.Container{Name: fmt.Sprintf("%s-%d", c.kind, i), Image: image, Resources: limits(c.gpus)}
		switch c.kind {
		case "init":
			ctr.Name = fmt.Sprintf("%s%d", oneShotPrefix, i)
			p.Spec.InitContainers = append(p.Spec.InitContainers, ctr)
		case "sidecar":
			ctr.RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
			p.Spec.InitContainers = append(p.Spec.InitContainers, ctr)
		default:
			p.Spec.Containers = append(p.Spec.Containers, ctr)
		}
	}
	return p
}

// endOneShotInitContainers makes every running one-shot init container of
// the fake runtime exit 0; kubelet then starts the pod's next container.
func (e *env) endOneShotInitContainers(ctx context.Context) {
	rs := e.k.Runtime.Fake.RuntimeService
	_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
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

// TestConcurrentAdmissionServesEveryPodItsPlan creates pods of mixed GPU
// shapes at once, each with a plan, so that together they fill the node,
// and binds them all concurrently: kubelet admits them one after the other
// in an order the node agent cannot know in advance, and the device plugin
// API does not say which pod a GetPreferredAllocation or Allocate is for.
// Every pod must get exactly its plan (allocated-gpus = assigned-gpus, no
// GPUAssignmentDrift), each GPU container must see its count of GPUs from
// its own pod's plan, and no GPU may be in containers of two pods. The
// mixes put same-size containers of different pods side by side (a
// one-shot init container of 2 next to a plain 2-GPU pod; several plain
// pods of one size), which a plan matched by size alone confuses.
func TestConcurrentAdmissionServesEveryPodItsPlan(t *testing.T) {
	const repetitions = 20
	e := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go e.endOneShotInitContainers(ctx)

	type member struct {
		role  string
		shape podShape
	}
	mixes := [][]member{
		{ // the shapes of the report: init + sidecar + app, plain, multi-container
			{"mixed", podShape{{"init", 2}, {"sidecar", 1}, {"app", 2}}},
			{"plain", podShape{{"app", 2}}},
			{"multi", podShape{{"app", 1}, {"app", 2}}},
		},
		{ // a sidecar started before the one-shot init container
			{"sidecar-first", podShape{{"sidecar", 1}, {"init", 2}, {"app", 2}}},
			{"plain", podShape{{"app", 2}}},
			{"multi", podShape{{"app", 2}, {"app", 1}}},
		},
		{ // init 4 whose app reuses 2 of them, two plain pods of one size
			{"init4", podShape{{"init", 4}, {"app", 2}}},
			{"plain-a", podShape{{"app", 2}}},
			{"plain-b", podShape{{"app", 2}}},
		},
		{ // four plain pods of one size
			{"plain-a", podShape{{"app", 2}}},
			{"plain-b", podShape{{"app", 2}}},
			{"plain-c", podShape{{"app", 2}}},
			{"plain-d", podShape{{"app", 2}}},
		},
		{ // GPUs only in an init container, two one-shot inits, a single GPU
			{"init-only", podShape{{"init", 2}, {"app", 0}}},
			{"two-inits", podShape{{"init", 1}, {"init", 2}, {"app", 1}}},
			{"mixed", podShape{{"init", 2}, {"sidecar", 1}, {"app", 2}}},
			{"single", podShape{{"app", 1}}},
		},
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	all := e.sim.UUIDs()
	failed := 0
	for rep := range repetitions {
		mix := mixes[rep%len(mixes)]
		perm := rng.Perm(len(all))
		pods := make([]*corev1.Pod, len(mix))
		plans := map[string][]string{}
		shapes := map[string]podShape{}
		next := 0
		var desc []string
		for i, m := range mix {
			name := fmt.Sprintf("r%02d-%s", rep, m.role)
			pods[i] = shapedPod(name, m.shape)
			demand, err := v1alpha1.PodGPUDemand(&pods[i].Spec, v1alpha1.ResourceGPU)
			if err != nil {
				t.Fatal(err)
			}
			plan := make([]string, demand)
			for j := range plan {
				plan[j] = all[perm[next]]
				next++
			}
			plans[name], shapes[name] = plan, m.shape
			desc = append(desc, fmt.Sprintf("%s (%s; plan of %d)", name, m.shape, demand))
		}
		if next != len(all) {
			t.Fatalf("mix %d fills %d of the node's %d GPUs", rep%len(mixes), next, len(all))
		}
		// Created in a random order, then bound all at once.
		rng.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
		for _, p := range pods {
			if err := e.cp.Client.Create(ctx, p); err != nil {
				t.Fatalf("create pod %s: %v", p.Name, err)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, len(pods))
		for i, p := range pods {
			wg.Go(func() {
				b := &corev1.Binding{
					ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: p.Name,
						Annotations: map[string]string{v1alpha1.AnnotationAssignedGPUs: v1alpha1.FormatGPUList(plans[p.Name])}},
					Target: corev1.ObjectReference{Kind: "Node", Name: nodeName},
				}
				errs[i] = e.cp.Clientset.CoreV1().Pods(namespace).Bind(ctx, b, metav1.CreateOptions{})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("bind pod %s: %v", pods[i].Name, err)
			}
		}

		var problems []string
		for _, p := range pods {
			e.waitRunning(t, p.Name)
		}
		owner := map[string]string{}
		for _, p := range pods {
			got := e.waitAllocatedAny(t, p.Name)
			if want := v1alpha1.SortedGPUList(plans[p.Name]); !slices.Equal(got, want) {
				problems = append(problems, fmt.Sprintf("%s: allocated-gpus %v, plan %v", p.Name, got, want))
			}
			for _, c := range e.k.Runtime.ContainersOf(namespace, p.Name) {
				gpus := kubelet.EnvList(c.Env[v1alpha1.EnvVisibleDevices])
				want := containerGPUs(shapes[p.Name], c.Name)
				if int64(len(gpus)) != want {
					problems = append(problems, fmt.Sprintf("%s/%s sees %v, wants %d GPUs", p.Name, c.Name, gpus, want))
				}
				for _, id := range gpus {
					if o, ok := owner[id]; ok && o != p.Name {
						problems = append(problems, fmt.Sprintf("GPU %s is in containers of %s and %s", id, o, p.Name))
					}
					owner[id] = p.Name
					if !slices.Contains(plans[p.Name], id) {
						problems = append(problems, fmt.Sprintf("%s/%s sees %s, not of its plan %v", p.Name, c.Name, id, plans[p.Name]))
					}
				}
			}
		}
		// The reconciler raises drift within a pass of the record: none
		// may appear for these pods in the next 2s, so this wait must run
		// out.
		err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Second, true, func(context.Context) (bool, error) {
			for _, p := range pods {
				if e.driftEvents(t, p.Name) != 0 {
					return true, nil
				}
			}
			return false, nil
		})
		if !wait.Interrupted(err) {
			for _, p := range pods {
				if n := e.driftEvents(t, p.Name); n != 0 {
					problems = append(problems, fmt.Sprintf("%s: %d %s events", p.Name, n, "GPUAssignmentDrift"))
				}
			}
		}
		if len(problems) > 0 {
			failed++
			t.Errorf("repetition %d, %s:\n  %s", rep, strings.Join(desc, ", "), strings.Join(problems, "\n  "))
		} else {
			t.Logf("repetition %d: %s: every pod got its plan", rep, strings.Join(desc, ", "))
		}
		e.deleteAll(t, pods)
	}
	if failed > 0 {
		t.Errorf("%d of %d repetitions served a pod off its plan", failed, repetitions)
	}
}

// containerGPUs is the GPU count of the shaped pod's container name.
func containerGPUs(s podShape, name string) int64 {
	for i, c := range s {
		n := fmt.Sprintf("%s-%d", c.kind, i)
		if c.kind == "init" {
			n = fmt.Sprintf("%s%d", oneShotPrefix, i)
		}
		if n == name {
			return c.gpus
		}
	}
	return -1
}

// waitAllocatedAny waits until the pod has an allocated-gpus record and
// returns it.
func (e *env) waitAllocatedAny(t *testing.T, name string) []string {
	t.Helper()
	p, err := e.cp.WaitForPod(context.Background(), namespace, name, 30*time.Second, func(p *corev1.Pod) bool {
		return p.Annotations[v1alpha1.AnnotationAllocatedGPUs] != ""
	})
	if err != nil {
		t.Fatalf("pod %s never got %s: %v", name, v1alpha1.AnnotationAllocatedGPUs, err)
	}
	return harness.PodGPUs(t, p, v1alpha1.AnnotationAllocatedGPUs)
}

// deleteAll deletes the pods at once and waits until the API and kubelet's
// PodResources no longer have them, so the next repetition finds the node
// free.
func (e *env) deleteAll(t *testing.T, pods []*corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Name] = true
		if err := e.cp.Client.Delete(ctx, p, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			t.Fatalf("delete pod %s: %v", p.Name, err)
		}
	}
	harness.Poll(t, time.Minute, "deleted pods to be gone from the API and kubelet", func() (bool, string) {
		list := &corev1.PodList{}
		if err := e.cp.Client.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return false, err.Error()
		}
		for _, p := range list.Items {
			if names[p.Name] {
				return false, "pod " + p.Name + " still in the API"
			}
		}
		prs, err := e.pr.List(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range prs {
			if p.Namespace == namespace && names[p.Name] {
				return false, "kubelet still lists " + p.Name
			}
		}
		return true, ""
	})
}
