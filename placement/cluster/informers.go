package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourcev1 "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
	"k8s.io/klog/v2"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
)

// scheme holds what the core's cache reads.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	_ = schedulingv1beta1.AddToScheme(s)
	return s
}

// PodFieldSelector leaves finished pods out of the cache: they hold no
// GPU, and a pod that finishes leaves the watch as a delete.
var PodFieldSelector = fields.AndSelectors(
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
)

// startInformers starts the cache and feeds the ledger from it; it returns
// once every initial list has been delivered to the ledger.
func (r *Runtime) startInformers(ctx context.Context) error {
	c, err := crcache.New(r.restCfg, crcache.Options{
		Scheme: scheme(),
		ByObject: map[client.Object]crcache.ByObject{
			&corev1.Pod{}:               {Field: PodFieldSelector, Transform: StripPod(r.cfg.GPUResource())},
			&corev1.Node{}:              {Transform: stripNode},
			&v1alpha1.NodeGPUTopology{}: {Transform: stripTopology()},
		},
		DefaultTransform: crcache.TransformStripManagedFields(),
	})
	if err != nil {
		return fmt.Errorf("create cache: %w", err)
	}
	var regs []toolscache.ResourceEventHandlerRegistration
	add := func(obj client.Object, h toolscache.ResourceEventHandlerFuncs) error {
		inf, err := c.GetInformer(ctx, obj, crcache.BlockUntilSynced(false))
		if err != nil {
			return fmt.Errorf("informer for %T: %w", obj, err)
		}
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("event handler for %T: %w", obj, err)
		}
		regs = append(regs, reg)
		return nil
	}
	h := feedHandlers(r.core.Feed())
	if err := add(&v1alpha1.NodeGPUTopology{}, h.topologies); err != nil {
		return err
	}
	if r.servesPodGroups(ctx) {
		if err := add(&schedulingv1beta1.PodGroup{}, h.podGroups); err != nil {
			return err
		}
	}
	if r.servesDRA(ctx) {
		klog.FromContext(ctx).V(2).Info("tracking GPUs allocated through ResourceClaims", "driver", r.cfg.DRA.Driver, "uuidAttribute", r.cfg.DRA.UUIDAttribute)
		t := newDRATracker(r.core.Feed(), r.cfg.DRA)
		t.refeed = r.refeedClaimPods(ctx, c)
		slices, claims, templates := t.handlers()
		if err := add(&resourcev1.ResourceSlice{}, slices); err != nil {
			return err
		}
		if err := add(&resourcev1.ResourceClaim{}, claims); err != nil {
			return err
		}
		// A pod's GPUs through claims from templates are read from the
		// cached templates (claimGPUs).
		if err := add(&resourcev1.ResourceClaimTemplate{}, templates); err != nil {
			return err
		}
		var reader client.Reader = c
		r.draCache.Store(&reader)
	}
	nodeHandler, podHandler := h.nodes, h.pods
	if host := r.opts.HostInformers; host != nil {
		// The host's own watches feed the ledger and answer bind's reads;
		// the cache watches NodeGPUTopologies only.
		for _, hi := range []struct {
			inf toolscache.SharedIndexInformer
			h   toolscache.ResourceEventHandlerFuncs
		}{{host.Nodes, nodeHandler}, {host.Pods, podHandler}} {
			reg, err := hi.inf.AddEventHandler(hi.h)
			if err != nil {
				return fmt.Errorf("event handler on the host's informer: %w", err)
			}
			regs = append(regs, reg)
		}
		r.api.podStore, r.api.nodeStore = host.Pods.GetIndexer(), host.Nodes.GetIndexer()
	} else {
		if err := add(&corev1.Node{}, nodeHandler); err != nil {
			return err
		}
		if err := add(&corev1.Pod{}, podHandler); err != nil {
			return err
		}
		// The preempt verb counts the budgets of the victims it returns
		// (Protected).
		if _, err := c.GetInformer(ctx, &policyv1.PodDisruptionBudget{}, crcache.BlockUntilSynced(false)); err != nil {
			return fmt.Errorf("informer for PodDisruptionBudgets: %w", err)
		}
	}
	go func() {
		if err := c.Start(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "cache stopped")
		}
	}()
	if !c.WaitForCacheSync(ctx) {
		return fmt.Errorf("wait for caches: %w", context.Cause(ctx))
	}
	r.api.cache = c
	for _, reg := range regs {
		if !toolscache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
			return fmt.Errorf("wait for event handlers: %w", context.Cause(ctx))
		}
	}
	// The ledger has every NodeGPUTopology of the initial list; a GPU UUID
	// listed from now on by a second node is that node's later claim.
	r.core.Feed().TopologiesListed()
	return nil
}

// servesPodGroups says whether the API server serves Kubernetes
// PodGroups (scheduling.k8s.io/v1beta1, feature gate GenericWorkload):
// only then are they watched, for pods that name one.
func (r *Runtime) servesPodGroups(ctx context.Context) bool {
	if r.client == nil {
		return false
	}
	rl, err := r.client.Discovery().ServerResourcesForGroupVersion(schedulingv1beta1.SchemeGroupVersion.String())
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Kubernetes PodGroups not served; pods that name one wait", "groupVersion", schedulingv1beta1.SchemeGroupVersion.String(), "err", err)
		return false
	}
	for _, r := range rl.APIResources {
		if r.Name == "podgroups" {
			return true
		}
	}
	return false
}

// handlers are the informers' event handlers that feed the core, one per
// kind.
type handlers struct {
	topologies, podGroups, nodes, pods toolscache.ResourceEventHandlerFuncs
}

// feedHandlers turns informer events into f's upserts and deletes.
func feedHandlers(f placement.Feed) handlers {
	return handlers{
		topologies: handler(f.UpsertTopology, func(m metav1.Object) { f.DeleteTopology(m.GetName()) }),
		podGroups:  handler(f.UpsertPodGroup, func(m metav1.Object) { f.DeletePodGroup(keyOf(m)) }),
		nodes:      handler(f.UpsertNode, func(m metav1.Object) { f.DeleteNode(m.GetName()) }),
		pods:       handler(f.UpsertPod, func(m metav1.Object) { f.DeletePod(keyOf(m), m.GetUID()) }),
	}
}

// handler calls upsert with each added or updated object of type T and
// del with each deleted one (deleted).
func handler[T any](upsert func(T), del func(metav1.Object)) toolscache.ResourceEventHandlerFuncs {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { upsertAs(o, upsert) },
		UpdateFunc: func(_, o any) { upsertAs(o, upsert) },
		DeleteFunc: func(o any) { deleted(o, del) },
	}
}

func upsertAs[T any](o any, f func(T)) {
	if t, ok := o.(T); ok {
		f(t)
	}
}

// deleted hands f the object an informer's delete handler received, its
// tombstone (DeletedFinalStateUnknown) unwrapped.
func deleted(o any, f func(metav1.Object)) {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if m, ok := o.(metav1.Object); ok {
		f(m)
	}
}

func keyOf(m metav1.Object) types.NamespacedName {
	return types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}
}

// rebuild re-reads every live pod from the API server (a consistent list,
// newer than anything the informer may still be delivering) into the
// ledger. A new leader does it before it serves so that GPUs bound by the
// previous leader a moment ago are never issued again. Holdings of bound
// pods only ever grow from it (see Ledger), so replaying older state is
// harmless.
func (r *Runtime) rebuild(ctx context.Context) error {
	l := r.core.Feed()
	p := pager.New(pager.SimplePageFunc(func(o metav1.ListOptions) (runtime.Object, error) {
		return r.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, o)
	}))
	p.PageSize = 500
	n := 0
	err := p.EachListItem(ctx, metav1.ListOptions{FieldSelector: PodFieldSelector.String()}, func(o runtime.Object) error {
		if pod, ok := o.(*corev1.Pod); ok {
			l.UpsertPod(pod)
			n++
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("rebuild ledger: list pods: %w", err)
	}
	klog.FromContext(ctx).Info("ledger rebuilt from pods", "pods", n, "ledger", r.core.Report().Counts().String())
	return nil
}
