package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/fakeapi"
	"github.com/gputopo/gputopo/topology"
)

// simNamespace holds the simulated pods.
const simNamespace = "sim"

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// gputopoPolicy runs the extender's Filter, Prioritize and Bind, exactly
// as kube-scheduler would call them, on a fake clientset. The pod carries
// the requirement the webhook derives from the job's intent, and the
// ledger is fed the pod updates its informers would deliver. The node
// with the highest extender score wins, at random among equals as in
// kube-scheduler (from a seeded source, so runs repeat); kube-scheduler's
// own plugins' scores, equal on GPU nodes of one shape, are left out.
type gputopoPolicy struct {
	x *extender.Extender
	// now is the simulated time; pods are created at their arrival on
	// this clock, so that fallbackAfter counts simulated waiting.
	now   time.Duration
	cs    *fake.Clientset
	table configv1alpha1.PolicyTable
	names []string
	index map[string]int
	pods  map[string]*corev1.Pod // pending or bound, by job ID
	// rng breaks ties between equally scored nodes.
	rng *rand.Rand
}

var _ Policy = (*gputopoPolicy)(nil)

// simEpoch is simulated time 0 on the extender's clock.
var simEpoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newGputopoPolicy(nodes []Node, ext *configv1alpha1.ExtenderConfiguration, table configv1alpha1.PolicyTable) (*gputopoPolicy, error) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "pods", fakeapi.BindingReactor(cs))
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	if ext != nil {
		c := *ext
		cfg = &c
	}
	// Nothing refreshes the simulated topologies: their age limit is
	// switched off, the documented way.
	cfg.TopologyMaxAge = &metav1.Duration{Duration: -1}
	p := &gputopoPolicy{x: extender.NewWithClient(cfg, cs), cs: cs, table: table, index: map[string]int{}, pods: map[string]*corev1.Pod{},
		rng: rand.New(rand.NewPCG(1, 0x6b756265))}
	p.x.SetClock(func() time.Time { return simEpoch.Add(p.now) })
	l := p.x.Ledger()
	now := metav1.NewTime(simEpoch)
	for i, n := range nodes {
		p.names = append(p.names, n.Name)
		p.index[n.Name] = i
		// As kubelet reports a node whose device plugin registered every
		// GPU of its topology: the extender checks the topology against it.
		gpus := corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(int64(n.Graph.Len()), resource.DecimalSI)}
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Status:     corev1.NodeStatus{Capacity: gpus, Allocatable: gpus.DeepCopy()},
		}
		// Bind checks the node exists and admits the pod, as in a cluster.
		if err := cs.Tracker().Add(node); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		l.UpsertNode(node)
		st := n.Graph.Status()
		st.ObservedTime = now
		l.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: n.Name}, Status: st})
	}
	return p, nil
}

func (*gputopoPolicy) Name() string { return PolicyGputopo }

// SetTime moves the extender's clock to simulated time t.
func (p *gputopoPolicy) SetTime(t time.Duration) { p.now = t }

// pod returns the job's pod, creating it in the API and the ledger the
// first time (as the webhook-mutated pod arriving through the informer).
func (p *gputopoPolicy) pod(job Job) (*corev1.Pod, error) {
	if pod, ok := p.pods[job.ID]; ok {
		return pod, nil
	}
	req := p.table.For(job.Parallelism).Requirement(int64(job.GPUs))
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("job %s: encode requirement: %w", job.ID, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "job-" + job.ID, Namespace: simNamespace, UID: types.UID("uid-" + job.ID),
			CreationTimestamp: metav1.NewTime(simEpoch.Add(job.Arrival)),
			Labels:            map[string]string{v1alpha1.LabelJob: job.ID},
			Annotations:       map[string]string{v1alpha1.AnnotationRequirement: string(raw)},
		},
		Spec: corev1.PodSpec{SchedulerName: v1alpha1.DefaultSchedulerName, Containers: []corev1.Container{{
			Name: "main", Image: "trainer",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				v1alpha1.ResourceGPU: *resource.NewQuantity(int64(job.GPUs), resource.DecimalSI),
			}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	if err := p.cs.Tracker().Add(pod); err != nil {
		return nil, fmt.Errorf("job %s: create pod: %w", job.ID, err)
	}
	p.x.Ledger().UpsertPod(pod)
	p.pods[job.ID] = pod
	return pod, nil
}

func (p *gputopoPolicy) Place(job Job, _ []topology.Mask) (Placement, bool, error) {
	pod, err := p.pod(job)
	if err != nil {
		return Placement{}, false, err
	}
	// Decisions are synchronous and in simulated time; the core logs
	// through the process's default logger.
	ctx := context.Background()
	names := append([]string(nil), p.names...)
	fr := p.x.Filter(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if fr.Error != "" {
		return Placement{}, false, fmt.Errorf("job %s: filter: %s", job.ID, fr.Error)
	}
	if fr.NodeNames == nil || len(*fr.NodeNames) == 0 {
		return Placement{}, false, nil
	}
	passed := *fr.NodeNames
	prio, err := p.x.Prioritize(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &passed})
	if err != nil {
		return Placement{}, false, fmt.Errorf("job %s: prioritize: %w", job.ID, err)
	}
	// kube-scheduler picks at random among the nodes with the highest
	// total score (reservoir sampling in selectHost); so does the
	// simulator, from its own seeded source, so that runs repeat.
	var top []int
	for i, hp := range prio {
		switch {
		case len(top) == 0 || hp.Score > prio[top[0]].Score:
			top = append(top[:0], i)
		case hp.Score == prio[top[0]].Score:
			top = append(top, i)
		}
	}
	node := prio[top[p.rng.IntN(len(top))]].Host
	br := p.x.Bind(ctx, &extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node})
	if br.Error != "" {
		return Placement{}, false, fmt.Errorf("job %s: bind to %s: %s", job.ID, node, br.Error)
	}
	obj, err := p.cs.Tracker().Get(podsGVR, pod.Namespace, pod.Name)
	if err != nil {
		return Placement{}, false, fmt.Errorf("job %s: read bound pod: %w", job.ID, err)
	}
	bound := obj.(*corev1.Pod)
	p.x.Ledger().UpsertPod(bound)
	p.pods[job.ID] = bound
	pl, err := v1alpha1.ParsePlacement(bound.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		return Placement{}, false, fmt.Errorf("job %s: %w", job.ID, err)
	}
	return Placement{Node: p.index[node], GPUs: topology.MaskOf(pl.GPUIndices...)}, true, nil
}

// Release deletes the finished pod, as the informer would report it.
func (p *gputopoPolicy) Release(job Job, _ Placement) error { return p.Drop(job) }

func (p *gputopoPolicy) Drop(job Job) error {
	pod, ok := p.pods[job.ID]
	if !ok {
		return nil
	}
	delete(p.pods, job.ID)
	if err := p.cs.Tracker().Delete(podsGVR, pod.Namespace, pod.Name); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("job %s: delete pod: %w", job.ID, err)
	}
	p.x.Ledger().DeletePod(pod)
	return nil
}
