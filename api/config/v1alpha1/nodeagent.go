package v1alpha1

import (
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// NodeAgentAPIVersion and NodeAgentKind identify a node agent
// configuration. Both may be omitted; when present they must match.
const (
	NodeAgentAPIVersion = "config.gputopo.io/v1alpha1"
	NodeAgentKind       = "NodeAgentConfiguration"
)

// NodeAgentConfiguration is the node agent's settings. `gputopo nodeagent`
// takes each as the flag its comment names (nodeagent.Options.AddFlags,
// whose defaults are DefaultNodeAgentConfiguration's); ParseNodeAgent
// reads them from a file, over the defaults.
type NodeAgentConfiguration struct {
	// TypeMeta: apiVersion is NodeAgentAPIVersion and kind NodeAgentKind,
	// or empty.
	metav1.TypeMeta `json:",inline"`

	// NodeName is the name of this node (--node-name, whose default is
	// $NODE_NAME, set from the downward API). Required.
	NodeName string `json:"nodeName"`
	// ResourceName is the extended resource served by the device plugin
	// (--resource-name). Default nvidia.com/gpu.
	ResourceName string `json:"resourceName"`
	// DevicePluginDir is kubelet's device plugin directory, holding
	// kubelet.sock (--device-plugin-dir). Default
	// /var/lib/kubelet/device-plugins.
	DevicePluginDir string `json:"devicePluginDir"`
	// PodResourcesSocket is kubelet's PodResources API socket
	// (--pod-resources-socket). Default
	// /var/lib/kubelet/pod-resources/kubelet.sock.
	PodResourcesSocket string `json:"podResourcesSocket"`
	// TopologyInterval is how often topology and health are re-read and
	// NodeGPUTopology rewritten, also on any health change
	// (--topology-interval). Default 5m.
	TopologyInterval metav1.Duration `json:"topologyInterval"`
	// TelemetryInterval is how often telemetry is read; it is written only
	// when it moved beyond the thresholds (--telemetry-interval). Default
	// 30s.
	TelemetryInterval metav1.Duration `json:"telemetryInterval"`
	// ReconcileInterval is how often kubelet's PodResources are read to
	// record allocated GPUs, also after every Allocate
	// (--reconcile-interval). Default 10s.
	ReconcileInterval metav1.Duration `json:"reconcileInterval"`
	// MetricsBindAddress is the address of the Prometheus /metrics
	// endpoint; "0" or empty turns it off (--metrics-bind-address).
	// Default ":9400".
	MetricsBindAddress string `json:"metricsBindAddress"`
	// DeviceListStrategies are the device plugin's device list strategy
	// names (DeviceListStrategy; --device-list-strategy); empty means
	// envvar. Default [envvar].
	DeviceListStrategies []string `json:"deviceListStrategies"`
	// CDIKind is the CDI kind of the GPUs for cdi-cri (--cdi-kind); empty
	// means DefaultCDIKind. Default DefaultCDIKind.
	CDIKind string `json:"cdiKind"`
	// ToolkitConfig is the NVIDIA container toolkit's config.toml, read
	// once at start to tell whether a container's environment can select
	// GPUs (--toolkit-config); empty skips the check. Default
	// DefaultToolkitConfig.
	ToolkitConfig string `json:"toolkitConfig"`
}

// DefaultToolkitConfig is where the NVIDIA container toolkit (the
// nvidia-container-runtime and its hook) reads its configuration on a
// node installed from NVIDIA's packages. The GPU operator's toolkit
// container writes its own copy elsewhere (see docs/install.md).
const DefaultToolkitConfig = "/etc/nvidia-container-runtime/config.toml"

// DefaultNodeAgentConfiguration returns the flags' defaults, NodeName (the
// flag's $NODE_NAME) aside.
func DefaultNodeAgentConfiguration() NodeAgentConfiguration {
	return NodeAgentConfiguration{
		ResourceName:         v1alpha1.ResourceGPU,
		DevicePluginDir:      "/var/lib/kubelet/device-plugins",
		PodResourcesSocket:   "/var/lib/kubelet/pod-resources/kubelet.sock",
		TopologyInterval:     metav1.Duration{Duration: 5 * time.Minute},
		TelemetryInterval:    metav1.Duration{Duration: 30 * time.Second},
		ReconcileInterval:    metav1.Duration{Duration: 10 * time.Second},
		MetricsBindAddress:   ":9400",
		DeviceListStrategies: []string{string(DeviceListEnvvar)},
		CDIKind:              DefaultCDIKind,
		ToolkitConfig:        DefaultToolkitConfig,
	}
}

// ParseNodeAgent strictly decodes data, a YAML or JSON
// NodeAgentConfiguration (Decode), over DefaultNodeAgentConfiguration and
// validates the result, reporting every problem at once.
func ParseNodeAgent(data []byte) (NodeAgentConfiguration, error) {
	c := DefaultNodeAgentConfiguration()
	if err := parse(data, &c, nil); err != nil {
		return NodeAgentConfiguration{}, err
	}
	return c, nil
}

// Validate reports every invalid field at once, by its JSON path.
func (c NodeAgentConfiguration) Validate() field.ErrorList {
	errs := validateTypeMeta(c.TypeMeta, NodeAgentAPIVersion, NodeAgentKind)
	if c.NodeName == "" {
		errs = append(errs, field.Required(field.NewPath("nodeName"), "set --node-name or $NODE_NAME (downward API spec.nodeName)"))
	}
	if c.ResourceName == "" {
		errs = append(errs, field.Required(field.NewPath("resourceName"), "e.g. nvidia.com/gpu"))
	}
	for _, d := range []struct {
		name string
		d    time.Duration
	}{{"topologyInterval", c.TopologyInterval.Duration}, {"telemetryInterval", c.TelemetryInterval.Duration}, {"reconcileInterval", c.ReconcileInterval.Duration}} {
		if d.d <= 0 {
			errs = append(errs, field.Invalid(field.NewPath(d.name), d.d.String(), "must be a positive duration, e.g. 30s"))
		}
	}
	if c.DevicePluginDir == "" {
		errs = append(errs, field.Required(field.NewPath("devicePluginDir"), "kubelet's device plugin directory"))
	}
	if c.PodResourcesSocket == "" {
		errs = append(errs, field.Required(field.NewPath("podResourcesSocket"), "kubelet's PodResources socket"))
	}
	kind := c.CDIKind
	if kind == "" {
		kind = DefaultCDIKind
	}
	return append(errs, ValidateDeviceList(c.DeviceListStrategies, kind, field.NewPath("deviceListStrategies"), field.NewPath("cdiKind"))...)
}

// DeviceListStrategy is how an Allocate answer tells the container runtime
// (the NVIDIA container toolkit, or the runtime's own CDI support) which
// GPUs a container gets. The names are those of NVIDIA's k8s-device-plugin,
// so a cluster's toolkit configuration carries over.
type DeviceListStrategy string

const (
	// DeviceListEnvvar sets NVIDIA_VISIBLE_DEVICES=<UUIDs>. It is the
	// default, and the weakest: the toolkit reads the container's final
	// environment, where a value the pod sets through env or envFrom comes
	// after the device plugin's and wins.
	DeviceListEnvvar DeviceListStrategy = "envvar"
	// DeviceListVolumeMounts mounts /dev/null at
	// /var/run/nvidia-container-devices/<UUID> for each GPU and sets
	// NVIDIA_VISIBLE_DEVICES to that directory. The toolkit reads the
	// mounts with accept-nvidia-visible-devices-as-volume-mounts=true, and
	// they win over the environment.
	DeviceListVolumeMounts DeviceListStrategy = "volume-mounts"
	// DeviceListCDICRI names each GPU as a CDI device (<cdi-kind>=<UUID>) in
	// the answer's CDIDevices, which kubelet passes in the CRI
	// ContainerConfig; the runtime (containerd, CRI-O) injects them from the
	// node's CDI spec. No environment variable is set.
	DeviceListCDICRI DeviceListStrategy = "cdi-cri"
)

// DeviceListStrategies are the valid strategies, the default first.
var DeviceListStrategies = []DeviceListStrategy{DeviceListEnvvar, DeviceListVolumeMounts, DeviceListCDICRI}

// DefaultCDIKind is the CDI kind (vendor/class) of the GPUs in the spec
// that NVIDIA's tooling (nvidia-ctk cdi generate, the GPU operator)
// writes; its device names include the GPU UUIDs.
const DefaultCDIKind = "nvidia.com/gpu"

// The CDI naming rules (tags.cncf.io/container-device-interface parser):
// vendor a domain-like name, class and device plain names.
var (
	cdiVendorRE = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$`)
	cdiClassRE  = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?$`)
)

// ValidateDeviceList checks strategy names and the CDI kind, reporting
// every problem at once under the given paths.
func ValidateDeviceList(strategies []string, cdiKind string, strategyPath, kindPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	valid := make([]string, len(DeviceListStrategies))
	for i, s := range DeviceListStrategies {
		valid[i] = string(s)
	}
	for i, s := range strategies {
		if !slices.Contains(valid, s) {
			errs = append(errs, field.NotSupported(strategyPath.Index(i), s, valid))
		}
	}
	if vendor, class, ok := strings.Cut(cdiKind, "/"); !ok || !cdiVendorRE.MatchString(vendor) || !cdiClassRE.MatchString(class) {
		errs = append(errs, field.Invalid(kindPath, cdiKind,
			"must be a CDI kind <vendor>/<class> (letters, digits, '-', '_', and '.' in the vendor), e.g. "+DefaultCDIKind))
	}
	return errs
}
