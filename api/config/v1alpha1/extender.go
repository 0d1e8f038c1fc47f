package v1alpha1

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// ExtenderAPIVersion and ExtenderKind identify the extender's configuration
// file. Both are optional in the file; when written they must be these (or,
// for the apiVersion, ExtenderLegacyAPIVersion). The version moves when a
// field changes meaning, so a file written for one release is never
// silently read with another's semantics.
//
// ExtenderAPIVersion is in the configuration group, config.gputopo.io, like
// the webhook's and the node agent's files; ExtenderLegacyAPIVersion is
// what extender files were written with before, the CRDs' group. The two
// name the same schema: a file with the legacy apiVersion is still accepted,
// and defaulting (so ParseExtender and LoadExtender) rewrites it to
// ExtenderAPIVersion, silently: this package logs nothing and its parse
// functions return no warnings.
const (
	ExtenderAPIVersion       = "config.gputopo.io/v1alpha1"
	ExtenderLegacyAPIVersion = "gputopo.io/v1alpha1"
	ExtenderKind             = "ExtenderConfiguration"
)

// ExtenderConfiguration is the extender's versioned configuration file.
// Every field is optional; the comment of each says its default. Flags
// cover what differs per deployment (ports, TLS, leader election); this
// file covers what shapes decisions.
type ExtenderConfiguration struct {
	metav1.TypeMeta `json:",inline"`

	// Weights of the prioritize components. Defaults: the placement
	// profile (docs/extender.md); profile: design restores the design's
	// 40/30/20/10. Only their ratios matter.
	Weights Weights `json:"weights"`

	// TopologyMaxAge is how old a NodeGPUTopology's observedTime may be
	// before filter treats the node as stale. The node agent refreshes
	// every 5 minutes, so the default 15m tolerates two missed refreshes.
	// 0 (or a negative age) turns the age check off (status.stale is
	// still honoured). A pointer, so that an explicit 0 differs from "not
	// set".
	TopologyMaxAge *metav1.Duration `json:"topologyMaxAge"`

	// TelemetryMaxAge is how old telemetry may be and still count in
	// prioritize. Older telemetry scores neutrally instead of steering
	// pods on numbers that no longer hold. Default 2m (four 30 s rounds).
	TelemetryMaxAge metav1.Duration `json:"telemetryMaxAge"`

	// Thermal shapes the thermal headroom component.
	Thermal Thermal `json:"thermal"`

	// BindTimeout bounds the Binding call. Keep it below the scheduler's
	// extender httpTimeout (5s in the shipped scheduler config) so that a
	// slow API server is settled here, by reading the pod, rather than
	// abandoned by kube-scheduler. Default 4s.
	BindTimeout metav1.Duration `json:"bindTimeout"`

	// ReservationTTL is how long GPUs reserved by a bind whose outcome is
	// unknown stay reserved without the pod showing up bound. The retry
	// kube-scheduler makes for the same pod reuses them; after the TTL
	// they return to the pool. Default 2m.
	ReservationTTL metav1.Duration `json:"reservationTTL"`

	// MaxRequestBytes caps a request body. 10,000 node names are about
	// 400 KB; full Node lists (nodeCacheCapable false) run to several KB
	// per node. Larger bodies get 413. Default 33554432 (32 MiB).
	MaxRequestBytes int64 `json:"maxRequestBytes"`

	// AllocatorMemoSize is how many allocation answers are remembered per
	// (topology, free GPUs, request): identical nodes share them. Default
	// 16384.
	AllocatorMemoSize int `json:"allocatorMemoSize"`

	// Telemetry chooses where prioritize reads GPU utilization,
	// temperature and power.
	Telemetry Telemetry `json:"telemetry"`

	// ResourceName is the extended resource whose devices the extender
	// counts and places: pods' demand (v1alpha1.PodGPUDemand), Nodes'
	// allocatable, the containers the pod cache keeps. It must be the name
	// the node agent serves (--resource-name) and the one the scheduler's
	// extender config lists in managedResources. Default nvidia.com/gpu.
	ResourceName string `json:"resourceName"`

	// Fabric names the cluster's network levels, which groups of pods
	// are placed inside (docs/groups.md).
	Fabric Fabric `json:"fabric"`

	// Events chooses the Events gputopo records on pods.
	Events Events `json:"events"`

	// Patience bounds how long a pod waits for a faster GPU set than the
	// free ones (docs/extender.md, "Waiting for a faster set").
	Patience Patience `json:"patience"`

	// DRA names the DRA driver whose devices are GPUs gputopo places, for
	// pods that ask for GPUs through ResourceClaims (docs/dra.md).
	DRA DRA `json:"dra"`
}

// DefaultDRADriver is NVIDIA's DRA driver for GPUs, and the name of the
// DeviceClass it installs.
const DefaultDRADriver = "gpu.nvidia.com"

// DRA is the DRA driver whose ResourceSlices publish GPUs: a pod's
// ResourceClaim request of one of DeviceClasses, for an exact count, is
// that many GPUs gputopo chooses (plugin mode), and each device is one
// GPU of the node's NodeGPUTopology, matched by the UUID in its
// UUIDAttribute.
type DRA struct {
	// Driver is the driver's name. Default gpu.nvidia.com (NVIDIA's DRA
	// driver for GPUs).
	Driver string `json:"driver"`
	// UUIDAttribute is the device attribute that carries the GPU's UUID.
	// Default uuid.
	UUIDAttribute string `json:"uuidAttribute"`
	// DeviceClasses are the DeviceClasses whose requests ask for the
	// driver's GPUs. Default [gpu.nvidia.com].
	DeviceClasses []string `json:"deviceClasses"`
}

// Patience is how long a pod that asks for bandwidth waits for a faster
// set. Such a pod (the model-parallel intent, NVLink required or a
// minimum pair bandwidth, more than one GPU) that is not in a group may
// be refused, from its creation until BandwidthWait later, every set whose
// ring bandwidth is below BandwidthPercent of the best ring it could get
// soon: only while GPUs expected to free in time on faster machines (pods
// there that ran to their end lately, or whose activeDeadlineSeconds ends
// them) cover it and the pods waiting ahead of it. After that it takes
// the best set free, as it does without patience.
type Patience struct {
	// BandwidthWait is how long the pod waits, counted from its creation.
	// Default 10m; 0 turns patience off.
	BandwidthWait *metav1.Duration `json:"bandwidthWait"`
	// BandwidthPercent is the share of the best ring expected to free
	// below which a set is refused while the pod waits, 1 to 100.
	// Default 50.
	BandwidthPercent *int32 `json:"bandwidthPercent"`
}

// BandwidthPatience is how long a pod that asks for bandwidth may wait for
// a faster set (0: it does not) and the share, 0..1, of the best ring
// expected to free that it waits for.
func (c *ExtenderConfiguration) BandwidthPatience() (time.Duration, float64) {
	p := c.Patience
	if p.BandwidthWait == nil || p.BandwidthWait.Duration <= 0 || p.BandwidthPercent == nil {
		return 0, 0
	}
	return p.BandwidthWait.Duration, float64(*p.BandwidthPercent) / 100
}

// Events chooses the Events gputopo records on pods. A degraded placement
// (PlacementFellBack) and GPUs held twice (GPUDoubleHeld) are always
// recorded.
type Events struct {
	// GPUsBound records a Normal Event on every GPU pod bound, naming its
	// node, GPUs, tier and ring bandwidth. It is one more write through
	// kube-apiserver and etcd per pod (docs/benchmarks.md measures it);
	// the pod's gputopo.io/assigned-gpus and gputopo.io/placement
	// annotations say the same and `kubectl describe pod` shows them.
	// Default false.
	GPUsBound *bool `json:"gpusBound"`
}

// GPUsBoundEvent says whether bind records the GPUsBound Event.
func (c *ExtenderConfiguration) GPUsBoundEvent() bool {
	return c.Events.GPUsBound != nil && *c.Events.GPUsBound
}

// Fabric is the cluster's network as node labels describe it, for groups.
type Fabric struct {
	// Levels are the fabric's levels, tightest first. A node's domain at a
	// level is the value of the first of the level's labels it carries;
	// a node with none of them is alone at that level. Default: nvlink,
	// leaf, spine, block, zone with the labels GPU Feature Discovery,
	// NVIDIA topograph, GKE, EKS and Kubernetes write (docs/groups.md).
	Levels []FabricLevel `json:"levels"`
	// GroupReservationTTL is how long the GPUs planned for a group stay
	// held for its pods that are not bound yet. A group is planned only
	// when all of its pods fit; pods that do not come within the TTL give
	// their GPUs back and the group is planned again. Default 2m.
	GroupReservationTTL metav1.Duration `json:"groupReservationTTL"`
	// ReserveAfter turns on reservations for waiting groups: once a group
	// has waited this long for room, the GPUs of the place where it would
	// fit soonest are refused to pods of the same or lower priority that
	// come after it, until it fits there (docs/groups.md, "A group that
	// waits"). Nothing is held for the group itself. 0 (the default): off;
	// docs/benchmarks.md has what it costs the other pods.
	ReserveAfter metav1.Duration `json:"reserveAfter"`
	// ReserveMaxPercent is the most of the cluster's GPUs kept for waiting
	// groups at once, 1 to 100. Default 25.
	ReserveMaxPercent *int32 `json:"reserveMaxPercent,omitempty"`
	// ReserveMaxDuration is how long, from reserveAfter on, GPUs are kept
	// for a waiting group; it then waits without them. Default 30m.
	ReserveMaxDuration metav1.Duration `json:"reserveMaxDuration"`
}

// FabricLevel is one level of the fabric.
type FabricLevel struct {
	// Name is what group annotations and messages call the level.
	Name string `json:"name"`
	// Labels are the node label keys that name a node's domain at this
	// level, in order of precedence.
	Labels []string `json:"labels"`
	// BandwidthGBps is the bandwidth per GPU, GB/s bidirectional, between
	// two pods whose tightest shared domain is at this level; 0 at the
	// NVLink level: pods there talk at their GPUs' own NVLink ring.
	BandwidthGBps int `json:"bandwidthGBps"`
}

// FabricNVLink is the name of the default multi-node NVLink level.
const FabricNVLink = "nvlink"

// DefaultFabricLevels are the fabric levels by default, tightest first.
func DefaultFabricLevels() []FabricLevel {
	return []FabricLevel{
		{Name: FabricNVLink, Labels: []string{"nvidia.com/gpu.clique", "network.topology.nvidia.com/accelerator", "accelerator.topograph.run/domain"}},
		{Name: "leaf", BandwidthGBps: 100, Labels: []string{"network.topology.nvidia.com/leaf", "fabric.topograph.run/tier-0", "cloud.google.com/gce-topology-subblock", "topology.k8s.aws/network-node-layer-3"}},
		{Name: "spine", BandwidthGBps: 50, Labels: []string{"network.topology.nvidia.com/spine", "fabric.topograph.run/tier-1", "cloud.google.com/gce-topology-block", "topology.k8s.aws/network-node-layer-2"}},
		{Name: "block", BandwidthGBps: 25, Labels: []string{"network.topology.nvidia.com/core", "network.topology.nvidia.com/block", "fabric.topograph.run/tier-2", "topology.k8s.aws/network-node-layer-1"}},
		{Name: "zone", BandwidthGBps: 12, Labels: []string{"topology.kubernetes.io/zone"}},
	}
}

// CrossZoneBandwidthGBps is the bandwidth per GPU between two pods that
// share no domain of any level.
const CrossZoneBandwidthGBps = 6

// FabricLevelIndex resolves a group annotation's level (a level name or
// one of a level's label keys) to its index in levels; ok is false when
// it names none.
func FabricLevelIndex(levels []FabricLevel, name string) (int, bool) {
	for i, l := range levels {
		if l.Name == name {
			return i, true
		}
	}
	for i, l := range levels {
		for _, k := range l.Labels {
			if k == name {
				return i, true
			}
		}
	}
	return 0, false
}

// GPUResource is the extended resource the extender manages
// (resourceName); nvidia.com/gpu when the configuration was never
// defaulted.
func (c *ExtenderConfiguration) GPUResource() corev1.ResourceName {
	if c == nil || c.ResourceName == "" {
		return v1alpha1.ResourceGPU
	}
	return corev1.ResourceName(c.ResourceName)
}

// Telemetry sources.
const (
	// TelemetryNodeGPUTopology reads the node agent's NodeGPUTopology
	// status (the default).
	TelemetryNodeGPUTopology = "nodeGPUTopology"
	// TelemetryPrometheus reads DCGM exporter metrics from Prometheus and
	// falls back to NodeGPUTopology, node by node, while that data is
	// missing or stale.
	TelemetryPrometheus = "prometheus"
)

// Telemetry is the telemetry source of prioritize.
type Telemetry struct {
	// Source is nodeGPUTopology (default) or prometheus.
	Source string `json:"source"`
	// Prometheus configures the prometheus source; required with it.
	Prometheus *PrometheusTelemetry `json:"prometheus,omitempty"`
}

// PrometheusTelemetry reads DCGM exporter metrics from a Prometheus server.
// Series are matched to GPUs by the node label and the GPU UUID label; a
// node uses them only when every healthy GPU of its NodeGPUTopology has a
// sample newer than MaxAge, and otherwise falls back to its NodeGPUTopology
// telemetry (see docs/prometheus.md).
type PrometheusTelemetry struct {
	// URL of the Prometheus server (its HTTP API is under /api/v1).
	URL string `json:"url"`
	// Interval between query rounds. Default 30s.
	Interval metav1.Duration `json:"interval"`
	// Timeout of one query round. Default 10s.
	Timeout metav1.Duration `json:"timeout"`
	// MaxAge is how old a scraped sample may be before the node falls
	// back to its NodeGPUTopology telemetry. Default 2m.
	MaxAge metav1.Duration `json:"maxAge"`
	// NodeLabel is the label carrying the Kubernetes node name. DCGM
	// exporter sets Hostname from its NODE_NAME; a ServiceMonitor often
	// relabels it to node. Default Hostname.
	NodeLabel string `json:"nodeLabel"`
	// UUIDLabel is the label carrying the GPU UUID. Default UUID.
	UUIDLabel string `json:"uuidLabel"`
	// Selector is added to every query as label matchers, for example
	// job="dcgm-exporter" when several jobs export DCGM names. Default none.
	Selector string `json:"selector"`
	// Metrics are the metric names read. Defaults are DCGM exporter's.
	Metrics DCGMMetrics `json:"metrics"`
}

// DCGMMetrics names the DCGM exporter metrics read.
type DCGMMetrics struct {
	// Utilization in percent. Default DCGM_FI_DEV_GPU_UTIL.
	Utilization string `json:"utilization"`
	// FramebufferUsed in MiB. Default DCGM_FI_DEV_FB_USED.
	FramebufferUsed string `json:"framebufferUsed"`
	// Temperature in degrees C. Default DCGM_FI_DEV_GPU_TEMP.
	Temperature string `json:"temperature"`
	// Power draw in watts. Default DCGM_FI_DEV_POWER_USAGE.
	Power string `json:"power"`
	// PowerLimit in watts; optional (not in DCGM exporter's default
	// counters): without it the node agent's limit is used. Default
	// DCGM_FI_DEV_POWER_MGMT_LIMIT.
	PowerLimit string `json:"powerLimit"`
}

// Weights of the prioritize components (see docs/extender.md for the
// formula and the measurements behind the defaults). Each is a
// non-negative integer; at least one must be positive. Only their ratios
// matter.
type Weights struct {
	// Profile picks the values of the weights left unset: "placement" (the
	// default; the split measured best for whole traces, docs/extender.md)
	// or "design" (the original 40/30/20/10 over the first four terms,
	// with the three node-choice terms off). A weight written in the file
	// always wins over its profile.
	Profile string `json:"profile"`
	// UtilizationBalance favours nodes whose GPUs stay least busy after the
	// placement (held GPUs count as busy; free ones by their telemetry).
	// Default 0 (design profile 40): spreading leaves no whole machine for
	// the large model-parallel pods (docs/extender.md).
	UtilizationBalance *int32 `json:"utilizationBalance"`
	// TaskAffinity favours nodes already running pods of the same
	// gputopo.io/job (1.0), or in the same NVLink fabric clique (0.5).
	// It counts only for pods whose job has pods placed already. Default
	// 30 (design profile 30).
	TaskAffinity *int32 `json:"taskAffinity"`
	// ThermalPowerHeadroom favours GPUs that run cool and below their power
	// limit. Default 10 (design profile 20).
	ThermalPowerHeadroom *int32 `json:"thermalPowerHeadroom"`
	// Fragmentation favours placements that leave the node's largest free
	// NVLink island intact. Default 10 (design profile 10).
	Fragmentation *int32 `json:"fragmentation"`
	// BandwidthFit favours, for pods that ask for bandwidth (NVLink
	// required, a minimum pair bandwidth, or highest_bandwidth with more
	// than one GPU), the node whose chosen set has the highest bottleneck
	// ring bandwidth, against the best of the nodes that passed filter.
	// It counts only for those pods.
	// Default 300 (design profile 0).
	BandwidthFit *int32 `json:"bandwidthFit"`
	// CapabilityConservation favours the node whose machine has the least
	// interconnect to offer (peak pair bandwidth times largest NVLink
	// clique: PCIe before NVLink meshes before NVLink-bridged pairs before
	// NVSwitch), keeping the fast machines for the pods that need them. For
	// a pod that asks for bandwidth, bandwidth fit weighs first, so this
	// picks the least capable of the machines that give it the same ring. Default 60
	// (design profile 0).
	CapabilityConservation *int32 `json:"capabilityConservation"`
	// IslandBestFit favours the node where the pod fills an NVLink island
	// that is already partly used, rather than breaking into an intact one
	// (bin packing by island). Default 40 (design profile 0).
	IslandBestFit *int32 `json:"islandBestFit"`
}

// Weight profiles.
const (
	// WeightsPlacement is the default profile, chosen by measurement on
	// generated traces and cluster mixes (docs/extender.md).
	WeightsPlacement = "placement"
	// WeightsDesign is the design's original split: utilization balance
	// 40, task affinity 30, thermal/power 20, fragmentation 10.
	WeightsDesign = "design"
)

// weightProfiles holds each profile's weights, in the order of
// Weights.fields.
var weightProfiles = map[string][numWeights]int32{
	WeightsPlacement: {0, 30, 10, 10, 300, 60, 40},
	WeightsDesign:    {40, 30, 20, 10, 0, 0, 0},
}

const numWeights = 7

// weightField is one weight with its configuration name.
type weightField struct {
	name string
	p    **int32
}

// fields lists the weights in profile order.
func (w *Weights) fields() [numWeights]weightField {
	return [numWeights]weightField{
		{"utilizationBalance", &w.UtilizationBalance},
		{"taskAffinity", &w.TaskAffinity},
		{"thermalPowerHeadroom", &w.ThermalPowerHeadroom},
		{"fragmentation", &w.Fragmentation},
		{"bandwidthFit", &w.BandwidthFit},
		{"capabilityConservation", &w.CapabilityConservation},
		{"islandBestFit", &w.IslandBestFit},
	}
}

// WeightProfile returns the weights of profile name, every one set, and
// whether there is such a profile.
func WeightProfile(name string) (Weights, bool) {
	profile, ok := weightProfiles[name]
	if !ok {
		return Weights{}, false
	}
	w := Weights{Profile: name}
	for i, f := range w.fields() {
		v := profile[i]
		*f.p = &v
	}
	return w, true
}

// Thermal fixes the temperature scale of the thermal headroom component.
type Thermal struct {
	// IdleTemperatureC scores full headroom at or below it. Default 30.
	IdleTemperatureC *int32 `json:"idleTemperatureC"`
	// LimitTemperatureC scores no headroom at or above it; data-centre GPUs
	// start to slow down near 85 °C. Default 85.
	LimitTemperatureC *int32 `json:"limitTemperatureC"`
}

// DefaultExtenderConfiguration returns the configuration with every
// default set; testdata/extender/defaults.json pins it.
func DefaultExtenderConfiguration() *ExtenderConfiguration {
	c := &ExtenderConfiguration{}
	SetExtenderDefaults(c)
	return c
}

// SetExtenderDefaults fills the fields left unset, and rewrites the legacy
// apiVersion (ExtenderLegacyAPIVersion) to ExtenderAPIVersion. Weights and
// topologyMaxAge are pointers so that an explicit 0 (switch a component or
// the check off) differs from "not set".
func SetExtenderDefaults(c *ExtenderConfiguration) {
	if c.APIVersion == "" || c.APIVersion == ExtenderLegacyAPIVersion {
		c.APIVersion = ExtenderAPIVersion
	}
	if c.Kind == "" {
		c.Kind = ExtenderKind
	}
	setInt32 := func(p **int32, v int32) {
		if *p == nil {
			*p = &v
		}
	}
	if c.Weights.Profile == "" {
		c.Weights.Profile = WeightsPlacement
	}
	// An unknown profile is left for Validate to name; its weights
	// default to the placement profile's meanwhile.
	profile, ok := weightProfiles[c.Weights.Profile]
	if !ok {
		profile = weightProfiles[WeightsPlacement]
	}
	for i, f := range c.Weights.fields() {
		setInt32(f.p, profile[i])
	}
	setInt32(&c.Thermal.IdleTemperatureC, 30)
	setInt32(&c.Thermal.LimitTemperatureC, 85)
	setDuration := func(d *metav1.Duration, v time.Duration) {
		if d.Duration == 0 {
			d.Duration = v
		}
	}
	if c.TopologyMaxAge == nil {
		c.TopologyMaxAge = &metav1.Duration{Duration: defaultTopologyMaxAge}
	}
	setDuration(&c.TelemetryMaxAge, 2*time.Minute)
	setDuration(&c.BindTimeout, 4*time.Second)
	setDuration(&c.ReservationTTL, 2*time.Minute)
	setDuration(&c.Fabric.GroupReservationTTL, 2*time.Minute)
	setInt32(&c.Fabric.ReserveMaxPercent, 25)
	setDuration(&c.Fabric.ReserveMaxDuration, 30*time.Minute)
	if c.Fabric.Levels == nil {
		c.Fabric.Levels = DefaultFabricLevels()
	}
	if c.Patience.BandwidthWait == nil {
		c.Patience.BandwidthWait = &metav1.Duration{Duration: 10 * time.Minute}
	}
	setInt32(&c.Patience.BandwidthPercent, 50)
	if c.DRA.Driver == "" {
		c.DRA.Driver = DefaultDRADriver
	}
	if c.DRA.UUIDAttribute == "" {
		c.DRA.UUIDAttribute = "uuid"
	}
	if c.DRA.DeviceClasses == nil {
		c.DRA.DeviceClasses = []string{DefaultDRADriver}
	}
	if c.Events.GPUsBound == nil {
		c.Events.GPUsBound = new(false)
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 32 << 20
	}
	if c.AllocatorMemoSize == 0 {
		c.AllocatorMemoSize = 16384
	}
	if c.Telemetry.Source == "" {
		c.Telemetry.Source = TelemetryNodeGPUTopology
	}
	if c.ResourceName == "" {
		c.ResourceName = v1alpha1.ResourceGPU
	}
	if p := c.Telemetry.Prometheus; p != nil {
		setDuration(&p.Interval, 30*time.Second)
		setDuration(&p.Timeout, 10*time.Second)
		setDuration(&p.MaxAge, 2*time.Minute)
		setString := func(s *string, v string) {
			if *s == "" {
				*s = v
			}
		}
		setString(&p.NodeLabel, "Hostname")
		setString(&p.UUIDLabel, "UUID")
		setString(&p.Metrics.Utilization, "DCGM_FI_DEV_GPU_UTIL")
		setString(&p.Metrics.FramebufferUsed, "DCGM_FI_DEV_FB_USED")
		setString(&p.Metrics.Temperature, "DCGM_FI_DEV_GPU_TEMP")
		setString(&p.Metrics.Power, "DCGM_FI_DEV_POWER_USAGE")
		setString(&p.Metrics.PowerLimit, "DCGM_FI_DEV_POWER_MGMT_LIMIT")
	}
}

// defaultTopologyMaxAge tolerates two missed 5-minute topology refreshes.
const defaultTopologyMaxAge = 15 * time.Minute

// TopologyAgeLimit is the topologyMaxAge in force: the default when unset,
// 0 (off) for 0 or a negative age in the file.
func (c *ExtenderConfiguration) TopologyAgeLimit() time.Duration {
	switch {
	case c.TopologyMaxAge == nil:
		return defaultTopologyMaxAge
	case c.TopologyMaxAge.Duration < 0:
		return 0
	}
	return c.TopologyMaxAge.Duration
}

// ParseExtender strictly decodes a YAML or JSON ExtenderConfiguration
// (Decode), applies defaults and validates it. Every problem, unknown and
// duplicate fields by their full path (e.g. weights.utilisation) as well as
// every invalid value, is reported at once: a typo must not silently fall
// back to a default.
func ParseExtender(data []byte) (*ExtenderConfiguration, error) {
	c := &ExtenderConfiguration{}
	if err := parse(data, c, func() { SetExtenderDefaults(c) }); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadExtender reads and parses the file at path; an empty path gives the
// defaults.
func LoadExtender(path string) (*ExtenderConfiguration, error) {
	if path == "" {
		return DefaultExtenderConfiguration(), nil
	}
	return load(path, "extender", ParseExtender)
}
