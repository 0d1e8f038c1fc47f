package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/schedplugin"
)

// Mode is how gputopo decides under a real scheduler.
type Mode string

const (
	// ModeExtender is kube-scheduler with the chart's profile calling
	// gputopo's HTTP extender.
	ModeExtender Mode = "extender"
	// ModePlugin is gputopo-scheduler (kube-scheduler with the GPUTopology
	// plugin) with the chart's plugin profile, deciding in-process.
	ModePlugin Mode = "plugin"
)

// Modes are both modes, extender first.
var Modes = []Mode{ModeExtender, ModePlugin}

// ParseMode reads a mode flag; "" is extender mode, the chart's default.
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "":
		return ModeExtender, nil
	case ModeExtender, ModePlugin:
		return Mode(s), nil
	}
	return "", fmt.Errorf("mode %q: use %s (kube-scheduler calls the extender) or %s (gputopo-scheduler decides in-process)", s, ModeExtender, ModePlugin)
}

// Running is a component run in this process (the extender, the webhook,
// a node agent): fn in a goroutine, with a context of its own.
type Running struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Go runs fn in the background until Stop or ctx ends.
func Go(ctx context.Context, fn func(context.Context) error) *Running {
	ctx, cancel := context.WithCancel(ctx)
	r := &Running{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = fn(ctx)
	}()
	return r
}

// StopTimeout is how long Stop waits for a component to return.
const StopTimeout = 30 * time.Second

// Stop cancels the component and returns what it returned, nil for a
// clean stop (context.Canceled); an error if it did not return within
// StopTimeout. Safe to call more than once, and on nil.
func (r *Running) Stop() error {
	if r == nil {
		return nil
	}
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(StopTimeout):
		return fmt.Errorf("did not stop within %v", StopTimeout)
	}
	if errors.Is(r.err, context.Canceled) {
		return nil
	}
	return r.err
}

// Exited reports whether the component returned, on its own or stopped,
// and what it returned.
func (r *Running) Exited() (bool, error) {
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}

// Done is closed once the component returned.
func (r *Running) Done() <-chan struct{} { return r.done }

// Extender is gputopo's extender (or, from StartCore, its decision core
// alone) running in this process.
type Extender struct {
	*extender.Extender
	*Running
}

// StartExtender runs gputopo's extender with o as cfg's user: its HTTP
// verbs, probes and metrics as o says. It does not wait for Ready
// (WaitReady): a standby replica is never Ready.
func StartExtender(ctx context.Context, cfg *rest.Config, o extender.Options) (*Extender, error) {
	return startExtender(ctx, cfg, o, (*extender.Extender).Start)
}

// StartCore runs the extender's decision core alone (informers, ledger,
// no HTTP server, no leader election): what gputopo-scheduler's plugin
// runs, and what a test or tool reads holdings and reasons from beside it.
func StartCore(ctx context.Context, cfg *rest.Config, o extender.Options) (*Extender, error) {
	return startExtender(ctx, cfg, o, (*extender.Extender).StartInProcess)
}

func startExtender(ctx context.Context, cfg *rest.Config, o extender.Options, start func(*extender.Extender, context.Context) error) (*Extender, error) {
	x, err := extender.New(cfg, o)
	if err != nil {
		return nil, fmt.Errorf("extender: %w", err)
	}
	return &Extender{Extender: x, Running: Go(ctx, func(ctx context.Context) error { return start(x, ctx) })}, nil
}

// URL is the extender's HTTP address as kube-scheduler's urlPrefix host.
func (x *Extender) URL() string { return "http://" + x.APIAddr() }

// WaitReady waits up to timeout until the extender is Ready (informers
// synced, ledger rebuilt, leading when it elects), failing early if it
// stopped.
func (x *Extender) WaitReady(ctx context.Context, timeout time.Duration) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		if exited, err := x.Exited(); exited {
			return false, fmt.Errorf("extender stopped: %v", err)
		}
		return x.Ready(), nil
	})
	if err != nil {
		return fmt.Errorf("extender not ready: %w", err)
	}
	return nil
}

// DeciderOptions say how to run the scheduler that decides GPU pods.
// GenericWorkloadGates turns on Kubernetes' PodGroup scheduling: the
// gate kube-apiserver and kube-scheduler both need (with kube-apiserver's
// GenericWorkloadAPIServerArgs).
const GenericWorkloadGates = "GenericWorkload=true"

// GenericWorkloadAPIServerArgs serve scheduling.k8s.io/v1beta1 PodGroups
// (Options.APIServerArgs).
func GenericWorkloadAPIServerArgs() map[string][]string {
	return map[string][]string{
		"feature-gates":  {GenericWorkloadGates},
		"runtime-config": {"scheduling.k8s.io/v1beta1=true"},
	}
}

type DeciderOptions struct {
	Mode Mode
	// Kubeconfig is the scheduler's identity. In plugin mode it needs the
	// extender's ClusterRole (GrantExtenderRole), as the chart binds it.
	Kubeconfig string
	// Dir holds the scheduler's config files and logs.
	Dir string
	// Name names the process in logs; default kube-scheduler or
	// gputopo-scheduler.
	Name string
	// ResourceName is the GPU resource every part is configured with
	// (the chart's gpuResourceName); "" is nvidia.com/gpu.
	ResourceName string
	// ExtenderURL is the extender kube-scheduler calls (extender mode).
	ExtenderURL string
	// Ignorable sets the extender's ignorable flag (extender mode). The
	// chart's is false.
	Ignorable bool
	// PluginArgs are the GPUTopology plugin's args (plugin mode). An
	// empty MetricsBindAddress gets a free loopback port (CoreAddr); with
	// ResourceName set and no ConfigFile, a config file naming it is
	// written into Dir.
	PluginArgs schedplugin.Args
	// Configure, when set, changes the configuration before each start
	// (leader election for a failover test, say).
	Configure func(*schedconfigv1.KubeSchedulerConfiguration)
	// FeatureGates is the scheduler's --feature-gates ("" for none), e.g.
	// GenericWorkloadGates.
	FeatureGates string
	// Binary is the scheduler binary in bin/ ("" for the mode's:
	// kube-scheduler, or gputopo-scheduler in plugin mode), e.g. an
	// earlier plugin build to compare with.
	Binary string
}

// Decider is the scheduler that decides GPU pods in one of the modes:
// kube-scheduler calling the extender at DeciderOptions.ExtenderURL, or
// gputopo-scheduler with its core in-process.
type Decider struct {
	Mode Mode
	// Process is the scheduler; Restart replaces it.
	*Process
	// CoreAddr is plugin mode's core /metrics and /readyz (host:port).
	CoreAddr string
	cfg      *schedconfigv1.KubeSchedulerConfiguration
	o        DeciderOptions
}

// StartDecider starts the deciding scheduler of o.Mode with the chart's
// profile of that mode and returns once /healthz answers; in plugin mode
// WaitCore then says when its core decides.
func StartDecider(o DeciderOptions) (*Decider, error) {
	if o.Mode == "" {
		o.Mode = ModeExtender
	}
	d := &Decider{Mode: o.Mode, o: o}
	var err error
	switch o.Mode {
	case ModeExtender:
		if d.cfg, err = ChartSchedulerConfig(o.ExtenderURL); err != nil {
			return nil, err
		}
		if d.cfg.Extenders[0].Ignorable {
			return nil, errors.New("the chart's extender is ignorable: GPU pods would run on GPUs the extender did not choose while it is down")
		}
		d.cfg.Extenders[0].Ignorable = o.Ignorable
		if o.ResourceName != "" {
			d.cfg.Extenders[0].ManagedResources[0].Name = o.ResourceName
		}
		if d.o.Name == "" {
			d.o.Name = "kube-scheduler"
		}
	case ModePlugin:
		args := o.PluginArgs
		if args.MetricsBindAddress == "" {
			port, err := FreePort()
			if err != nil {
				return nil, fmt.Errorf("free port for the core's metrics: %w", err)
			}
			args.MetricsBindAddress = "127.0.0.1:" + strconv.Itoa(port)
		}
		d.CoreAddr = args.MetricsBindAddress
		if o.ResourceName != "" && args.ConfigFile == "" {
			args.ConfigFile = filepath.Join(o.Dir, "extender-config.yaml")
			doc := fmt.Sprintf("apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: %q\n", o.ResourceName)
			if err := os.WriteFile(args.ConfigFile, []byte(doc), 0o600); err != nil {
				return nil, fmt.Errorf("write the plugin's config: %w", err)
			}
		}
		if d.cfg, err = PluginSchedulerConfig(args); err != nil {
			return nil, err
		}
		if d.o.Name == "" {
			d.o.Name = "gputopo-scheduler"
		}
	default:
		_, err := ParseMode(string(o.Mode))
		return nil, err
	}
	if o.Configure != nil {
		o.Configure(d.cfg)
	}
	return d, d.start()
}

// start runs the binary of the mode with the configuration. The secure
// port is picked free and then bound by the new process; on a busy
// machine another process may take it in between, which startServing
// retries.
func (d *Decider) start() error {
	bin := "kube-scheduler"
	if d.Mode == ModePlugin {
		bin = "gputopo-scheduler"
	}
	if d.o.Binary != "" {
		bin = d.o.Binary
	}
	var extra []string
	if d.o.FeatureGates != "" {
		extra = append(extra, "--feature-gates="+d.o.FeatureGates)
	}
	p, err := StartSchedulerBinary(bin, d.cfg, d.o.Kubeconfig, d.o.Dir, extra...)
	if err != nil {
		return err
	}
	p.Name = d.o.Name
	d.Process = p
	return nil
}

// Restart stops the scheduler (SIGTERM; Kill first for a crash) and
// starts it again with the same configuration.
func (d *Decider) Restart() error {
	if d.Process != nil {
		d.Stop()
	}
	return d.start()
}

// CoreGauges are plugin mode's core ledger gauges (LedgerGPUs).
func (d *Decider) CoreGauges() (map[string]float64, error) {
	if d.Mode != ModePlugin {
		return nil, fmt.Errorf("%s mode: the extender serves the ledger's metrics, not the scheduler", d.Mode)
	}
	return LedgerGPUs("http://" + d.CoreAddr + "/metrics")
}

// WaitCore waits up to timeout, in plugin mode, until the core decides
// (/readyz: informers synced, ledger rebuilt from the pods) and holds
// cond's view of its ledger (nil: any), failing early if the scheduler
// exits. In extender mode the extender is the core; it returns at once.
func (d *Decider) WaitCore(ctx context.Context, timeout time.Duration, cond func(gauges map[string]float64) bool) error {
	if d.Mode != ModePlugin {
		return nil
	}
	var why string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		if exited, err := d.Exited(); exited {
			return false, fmt.Errorf("%s exited (%v):\n%s", d.Name, err, d.Tail(30))
		}
		ok, reason := CoreReady(d.CoreAddr)
		if !ok {
			why = "not ready: " + reason
			return false, nil
		}
		g, err := d.CoreGauges()
		if err != nil {
			why = err.Error()
			return false, nil
		}
		why = fmt.Sprint(g)
		return cond == nil || cond(g), nil
	})
	if err != nil {
		return fmt.Errorf("%s's core (last: %s): %w", d.Name, why, err)
	}
	return nil
}

// AtLeast is a WaitCore condition: the ledger has at least n GPUs.
func AtLeast(n int) func(map[string]float64) bool {
	return func(g map[string]float64) bool { return g["total"] >= float64(n) }
}

// TotalGPUs is a WaitCore condition: the ledger has exactly n GPUs.
func TotalGPUs(n int) func(map[string]float64) bool {
	return func(g map[string]float64) bool { return g["total"] == float64(n) }
}

// AllFree is a WaitCore condition: the ledger has exactly n GPUs, every
// one free.
func AllFree(n int) func(map[string]float64) bool {
	return func(g map[string]float64) bool { return g["total"] == float64(n) && g["free"] == float64(n) }
}
