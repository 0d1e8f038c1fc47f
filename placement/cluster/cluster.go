// Package cluster is the decision core's runtime in a cluster: the
// informers (with their transforms) that feed the ledger, the rebuild of
// the ledger from pods when this replica starts leading, the decider
// Lease, the Event broadcaster, the Prometheus telemetry poller, and the
// API through which bind reads and writes. Both scheduler front ends (the
// HTTP extender and the scheduler plugin) start a core through it; the
// core itself (package placement) decides and imports none of this.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
)

// Options are a runtime's settings.
type Options struct {
	// Core shapes the decision core. Its API and Gate are the runtime's;
	// its Recorder, when set, replaces the runtime's own Event
	// broadcaster (the plugin build passes the framework's recorder).
	Core placement.Options
	// Mode names the front end in the decider Lease's holder identity
	// ("extender", "plugin").
	Mode string
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
}

// HostInformers are a host process's informers the runtime shares.
type HostInformers struct {
	Pods, Nodes toolscache.SharedIndexInformer
}

// Runtime runs one decision core in a cluster. It is the core's Gate: the
// core decides once the informers synced and, once Lead, the ledger was
// rebuilt from pods, and while this replica holds the decider Lease.
type Runtime struct {
	core *placement.Core
	cfg  *configv1alpha1.ExtenderConfiguration
	opts Options
	// draCache reads ResourceClaims and ResourceClaimTemplates once the
	// cluster is known to serve them (claimGPUs); nil before.
	draCache atomic.Pointer[client.Reader]
	// client talks to the API server (rebuild, the decider Lease, Events,
	// reads bind cannot answer from a cache).
	client  kubernetes.Interface
	restCfg *rest.Config
	api     *clusterAPI
	// events sends the recorder's Events to the API server; nil when the
	// front end passed its own recorder.
	events record.EventBroadcaster
	// prom reads telemetry from Prometheus (telemetry.source: prometheus).
	prom *promTelemetry

	synced  atomic.Bool // informers synced and the initial ledger built
	leading atomic.Bool // this replica decides (Lead) and its ledger is rebuilt

	// decider holds the cluster-wide decider Lease (decider.go) once
	// started; nil when this core decides nothing (shadow).
	decider atomic.Pointer[decider]
	// startCtx is Sync's context, for a decider started later (the
	// plugin build's, on the first GPU pod's cycle).
	startCtx atomic.Pointer[context.Context]
	// pub publishes what the core holds for groups (publish.go); only
	// its own goroutine touches it.
	pub publisher
}

// New builds a runtime and its core for a cluster: restCfg feeds its
// informers and cs writes Bindings, Events and the decider Lease. Sync
// starts it. It refuses an invalid configuration.
func New(restCfg *rest.Config, cs kubernetes.Interface, o Options) (*Runtime, error) {
	if cfg := o.Core.Config; cfg != nil {
		if errs := cfg.Validate(); len(errs) > 0 {
			return nil, fmt.Errorf("invalid %s: %w", configv1alpha1.ExtenderKind, errs.ToAggregate())
		}
	}
	if o.Identity == "" {
		o.Identity = defaultIdentity()
	}
	if len(o.Core.SchedulerNames) == 0 {
		o.Core.SchedulerNames = []string{v1alpha1.DefaultSchedulerName}
	}
	r := &Runtime{opts: o, client: cs, restCfg: restCfg}
	co := o.Core
	co.ClaimGPUs = r.claimGPUs
	r.api = &clusterAPI{client: cs}
	co.API, co.Gate = r.api, r
	if co.Recorder == nil {
		r.events, co.Recorder = newEventBroadcaster()
	}
	x, err := placement.New(co)
	if err != nil {
		return nil, err
	}
	r.core, r.cfg = x, x.Config()
	r.api.bindTimeout = r.cfg.BindTimeout.Duration
	if r.cfg.Telemetry.Source == configv1alpha1.TelemetryPrometheus {
		if r.prom, err = newPromTelemetry(r.cfg.Telemetry.Prometheus, x, co.Observer); err != nil {
			return nil, err
		}
	}
	if !o.DecidesNothing && cs != nil {
		r.decider.Store(newDecider(r, o.Mode))
	}
	return r, nil
}

// Core is the runtime's decision core.
func (r *Runtime) Core() *placement.Core { return r.core }

// Client is the runtime's API server client.
func (r *Runtime) Client() kubernetes.Interface { return r.client }

// Identity is this process's identity in Leases (Options.Identity, else
// hostname_random).
func (r *Runtime) Identity() string { return r.opts.Identity }

// NotReady says why the core cannot decide yet (informers syncing, ledger
// rebuild pending); empty when it can. It is the core's Gate.
func (r *Runtime) NotReady() string {
	switch {
	case !r.synced.Load():
		return "not ready: informer caches are syncing"
	case !r.leading.Load():
		return "not ready: not the leader (another replica holds the lease) or ledger rebuild pending"
	}
	return ""
}

// Leading reports whether the core decides (Lead, until StopLeading).
func (r *Runtime) Leading() bool { return r.leading.Load() }

// ErrStopped is returned for a runtime whose cluster connection ended.
var ErrStopped = errors.New("placement: core stopped")

// Sync starts the runtime's Event broadcaster and informers and returns
// once every initial list is in the ledger; the reservation sweep and the
// Prometheus telemetry then run until ctx ends. The returned stop flushes
// the Event broadcaster. The core decides only after Lead.
func (r *Runtime) Sync(ctx context.Context) (stop func(), err error) {
	r.startCtx.Store(&ctx)
	stop = r.startEvents()
	if err := r.startInformers(ctx); err != nil {
		stop()
		return func() {}, err
	}
	r.synced.Store(true)
	klog.FromContext(ctx).Info("caches synced", "ledger", r.core.Report().Counts().String())
	go wait.UntilWithContext(ctx, func(context.Context) { r.core.Upkeep().Sweep() }, r.core.Upkeep().SweepPeriod())
	// Waiting groups get their reservations even where kube-scheduler's
	// own filters never let it ask the extender about their pods.
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		if r.holdsDecider() { // a shadow, or a replica that does not decide, keeps nothing
			r.core.Upkeep().KeepForWaitingGroups(ctx)
		}
	}, placement.ReserveRefresh)
	// Plans and reservations are published for kubectl gputopo and the
	// next decider. The client is made (and its API discovery done) now,
	// so that taking the decider Lease over later costs one list.
	if r.restCfg != nil {
		r.pub.ready(ctx, r)
	}
	go wait.UntilWithContext(ctx, r.publish, PublishPeriod)
	if r.prom != nil {
		go r.prom.run(ctx)
	}
	return stop, nil
}

// Lead makes the core decide: it rebuilds the ledger from a fresh list of
// pods (GPUs bound by a previous leader a moment ago are never issued
// again) and, with eagerDecider, takes its first answer from the decider
// Lease before returning, so that no decision waits for it (the HTTP
// extender, which reports Ready next). Without it, the first GPU pod's
// cycle asks (the plugin build: only the scheduling leader asks).
func (r *Runtime) Lead(ctx context.Context, eagerDecider bool) error {
	if err := r.rebuild(ctx); err != nil {
		return err
	}
	if eagerDecider {
		r.startDecider(ctx)
	}
	r.leading.Store(true)
	r.core.Upkeep().AnnounceDoubleHolds()
	return nil
}

// StopLeading makes the core stop deciding (its leader election lost).
func (r *Runtime) StopLeading() { r.leading.Store(false) }

// Run is the core's life beside a front end that serves nothing of its
// own (the plugin build, an observer): Sync, Lead, then until ctx ends.
// See Lead for eagerDecider.
func (r *Runtime) Run(ctx context.Context, eagerDecider bool) error {
	stop, err := r.Sync(ctx)
	defer stop()
	if err != nil {
		return err
	}
	if err := r.Lead(ctx, eagerDecider); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("decision core ready")
	<-ctx.Done()
	return nil
}

// EventComponent is the source component of the runtime's own Events.
const EventComponent = "gputopo-extender"

// newEventBroadcaster is the Events sink of a replica. client-go's
// correlator rate-limits per pod (a burst of 25, then one Event per 5
// minutes) and folds repeats into one Event with a count, so that a
// conflict that comes and goes cannot flood the API server.
func newEventBroadcaster() (record.EventBroadcaster, record.EventRecorder) {
	b := record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{BurstSize: 25, QPS: 1. / 300}))
	return b, b.NewRecorder(scheme(), corev1.EventSource{Component: EventComponent})
}

// startEvents sends the recorder's Events to the API server until stop is
// called.
func (r *Runtime) startEvents() (stop func()) {
	if r.events == nil || r.client == nil {
		return func() {}
	}
	r.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.client.CoreV1().Events("")})
	return r.events.Shutdown
}

var _ placement.Gate = (*Runtime)(nil)
