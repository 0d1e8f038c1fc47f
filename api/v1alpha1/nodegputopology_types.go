package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of gputopo's resources.
var GroupVersion = schema.GroupVersion{Group: "gputopo.io", Version: "v1alpha1"}

// SchemeBuilder registers gputopo's types; AddToScheme adds them to a scheme.
var (
	SchemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(GroupVersion, &NodeGPUTopology{}, &NodeGPUTopologyList{}, &GroupPlan{}, &GroupPlanList{})
		metav1.AddToGroupVersion(s, GroupVersion)
		return nil
	})
	AddToScheme = SchemeBuilder.AddToScheme
)

// PCIeLevel is the closest common PCIe ancestor of two GPUs, as NVML's
// GetTopologyCommonAncestor reports it, from nearest to farthest.
// +kubebuilder:validation:Enum=Internal;SameSwitch;MultipleSwitches;HostBridge;SameNUMA;CrossSocket
type PCIeLevel string

const (
	PCIeInternal         PCIeLevel = "Internal"         // NVML TOPOLOGY_INTERNAL: same board
	PCIeSameSwitch       PCIeLevel = "SameSwitch"       // NVML TOPOLOGY_SINGLE (PIX)
	PCIeMultipleSwitches PCIeLevel = "MultipleSwitches" // NVML TOPOLOGY_MULTIPLE (PXB)
	PCIeHostBridge       PCIeLevel = "HostBridge"       // NVML TOPOLOGY_HOSTBRIDGE (PHB)
	PCIeSameNUMA         PCIeLevel = "SameNUMA"         // NVML TOPOLOGY_NODE (NODE)
	PCIeCrossSocket      PCIeLevel = "CrossSocket"      // NVML TOPOLOGY_SYSTEM (SYS)
)

// GPUHealth is a GPU's health as the node agent last saw it.
// +kubebuilder:validation:Enum=Healthy;Unhealthy
type GPUHealth string

const (
	GPUHealthy   GPUHealth = "Healthy"
	GPUUnhealthy GPUHealth = "Unhealthy"
)

// GPU is one device as NVML reports it.
type GPU struct {
	// Index is the NVML device index.
	Index int `json:"index"`
	// UUID is the NVML UUID, e.g. GPU-5c8a...; the device plugin's device ID.
	UUID string `json:"uuid"`
	// Model is the product name, e.g. "NVIDIA A100-SXM4-40GB".
	Model string `json:"model,omitempty"`
	// MemoryMiB is the total framebuffer memory.
	MemoryMiB int64 `json:"memoryMiB,omitempty"`
	// NUMANode is the NUMA node of the GPU's PCIe root; -1 when unknown.
	NUMANode int `json:"numaNode"`
	// PCIBusID is the PCI bus ID, e.g. 0000:07:00.0.
	PCIBusID string `json:"pciBusID,omitempty"`
	// Health of the GPU.
	Health GPUHealth `json:"health"`
	// HealthReason says why a GPU is unhealthy, e.g. "XID 79: GPU has
	// fallen off the bus".
	HealthReason string `json:"healthReason,omitempty"`
	// FabricClique names the multi-node NVLink domain the GPU belongs to
	// (cluster UUID and clique ID), empty when it has none.
	FabricClique string `json:"fabricClique,omitempty"`
}

// Link describes the connection between GPUs A and B (A < B).
type Link struct {
	A int `json:"a"`
	B int `json:"b"`
	// NVLinks is the number of active NVLink links between A and B (for
	// NVSwitch systems, the links each GPU has into the fabric).
	NVLinks int `json:"nvlinks,omitempty"`
	// NVSwitch is true when the NVLink path goes through an NVSwitch.
	NVSwitch bool `json:"nvswitch,omitempty"`
	// PCIe is the closest common PCIe ancestor.
	PCIe PCIeLevel `json:"pcie"`
	// P2P is true when peer-to-peer reads and writes are supported.
	P2P bool `json:"p2p,omitempty"`
	// BandwidthGBps is the pair's usable bandwidth, GB/s bidirectional: the
	// NVLink bandwidth when there is NVLink, else the PCIe path's.
	BandwidthGBps int `json:"bandwidthGBps"`
}

// Telemetry is one GPU's load and thermals.
type Telemetry struct {
	Index int `json:"index"`
	// UtilizationPercent is the compute utilization, 0..100.
	UtilizationPercent int32 `json:"utilizationPercent"`
	// MemoryUsedMiB is framebuffer memory in use.
	MemoryUsedMiB int64 `json:"memoryUsedMiB"`
	// TemperatureC is the core temperature in degrees Celsius.
	TemperatureC int32 `json:"temperatureC"`
	// PowerWatts is the current draw.
	PowerWatts int32 `json:"powerWatts"`
	// PowerLimitWatts is the enforced power limit.
	PowerLimitWatts int32 `json:"powerLimitWatts"`
	// ThrottleReasons lists active clock throttle reasons, if any.
	ThrottleReasons []string `json:"throttleReasons,omitempty"`
}

// NodeGPUTopologySpec is empty: the object only reports what the node agent
// observed. It exists so that the object has the usual shape.
type NodeGPUTopologySpec struct{}

// NodeGPUTopologyStatus is a node's GPUs, their links and their telemetry.
type NodeGPUTopologyStatus struct {
	// DriverVersion is the NVIDIA driver version.
	DriverVersion string `json:"driverVersion,omitempty"`
	// GPUs in index order.
	GPUs []GPU `json:"gpus,omitempty"`
	// Links lists every pair of GPUs once (A < B).
	Links []Link `json:"links,omitempty"`
	// Telemetry per GPU, in index order.
	Telemetry []Telemetry `json:"telemetry,omitempty"`
	// TopologyHash identifies the GPUs and links (not telemetry, not
	// health); nodes with the same hash share allocator work.
	TopologyHash string `json:"topologyHash,omitempty"`
	// ObservedTime is when topology and health were last read.
	ObservedTime metav1.Time `json:"observedTime,omitempty"`
	// TelemetryTime is when telemetry was last read.
	TelemetryTime metav1.Time `json:"telemetryTime,omitempty"`
	// Stale is true when the agent could not refresh from NVML and is
	// publishing the last good topology.
	Stale bool `json:"stale,omitempty"`
	// StaleReason says why.
	StaleReason string `json:"staleReason,omitempty"`
	// Conditions say how far the published facts can be trusted. The node
	// agent sets ConditionTopologyConsistent: True when both ends of every
	// link agreed and every NVLink led to a known device; False, with a
	// reason and a message naming the GPUs and values, when it published
	// the conservative value instead (docs/nodeagent.md).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ConditionTopologyConsistent is the condition type the node agent sets on
// every topology read: whether NVML's answers agreed with each other.
const ConditionTopologyConsistent = "TopologyConsistent"

// Reasons of ConditionTopologyConsistent. With several kinds of
// inconsistency at once the reason is the first of DuplicateBusID,
// UnknownRemoteBusID, AsymmetricLink and the message lists them all.
const (
	// ReasonConsistent: both ends of every link agreed (status True).
	ReasonConsistent = "Consistent"
	// ReasonAsymmetricLink: the two GPUs of a pair reported different
	// NVLink counts, per-link speeds, PCIe levels or P2P support; the
	// conservative value was published.
	ReasonAsymmetricLink = "AsymmetricLink"
	// ReasonUnknownRemoteBusID: an NVLink leads to a bus ID that is no GPU
	// of the node and the driver did not say the remote is an NVSwitch;
	// the link was not counted.
	ReasonUnknownRemoteBusID = "UnknownRemoteBusID"
	// ReasonDuplicateBusID: two GPUs reported the same PCI bus ID, so
	// NVLinks cannot be told apart; discovery was refused and the node
	// published as stale.
	ReasonDuplicateBusID = "DuplicateBusID"
)

// NodeGPUTopology is one node's GPU topology and telemetry, published by the
// node agent. Cluster-scoped; its name is the node's name.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ngt
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Hash",type=string,JSONPath=`.status.topologyHash`
// +kubebuilder:printcolumn:name="Stale",type=boolean,JSONPath=`.status.stale`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type NodeGPUTopology struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeGPUTopologySpec   `json:"spec,omitempty"`
	Status NodeGPUTopologyStatus `json:"status,omitempty"`
}

// NodeGPUTopologyList is a list of NodeGPUTopology.
// +kubebuilder:object:root=true
type NodeGPUTopologyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeGPUTopology `json:"items"`
}
