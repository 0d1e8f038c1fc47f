package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

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

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/topology/machine"
)

// Options configure the node agent; each field's flag and default is in
// AddFlags.
type Options struct {
	NodeName           string
	Simulate           string
	ResourceName       string
	DevicePluginDir    string
	PodResourcesSocket string
	TopologyInterval   time.Duration
	TelemetryInterval  time.Duration
	ReconcileInterval  time.Duration
	MetricsBindAddress string
	// DeviceListStrategies are the device plugin's device list strategy
	// names (see DeviceListStrategy); empty means envvar.
	DeviceListStrategies []string
	// CDIKind is the CDI kind of the GPUs for cdi-cri; empty means
	// nvidia.com/gpu.
	CDIKind string
	// ToolkitConfig is the NVIDIA container toolkit's config.toml, read
	// once at start to tell whether a container's environment can select
	// GPUs (CheckEnvIsolation); empty skips the check. The flag defaults
	// to DefaultToolkitConfig, the zero value of the field to no check.
	ToolkitConfig string

	// Simulator, when set, is the simulated node to run (tests and the demo
	// keep a handle on it to script telemetry and inject faults); it
	// overrides Simulate.
	Simulator *nvmlsim.Simulator
	// Ready, when set, is called once the first topology is published and
	// the device plugin is serving.
	Ready func(*Agent)
}

// AddFlags binds the options to flags with their defaults.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "Name of this node (default $NODE_NAME, set from the downward API).")
	fs.StringVar(&o.Simulate, "simulate", "", "Run against a simulated GPU node built from this machine, a topology fixture (e.g. dgx-a100) or a machine file (mybox.yaml), instead of the NVIDIA driver; empty uses NVML.")
	fs.StringVar(&o.ResourceName, "resource-name", v1alpha1.ResourceGPU, "Extended resource served by the device plugin.")
	fs.StringVar(&o.DevicePluginDir, "device-plugin-dir", "/var/lib/kubelet/device-plugins", "kubelet's device plugin directory (holds kubelet.sock).")
	fs.StringVar(&o.PodResourcesSocket, "pod-resources-socket", "/var/lib/kubelet/pod-resources/kubelet.sock", "kubelet's PodResources API socket.")
	fs.DurationVar(&o.TopologyInterval, "topology-interval", 5*time.Minute, "How often topology and health are re-read and NodeGPUTopology rewritten (also on any health change).")
	fs.DurationVar(&o.TelemetryInterval, "telemetry-interval", 30*time.Second, "How often telemetry is read; it is written only when it moved beyond the thresholds.")
	fs.DurationVar(&o.ReconcileInterval, "reconcile-interval", 10*time.Second, "How often kubelet's PodResources are read to record allocated GPUs (also after every Allocate).")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", ":9400", "Address of the Prometheus /metrics endpoint; \"0\" turns it off.")
	fs.StringSliceVar(&o.DeviceListStrategies, "device-list-strategy", []string{string(DeviceListEnvvar)},
		"How Allocate names a container's GPUs to the container runtime, repeatable or comma-separated: envvar (NVIDIA_VISIBLE_DEVICES=<UUIDs>), "+
			"volume-mounts (/dev/null mounts under "+DeviceListMountRoot+"; toolkit accept-nvidia-visible-devices-as-volume-mounts=true), "+
			"cdi-cri (CDI devices <cdi-kind>=<UUID>; CDI enabled in containerd or CRI-O). Only volume-mounts and cdi-cri, with the toolkit's "+
			"accept-nvidia-visible-devices-envvar-when-unprivileged=false, keep a pod from taking GPUs through its environment.")
	fs.StringVar(&o.CDIKind, "cdi-kind", DefaultCDIKind, "CDI kind (vendor/class) of the GPUs in the node's CDI spec, for --device-list-strategy=cdi-cri.")
	fs.StringVar(&o.ToolkitConfig, "toolkit-config", DefaultToolkitConfig,
		"The NVIDIA container toolkit's config.toml as the agent sees it, read at start: with "+ToolkitKeyEnvvarWhenUnprivileged+
			" not false the agent warns that a container's environment can select GPUs (gputopo_nodeagent_env_isolation). A missing file reports unknown; empty skips the check.")
}

// Validate reports every bad option at once.
func (o *Options) Validate() error {
	var errs field.ErrorList
	if o.NodeName == "" {
		errs = append(errs, field.Required(field.NewPath("node-name"), "set --node-name or $NODE_NAME (downward API spec.nodeName)"))
	}
	if o.Simulate != "" && o.Simulator == nil {
		if _, err := machine.Load(o.Simulate); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("simulate"), o.Simulate, err.Error()))
		}
	}
	if o.ResourceName == "" {
		errs = append(errs, field.Required(field.NewPath("resource-name"), "e.g. nvidia.com/gpu"))
	}
	for name, d := range map[string]time.Duration{"topology-interval": o.TopologyInterval, "telemetry-interval": o.TelemetryInterval, "reconcile-interval": o.ReconcileInterval} {
		if d <= 0 {
			errs = append(errs, field.Invalid(field.NewPath(name), d.String(), "must be a positive duration, e.g. 30s"))
		}
	}
	if o.DevicePluginDir == "" {
		errs = append(errs, field.Required(field.NewPath("device-plugin-dir"), "kubelet's device plugin directory"))
	}
	if o.PodResourcesSocket == "" {
		errs = append(errs, field.Required(field.NewPath("pod-resources-socket"), "kubelet's PodResources socket"))
	}
	kind := o.CDIKind
	if kind == "" {
		kind = DefaultCDIKind
	}
	errs = append(errs, ValidateDeviceList(o.DeviceListStrategies, kind, field.NewPath("device-list-strategy"), field.NewPath("cdi-kind"))...)
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

// Run runs the node agent until ctx ends: discovery and publishing, the
// device plugin, the reconciler, the health watcher and /metrics.
func Run(ctx context.Context, restCfg *rest.Config, o Options) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("node agent options: %w", err)
	}
	logger := klog.FromContext(ctx).WithValues("node", o.NodeName)

	var lib nvml.Interface
	switch {
	case o.Simulator != nil:
		lib = o.Simulator.NVML()
	case o.Simulate != "":
		f, _ := machine.Load(o.Simulate)
		lib = nvmlsim.New(f, o.NodeName).NVML()
	default:
		lib = nvml.New()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := NewMetrics(reg, o.NodeName)
	src := NewNVMLSource(lib, logger.WithName("nvml"), metrics)
	if o.Simulate == "" && o.Simulator == nil {
		src.WithSysfsNUMA()
	}
	defer src.Close()

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return fmt.Errorf("scheme: %w", err)
	}
	c, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("api client: %w", err)
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("api clientset: %w", err)
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

	pub := NewPublisher(c, src, PublisherOptions{NodeName: o.NodeName, TopologyInterval: o.TopologyInterval, TelemetryInterval: o.TelemetryInterval}, metrics, logger.WithName("publisher"))
	strategies := make([]DeviceListStrategy, len(o.DeviceListStrategies))
	for i, s := range o.DeviceListStrategies {
		strategies[i] = DeviceListStrategy(s)
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
	rec := NewReconciler(cs, pods, pr, o.ResourceName, recorder, metrics, logger.WithName("reconciler"), o.ReconcileInterval)
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
	if o.MetricsBindAddress != "0" && o.MetricsBindAddress != "" {
		lis, err := net.Listen("tcp", o.MetricsBindAddress)
		if err != nil {
			cancel()
			_ = g.Wait()
			return fmt.Errorf("metrics listener on %s: %w", o.MetricsBindAddress, err)
		}
		srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics server: %w", err)
			}
			return nil
		})
		g.Go(func() error { <-ctx.Done(); return srv.Close() })
	}
	if o.Ready != nil {
		o.Ready(&Agent{Source: src, Publisher: pub, Plugin: plugin, Reconciler: rec, Pods: pods, Metrics: metrics, Registry: reg})
	}
	return g.Wait()
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
