package schedplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/gputopo/gputopo/placement"
	clusterrt "github.com/gputopo/gputopo/placement/cluster"
	"github.com/gputopo/gputopo/placement/metrics"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
)

// One core per process: a second profile that enables the plugin shares
// the first's ledger (two ledgers would hand out the same GPUs), and must
// have the same arguments.
var (
	sharedMu   sync.Mutex
	shared     *Plugin
	sharedArgs Args
)

// New is the plugin factory for app.WithPlugin. It builds the core and
// starts it in the background (informers, ledger rebuild, /metrics); until
// it is ready every GPU pod's cycle ends in an error that says so, and the
// pod is retried.
func New(ctx context.Context, obj runtime.Object, h fwk.Handle) (fwk.Plugin, error) {
	args, err := DecodeArgs(obj)
	if err != nil {
		return nil, err
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		if fmt.Sprint(args) != fmt.Sprint(sharedArgs) {
			return nil, fmt.Errorf("plugin %s is enabled in two profiles with different args (%+v, %+v): one process has one GPU ledger; give both the same args", Name, sharedArgs, args)
		}
		return shared, nil
	}
	// kube-scheduler's own pod and node informers feed the core's ledger:
	// no second watch of every pod and node.
	f := h.SharedInformerFactory()
	host := &clusterrt.HostInformers{Pods: f.Core().V1().Pods().Informer(), Nodes: f.Core().V1().Nodes().Informer()}
	p, err := start(ctx, h.KubeConfig(), args, host, frameworkRecorder{h.EventRecorder()})
	if err != nil {
		return nil, err
	}
	p.h = h
	p.watchUsable(ctx)
	shared, sharedArgs = p, args
	return p, nil
}

// started are the cores the plugin built in this process (one per
// profile that enables it), for AwaitShutdown.
var started struct {
	sync.Mutex
	runtimes []*clusterrt.Runtime
}

// AwaitShutdown waits, at most timeout in all, until every core the
// plugin started has released its decider Lease after the scheduler's
// context ended. kube-scheduler returns from its command as soon as its
// context ends (SIGTERM), before the plugin's goroutines finish; without
// the wait the Lease stays held until it expires, and the next
// gputopo-scheduler (a rolling update) decides no GPU pod for the Lease
// duration. gputopo-scheduler's main calls it after the command returns;
// false means some Lease may still be held.
func AwaitShutdown(timeout time.Duration) bool {
	started.Lock()
	runtimes := slices.Clone(started.runtimes)
	started.Unlock()
	deadline := time.Now().Add(timeout)
	ok := true
	for _, x := range runtimes {
		ok = x.AwaitDeciderReleased(max(time.Until(deadline), 0)) && ok
	}
	return ok
}

// start builds the core from args and runs it until ctx ends; its Events
// go to rec.
func start(ctx context.Context, cfg *rest.Config, args Args, host *clusterrt.HostInformers, rec placement.Recorder) (*Plugin, error) {
	o := clusterrt.Options{Mode: "plugin", Core: placement.Options{SchedulerNames: args.SchedulerNames, Recorder: rec}, HostInformers: host,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		DeciderLeaseNamespace: args.DeciderLeaseNamespace, DeciderLeaseName: args.DeciderLeaseName}
	if o.DeciderLeaseNamespace == "" {
		o.DeciderLeaseNamespace = clusterrt.DefaultDeciderLeaseNamespace
	}
	if msgs := validation.IsDNS1123Label(o.DeciderLeaseNamespace); len(msgs) > 0 {
		return nil, fmt.Errorf("plugin %s: deciderLeaseNamespace %q: %s", Name, o.DeciderLeaseNamespace, strings.Join(msgs, "; "))
	}
	if o.DeciderLeaseName != "" {
		if err := clusterrt.ValidDeciderLeaseName(o.DeciderLeaseName); err != nil {
			return nil, fmt.Errorf("plugin %s: %w", Name, err)
		}
	}
	var err error
	if o.Core.Config, err = configv1alpha1.LoadExtender(args.ConfigFile); err != nil {
		return nil, fmt.Errorf("plugin %s: %w", Name, err)
	}
	// kube-scheduler's clientConnection (qps, burst) rules its client.
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: kubernetes client: %w", Name, err)
	}
	obs := &metrics.Pending{}
	o.Core.Observer = obs
	rt, err := clusterrt.New(cfg, cs, o)
	if err != nil {
		return nil, fmt.Errorf("plugin %s: %w", Name, err)
	}
	x := rt.Core()
	m := obs.Attach(x)
	p := &Plugin{x: x}
	started.Lock()
	started.runtimes = append(started.runtimes, rt)
	started.Unlock()
	addr := args.MetricsBindAddress
	if addr == "" {
		addr = DefaultMetricsBindAddress
	}
	log := klog.FromContext(ctx).WithName(Name)
	log.Info("starting the GPU decision core", "gputopoVersion", Version, "config", args.ConfigFile, "metrics", addr)
	go func() {
		ctx := klog.NewContext(ctx, log)
		_, err := metrics.Serve(ctx, addr, metrics.Handler(m, x.NotReady))
		if err == nil {
			err = rt.Run(ctx, false)
		}
		if err == nil && ctx.Err() == nil {
			err = errors.New("stopped")
		}
		if err != nil {
			log.Error(err, "GPU decision core stopped; GPU pods stay Pending until the scheduler restarts")
			p.mu.Lock()
			p.stopped = err
			p.mu.Unlock()
		}
	}()
	return p, nil
}
