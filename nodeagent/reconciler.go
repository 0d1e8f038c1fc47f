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

var _ PlanSource = (*PodCache)(nil)

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

// Plans implements PlanSource: pods bound here, still Pending, not being
// deleted, with an assignment and no allocation recorded yet.
func (c *PodCache) Plans(ctx context.Context, live bool) ([]Plan, error) {
	var pods []*corev1.Pod
	if live {
		list, err := c.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
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
	return PlansFromPods(pods), nil
}

// PlansFromPods extracts the pending plans from pods.
// A malformed assigned-gpus annotation is skipped (the webhook keeps such
// values out; this is the last line).
func PlansFromPods(pods []*corev1.Pod) []Plan {
	var out []Plan
	for _, p := range pods {
		if p.Status.Phase != corev1.PodPending && p.Status.Phase != "" || p.DeletionTimestamp != nil {
			continue
		}
		if p.Annotations[v1alpha1.AnnotationAllocatedGPUs] != "" {
			continue
		}
		gpus, err := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
		if err != nil || len(gpus) == 0 {
			continue
		}
		pl := Plan{Pod: p.Namespace + "/" + p.Name, GPUs: gpus, Created: p.CreationTimestamp.Time}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
				pl.BoundAt = c.LastTransitionTime.Time
			}
		}
		out = append(out, pl)
	}
	return out
}

// PodResourcesLister is the part of kubelet's PodResources API the
// reconciler uses.
type PodResourcesLister interface {
	List(ctx context.Context) ([]*podresourcesapi.PodResources, error)
}

// ReasonAssignmentDrift is the Event reason on a pod whose allocated GPUs
// differ from its assigned ones.
const ReasonAssignmentDrift = "GPUAssignmentDrift"

// Reconciler records the truth: the GPUs kubelet allocated to each GPU pod
// of the node (PodResources List) go into the pod's allocated-gpus; when
// they differ from the extender's plan the pod gets a GPUAssignmentDrift
// Event and the drift metric counts it, once per pod and value.
type Reconciler struct {
	cs       kubernetes.Interface
	pods     *PodCache
	pr       PodResourcesLister
	resource string
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
	return &Reconciler{cs: cs, pods: pods, pr: pr, resource: resource, recorder: recorder, metrics: metrics,
		logger: logger, interval: interval, poke: make(chan struct{}, 1), drifted: map[types.UID]string{}}
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
	resources, err := r.pr.List(ctx)
	if err != nil {
		return fmt.Errorf("list pod resources: %w", err)
	}
	var errs []error
	for _, pr := range resources {
		var ids []string
		for _, c := range pr.Containers {
			for _, d := range c.Devices {
				if d.ResourceName == r.resource {
					ids = append(ids, d.DeviceIds...)
				}
			}
		}
		if len(ids) == 0 {
			continue
		}
		if err := r.reconcilePod(ctx, pr.Namespace, pr.Name, v1alpha1.SortedGPUList(ids)); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d pods not reconciled, first: %w", len(errs), errs[0])
	}
	return nil
}

func (r *Reconciler) reconcilePod(ctx context.Context, namespace, name string, allocated []string) error {
	pod, ok := r.pods.Get(namespace, name)
	if !ok {
		var err error
		pod, err = r.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // gone since kubelet listed it
		}
		if err != nil {
			return fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
		}
	}
	value := v1alpha1.FormatGPUList(allocated)
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
	assigned, err := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, pod.Annotations[v1alpha1.AnnotationAssignedGPUs])
	if err != nil || len(assigned) == 0 {
		return nil // no plan to compare with (extender down and ignorable)
	}
	if slices.Equal(v1alpha1.SortedGPUList(assigned), allocated) {
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
