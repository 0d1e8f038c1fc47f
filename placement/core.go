package placement

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/gputopo/gputopo/topology/allocator"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// Core is the decision core of one gputopo scheduler: the GPU ledger, the
// evaluator that answers filter and score, group planning, and the bind
// transaction. Front ends (the HTTP extender, the scheduler plugin,
// `kubectl gputopo explain`, the simulator) translate their callers'
// requests into its Request and answers; it speaks no front end's wire
// types. What connects it to a cluster (informers feeding the ledger, the
// decider Lease, Events, telemetry) is its runtime's, package
// placement/cluster, which reaches it through Options: API, Recorder and
// Gate.
type Core struct {
	cfg    *configv1alpha1.ExtenderConfiguration
	opts   Options
	ledger *ledger.Ledger
	alloc  *allocator.Allocator
	obs    Observer
	// api is what bind reads and writes: the cluster, or a front end's
	// own (the simulator's).
	api API
	// gate says whether the core may decide (nil: always).
	gate Gate
	// recorder receives the core's Events (nil: none).
	recorder Recorder
	now      func() time.Time
	// log is for what the ledger reports (onDoubleHeld).
	log klog.Logger

	// binding counts binds between their decider check and their
	// Binding's outcome: the decider Lease is released only once none is
	// in flight (BindsInFlight).
	binding atomic.Int64
	// lastCycle is the newest Cycle, whose filter counts are flushed when
	// the next one starts unless Score flushed them.
	lastCycle atomic.Pointer[Cycle]
	// refusedTold is, per group, when it was last told that
	// fabric.reserveMaxPercent refuses it a reservation (tellRefused).
	refusedTold sync.Map
	// preempting is, per waiting group, the nodes of the preemption plan
	// its pods last evicted for (keptPreemption).
	preempting sync.Map
}

// Options are a core's settings besides its configuration file.
type Options struct {
	// Config shapes decisions; nil means the defaults.
	Config *configv1alpha1.ExtenderConfiguration
	// SchedulerNames are the kube-scheduler profiles gputopo decides for;
	// bind refuses pods addressed to any other scheduler.
	SchedulerNames []string
	// Observer receives counts (nil: none are kept).
	Observer Observer
	// API is what bind reads and writes (nil: a core that only answers
	// filter, score and explain, as `kubectl gputopo explain` uses it).
	API API
	// Recorder receives the core's Events: GPUsBound, PlacementFellBack,
	// GPUDoubleHeld (nil: none are recorded).
	Recorder Recorder
	// Gate says whether the core may decide now: its runtime's informers
	// synced, leadership and decider Lease (nil: it always may, as a
	// core fed by its caller).
	Gate Gate
	// Logger logs what the ledger reports; zero means klog's background
	// logger named "placement".
	Logger klog.Logger
	// Clock is the core's clock (nil: the wall clock). A simulation that
	// runs in simulated time passes its own: pod ages (fallbackAfter),
	// reservation TTLs and topology ages are then measured on it.
	Clock func() time.Time
	// ClaimGPUs, when set, is how many GPUs a pod that asks none of the
	// device plugin's resource asks through its ResourceClaims (the
	// runtime reads them from its caches; docs/dra.md): the ledger then
	// knows such pods, pending ones included, as GPU pods.
	ClaimGPUs func(*corev1.Pod) int
}

// Recorder records Events about pods: client-go's record.EventRecorder,
// or a front end's adapter to its host's recorder.
type Recorder interface {
	Event(object runtime.Object, eventtype, reason, message string)
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Gate is the runtime's say in whether the core decides.
type Gate interface {
	// NotReady says why the core cannot decide yet (informers syncing,
	// ledger rebuild pending, not the leader); empty when it can.
	NotReady() string
	// Leading reports whether this replica serves: only it records Events.
	Leading() bool
	// DeciderRefusal says why this replica may not decide GPU pods now
	// (another gputopo scheduler holds the decider Lease, or it is being
	// acquired); empty when it may.
	DeciderRefusal() string
}

// New builds a core on o.Config as given: the caller validates it (a
// cluster's runtime does; tests may weigh terms no user could set alone).
// Without a Gate it is ready at once and its caller
// feeds the ledger (Feed) as informers would: `kubectl gputopo explain`,
// the simulator (which binds through an API of its own) and tests. A
// cluster's runtime (package placement/cluster) builds it with its API,
// Recorder and Gate.
func New(o Options) (*Core, error) {
	cfg := o.Config
	if cfg == nil {
		cfg = configv1alpha1.DefaultExtenderConfiguration()
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if len(o.SchedulerNames) == 0 {
		o.SchedulerNames = []string{v1alpha1.DefaultSchedulerName}
	}
	if o.API == nil {
		o.API = noAPI{}
	}
	if o.Logger.GetSink() == nil {
		o.Logger = klog.Background().WithName("placement")
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	x := &Core{
		cfg:      cfg,
		opts:     o,
		alloc:    allocator.New(cfg.AllocatorMemoSize),
		obs:      o.Observer,
		api:      o.API,
		gate:     o.Gate,
		recorder: o.Recorder,
		now:      o.Clock,
		log:      o.Logger,
	}
	fabric := make([][]string, len(cfg.Fabric.Levels))
	for i, lvl := range cfg.Fabric.Levels {
		fabric[i] = lvl.Labels
	}
	lo := ledger.Options{
		Resource: cfg.GPUResource(),
		// The ledger reads the core's clock, so that one clock rules both.
		Clock:          func() time.Time { return x.now() },
		Fabric:         fabric,
		TopologyMaxAge: cfg.TopologyAgeLimit(),
		OnDoubleHeld:   x.onDoubleHeld,
		ClaimGPUs:      o.ClaimGPUs,
	}
	if p := cfg.Telemetry.Prometheus; cfg.Telemetry.Source == configv1alpha1.TelemetryPrometheus && p != nil {
		lo.ExternalTelemetryMaxAge = p.MaxAge.Duration
	}
	x.ledger = ledger.New(lo)
	return x, nil
}

// Report is what the core's ledger tells audits, metrics, `kubectl
// gputopo` and the runtime's publisher; it changes nothing.
func (x *Core) Report() Report { return x.ledger.Report() }

// Report is the read-only side of the core's ledger (ledger.Report).
type Report interface {
	Counts() ledger.Counts
	Holdings() []ledger.Holding
	DoubleHolds() []ledger.DoubleHold
	DuplicateGPUs() int
	TopologyStates(now time.Time, maxAge time.Duration) map[string]int
	TelemetrySources() (bySource map[string]int, fallback map[string]int)
	NodeTelemetrySource(node string) (source, fallback string)
	Held() []ledger.Held
	GroupPlans() []ledger.GroupPlan
	GroupReservations() []ledger.GroupReservation
	OnTelemetry(fn func(node string, g *topology.Graph, tel []v1alpha1.Telemetry))
	OnUsable(fn func())
}

// Config is the configuration the core decides with.
func (x *Core) Config() *configv1alpha1.ExtenderConfiguration { return x.cfg }

// Now is the core's clock.
func (x *Core) Now() time.Time { return x.now() }

// NotReady says why the core cannot decide yet; empty when it can.
func (x *Core) NotReady() string {
	if x.gate == nil {
		return ""
	}
	return x.gate.NotReady()
}

// Leading reports whether this replica serves: without a Gate always;
// only a serving replica records Events and exports per-GPU metrics.
func (x *Core) Leading() bool { return x.gate == nil || x.gate.Leading() }

// deciderRefusal says why this core may not decide GPU pods now (another
// gputopo scheduler holds the decider Lease, or it is being acquired);
// empty when it may. PreFilter asks it once per GPU pod's cycle: the
// runtime starts the election on the first call, since only the
// scheduling replica calls it.
func (x *Core) deciderRefusal() string {
	if x.gate == nil {
		return ""
	}
	return x.gate.DeciderRefusal()
}

// setClock replaces the core's clock, and so its ledger's, which reads
// the core's (tests that move time).
func (x *Core) setClock(now func() time.Time) { x.now = now }
