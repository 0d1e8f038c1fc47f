package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// One decider per GPU resource per cluster.
//
// Each gputopo scheduler keeps its GPU ledger in memory, fed by watches:
// two of them deciding the same GPUs (the extender and the plugin build
// side by side during a migration, two releases, two profiles in two
// processes) each see the other's binds only after the watch delivers
// them, and in that window both issue the same GPU. So the one that
// decides must hold a cluster-wide Lease, named for the GPU resource, in
// a namespace every release can reach (kube-system by default): a second
// scheduler refuses every GPU pod with a message naming the holder until
// the Lease is free, and then takes over after rebuilding its ledger from
// a fresh list of pods (the GPUs the previous decider bound a moment ago
// are never issued again). Inside one deployment, only the replica that
// decides holds it: the extender leader, or the kube-scheduler leader of
// the plugin build (which asks for it on its first GPU pod, since only the
// leader schedules).

// DefaultDeciderLeaseNamespace holds the decider Lease.
const DefaultDeciderLeaseNamespace = "kube-system"

// DeciderLeaseName is the decider Lease's default name for a GPU
// resource: "gputopo-decider-" and the resource with "/" as "-"
// (gputopo-decider-nvidia.com-gpu).
func DeciderLeaseName(resource string) string {
	return "gputopo-decider-" + strings.NewReplacer("/", "-", "_", "-").Replace(strings.ToLower(resource))
}

// ValidDeciderLeaseName checks a decider Lease name given by flag.
func ValidDeciderLeaseName(name string) error {
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return fmt.Errorf("--decider-lease-name %q: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}

// decider runs the election for the decider Lease and answers whether
// this process may decide GPUs now.
type decider struct {
	x         *Runtime
	namespace string
	name      string
	identity  string

	startOnce sync.Once
	// started says start ran (the election is running or has ended).
	started atomic.Bool
	// mu orders a term's start (takeOver) against its end
	// (OnStoppedLeading), so that holding is never set after its term.
	mu      sync.Mutex
	holding atomic.Bool
	// draining: the scheduler is stopping; no term may start deciding.
	draining bool
	// holder is the identity last seen holding the Lease ("" unknown).
	holder atomic.Pointer[string]
	// done is closed when the election has ended (its context ended).
	done chan struct{}
	// settled is closed once the first try has an answer: the Lease is
	// held, by this process or another.
	settled     chan struct{}
	settledOnce sync.Once
}

// newDecider returns the decider of x, or nil when x decides nothing (a
// shadow, or the decider Lease turned off for in-memory use).
func newDecider(x *Runtime, mode string) *decider {
	if x.opts.DecidesNothing || x.client == nil {
		return nil
	}
	name := x.opts.DeciderLeaseName
	if name == "" {
		name = DeciderLeaseName(string(x.cfg.GPUResource()))
	}
	ns := x.opts.DeciderLeaseNamespace
	if ns == "" {
		ns = DefaultDeciderLeaseNamespace
	}
	base := x.opts.Identity
	return &decider{
		x:         x,
		namespace: ns,
		name:      name,
		identity:  fmt.Sprintf("%s (%s mode, scheduler %s)", base, mode, strings.Join(x.opts.Core.SchedulerNames, ",")),
		done:      make(chan struct{}),
		settled:   make(chan struct{}),
	}
}

// defaultIdentity is hostname_random: unique per process, so that two
// replicas on one host never share a Lease.
func defaultIdentity() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return host + "_" + hex.EncodeToString(b)
}

// lease names the Lease for messages.
func (d *decider) lease() string { return d.namespace + "/" + d.name }

// start runs the election until ctx ends; later calls do nothing. Winning
// rebuilds the ledger before deciding; losing stops deciding at once and
// keeps trying, so a scheduler whose Lease renewal failed once comes back.
func (d *decider) start(ctx context.Context) {
	d.startOnce.Do(func() {
		d.started.Store(true)
		go d.run(ctx)
	})
}

// AwaitDeciderReleased waits, at most timeout, until the decider Lease
// election has ended after the core's context ended: its Bindings in
// flight drained and the Lease released, so that the next scheduler
// takes it at once instead of after the Lease duration. It returns at once
// for a core that never ran the election. A process that exits when its
// context ends (kube-scheduler on SIGTERM) calls it before exiting;
// false means the Lease may still be held.
func (x *Runtime) AwaitDeciderReleased(timeout time.Duration) bool {
	d := x.decider.Load()
	if d == nil || !d.started.Load() {
		return true
	}
	select {
	case <-d.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

func (d *decider) run(ctx context.Context) {
	defer close(d.done)
	log := klog.FromContext(ctx).WithValues("lease", d.lease(), "identity", d.identity)
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, d.namespace, d.name,
		d.x.client.CoreV1(), d.x.client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: d.identity})
	if err != nil {
		log.Error(err, "decider lease lock; this scheduler decides no GPU pod")
		return
	}
	o := d.x.opts
	for ctx.Err() == nil {
		// Each term has its own context: a term that cannot decide (its
		// rebuild failed) ends itself, and ReleaseOnCancel frees the Lease
		// for the next try here or for another scheduler. It is not ctx's
		// child: when ctx ends, the term stops deciding at once but keeps
		// the Lease until its Bindings in flight are done (drain), so a
		// scheduler that takes a released Lease has none to wait for.
		term, endTerm := context.WithCancel(context.WithoutCancel(ctx))
		go func() {
			select {
			case <-ctx.Done():
				d.drain(log)
				endTerm()
			case <-term.Done():
			}
		}()
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   o.LeaseDuration,
			RenewDeadline:   o.RenewDeadline,
			RetryPeriod:     o.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            d.name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					if err := d.takeOver(ctx); err != nil {
						log.Error(err, "taking over as decider failed; releasing the decider lease and trying again")
						endTerm()
						return
					}
					log.Info("deciding GPUs")
				},
				OnStoppedLeading: func() {
					d.mu.Lock()
					was := d.holding.Swap(false)
					d.mu.Unlock()
					if was {
						log.Info("decider lease lost; no longer deciding GPUs")
					}
				},
				OnNewLeader: func(identity string) {
					d.holder.Store(&identity)
					if identity != d.identity {
						d.settle()
						log.Info("another gputopo scheduler decides GPUs", "holder", identity)
					}
				},
			},
		})
		if err != nil {
			endTerm()
			log.Error(err, "decider lease election; this scheduler decides no GPU pod")
			return
		}
		le.Run(term)
		endTerm()
		d.holding.Store(false)
		select {
		case <-ctx.Done():
		case <-time.After(o.RetryPeriod):
		}
	}
}

func (d *decider) settle() { d.settledOnce.Do(func() { close(d.settled) }) }

// drain stops deciding and waits, at most bindTimeout and a second, until
// no Binding this process started is in flight, before the Lease is
// released.
func (d *decider) drain(log klog.Logger) {
	d.mu.Lock()
	d.draining = true
	d.holding.Store(false)
	d.mu.Unlock()
	deadline := time.Now().Add(d.x.cfg.BindTimeout.Duration + time.Second)
	for d.x.core.Upkeep().BindsInFlight() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := d.x.core.Upkeep().BindsInFlight(); n > 0 {
		log.Info("releasing the decider lease with Bindings still in flight", "bindings", n)
	}
}

// firstAnswerWait bounds how long the first GPU pod waits for the first
// try at the decider Lease: a free Lease is taken in one round trip and a
// rebuild of the ledger, so the pod is decided, not refused, on its first
// cycle.
const firstAnswerWait = 3 * time.Second

// awaitFirstAnswer waits, once and at most firstAnswerWait, until the
// Lease is known to be held by this process or another; a try that could
// not be answered in time (the API server unreachable, the Lease not
// permitted) is not waited for again.
func (d *decider) awaitFirstAnswer() {
	select {
	case <-d.settled:
		return
	default:
	}
	t := time.NewTimer(firstAnswerWait)
	defer t.Stop()
	select {
	case <-d.settled:
	case <-d.done:
	case <-t.C:
		d.settle()
	}
}

// takeOver makes this process the decider once it holds the Lease. The
// previous decider's Bindings are done by then: one that released the
// Lease drained them first (drain), and one whose Lease expired stopped
// deciding renewDeadline before it did, so its last Bindings ended
// bindTimeout after that; only a bindTimeout longer than the difference
// (leaseDuration − renewDeadline, 5 s by default) leaves some to wait
// for. Then it lists every pod, so the GPUs those Bindings carry are in
// the ledger before this process promises any. It decides only if the
// term is still on: a term that ended meanwhile (OnStoppedLeading ran)
// must not be revived.
func (d *decider) takeOver(ctx context.Context) error {
	log := klog.FromContext(ctx)
	o := d.x.opts
	wait := max(d.x.cfg.BindTimeout.Duration-(o.LeaseDuration-o.RenewDeadline), 0)
	log.Info("decider lease acquired; rebuilding the ledger before deciding GPUs", "wait", wait)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
	}
	if err := d.x.rebuild(ctx); err != nil {
		return err
	}
	// The plans the previous decider published for groups it had not
	// bound whole: this one binds their pods there.
	d.x.adoptPlans(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	if d.draining {
		return errors.New("the scheduler is stopping")
	}
	d.holding.Store(true)
	d.settle()
	return nil
}

// refusal is why this process may not decide GPUs now, "" when it may.
func (d *decider) refusal() string {
	if d == nil || d.holding.Load() {
		return ""
	}
	holder := ""
	if h := d.holder.Load(); h != nil {
		holder = *h
	}
	res := d.x.cfg.GPUResource()
	if holder == "" || holder == d.identity {
		return fmt.Sprintf("not deciding %s yet: acquiring the decider Lease %s (one gputopo scheduler decides a GPU resource per cluster); retrying", res, d.lease())
	}
	return fmt.Sprintf("GPUs of %s are decided by another gputopo scheduler, %q, which holds the decider Lease %s; one gputopo scheduler decides a GPU resource per cluster, so this one (%q) waits and takes over when that one stops (docs/scheduler-plugin.md, one decider per cluster)",
		res, holder, d.lease(), d.identity)
}

// DeciderRefusal says why this core may not decide GPU pods now (another
// gputopo scheduler holds the decider Lease, or it is being acquired);
// empty when it may. In-process front ends call it once per GPU pod's
// cycle: the first call starts the election, since only the scheduling
// replica calls it.
func (x *Runtime) DeciderRefusal() string {
	d := x.decider.Load()
	if d == nil {
		return ""
	}
	if ctx := x.startCtx.Load(); ctx != nil {
		d.start(*ctx)
		d.awaitFirstAnswer()
	}
	return d.refusal()
}

// startDecider starts the decider Lease election, if this core decides,
// and waits for its first answer (at most firstAnswerWait), so that the
// verbs, served once the caller reports Ready, never wait for it.
func (x *Runtime) startDecider(ctx context.Context) {
	if d := x.decider.Load(); d != nil {
		d.start(ctx)
		d.awaitFirstAnswer()
	}
}
