package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// PodCache is an informer over the pods bound to this node: the device
// plugin reads plans from it and the reconciler reads pods from it, so
// neither asks the API server per call.
type PodCache struct {
	cs       kubernetes.Interface
	node     string
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   corelisters.PodLister
}

var _ PodSource = (*PodCache)(nil)

// NewPodCache watches the pods with spec.nodeName=node.
func NewPodCache(cs kubernetes.Interface, node string) *PodCache {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	pods := f.Core().V1().Pods()
	return &PodCache{cs: cs, node: node, factory: f, informer: pods.Informer(), lister: pods.Lister()}
}

// Start runs the informer until ctx ends and waits for its first sync.
func (c *PodCache) Start(ctx context.Context) error {
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("pod cache for node %s did not sync", c.node)
	}
	return nil
}

// Get returns a cached pod.
func (c *PodCache) Get(namespace, name string) (*corev1.Pod, bool) {
	p, err := c.lister.Pods(namespace).Get(name)
	return p, err == nil
}

// livePodListTimeout bounds PendingPods' live read of the node's pods.
const livePodListTimeout = 2 * time.Second

// PendingPods implements PodSource: pods bound here, Pending, not being
// deleted, needing the resource, from the cache or, with live, from the
// API.
func (c *PodCache) PendingPods(ctx context.Context, resource corev1.ResourceName, live bool) ([]PendingPod, error) {
	var pods []*corev1.Pod
	if live {
		// kubelet's device manager waits on this answer for every pod it
		// admits; kubelet's own call carries no deadline.
		lctx, cancel := context.WithTimeout(ctx, livePodListTimeout)
		defer cancel()
		list, err := c.cs.CoreV1().Pods(metav1.NamespaceAll).List(lctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", c.node).String(),
		})
		if err != nil {
			return nil, fmt.Errorf("list pods on node %s: %w", c.node, err)
		}
		for i := range list.Items {
			pods = append(pods, &list.Items[i])
		}
	} else {
		var err error
		if pods, err = c.lister.List(everything); err != nil {
			return nil, fmt.Errorf("list cached pods: %w", err)
		}
	}
	return PendingFromPods(pods, resource), nil
}

// PendingFromPods extracts the pods kubelet may be admitting: Pending, not
// being deleted, with a demand for resource, each with its plan (empty
// when it has none or a malformed one: the webhook keeps such values out,
// and the plan only steers kubelet), its allocated-gpus and its GPU
// containers in kubelet's order.
func PendingFromPods(pods []*corev1.Pod, resource corev1.ResourceName) []PendingPod {
	var out []PendingPod
	for _, p := range pods {
		if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" || p.DeletionTimestamp != nil {
			continue
		}
		demand, err := v1alpha1.PodGPUDemand(&p.Spec, resource)
		if err != nil || demand <= 0 {
			continue
		}
		containers, err := PodContainerGPUs(&p.Spec, resource)
		if err != nil {
			continue
		}
		gpus, _ := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
		recorded, _ := v1alpha1.ParseGPUList(v1alpha1.AnnotationAllocatedGPUs, p.Annotations[v1alpha1.AnnotationAllocatedGPUs])
		out = append(out, PendingPod{Plan: planOf(p, gpus), Demand: int(demand), Recorded: recorded, Containers: containers})
	}
	return out
}

// planOf is the pod's plan with its admission-order keys.
func planOf(p *corev1.Pod, gpus []string) Plan {
	pl := Plan{Pod: p.Namespace + "/" + p.Name, UID: p.UID, GPUs: gpus, Created: p.CreationTimestamp.Time}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			pl.BoundAt = c.LastTransitionTime.Time
		}
	}
	return pl
}

// PodResourcesLister is the part of kubelet's PodResources API the
// reconciler uses.
type PodResourcesLister interface {
	List(ctx context.Context) ([]*podresourcesapi.PodResources, error)
}

// ReasonAssignmentDrift is the Event reason on a pod whose allocated GPUs
// differ from its assigned ones.
const ReasonAssignmentDrift = "GPUAssignmentDrift"

// Reconciler records the truth: the GPUs kubelet holds for each GPU pod of
// the node go into the pod's allocated-gpus; when they differ from the
// extender's plan the pod gets a GPUAssignmentDrift Event and the drift
// metric counts it, once per pod and value.
//
// What kubelet holds for a pod is more than PodResources List shows: List
// reports app containers and sidecars, not one-shot init containers, whose
// devices kubelet keeps with the pod until it ends. So the record of a pod
// is the union of what List shows for it, what the device plugin's
// AllocationLog attributed to it, and what its allocated-gpus already names
// (the log is in memory only; after a restart the annotation carries what
// List cannot show). A device that List shows in another pod's container
// is never counted for this one.
type Reconciler struct {
	cs       kubernetes.Interface
	pods     *PodCache
	pr       PodResourcesLister
	allocs   *AllocationLog
	resource corev1.ResourceName
	recorder record.EventRecorder
	metrics  *Metrics
	logger   klog.Logger
	interval time.Duration
	poke     chan struct{}

	mu      sync.Mutex
	drifted map[types.UID]string
}

// NewReconciler builds a reconciler; interval defaults to 10s.
func NewReconciler(cs kubernetes.Interface, pods *PodCache, pr PodResourcesLister, resource string, recorder record.EventRecorder, metrics *Metrics, logger klog.Logger, interval time.Duration) *Reconciler {
	if interval <= 0 {
		interval = 10 * time.Second
	}
	return &Reconciler{cs: cs, pods: pods, pr: pr, resource: corev1.ResourceName(resource), recorder: recorder, metrics: metrics,
		logger: logger, interval: interval, poke: make(chan struct{}, 1), drifted: map[types.UID]string{},
		allocs: newAllocationLog(logger)}
}

// UseAllocations makes the reconciler read the device plugin's record of
// Allocate calls (DevicePlugin.Allocations); without it one-shot init
// containers' devices are known only from allocated-gpus. The log reads
// kubelet's PodResources through the reconciler's client, to tell which
// pending pod kubelet is admitting.
func (r *Reconciler) UseAllocations(l *AllocationLog) {
	if l != nil {
		r.allocs = l
		l.UsePodResources(r.pr)
	}
}

// Poke asks for a reconcile soon (after an Allocate: the container is about
// to start and PodResources will show it).
func (r *Reconciler) Poke() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// Run reconciles every interval and shortly after every Poke.
func (r *Reconciler) Run(ctx context.Context) error {
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-r.poke:
			// kubelet reports the allocation once the container is
			// created; give it a moment.
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(500 * time.Millisecond):
			}
		}
		if err := r.Reconcile(ctx); err != nil {
			r.logger.Error(err, "Reconciling allocated GPUs failed")
		}
	}
}

// Reconcile does one pass.
func (r *Reconciler) Reconcile(ctx context.Context) error {
	listed := time.Now()
	resources, err := r.pr.List(ctx)
	if err != nil {
		return fmt.Errorf("list pod resources: %w", err)
	}
	// What kubelet shows, by pod and by device.
	visible := make(map[string][]string, len(resources))
	holder := map[string]string{}
	for _, pr := range resources {
		key := pr.Namespace + "/" + pr.Name
		for _, c := range pr.Containers {
			for _, d := range c.Devices {
				if d.ResourceName != string(r.resource) {
					continue
				}
				visible[key] = append(visible[key], d.DeviceIds...)
				for _, id := range d.DeviceIds {
					holder[id] = key
				}
			}
		}
	}
	live := map[types.UID]bool{}
	complete := true
	var errs []error
	for _, pr := range resources {
		key := pr.Namespace + "/" + pr.Name
		if len(visible[key]) == 0 && !r.allocs.Has(key) {
			// Nothing seen or logged: only one-shot init containers can
			// hold GPUs for it then, and allocated-gpus or the plan
			// says which.
			if p, ok := r.pods.Get(pr.Namespace, pr.Name); !ok || !initGPUs(&p.Spec, r.resource) {
				continue
			}
		}
		pod, err := r.pod(ctx, pr.Namespace, pr.Name)
		if err != nil {
			errs = append(errs, err)
			complete = false
			continue
		}
		if pod == nil || podEnded(pod) {
			continue
		}
		live[pod.UID] = true
		if err := r.reconcilePod(ctx, pod, visible[key], holder); err != nil {
			errs = append(errs, err)
		}
	}
	// A pod kubelet no longer lists has ended: its log entry goes. Not
	// after a failed read, whose pod may well be alive.
	if complete {
		if n := r.allocs.Forget(live, listed); n > 0 {
			r.logger.V(2).Info("Forgot the allocations of ended pods", "pods", n)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d pods not reconciled, first: %w", len(errs), errs[0])
	}
	return nil
}

// pod reads a pod from the cache, else from the API; nil when it is gone.
func (r *Reconciler) pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	if pod, ok := r.pods.Get(namespace, name); ok {
		return pod, nil
	}
	pod, err := r.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil // gone since kubelet listed it
	}
	if err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// heldBy is what kubelet holds for the pod as far as the node agent can
// tell: what PodResources shows for it (visible), plus what the allocation
// log and its allocated-gpus name, less any device PodResources shows in
// another pod (holder: device → pod).
func (r *Reconciler) heldBy(pod *corev1.Pod, visible []string, holder map[string]string) []string {
	key := pod.Namespace + "/" + pod.Name
	held := setOf(visible)
	// A malformed allocated-gpus counts as empty and is rewritten.
	recorded, _ := v1alpha1.ParseGPUList(v1alpha1.AnnotationAllocatedGPUs, pod.Annotations[v1alpha1.AnnotationAllocatedGPUs])
	for _, id := range append(r.allocs.Devices(pod.UID), recorded...) {
		if h, ok := holder[id]; ok && h != key {
			continue
		}
		held[id] = true
	}
	return setList(held)
}

// initGPUs reports whether a one-shot init container of the pod asks for
// the resource: its devices are the ones PodResources does not show.
func initGPUs(spec *corev1.PodSpec, resource corev1.ResourceName) bool {
	view := &corev1.PodSpec{}
	for _, c := range spec.InitContainers {
		if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			view.InitContainers = append(view.InitContainers, c)
		}
	}
	n, err := v1alpha1.PodGPUDemand(view, resource)
	return err == nil && n > 0
}

func (r *Reconciler) reconcilePod(ctx context.Context, pod *corev1.Pod, visible []string, holder map[string]string) error {
	allocated := r.heldBy(pod, visible, holder)
	assigned, err := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, pod.Annotations[v1alpha1.AnnotationAssignedGPUs])
	if err != nil {
		assigned = nil // no plan to compare with
	}
	assigned = v1alpha1.SortedGPUList(assigned)
	// The pod's demand is what kubelet holds once it has allocated every
	// container (v1alpha1.PodGPUDemand follows kubelet's rule).
	if demand, err := v1alpha1.PodGPUDemand(&pod.Spec, r.resource); err == nil && int64(len(allocated)) < demand {
		if pod.Status.Phase == corev1.PodPending || pod.Status.Phase == "" {
			// kubelet allocates a pod's containers one after the other
			// at admission; a partial record would free the rest of the
			// plan in the extender's ledger. Wait for the whole.
			r.logger.V(2).Info("Allocation not complete yet", "pod", klog.KObj(pod), "held", allocated, "demand", demand)
			return nil
		}
		// Running with fewer than its demand: a one-shot init
		// container's devices were neither logged (the agent restarted
		// between Allocate and this record) nor shown by PodResources.
		// When what is seen is the plan's, kubelet followed the plan,
		// and the rest of it is what the init containers hold.
		if initGPUs(&pod.Spec, r.resource) && int64(len(assigned)) == demand && all(allocated, setOf(assigned)) {
			r.logger.Info("One-shot init containers' GPUs not seen; taking them from the plan", "pod", klog.KObj(pod), "seen", allocated, "assigned", assigned)
			allocated = assigned
		}
	}
	if len(allocated) == 0 {
		return nil
	}
	value := v1alpha1.FormatGPUList(allocated)
	namespace, name := pod.Namespace, pod.Name
	if pod.Annotations[v1alpha1.AnnotationAllocatedGPUs] != value {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid":         pod.UID, // refuse to annotate a newer pod of the same name
			"annotations": map[string]string{v1alpha1.AnnotationAllocatedGPUs: value},
		}})
		_, err := r.cs.CoreV1().Pods(namespace).Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		r.metrics.apiWrite("pod", err)
		if err != nil {
			return fmt.Errorf("annotate pod %s/%s with %s: %w", namespace, name, v1alpha1.AnnotationAllocatedGPUs, err)
		}
		r.logger.V(1).Info("Recorded allocated GPUs", "pod", klog.KObj(pod), "gpus", value)
	}
	if len(assigned) == 0 {
		return nil // no plan to compare with (extender down and ignorable)
	}
	if slices.Equal(assigned, allocated) {
		return nil
	}
	r.mu.Lock()
	seen := r.drifted[pod.UID] == value
	r.drifted[pod.UID] = value
	r.mu.Unlock()
	if seen {
		return nil
	}
	r.metrics.driftSeen()
	r.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonAssignmentDrift,
		"kubelet allocated GPUs %s but the extender assigned %s", value, v1alpha1.FormatGPUList(assigned))
	r.logger.Info("GPU assignment drift", "pod", klog.KObj(pod), "assigned", assigned, "allocated", allocated)
	return nil
}

// Drifts returns how many distinct drifts were recorded.
func (r *Reconciler) Drifts() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.drifted)
}
