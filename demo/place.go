package demo

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/topology"
)

// gpuSource is how a scheduler's bound pod gets its GPUs: gputopo's bind
// writes them on the pod; under plain kube-scheduler the device plugin
// chooses them when kubelet admits the pod.
type gpuSource interface {
	// known says whether p's GPUs can be read yet.
	known(p *corev1.Pod) bool
	// gpus returns the UUIDs of p's GPUs.
	gpus(ctx context.Context, c client.Client, p *corev1.Pod) ([]string, error)
	// gone says a pod that held uuids on node was deleted (preempted).
	gone(node string, uuids []string)
}

// gputopoGPUs reads the GPUs gputopo's bind wrote.
type gputopoGPUs struct{}

func (gputopoGPUs) known(p *corev1.Pod) bool {
	return p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationAssignedGPUs] != ""
}

func (gputopoGPUs) gpus(_ context.Context, _ client.Client, p *corev1.Pod) ([]string, error) {
	return v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
}

func (gputopoGPUs) gone(string, []string) {}

// place creates the namespace (labelled for gputopo's webhook when inject),
// then submits each workload and waits for its pods to be placed,
// numbering them in placement order. It returns the workloads as submitted
// (a Fill workload with its pod count) and every pod placed, those
// preempted later marked so.
func place(ctx context.Context, c client.Client, ws []Workload, nodes []NodeView, src gpuSource, inject bool, say func(string, ...any)) ([]Workload, []Placed, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}
	if inject {
		say("labelling namespace %s %s=%s", demoNamespace, v1alpha1.LabelInjection, v1alpha1.InjectionEnabled)
		ns.Labels = map[string]string{v1alpha1.LabelInjection: v1alpha1.InjectionEnabled}
	}
	if err := c.Create(ctx, ns); err != nil {
		return nil, nil, fmt.Errorf("create namespace: %w", err)
	}
	if err := createPriorityClasses(ctx, c, ws); err != nil {
		return nil, nil, err
	}
	graphs := map[string]*topology.Graph{}
	total := 0
	for _, n := range nodes {
		graphs[n.Name] = n.Graph
		total += n.Graph.Len()
	}
	order := 0
	var placed []Placed
	var submitted []Workload
	for _, w := range ws {
		if w.Fill {
			held := 0
			for _, p := range placed {
				if !p.Evicted {
					held += len(p.GPUs)
				}
			}
			if w.Pods = (total - held) / max(w.GPUs, 1); w.Pods == 0 {
				say("skipping %s: no GPU is left for it", w.Name)
				continue
			}
		}
		say("submitting %s", describe(w))
		if err := submit(ctx, c, w); err != nil {
			return nil, nil, err
		}
		submitted = append(submitted, w)
		pods, err := waitPlaced(ctx, c, w, src)
		if err != nil {
			return nil, nil, err
		}
		// Pods this workload preempted are gone by the time it is bound:
		// their GPUs are free again before its own are taken.
		var live corev1.PodList
		if err := c.List(ctx, &live, client.InNamespace(demoNamespace)); err != nil {
			return nil, nil, fmt.Errorf("list pods: %w", err)
		}
		alive := map[string]bool{}
		for _, p := range live.Items {
			if p.DeletionTimestamp == nil {
				alive[p.Name] = true
			}
		}
		for i := range placed {
			if p := &placed[i]; !p.Evicted && !alive[p.Name] {
				p.Evicted, p.EvictedBy = true, w.Name
				src.gone(p.Node, p.UUIDs)
			}
		}
		for _, p := range pods {
			pv, err := placedPod(ctx, c, src, graphs, w, &p)
			if err != nil {
				return nil, nil, err
			}
			order++
			pv.Order = order
			placed = append(placed, pv)
		}
	}
	return submitted, placed, nil
}

// placedPod reads (or has chosen) p's GPUs and its group record.
func placedPod(ctx context.Context, c client.Client, src gpuSource, graphs map[string]*topology.Graph, w Workload, p *corev1.Pod) (Placed, error) {
	uuids, err := src.gpus(ctx, c, p)
	if err != nil {
		return Placed{}, fmt.Errorf("pod %s: %w", p.Name, err)
	}
	g := graphs[p.Spec.NodeName]
	if g == nil {
		return Placed{}, fmt.Errorf("pod %s bound to unknown node %q", p.Name, p.Spec.NodeName)
	}
	idx := make([]int, 0, len(uuids))
	for _, u := range uuids {
		i, ok := g.IndexOf(u)
		if !ok {
			return Placed{}, fmt.Errorf("pod %s: GPU %s is not on node %s", p.Name, u, p.Spec.NodeName)
		}
		idx = append(idx, i)
	}
	pv := Placed{PodView: PodView{Name: p.Name, Node: p.Spec.NodeName, Intent: string(w.Intent), GPUs: idx}, Job: w.Name, UUIDs: uuids}
	// The group and its domain, as gputopo's bind recorded them.
	if pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement]); err == nil {
		pv.Group, pv.Domain = pl.Group, pl.Domain
	}
	return pv, nil
}

// createPriorityClasses creates the demo's PriorityClasses that ws use.
func createPriorityClasses(ctx context.Context, c client.Client, ws []Workload) error {
	done := map[string]bool{}
	for _, w := range ws {
		if w.Priority == "" || done[w.Priority] {
			continue
		}
		v, ok := priorityValues[w.Priority]
		if !ok {
			return fmt.Errorf("workload %s: priority %q is not one of the demo's (%s, %s)", w.Name, w.Priority, PriorityBatch, PriorityServing)
		}
		done[w.Priority] = true
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: w.Priority}, Value: v}
		if err := c.Create(ctx, pc); err != nil {
			return fmt.Errorf("create PriorityClass %s: %w", w.Priority, err)
		}
	}
	return nil
}

func describe(w Workload) string {
	kind := "Job"
	if w.Bare {
		kind = "standalone pods"
	}
	intent := "no parallelism annotation"
	if w.Intent != "" {
		intent = fmt.Sprintf("%s: %s", v1alpha1.AnnotationParallelism, w.Intent)
	}
	where := ""
	if w.Machine != "" {
		where = " on " + w.Machine + " nodes"
	}
	return fmt.Sprintf("%s %s (%s): %d pod(s) x %d GPU(s)%s", kind, w.Name, intent, w.Pods, w.GPUs, where)
}

func submit(ctx context.Context, c client.Client, w Workload) error {
	spec := localcluster.GPUPodSpec(w.GPUs)
	// No kubelet runs to confirm a graceful deletion: a preempted pod
	// is gone at once.
	spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	spec.PriorityClassName = w.Priority
	if w.Machine != "" {
		spec.NodeSelector = map[string]string{labelMachine: w.Machine}
	}
	ann := map[string]string{}
	if w.Intent != "" {
		ann[v1alpha1.AnnotationParallelism] = string(w.Intent)
	}
	if w.Bare {
		for i := 0; i < w.Pods; i++ {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: fmt.Sprintf("%s-%d", w.Name, i), Annotations: ann, Labels: map[string]string{"demo": w.Name}},
				Spec:       spec,
			}
			if err := c.Create(ctx, pod); err != nil {
				return fmt.Errorf("create pod %s: %w", pod.Name, err)
			}
		}
		return nil
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: w.Name, Annotations: ann},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(int32(w.Pods)),
			Completions: ptr.To(int32(w.Pods)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"demo": w.Name}},
				Spec:       spec,
			},
		},
	}
	if err := c.Create(ctx, job); err != nil {
		return fmt.Errorf("create job %s: %w", w.Name, err)
	}
	return nil
}

// waitPlaced waits until the workload's pods are all bound and their GPUs
// known, and returns them in bind order.
func waitPlaced(ctx context.Context, c client.Client, w Workload, src gpuSource) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, &pods, client.InNamespace(demoNamespace), client.MatchingLabels{"demo": w.Name}); err != nil {
			return false, err
		}
		if len(pods.Items) < w.Pods {
			return false, nil
		}
		for i := range pods.Items {
			if !src.known(&pods.Items[i]) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: pods not placed: %w%s", w.Name, err, pending(pods.Items))
	}
	sort.SliceStable(pods.Items, func(i, j int) bool { return scheduledAt(&pods.Items[i]).Before(scheduledAt(&pods.Items[j])) })
	return pods.Items, nil
}

func scheduledAt(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.LastTransitionTime.Time
		}
	}
	return p.CreationTimestamp.Time
}

func pending(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				fmt.Fprintf(&b, "\n  %s: %s", p.Name, c.Message)
			}
		}
	}
	return b.String()
}
