package extender

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender/ledger"
	"github.com/gputopo/gputopo/topology/allocator"
)

// ErrLeadershipLost is returned by Start when another replica took the
// Lease: the process should exit and be restarted as a standby, so that no
// decision is ever made from a ledger the new leader does not share.
var ErrLeadershipLost = errors.New("extender: leader election lost")

// Extender is one extender replica: informers, ledger, HTTP servers and,
// optionally, leader election.
type Extender struct {
	cfg     *Configuration
	opts    Options
	ledger  *Ledger
	alloc   *allocator.Allocator
	metrics *Metrics
	client  kubernetes.Interface
	restCfg *rest.Config
	now     func() time.Time
	// prom reads telemetry from Prometheus (telemetry.source: prometheus).
	prom *promTelemetry
	// cache is the informer cache (stripped pods and nodes) once started;
	// nil in-process without informers.
	cache client.Reader
	// podStore and nodeStore are the host's informer stores with
	// Options.HostInformers (they answer bind's reads instead of cache).
	podStore, nodeStore toolscache.Store
	// mirror sends filter and prioritize requests to a shadow extender
	// (--shadow-url); nil when none.
	mirror *mirror
	// shadowLog is the sampled log of differing decisions (--shadow).
	shadowLog *decisionLog
	// events sends recorder's Events (GPUDoubleHeld) to the API server;
	// both nil in-process without a cluster.
	events   record.EventBroadcaster
	recorder record.EventRecorder
	// log is for what the ledger reports (onDoubleHeld); Start sets the
	// context's.
	log klog.Logger

	synced  atomic.Bool // informers synced and the initial ledger built
	leading atomic.Bool // holds the Lease (or runs without election) and rebuilt

	// decider holds the cluster-wide decider Lease (decider.go) once
	// started; nil when this core decides nothing (shadow, in-memory use).
	decider atomic.Pointer[decider]
	// binding counts binds between their decider check and their
	// Binding's outcome: the decider Lease is released only once none is
	// in flight (decider.drain).
	binding atomic.Int64
	// startCtx is Start's context, for a decider started later
	// (in-process, on the first GPU pod's cycle).
	startCtx atomic.Pointer[context.Context]

	addrMu      sync.Mutex
	apiAddr     string
	metricsAddr string
}

// New builds an extender from a REST config and options; Start runs it.
func New(restCfg *rest.Config, o Options) (*Extender, error) {
	o.setDefaults()
	cfg := o.Config
	if cfg == nil {
		var err error
		if cfg, err = LoadConfiguration(o.ConfigFile); err != nil {
			return nil, err
		}
	} else if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("invalid %s: %w", ConfigKind, errs.ToAggregate())
	}
	restCfg = withRateLimits(restCfg, o)
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	x := newExtender(cfg, cs)
	x.opts, x.restCfg = o, restCfg
	x.events, x.recorder = newEventBroadcaster()
	if cfg.Telemetry.Source == TelemetryPrometheus {
		if x.prom, err = newPromTelemetry(cfg.Telemetry.Prometheus, x.ledger, x.metrics); err != nil {
			return nil, err
		}
	}
	if o.ShadowURL != "" {
		if x.mirror, err = newMirror(o, x.metrics); err != nil {
			return nil, err
		}
		x.mirror.resource = cfg.GPUResource()
	}
	if o.Shadow {
		x.shadowLog = &decisionLog{rate: o.ShadowLogSampleRate}
	}
	return x, nil
}

// withRateLimits is restCfg with the options' client rate limits, a copy
// (the caller's config is left alone).
func withRateLimits(restCfg *rest.Config, o Options) *rest.Config {
	c := rest.CopyConfig(restCfg)
	if o.KubeAPIQPS > 0 {
		c.QPS = o.KubeAPIQPS
	}
	if o.KubeAPIBurst > 0 {
		c.Burst = o.KubeAPIBurst
	}
	return c
}

// newExtender builds the request-serving core without informers or
// servers: unit tests drive its ledger directly.
func newExtender(cfg *Configuration, cs kubernetes.Interface) *Extender {
	l := ledger.New(cfg.GPUResource())
	m := NewMetrics(l)
	l.OnTelemetry(m.setTelemetry)
	x := &Extender{
		cfg:     cfg,
		opts:    NewOptions(), // New replaces them with the flags
		ledger:  l,
		alloc:   allocator.New(cfg.AllocatorMemoSize),
		metrics: m,
		client:  cs,
		now:     time.Now,
		log:     klog.Background().WithName("extender"),
	}
	l.OnDoubleHeld(x.onDoubleHeld)
	m.leader = x.leading.Load
	m.topologyClock = func() (time.Time, time.Duration) { return x.now(), cfg.topologyMaxAge() }
	return x
}

// Ledger exposes the GPU ledger for audits.
func (x *Extender) Ledger() *Ledger { return x.ledger }

// Metrics exposes the extender's metrics registry.
func (x *Extender) Metrics() *Metrics { return x.metrics }

// Ready reports whether this replica serves: caches synced, ledger rebuilt
// from pods and, with leader election, holding the Lease.
func (x *Extender) Ready() bool { return x.synced.Load() && x.leading.Load() }

// APIAddr is the address the verbs listen on, once Start has bound it.
func (x *Extender) APIAddr() string {
	x.addrMu.Lock()
	defer x.addrMu.Unlock()
	return x.apiAddr
}

// MetricsAddr is the address /metrics listens on, once Start has bound it.
func (x *Extender) MetricsAddr() string {
	x.addrMu.Lock()
	defer x.addrMu.Unlock()
	return x.metricsAddr
}

// scheme holds what the extender's cache reads.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// podFieldSelector leaves finished pods out of the cache: they hold no GPU,
// and a pod that finishes leaves the watch as a delete.
var podFieldSelector = fields.AndSelectors(
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
)

// Start serves until ctx ends or, with leader election, the Lease is lost
// (ErrLeadershipLost). /healthz answers at once; /readyz and the verbs only
// once the replica is Ready.
func (x *Extender) Start(ctx context.Context) error {
	return x.start(ctx, true)
}

// StartInProcess runs the decision core for a front end in the same
// process (the gputopo-scheduler plugin build): informers, the ledger and
// its rebuild, the reservation sweep, telemetry, events and, unless
// MetricsBindAddress is "0", /metrics with the same names. It serves no
// verbs and runs no leader election of its own: the host scheduler elects
// its leader and only the leader schedules. It returns when ctx ends.
func (x *Extender) StartInProcess(ctx context.Context) error {
	return x.start(ctx, false)
}

func (x *Extender) start(ctx context.Context, verbs bool) error {
	log := klog.FromContext(ctx).WithName("extender")
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, log))
	defer cancel()
	x.log = log
	defer x.startEvents()()
	mode := "extender"
	if !verbs {
		mode = "plugin"
	}
	x.startCtx.Store(&ctx)
	x.decider.Store(newDecider(x, mode))

	var servers []*http.Server
	var listeners []net.Listener
	if verbs {
		apiLn, err := x.listenAPI()
		if err != nil {
			return err
		}
		listeners = append(listeners, apiLn)
		servers = append(servers, &http.Server{Handler: x.Handler(), ReadHeaderTimeout: 10 * time.Second})
		x.addrMu.Lock()
		x.apiAddr = apiLn.Addr().String()
		x.addrMu.Unlock()
	}
	if x.opts.MetricsBindAddress != "0" && x.opts.MetricsBindAddress != "" {
		mln, err := net.Listen("tcp", x.opts.MetricsBindAddress)
		if err != nil {
			for _, ln := range listeners {
				ln.Close()
			}
			return fmt.Errorf("listen for metrics on %s: %w", x.opts.MetricsBindAddress, err)
		}
		x.addrMu.Lock()
		x.metricsAddr = mln.Addr().String()
		x.addrMu.Unlock()
		servers = append(servers, &http.Server{Handler: x.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second})
		listeners = append(listeners, mln)
	}
	serveErr := make(chan error, len(servers))
	for i := range servers {
		go func() {
			if err := servers[i].Serve(listeners[i]); err != nil && !errors.Is(err, http.ErrServerClosed) {
				serveErr <- fmt.Errorf("serve %s: %w", listeners[i].Addr(), err)
			}
		}()
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		for _, s := range servers {
			_ = s.Shutdown(sctx)
		}
	}()
	log.Info("extender listening", "api", x.APIAddr(), "metrics", x.MetricsAddr())

	if err := x.startInformers(ctx); err != nil {
		return err
	}
	x.synced.Store(true)
	log.Info("extender caches synced", "ledger", x.ledger.Counts().String())

	go x.sweep(ctx)
	if x.prom != nil {
		go x.prom.run(ctx)
	}
	if x.mirror != nil {
		x.mirror.start(ctx)
	}

	lost := make(chan struct{})
	if verbs && x.opts.LeaderElect {
		le, err := x.elector(ctx, lost)
		if err != nil {
			return err
		}
		go le.Run(ctx)
	} else {
		if err := x.rebuild(ctx); err != nil {
			return err
		}
		if verbs {
			// In-process, only the host's scheduling leader asks. Started
			// before the verbs serve, so that no verb starts it first with
			// another context.
			x.startDecider(ctx)
		}
		x.leading.Store(true)
		x.announceDoubleHolds()
		log.Info("extender ready")
	}
	select {
	case <-ctx.Done():
		return nil
	case <-lost:
		return ErrLeadershipLost
	case err := <-serveErr:
		return err
	}
}

// startInformers starts the cache and feeds the ledger from it; it returns
// once every initial list has been delivered to the ledger.
func (x *Extender) startInformers(ctx context.Context) error {
	c, err := crcache.New(x.restCfg, crcache.Options{
		Scheme: scheme(),
		ByObject: map[client.Object]crcache.ByObject{
			&corev1.Pod{}:  {Field: podFieldSelector, Transform: stripPod(x.cfg.GPUResource())},
			&corev1.Node{}: {Transform: stripNode},
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

// stripPod keeps only what the ledger reads, so that a cluster's pods cost
// little memory. Of the containers it keeps those that ask for resource
// (the managed GPU resource), with what v1alpha1.PodGPUDemand reads:
// resources and restartPolicy (a sidecar's devices add up, a one-shot init
// container's do not). Containers without the resource add nothing to the
// demand.
func stripPod(resource corev1.ResourceName) toolscache.TransformFunc {
	return func(obj any) (any, error) { return stripPodOf(obj, resource) }
}

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
			NodeSelector: p.Spec.NodeSelector, Tolerations: p.Spec.Tolerations},
		Status: corev1.PodStatus{Phase: p.Status.Phase},
	}
	if j, ok := p.Labels[v1alpha1.LabelJob]; ok {
		out.Labels = map[string]string{v1alpha1.LabelJob: j}
	}
	for _, k := range []string{v1alpha1.AnnotationRequirement, v1alpha1.AnnotationAssignedGPUs, v1alpha1.AnnotationPlacement, v1alpha1.AnnotationAllocatedGPUs} {
		if v, ok := p.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = make(map[string]string, 4)
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
func (x *Extender) rebuild(ctx context.Context) error {
	var cont string
	n := 0
	for {
		list, err := x.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			FieldSelector: podFieldSelector.String(), Limit: 500, Continue: cont,
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

func (x *Extender) sweep(ctx context.Context) {
	period := min(x.cfg.ReservationTTL.Duration/4, 30*time.Second)
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
		}
	}
}

// elector builds the Lease-based leader election. On winning, the replica
// rebuilds its ledger and only then reports Ready; on losing, it stops
// serving at once and closes lost.
func (x *Extender) elector(ctx context.Context, lost chan struct{}) (*leaderelection.LeaderElector, error) {
	id := x.identity()
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, x.opts.LeaderElectionNamespace, x.opts.LeaderElectionID,
		x.client.CoreV1(), x.client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return nil, fmt.Errorf("leader election lock: %w", err)
	}
	log := klog.FromContext(ctx)
	var once sync.Once
	return leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   x.opts.LeaseDuration,
		RenewDeadline:   x.opts.RenewDeadline,
		RetryPeriod:     x.opts.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            x.opts.LeaderElectionID,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("leader election won; rebuilding ledger", "identity", id)
				if err := x.rebuild(ctx); err != nil {
					log.Error(err, "rebuild after winning leader election failed; giving up the lease")
					once.Do(func() { close(lost) })
					return
				}
				x.startDecider(ctx)
				x.leading.Store(true)
				x.announceDoubleHolds()
				log.Info("extender ready", "identity", id)
			},
			OnStoppedLeading: func() {
				x.leading.Store(false)
				if ctx.Err() == nil {
					log.Info("leader election lost", "identity", id)
					once.Do(func() { close(lost) })
				}
			},
		},
	})
}

func (x *Extender) listenAPI() (net.Listener, error) {
	addr := net.JoinHostPort(x.opts.BindAddress, strconv.Itoa(x.opts.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	if x.opts.TLSCertFile == "" && x.opts.TLSPrivateKeyFile == "" {
		return ln, nil
	}
	tc, err := x.tlsConfig()
	if err != nil {
		ln.Close()
		return nil, err
	}
	return tlsListener(ln, tc), nil
}
