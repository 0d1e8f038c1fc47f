package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gputopo/gputopo/topology/machine"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
)

// Options configure the node agent: its configuration, each field bound to
// a flag by AddFlags, and what only a process or a program embedding the
// agent sets.
type Options struct {
	configv1alpha1.NodeAgentConfiguration

	// Simulate, when set, runs the agent on a simulated node built from
	// this machine, a topology fixture or a machine file instead of the
	// NVIDIA driver (--simulate).
	Simulate string
	// Ready, when set, is called once the first topology is published and
	// the device plugin is serving.
	Ready func(*Agent)
}

// AddFlags binds the options to flags, with DefaultNodeAgentConfiguration's
// defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	d := configv1alpha1.DefaultNodeAgentConfiguration()
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node (default $NODE_NAME, set from the downward API).")
	fs.StringVar(&o.Simulate, "simulate", "", "Run against a simulated GPU node built from this machine, a topology fixture (e.g. dgx-a100) or a machine file (mybox.yaml), instead of the NVIDIA driver; empty uses NVML.")
	fs.StringVar(&o.ResourceName, "resource-name", d.ResourceName, "Extended resource served by the device plugin.")
	fs.StringVar(&o.DevicePluginDir, "device-plugin-dir", d.DevicePluginDir, "kubelet's device plugin directory (holds kubelet.sock).")
	fs.StringVar(&o.PodResourcesSocket, "pod-resources-socket", d.PodResourcesSocket, "kubelet's PodResources API socket.")
	fs.DurationVar(&o.TopologyInterval.Duration, "topology-interval", d.TopologyInterval.Duration, "How often topology and health are re-read and NodeGPUTopology rewritten (also on any health change).")
	fs.DurationVar(&o.TelemetryInterval.Duration, "telemetry-interval", d.TelemetryInterval.Duration, "How often telemetry is read; it is written only when it moved beyond the thresholds.")
	fs.DurationVar(&o.ReconcileInterval.Duration, "reconcile-interval", d.ReconcileInterval.Duration, "How often kubelet's PodResources are read to record allocated GPUs (also after every Allocate).")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", d.MetricsBindAddress, "Address of the Prometheus /metrics endpoint; \"0\" turns it off.")
	fs.StringSliceVar(&o.DeviceListStrategies, "device-list-strategy", d.DeviceListStrategies,
		"How Allocate names a container's GPUs to the container runtime, repeatable or comma-separated: envvar (NVIDIA_VISIBLE_DEVICES=<UUIDs>), "+
			"volume-mounts (/dev/null mounts under "+DeviceListMountRoot+"; toolkit accept-nvidia-visible-devices-as-volume-mounts=true), "+
			"cdi-cri (CDI devices <cdi-kind>=<UUID>; CDI enabled in containerd or CRI-O). Only volume-mounts and cdi-cri, with the toolkit's "+
			"accept-nvidia-visible-devices-envvar-when-unprivileged=false, keep a pod from taking GPUs through its environment.")
	fs.StringVar(&o.CDIKind, "cdi-kind", d.CDIKind, "CDI kind (vendor/class) of the GPUs in the node's CDI spec, for --device-list-strategy=cdi-cri.")
	fs.StringVar(&o.ToolkitConfig, "toolkit-config", d.ToolkitConfig,
		"The NVIDIA container toolkit's config.toml as the agent sees it, read at start: with "+ToolkitKeyEnvvarWhenUnprivileged+
			" not false the agent warns that a container's environment can select GPUs (gputopo_nodeagent_env_isolation). A missing file reports unknown; empty skips the check.")
}

// flagNames are the flags (AddFlags) of the configuration's fields, by
// JSON name, so that Validate names what the user typed.
var flagNames = map[string]string{
	"nodeName": "node-name", "resourceName": "resource-name", "devicePluginDir": "device-plugin-dir",
	"podResourcesSocket": "pod-resources-socket", "topologyInterval": "topology-interval",
	"telemetryInterval": "telemetry-interval", "reconcileInterval": "reconcile-interval",
	"metricsBindAddress": "metrics-bind-address", "deviceListStrategies": "device-list-strategy",
	"cdiKind": "cdi-kind", "toolkitConfig": "toolkit-config",
}

// Validate reports every bad option at once, each by its flag.
func (o *Options) Validate() error {
	errs := o.NodeAgentConfiguration.Validate()
	for _, e := range errs {
		name, rest := e.Field, ""
		if i := strings.IndexAny(name, ".["); i >= 0 {
			name, rest = name[:i], name[i:]
		}
		if f, ok := flagNames[name]; ok {
			e.Field = f + rest
		}
	}
	if o.Simulate != "" {
		if _, err := machine.Load(o.Simulate); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("simulate"), o.Simulate, err.Error()))
		}
	}
	return errs.ToAggregate()
}

// Agent is a running node agent's parts, handed to Options.Ready.
type Agent struct {
	Source     Source
	Publisher  *Publisher
	Plugin     *DevicePlugin
	Reconciler *Reconciler
	Pods       *PodCache
	Metrics    *Metrics
	Registry   *prometheus.Registry
}

// Run runs the node agent until ctx ends, on the NVIDIA driver or on the
// simulated node o.Simulate names: discovery and publishing, the device
// plugin, the reconciler, the health watcher and /metrics.
func Run(ctx context.Context, restCfg *rest.Config, o Options) error {
	return RunWithNVML(ctx, restCfg, o, nil)
}

// RunWithNVML is Run on lib, an NVML implementation such as a simulated
// node's (nvmlsim.Simulator.NVML(): tests keep a handle on the simulator to
// script telemetry and inject faults). lib overrides o.Simulate, and the
// GPUs' NUMA nodes are its answers alone (sysfs is read only for the
// driver). A nil lib is Run.
func RunWithNVML(ctx context.Context, restCfg *rest.Config, o Options, lib nvml.Interface) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("node agent options: %w", err)
	}
	logger := klog.FromContext(ctx).WithValues("node", o.NodeName)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := NewMetrics(reg, o.NodeName)
	src := o.source(lib, logger, metrics)
	defer src.Close()

	scheme, c, cs, err := apiClients(restCfg)
	if err != nil {
		return err
	}
	pr, err := DialPodResources(o.PodResourcesSocket)
	if err != nil {
		return err
	}
	defer pr.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pods := NewPodCache(cs, o.NodeName)
	if err := pods.Start(ctx); err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "gputopo-nodeagent", Host: o.NodeName})

	pub := NewPublisher(c, src, PublisherOptions{NodeName: o.NodeName, TopologyInterval: o.TopologyInterval.Duration, TelemetryInterval: o.TelemetryInterval.Duration}, metrics, logger.WithName("publisher"))
	strategies := make([]configv1alpha1.DeviceListStrategy, len(o.DeviceListStrategies))
	for i, s := range o.DeviceListStrategies {
		strategies[i] = configv1alpha1.DeviceListStrategy(s)
	}
	plugin := NewDevicePlugin(DevicePluginOptions{ResourceName: o.ResourceName, PluginDir: o.DevicePluginDir,
		DeviceListStrategies: strategies, CDIKind: o.CDIKind}, pods, metrics, logger.WithName("deviceplugin"))
	logger.Info("Device list", "strategies", plugin.opts.DeviceListStrategies, "cdiKind", plugin.opts.CDIKind)
	// Whether a container's env can select GPUs here: logged and exported,
	// never fatal (a malformed file is reported and the agent runs on).
	isolation := CheckEnvIsolation(o.ToolkitConfig, plugin.opts.DeviceListStrategies)
	isolation.log(logger.WithName("toolkit"), plugin.opts.DeviceListStrategies)
	metrics.setEnvIsolation(isolation)
	pub.OnTopology(plugin.SetTopology)
	rec := NewReconciler(cs, pods, pr, o.ResourceName, recorder, metrics, logger.WithName("reconciler"), o.ReconcileInterval.Duration)
	plugin.OnAllocate(rec.Poke)
	rec.UseAllocations(plugin.Allocations())

	// The first topology before the plugin registers, so that kubelet's
	// first device list is the real one.
	if err := pub.Sync(ctx, time.Now(), true); err != nil {
		logger.Error(err, "First NodeGPUTopology publish failed; retrying")
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return pub.Run(ctx) })
	g.Go(func() error { return plugin.Run(ctx) })
	g.Go(func() error { return rec.Run(ctx) })
	g.Go(func() error { watchHealth(ctx, src, logger); return nil })
	if err := serveMetrics(ctx, g, o.MetricsBindAddress, reg); err != nil {
		cancel()
		_ = g.Wait()
		return err
	}
	if o.Ready != nil {
		o.Ready(&Agent{Source: src, Publisher: pub, Plugin: plugin, Reconciler: rec, Pods: pods, Metrics: metrics, Registry: reg})
	}
	return g.Wait()
}

// source is the GPUs the agent reads: lib when set, else the simulated node
// o.Simulate names, else the NVIDIA driver, with NUMA nodes from sysfs.
func (o *Options) source(lib nvml.Interface, logger klog.Logger, metrics *Metrics) *NVMLSource {
	sysfs := false
	switch {
	case lib != nil:
	case o.Simulate != "":
		f, _ := machine.Load(o.Simulate) // checked by Validate
		lib = nvmlsim.New(f, o.NodeName).NVML()
	default:
		lib, sysfs = nvml.New(), true
	}
	src := NewNVMLSource(lib, logger.WithName("nvml"), metrics)
	if sysfs {
		src.WithSysfsNUMA()
	}
	return src
}

// apiClients are the agent's API clients, over a scheme of the core and
// gputopo types.
func apiClients(restCfg *rest.Config) (*runtime.Scheme, client.Client, kubernetes.Interface, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, nil, nil, fmt.Errorf("scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, nil, nil, fmt.Errorf("scheme: %w", err)
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("api client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("api clientset: %w", err)
	}
	return scheme, c, cs, nil
}

// serveMetrics serves reg's /metrics on addr in g until ctx ends; "0" or
// an empty addr serves nothing.
func serveMetrics(ctx context.Context, g *errgroup.Group, addr string, reg *prometheus.Registry) error {
	if addr == "0" || addr == "" {
		return nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listener on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
	g.Go(func() error {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics server: %w", err)
		}
		return nil
	})
	g.Go(func() error { <-ctx.Done(); return srv.Close() })
	return nil
}

// watchHealth waits for driver health events; the source updates health
// and signals the publisher, this loop only logs and backs off on errors.
func watchHealth(ctx context.Context, src Source, logger klog.Logger) {
	for ctx.Err() == nil {
		evs, err := src.WaitHealth(5 * time.Second)
		if err != nil {
			logger.V(2).Info("Waiting for GPU health events failed", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(30 * time.Second):
			}
			continue
		}
		for _, ev := range evs {
			logger.Info("GPU health event", "gpu", ev.Index, "uuid", ev.UUID, "xid", ev.XID, "class", ev.Class, "reason", ev.Reason)
		}
	}
}
