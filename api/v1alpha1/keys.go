package v1alpha1

// Label and annotation keys. Each says who writes it and what its value
// looks like; DESIGN §3 / docs/design.md is the table of record.
const (
	// LabelInjection on a Namespace opts it in to gputopo. Written by the
	// operator; the only value that enables gputopo is InjectionEnabled.
	LabelInjection = "gputopo.io/injection"
	// InjectionEnabled is the LabelInjection value that opts a namespace in.
	InjectionEnabled = "enabled"

	// AnnotationParallelism states the workload's intent on a Job, a Pod or
	// (as a default for the namespace) a Namespace. Written by the user.
	// Value: "data" or "model".
	AnnotationParallelism = "gputopo.io/parallelism"

	// AnnotationRequirement carries the pod's GPU topology requirement as
	// JSON (see Requirement). Written by the webhook, or by the user, in
	// which case it is validated and kept.
	// Example: {"requireNVLink":true,"strategy":"highest_bandwidth"}.
	AnnotationRequirement = "gputopo.io/gpu-topology-requirement"

	// LabelJob identifies the job a pod belongs to, for task affinity.
	// Written by the webhook: the controlling Job's name, else the pod's
	// own name. Value: a label value (63 characters at most).
	LabelJob = "gputopo.io/job"

	// AnnotationAssignedGPUs is the extender's plan: the GPUs the pod gets,
	// as comma-separated GPU UUIDs in allocation order. Written by the
	// extender only, and only through the pod's Binding, so that node and
	// GPUs are set in one write.
	AnnotationAssignedGPUs = "gputopo.io/assigned-gpus"

	// AnnotationPlacement records why the plan was chosen, as JSON (see
	// Placement). Written by the extender only, through the Binding.
	AnnotationPlacement = "gputopo.io/placement"

	// AnnotationAllocatedGPUs is the truth: the GPU UUIDs kubelet allocated
	// to the pod's containers, read from kubelet's PodResources API,
	// comma-separated and sorted. Written by the node agent only.
	AnnotationAllocatedGPUs = "gputopo.io/allocated-gpus"
)

// ResourceGPU is the extended resource gputopo schedules.
const ResourceGPU = "nvidia.com/gpu"

// DefaultSchedulerName is the scheduler profile the webhook routes GPU pods
// to; the profile runs kube-scheduler with the gputopo extender.
const DefaultSchedulerName = "gputopo-scheduler"

// EnvVisibleDevices is the environment variable through which the NVIDIA
// container runtime decides which GPUs a container sees. Only the node
// agent's Allocate answer may set it for a GPU container.
const EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

// SystemAnnotations are the annotations only gputopo's own service accounts
// may set or change.
var SystemAnnotations = []string{AnnotationAssignedGPUs, AnnotationPlacement, AnnotationAllocatedGPUs}

// Parallelism is a workload's intent.
type Parallelism string

const (
	// ParallelismData: each GPU holds a full replica; gradients are reduced.
	ParallelismData Parallelism = "data"
	// ParallelismModel: the model is split across GPUs, which exchange
	// activations at every layer; interconnect bandwidth dominates.
	ParallelismModel Parallelism = "model"
)
