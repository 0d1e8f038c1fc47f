package simulator

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/topology"
)

// simNamespace holds the simulated pods.
const simNamespace = "sim"

// gputopoPolicy runs the decision core's Filter, Score and Bind, exactly
// as kube-scheduler's gputopo profile would call them, binding through
// the simulator's own in-memory API (simAPI). The pod carries
// the requirement the webhook derives from the job's intent, and the
// ledger is fed the pod updates its informers would deliver. The node
// with the highest extender score wins, at random among equals as in
// kube-scheduler (from a seeded source, so runs repeat); kube-scheduler's
// own plugins' scores, equal on GPU nodes of one shape, are left out.
type gputopoPolicy struct {
	x *placement.Core
	// now is the simulated time; pods are created at their arrival on
	// this clock, so that fallbackAfter counts simulated waiting.
	now   time.Duration
	api   *simAPI
	table configv1alpha1.PolicyTable
	names []string
	index map[string]int
	pods  map[string]*corev1.Pod // pending or bound, by job ID
	// rng breaks ties between equally scored nodes.
	rng *rand.Rand
	// nodeOnly: gputopo chooses the node and the devices there are the
	// lowest free ones (PolicyGputopoNode: extender mode with GPUs
	// through DRA claims, whose devices upstream's allocator picks).
	nodeOnly   bool
	graphs     []*topology.Graph
	freeBefore []topology.Mask
}

var _ Policy = (*gputopoPolicy)(nil)

// simEpoch is simulated time 0 on the extender's clock.
var simEpoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func newGputopoPolicy(nodes []Node, ext *configv1alpha1.ExtenderConfiguration, table configv1alpha1.PolicyTable) (*gputopoPolicy, error) {
	api := newSimAPI()
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	if ext != nil {
		c := *ext
		cfg = &c
	}
	// Nothing refreshes the simulated topologies: their age limit is
	// switched off, the documented way.
	cfg.TopologyMaxAge = &metav1.Duration{Duration: -1}
	p := &gputopoPolicy{api: api, table: table, index: map[string]int{}, pods: map[string]*corev1.Pod{},
		rng: rand.New(rand.NewPCG(1, 0x6b756265))}
	x, err := placement.New(placement.Options{Config: cfg, API: api, Clock: func() time.Time { return simEpoch.Add(p.now) }})
	if err != nil {
		return nil, err
	}
	p.x = x
	l := p.x.Feed()
	now := metav1.NewTime(simEpoch)
	for i, n := range nodes {
		p.names = append(p.names, n.Name)
		p.index[n.Name] = i
		// As kubelet reports a node whose device plugin registered every
		// GPU of its topology: the extender checks the topology against it.
		gpus := corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(int64(n.Graph.Len()), resource.DecimalSI)}
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: maps.Clone(n.Labels)},
			Status:     corev1.NodeStatus{Capacity: gpus, Allocatable: gpus.DeepCopy()},
		}
		// Bind checks the node exists and admits the pod, as in a cluster.
		api.nodes[n.Name] = node
		l.UpsertNode(node)
		st := n.Graph.Status()
		st.ObservedTime = now
		l.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: n.Name}, Status: st})
	}
	return p, nil
}

func (p *gputopoPolicy) Name() string {
	if p.nodeOnly {
		return PolicyGputopoNode
	}
	return PolicyGputopo
}

// SetTime moves the extender's clock to simulated time t.
func (p *gputopoPolicy) SetTime(t time.Duration) { p.now = t }

// pod returns the job's pod, creating it in the API and the ledger the
// first time (as the webhook-mutated pod arriving through the informer).
func (p *gputopoPolicy) pod(job Job) (*corev1.Pod, error) {
	if pod, ok := p.pods[job.ID]; ok {
		return pod, nil
	}
	return p.newPod(job.ID, job.ID, job, nil)
}

// newPod creates the pod of job under key id (by which p.pods knows it),
// named "job-<name>", with the job's requirement and the extra
// annotations, in the API and the ledger.
func (p *gputopoPolicy) newPod(id, name string, job Job, extra map[string]string) (*corev1.Pod, error) {
	req := p.table.For(job.Parallelism).Requirement(int64(job.GPUs))
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("job %s: encode requirement: %w", job.ID, err)
	}
	ann := map[string]string{v1alpha1.AnnotationRequirement: string(raw)}
	for k, v := range extra {
		ann[k] = v
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "job-" + name, Namespace: simNamespace, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(simEpoch.Add(job.Arrival)),
			Labels:            map[string]string{v1alpha1.LabelJob: job.ID},
			Annotations:       ann,
		},
		Spec: corev1.PodSpec{SchedulerName: v1alpha1.DefaultSchedulerName, Containers: []corev1.Container{{
			Name: "main", Image: "trainer",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				v1alpha1.ResourceGPU: *resource.NewQuantity(int64(job.GPUs), resource.DecimalSI),
			}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	if job.Priority != 0 {
		// The pod's priority, as admission sets it from its
		// PriorityClass: the core reads it (patience, reservations).
		prio := job.Priority
		pod.Spec.Priority = &prio
	}
	if job.Declared > 0 {
		secs := int64((job.Declared + time.Second - 1) / time.Second)
		pod.Spec.ActiveDeadlineSeconds = &secs
	}
	p.api.pods[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}] = pod
	p.x.Feed().UpsertPod(pod)
	p.pods[id] = pod
	return pod, nil
}

func (p *gputopoPolicy) Place(job Job, free []topology.Mask) (Placement, bool, error) {
	p.freeBefore = free
	pod, err := p.pod(job)
	if err != nil {
		return Placement{}, false, err
	}
	return p.placePod(job.ID, pod)
}

// placePod runs Filter, Score and Bind for the pod p.pods knows as id.
func (p *gputopoPolicy) placePod(id string, pod *corev1.Pod) (Placement, bool, error) {
	// Decisions are synchronous and in simulated time; the core logs
	// through the process's default logger.
	ctx := context.Background()
	pr, err := placement.ParseRequest(pod, p.x.Config().GPUResource(), p.x.Now())
	if err != nil {
		return Placement{}, false, fmt.Errorf("job %s: filter: %w", id, err)
	}
	fr, err := p.x.Filter(ctx, pr, p.names)
	if err != nil {
		return Placement{}, false, fmt.Errorf("job %s: filter: %w", id, err)
	}
	if len(fr.Passed) == 0 {
		return Placement{}, false, nil
	}
	passed := fr.Passed
	scores, _ := p.x.Score(ctx, pr, passed, false, nil)
	// kube-scheduler picks at random among the nodes with the highest
	// total score (reservoir sampling in selectHost); so does the
	// simulator, from its own seeded source, so that runs repeat.
	var top []int
	for i, score := range scores {
		switch {
		case len(top) == 0 || score > scores[top[0]]:
			top = append(top[:0], i)
		case score == scores[top[0]]:
			top = append(top, i)
		}
	}
	node := passed[top[p.rng.IntN(len(top))]]
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	if br := p.x.Bind(ctx, placement.BindRequest{Key: key, UID: pod.UID, Node: node}); br.Err != nil {
		return Placement{}, false, fmt.Errorf("job %s: bind to %s: %w", id, node, br.Err)
	}
	bound := p.api.pods[key]
	// kubelet starts it now: its deadline counts from here, and when it
	// ends it is a pod that ran (patience's churn).
	bound.Status.StartTime = &metav1.Time{Time: simEpoch.Add(p.now)}
	p.x.Feed().UpsertPod(bound)
	p.pods[id] = bound
	pl, err := v1alpha1.ParsePlacement(bound.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		return Placement{}, false, fmt.Errorf("job %s: %w", id, err)
	}
	if p.nodeOnly {
		// Upstream's allocator takes the first free devices of the node;
		// the ledger follows the claim's allocation (docs/dra.md).
		g := p.graphs[p.index[node]]
		free := p.freeBefore[p.index[node]]
		set := lowestK(free, len(pl.GPUIndices))
		var uuids []string
		for _, i := range set.Indices() {
			uuids = append(uuids, g.GPU(i).UUID)
		}
		bound.Annotations[v1alpha1.AnnotationAssignedGPUs] = v1alpha1.FormatGPUList(uuids)
		p.x.Feed().UpsertPod(bound)
		return Placement{Node: p.index[node], GPUs: set}, true, nil
	}
	return Placement{Node: p.index[node], GPUs: topology.MaskOf(pl.GPUIndices...)}, true, nil
}

// Release deletes the finished pod, as the informer would report it (a
// watch that skips finished pods reports one as a delete).
func (p *gputopoPolicy) Release(job Job, _ Placement) error { return p.Drop(job) }

func (p *gputopoPolicy) Drop(job Job) error { return p.deletePod(job.ID) }

// deletePod deletes the pod p.pods knows as id, as the informer would
// report it.
func (p *gputopoPolicy) deletePod(id string) error {
	pod, ok := p.pods[id]
	if !ok {
		return nil
	}
	delete(p.pods, id)
	delete(p.api.pods, types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name})
	p.x.Feed().DeletePod(types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, pod.UID)
	return nil
}

// simAPI is the simulated cluster's API server as bind sees it: its pods
// and nodes in memory, and a Binding that does what kube-apiserver's
// binding subresource does (nodeName and the Binding's annotations set in
// one write).
type simAPI struct {
	pods  map[types.NamespacedName]*corev1.Pod
	nodes map[string]*corev1.Node
}

var _ placement.API = (*simAPI)(nil)

func newSimAPI() *simAPI {
	return &simAPI{pods: map[types.NamespacedName]*corev1.Pod{}, nodes: map[string]*corev1.Node{}}
}

func (a *simAPI) Pod(ctx context.Context, key types.NamespacedName, _ types.UID) (*corev1.Pod, error) {
	return a.FreshPod(ctx, key)
}

func (a *simAPI) FreshPod(_ context.Context, key types.NamespacedName) (*corev1.Pod, error) {
	if p, ok := a.pods[key]; ok {
		return p, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("pods"), key.Name)
}

func (a *simAPI) Node(_ context.Context, name string) (*corev1.Node, error) {
	if n, ok := a.nodes[name]; ok {
		return n, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("nodes"), name)
}

// Bind refuses, as kube-apiserver does, a pod that is gone, recreated or
// already bound.
func (a *simAPI) Bind(_ context.Context, b *corev1.Binding) error {
	key := types.NamespacedName{Namespace: b.Namespace, Name: b.Name}
	p, ok := a.pods[key]
	switch {
	case !ok:
		return apierrors.NewNotFound(corev1.Resource("pods"), b.Name)
	case b.UID != "" && p.UID != b.UID:
		return apierrors.NewConflict(corev1.Resource("pods"), b.Name, fmt.Errorf("the UID in the binding (%s) does not match the pod's (%s)", b.UID, p.UID))
	case p.Spec.NodeName != "":
		return apierrors.NewConflict(corev1.Resource("pods"), b.Name, fmt.Errorf("pod %s is already assigned to node %q", key, p.Spec.NodeName))
	}
	bound := p.DeepCopy()
	bound.Spec.NodeName = b.Target.Name
	if len(b.Annotations) > 0 && bound.Annotations == nil {
		bound.Annotations = map[string]string{}
	}
	for k, v := range b.Annotations {
		bound.Annotations[k] = v
	}
	a.pods[key] = bound
	return nil
}
