package extender

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/cluster"
	"github.com/gputopo/gputopo/placement/metrics"
)

// ErrLeadershipLost is returned by Start when another replica took the
// Lease: the process should exit and be restarted as a standby, so that no
// decision is ever made from a ledger the new leader does not share.
var ErrLeadershipLost = errors.New("extender: leader election lost")

// Extender is one extender replica: the HTTP and TLS front end, shadow
// mode and leader election over a decision core (package placement),
// and the metrics of both.
type Extender struct {
	core *placement.Core
	// rt runs the core in the cluster (informers, leadership, the
	// decider Lease); nil for a core its caller runs or feeds.
	rt      *cluster.Runtime
	cfg     *configv1alpha1.ExtenderConfiguration
	opts    Options
	metrics *metrics.Metrics
	client  kubernetes.Interface
	// mirror sends filter and prioritize requests to a shadow extender
	// (--shadow-url); nil when none.
	mirror *mirror
	// shadowLog is the sampled log of differing decisions (--shadow).
	shadowLog *decisionLog

	// log is Start's (the verbs log with it).
	log klog.Logger

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
		if cfg, err = configv1alpha1.LoadExtender(o.ConfigFile); err != nil {
			return nil, err
		}
	}
	restCfg = withRateLimits(restCfg, o)
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	x, err := build(cfg, o, func(co cluster.Options) (*placement.Core, *cluster.Runtime, error) {
		rt, err := cluster.New(restCfg, cs, co)
		if err != nil {
			return nil, nil, err
		}
		return rt.Core(), rt, nil
	})
	if err != nil {
		return nil, err
	}
	x.client = cs
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

// build makes the extender over the core (and its runtime: nil for a
// core its caller feeds) that newCore builds with o's settings and the
// extender's metrics as its observer.
func build(cfg *configv1alpha1.ExtenderConfiguration, o Options, newCore func(cluster.Options) (*placement.Core, *cluster.Runtime, error)) (*Extender, error) {
	x := &Extender{cfg: cfg, opts: o, log: klog.Background().WithName("extender")}
	obs := &metrics.Pending{}
	core, rt, err := newCore(o.coreOptions(cfg, obs))
	if err != nil {
		return nil, err
	}
	x.core, x.rt = core, rt
	x.metrics = obs.Attach(core)
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

// Core is the extender's decision core.
func (x *Extender) Core() *placement.Core { return x.core }

// Metrics exposes the extender's metrics registry.
func (x *Extender) Metrics() *metrics.Metrics { return x.metrics }

// Ready reports whether this replica serves: caches synced, ledger rebuilt
// from pods and, with leader election, holding the Lease.
func (x *Extender) Ready() bool { return x.core.NotReady() == "" }

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

// Start serves until ctx ends or, with leader election, the Lease is lost
// (ErrLeadershipLost). /healthz answers at once; /readyz and the verbs only
// once the replica is Ready.
func (x *Extender) Start(ctx context.Context) error {
	log := klog.FromContext(ctx).WithName("extender")
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, log))
	defer cancel()
	x.log = log
	servers, listeners, err := x.listen()
	if err != nil {
		return err
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

	stopEvents, err := x.rt.Sync(ctx)
	defer stopEvents()
	if err != nil {
		return err
	}
	if x.mirror != nil {
		x.mirror.start(ctx)
	}
	lost := make(chan struct{})
	if x.opts.LeaderElect {
		le, err := x.elector(ctx, lost)
		if err != nil {
			return err
		}
		go le.Run(ctx)
	} else {
		// Started before the verbs serve, so that no verb starts the
		// decider first with another context.
		if err := x.rt.Lead(ctx, true); err != nil {
			return err
		}
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

// StartInProcess runs the decision core alone, without verbs or leader
// election (an observer beside a scheduler that decides: it reads the same
// cluster into its own ledger), and /metrics unless MetricsBindAddress is
// "0"; it decides nothing unless asked. It returns when ctx ends.
func (x *Extender) StartInProcess(ctx context.Context) error {
	log := klog.FromContext(ctx).WithName("extender")
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, log))
	defer cancel()
	x.log = log
	addr, err := metrics.Serve(ctx, x.opts.MetricsBindAddress, x.MetricsHandler())
	if err != nil {
		return err
	}
	x.addrMu.Lock()
	x.metricsAddr = addr
	x.addrMu.Unlock()
	return x.rt.Run(ctx, false)
}

// listen binds the verbs' and the metrics' listeners ("0" turns metrics
// off) and returns their servers.
func (x *Extender) listen() ([]*http.Server, []net.Listener, error) {
	apiLn, err := x.listenAPI()
	if err != nil {
		return nil, nil, err
	}
	servers := []*http.Server{{Handler: x.Handler(), ReadHeaderTimeout: 10 * time.Second}}
	listeners := []net.Listener{apiLn}
	x.addrMu.Lock()
	x.apiAddr = apiLn.Addr().String()
	x.addrMu.Unlock()
	if x.opts.MetricsBindAddress == "0" || x.opts.MetricsBindAddress == "" {
		return servers, listeners, nil
	}
	mln, err := net.Listen("tcp", x.opts.MetricsBindAddress)
	if err != nil {
		apiLn.Close()
		return nil, nil, fmt.Errorf("listen for metrics on %s: %w", x.opts.MetricsBindAddress, err)
	}
	x.addrMu.Lock()
	x.metricsAddr = mln.Addr().String()
	x.addrMu.Unlock()
	return append(servers, &http.Server{Handler: x.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second}), append(listeners, mln), nil
}

// elector builds the Lease-based leader election. On winning, the replica
// rebuilds its ledger and only then reports Ready; on losing, it stops
// serving at once and closes lost.
func (x *Extender) elector(ctx context.Context, lost chan struct{}) (*leaderelection.LeaderElector, error) {
	id := x.rt.Identity()
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
				if err := x.rt.Lead(ctx, true); err != nil {
					log.Error(err, "rebuild after winning leader election failed; giving up the lease")
					once.Do(func() { close(lost) })
					return
				}
				log.Info("extender ready", "identity", id)
			},
			OnStoppedLeading: func() {
				x.rt.StopLeading()
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

// NewForCore is the extender's verbs over a core the caller built and
// runs (a test that compares the front ends on one core): its metrics
// count the verbs only, since the core reports to the observer it was
// built with.
func NewForCore(core *placement.Core, o Options) *Extender {
	o.setDefaults()
	x := &Extender{core: core, cfg: core.Config(), opts: o, log: klog.Background().WithName("extender")}
	x.metrics = metrics.New(core.Report())
	return x
}
