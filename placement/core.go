package placement

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/gputopo/gputopo/topology/allocator"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// Core is the decision core of one gputopo scheduler: the GPU ledger fed
// from the cluster, the evaluator that answers filter and score, the bind
// transaction, and the decider Lease. Front ends (the HTTP extender, the
// scheduler plugin, `kubectl gputopo explain`, the simulator) translate
// their callers' requests into its Request and answers; it speaks no
// front end's wire types.
type Core struct {
	cfg    *configv1alpha1.ExtenderConfiguration
	opts   Options
	ledger *ledger.Ledger
	alloc  *allocator.Allocator
	obs    Observer
	// client talks to the API server (rebuild, the decider Lease, Events,
	// reads bind cannot answer from a cache); nil without a cluster.
	client  kubernetes.Interface
	restCfg *rest.Config
	// api is what bind reads and writes: the cluster through client and
	// the informer caches, or a front end's own (the simulator's).
	api API
	now func() time.Time
	// prom reads telemetry from Prometheus (telemetry.source: prometheus).
	prom *promTelemetry
	// cache is the informer cache (stripped pods and nodes) once started.
	cache client.Reader
	// podStore and nodeStore are the host's informer stores with
	// Options.HostInformers (they answer bind's reads instead of cache).
	podStore, nodeStore toolscache.Store
	// events sends recorder's Events (GPUsBound, GPUDoubleHeld) to the
	// API server; both nil without a cluster.
	events   record.EventBroadcaster
	recorder record.EventRecorder
	// log is for what the ledger reports (onDoubleHeld); Sync sets the
	// context's.
	log klog.Logger

	synced  atomic.Bool // informers synced and the initial ledger built
	leading atomic.Bool // this replica decides (Lead) and its ledger is rebuilt

	// decider holds the cluster-wide decider Lease (decider.go) once
	// started; nil when this core decides nothing (shadow, in-memory use).
	decider atomic.Pointer[decider]
	// binding counts binds between their decider check and their
	// Binding's outcome: the decider Lease is released only once none is
	// in flight (decider.drain).
	binding atomic.Int64
	// lastCycle is the newest Cycle, whose filter counts are flushed when
	// the next one starts unless Score flushed them.
	lastCycle atomic.Pointer[Cycle]
	// startCtx is Sync's context, for a decider started later (the
	// plugin build's, on the first GPU pod's cycle).
	startCtx atomic.Pointer[context.Context]
}

// Options are a core's settings besides its configuration file.
type Options struct {
	// Config shapes decisions; nil means the defaults.
	Config *configv1alpha1.ExtenderConfiguration
	// Mode names the front end in the decider Lease's holder identity
	// ("extender", "plugin").
	Mode string
	// SchedulerNames are the kube-scheduler profiles gputopo decides for;
	// bind refuses pods addressed to any other scheduler.
	SchedulerNames []string
	// Identity is this process's identity in Leases; empty means
	// hostname_random.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the decider
	// Lease's election.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// DeciderLeaseNamespace and DeciderLeaseName name the decider Lease
	// (decider.go); defaults kube-system and DeciderLeaseName(resource).
	DeciderLeaseNamespace, DeciderLeaseName string
	// DecidesNothing: this core only compares (a shadow) and takes no
	// decider Lease.
	DecidesNothing bool
	// HostInformers are the host process's own pod and node informers
	// (kube-scheduler's in the plugin build): the ledger is fed from
	// them instead of a second watch of every pod and node. Their pods
	// must exclude terminal ones, as kube-scheduler's do.
	HostInformers *HostInformers
	// Observer receives counts (nil: none are kept).
	Observer Observer
}

// HostInformers are a host process's informers the core shares.
type HostInformers struct {
	Pods, Nodes toolscache.SharedIndexInformer
}

// New builds a core for a cluster: restCfg feeds its informers and cs
// writes Bindings, Events and the decider Lease. Sync starts it.
func New(restCfg *rest.Config, cs kubernetes.Interface, o Options) (*Core, error) {
	if o.Config != nil {
		if errs := o.Config.Validate(); len(errs) > 0 {
			return nil, fmt.Errorf("invalid %s: %w", configv1alpha1.ExtenderKind, errs.ToAggregate())
		}
	}
	x, err := newCore(o)
	if err != nil {
		return nil, err
	}
	x.client, x.restCfg = cs, restCfg
	x.api = &clusterAPI{x: x}
	x.events, x.recorder = newEventBroadcaster()
	if x.cfg.Telemetry.Source == configv1alpha1.TelemetryPrometheus {
		if x.prom, err = newPromTelemetry(x.cfg.Telemetry.Prometheus, x.ledger, x.obs); err != nil {
			return nil, err
		}
	}
	return x, nil
}

func newCore(o Options) (*Core, error) {
	cfg := o.Config
	if cfg == nil {
		cfg = configv1alpha1.DefaultExtenderConfiguration()
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if o.Identity == "" {
		o.Identity = defaultIdentity()
	}
	if len(o.SchedulerNames) == 0 {
		o.SchedulerNames = []string{v1alpha1.DefaultSchedulerName}
	}
	l := ledger.New(cfg.GPUResource())
	x := &Core{
		cfg:    cfg,
		opts:   o,
		ledger: l,
		alloc:  allocator.New(cfg.AllocatorMemoSize),
		obs:    o.Observer,
		now:    time.Now,
		log:    klog.Background().WithName("placement"),
	}
	l.OnDoubleHeld(x.onDoubleHeld)
	fabric := make([][]string, len(cfg.Fabric.Levels))
	for i, lvl := range cfg.Fabric.Levels {
		fabric[i] = lvl.Labels
	}
	l.SetFabric(fabric)
	return x, nil
}

// Ledger is the core's GPU ledger.
func (x *Core) Ledger() *ledger.Ledger { return x.ledger }

// Config is the configuration the core decides with.
func (x *Core) Config() *configv1alpha1.ExtenderConfiguration { return x.cfg }

// Now is the core's clock.
func (x *Core) Now() time.Time { return x.now() }

// Client is the core's API server client (nil without a cluster).
func (x *Core) Client() kubernetes.Interface { return x.client }

// Ready reports whether the core decides: caches synced and, once Lead,
// its ledger rebuilt from pods.
func (x *Core) Ready() bool { return x.synced.Load() && x.leading.Load() }

// NotReady says why the core cannot decide yet (informers syncing, ledger
// rebuild pending); empty when it can.
func (x *Core) NotReady() string {
	switch {
	case !x.synced.Load():
		return "not ready: informer caches are syncing"
	case !x.leading.Load():
		return "not ready: not the leader (another replica holds the lease) or ledger rebuild pending"
	}
	return ""
}

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

// Sync starts the core's Event broadcaster and informers and returns once
// every initial list is in the ledger; the reservation sweep and the
// Prometheus telemetry then run until ctx ends. The returned stop flushes
// the Event broadcaster. The core decides only after Lead.
func (x *Core) Sync(ctx context.Context) (stop func(), err error) {
	x.log = klog.FromContext(ctx)
	x.startCtx.Store(&ctx)
	if !x.opts.DecidesNothing && x.client != nil {
		x.decider.Store(newDecider(x, x.opts.Mode))
	}
	stop = x.startEvents()
	if err := x.startInformers(ctx); err != nil {
		stop()
		return func() {}, err
	}
	x.synced.Store(true)
	x.log.Info("caches synced", "ledger", x.ledger.Counts().String())
	go x.sweep(ctx)
	if x.prom != nil {
		go x.prom.run(ctx)
	}
	return stop, nil
}

// Lead makes the core decide: it rebuilds the ledger from a fresh list of
// pods (GPUs bound by a previous leader a moment ago are never issued
// again) and, with eagerDecider, takes its first answer from the decider
// Lease before returning, so that no decision waits for it (the HTTP
// extender, which reports Ready next). Without it, the first GPU pod's
// cycle asks (the plugin build: only the scheduling leader asks).
func (x *Core) Lead(ctx context.Context, eagerDecider bool) error {
	if err := x.rebuild(ctx); err != nil {
		return err
	}
	if eagerDecider {
		x.startDecider(ctx)
	}
	x.leading.Store(true)
	x.announceDoubleHolds()
	return nil
}

// StopLeading makes the core stop deciding (its leader election lost).
func (x *Core) StopLeading() { x.leading.Store(false) }

// Leading reports whether the core decides.
func (x *Core) Leading() bool { return x.leading.Load() }

// ErrStopped is returned for a core whose cluster connection ended.
var ErrStopped = errors.New("placement: core stopped")

// startInformers starts the cache and feeds the ledger from it; it returns
// once every initial list has been delivered to the ledger.
func (x *Core) startInformers(ctx context.Context) error {
	c, err := crcache.New(x.restCfg, crcache.Options{
		Scheme: scheme(),
		ByObject: map[client.Object]crcache.ByObject{
			&corev1.Pod{}:               {Field: PodFieldSelector, Transform: StripPod(x.cfg.GPUResource())},
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
	l := x.ledger
	if err := add(&v1alpha1.NodeGPUTopology{}, toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { upsertAs(o, l.UpsertTopology) },
		UpdateFunc: func(_, o any) { upsertAs(o, l.UpsertTopology) },
		DeleteFunc: func(o any) { deleteByName(o, l.DeleteTopology) },
	}); err != nil {
		return err
	}
	if x.servesPodGroups(ctx) {
		if err := add(&schedulingv1beta1.PodGroup{}, toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { upsertAs(o, l.UpsertPodGroup) },
			UpdateFunc: func(_, o any) { upsertAs(o, l.UpsertPodGroup) },
			DeleteFunc: l.DeletePodGroup,
		}); err != nil {
			return err
		}
	}
	nodeHandler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { upsertAs(o, l.UpsertNode) },
		UpdateFunc: func(_, o any) { upsertAs(o, l.UpsertNode) },
		DeleteFunc: func(o any) { deleteByName(o, l.DeleteNode) },
	}
	podHandler := toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { upsertAs(o, l.UpsertPod) },
		UpdateFunc: func(_, o any) { upsertAs(o, l.UpsertPod) },
		DeleteFunc: l.DeletePod,
	}
	if h := x.opts.HostInformers; h != nil {
		// The host's own watches feed the ledger and answer bind's reads;
		// the cache watches NodeGPUTopologies only.
		for _, hi := range []struct {
			inf toolscache.SharedIndexInformer
			h   toolscache.ResourceEventHandlerFuncs
		}{{h.Nodes, nodeHandler}, {h.Pods, podHandler}} {
			reg, err := hi.inf.AddEventHandler(hi.h)
			if err != nil {
				return fmt.Errorf("event handler on the host's informer: %w", err)
			}
			regs = append(regs, reg)
		}
		x.podStore, x.nodeStore = h.Pods.GetIndexer(), h.Nodes.GetIndexer()
	} else {
		if err := add(&corev1.Node{}, nodeHandler); err != nil {
			return err
		}
		if err := add(&corev1.Pod{}, podHandler); err != nil {
			return err
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
	x.cache = c
	for _, r := range regs {
		if !toolscache.WaitForCacheSync(ctx.Done(), r.HasSynced) {
			return fmt.Errorf("wait for event handlers: %w", context.Cause(ctx))
		}
	}
	// The ledger has every NodeGPUTopology of the initial list; a GPU UUID
	// listed from now on by a second node is that node's later claim.
	l.TopologiesListed()
	return nil
}

// servesPodGroups says whether the API server serves Kubernetes
// PodGroups (scheduling.k8s.io/v1beta1, feature gate GenericWorkload):
// only then are they watched, for pods that name one.
func (x *Core) servesPodGroups(ctx context.Context) bool {
	if x.client == nil {
		return false
	}
	rl, err := x.client.Discovery().ServerResourcesForGroupVersion(schedulingv1beta1.SchemeGroupVersion.String())
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

func upsertAs[T any](o any, f func(T)) {
	if t, ok := o.(T); ok {
		f(t)
	}
}

func deleteByName(o any, f func(string)) {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if m, ok := o.(metav1.Object); ok {
		f(m.GetName())
	}
}

// StripPod keeps only what the ledger reads, so that a cluster's pods cost
// little memory. Of the containers it keeps those that ask for resource
// (the managed GPU resource), with what v1alpha1.PodGPUDemand reads:
// resources and restartPolicy (a sidecar's devices add up, a one-shot init
// container's do not). Containers without the resource add nothing to the
// demand.
func StripPod(resource corev1.ResourceName) toolscache.TransformFunc {
	return func(obj any) (any, error) { return stripPodOf(obj, resource) }
}

// keptAnnotations are the annotations the stripped pod cache keeps: what
// the ledger reads (ledger.NewPodInfo).
var keptAnnotations = append([]string{v1alpha1.AnnotationRequirement, v1alpha1.AnnotationAssignedGPUs,
	v1alpha1.AnnotationPlacement, v1alpha1.AnnotationAllocatedGPUs}, v1alpha1.GroupAnnotations...)

func stripPodOf(obj any, resource corev1.ResourceName) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp,
			// Bind counts a requirement's fallbackAfter from it.
			CreationTimestamp: p.CreationTimestamp,
		},
		// Bind checks the node constraints kube-scheduler checked.
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, SchedulerName: p.Spec.SchedulerName,
			NodeSelector: p.Spec.NodeSelector, Tolerations: p.Spec.Tolerations,
			// The pod's Kubernetes PodGroup (groups).
			SchedulingGroup: p.Spec.SchedulingGroup,
			// Preemption orders victims by priority and start.
			Priority: p.Spec.Priority},
		// A group's pods plan on the nodes preemption nominated them to.
		Status: corev1.PodStatus{Phase: p.Status.Phase, StartTime: p.Status.StartTime, NominatedNodeName: p.Status.NominatedNodeName},
	}
	if j, ok := p.Labels[v1alpha1.LabelJob]; ok {
		out.Labels = map[string]string{v1alpha1.LabelJob: j}
	}
	for _, k := range keptAnnotations {
		if v, ok := p.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = make(map[string]string, len(keptAnnotations))
			}
			out.Annotations[k] = v
		}
	}
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		out.Spec.Affinity = &corev1.Affinity{NodeAffinity: a.NodeAffinity}
	}
	strip := func(cs []corev1.Container) []corev1.Container {
		var res []corev1.Container
		for _, c := range cs {
			_, l := c.Resources.Limits[resource]
			_, r := c.Resources.Requests[resource]
			if l || r {
				res = append(res, corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy})
			}
		}
		return res
	}
	out.Spec.Containers = strip(p.Spec.Containers)
	out.Spec.InitContainers = strip(p.Spec.InitContainers)
	return out, nil
}

func stripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		TypeMeta: n.TypeMeta,
		// Labels and taints: bind checks the pod's node constraints.
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels},
		Spec:       corev1.NodeSpec{Taints: n.Spec.Taints},
		// Capacity and allocatable: the GPU counts a topology is checked
		// against.
		Status: corev1.NodeStatus{Capacity: n.Status.Capacity, Allocatable: n.Status.Allocatable},
	}, nil
}

// rebuild re-reads every live pod from the API server (a consistent list,
// newer than anything the informer may still be delivering) into the
// ledger. A new leader does it before it serves so that GPUs bound by the
// previous leader a moment ago are never issued again. Holdings of bound
// pods only ever grow from it (see Ledger), so replaying older state is
// harmless.
func (x *Core) rebuild(ctx context.Context) error {
	var cont string
	n := 0
	for {
		list, err := x.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: PodFieldSelector.String(), Limit: 500, Continue: cont,
		})
		if err != nil {
			return fmt.Errorf("rebuild ledger: list pods: %w", err)
		}
		for i := range list.Items {
			x.ledger.UpsertPod(&list.Items[i])
		}
		n += len(list.Items)
		if cont = list.Continue; cont == "" {
			break
		}
	}
	klog.FromContext(ctx).Info("ledger rebuilt from pods", "pods", n, "ledger", x.ledger.Counts().String())
	return nil
}

func (x *Core) sweep(ctx context.Context) {
	period := min(x.cfg.ReservationTTL.Duration/4, x.cfg.Fabric.GroupReservationTTL.Duration/4, 30*time.Second)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := x.ledger.SweepReservations(x.cfg.ReservationTTL.Duration); n > 0 {
				klog.FromContext(ctx).Info("expired GPU reservations released", "count", n)
			}
			if n := x.ledger.SweepGroups(x.cfg.Fabric.GroupReservationTTL.Duration); n > 0 {
				klog.FromContext(ctx).Info("group plans whose pods did not all come were released", "count", n)
			}
		}
	}
}

// Run is the core's life beside a front end that serves nothing of its
// own (the plugin build, an observer): Sync, Lead, then until ctx ends.
// See Lead for eagerDecider.
func (x *Core) Run(ctx context.Context, eagerDecider bool) error {
	stop, err := x.Sync(ctx)
	defer stop()
	if err != nil {
		return err
	}
	if err := x.Lead(ctx, eagerDecider); err != nil {
		return err
	}
	x.log.Info("decision core ready")
	<-ctx.Done()
	return nil
}

// Observer is what the core reports its counts to.
func (x *Core) Observer() Observer { return x.obs }

// SetRecorder makes the core record its Events through r (a host's own
// recorder) instead of a broadcaster of its own; call it before Sync.
func (x *Core) SetRecorder(r record.EventRecorder) { x.events, x.recorder = nil, r }
