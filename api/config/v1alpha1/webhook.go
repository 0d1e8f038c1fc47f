package v1alpha1

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// WebhookAPIVersion and WebhookKind identify a webhook configuration file.
// Both may be omitted; when present they must match, so a file written for
// another component or another version is refused rather than misread.
const (
	WebhookAPIVersion = "config.gputopo.io/v1alpha1"
	WebhookKind       = "WebhookConfiguration"
)

// Default service accounts of the components that write system
// annotations, as installed by the chart in its default namespace.
const (
	DefaultExtenderServiceAccount  = "system:serviceaccount:gputopo-system:gputopo-extender"
	DefaultNodeAgentServiceAccount = "system:serviceaccount:gputopo-system:gputopo-nodeagent"
)

// DefaultCertManagerNamespace is where cert-manager usually runs. It issues
// the webhook's serving certificate, so it is excluded by default: a
// webhook waiting for its certificate must never block cert-manager's own
// pods.
const DefaultCertManagerNamespace = "cert-manager"

// WebhookConfiguration is the webhook's configuration file. A file states
// only what it changes: ParseWebhook decodes it over
// DefaultWebhookConfiguration, field by field.
type WebhookConfiguration struct {
	// TypeMeta: apiVersion is WebhookAPIVersion and kind WebhookKind, or
	// empty.
	metav1.TypeMeta `json:",inline"`

	// SchedulerName is written into spec.schedulerName of GPU pods whose
	// schedulerName is empty or "default-scheduler"; pods that name another
	// scheduler keep it. Default "gputopo-scheduler".
	SchedulerName string `json:"schedulerName"`

	// PolicyTable maps a workload's intent to the requirement the webhook
	// derives for it. Defaults: model -> requireNVLink when the pod requests
	// more than 1 GPU, strategy highest_bandwidth; data -> numa_local;
	// none -> lowest_fragmentation.
	PolicyTable PolicyTable `json:"policyTable"`

	// SystemServiceAccounts are the user names allowed to set, change or
	// remove gputopo.io/assigned-gpus, gputopo.io/placement and
	// gputopo.io/allocated-gpus. Default: the extender's and the node
	// agent's service accounts in gputopo-system
	// ("system:serviceaccount:gputopo-system:gputopo-extender",
	// "system:serviceaccount:gputopo-system:gputopo-nodeagent"). Installs
	// in another namespace must change both.
	SystemServiceAccounts []string `json:"systemServiceAccounts"`

	// NodeAgentServiceAccounts are the node agents' user names. Such a user
	// may set, change or remove gputopo.io/allocated-gpus and no other
	// system annotation, and only on pods bound to the node named in its
	// credential (the authentication.kubernetes.io/node-name extra that
	// kube-apiserver adds for a service account token bound to a pod);
	// these rules hold even when SystemServiceAccounts lists the user too.
	// Default: the node agent's service account in gputopo-system
	// ("system:serviceaccount:gputopo-system:gputopo-nodeagent").
	NodeAgentServiceAccounts []string `json:"nodeAgentServiceAccounts"`

	// ResourceName is the extended resource that stands for one GPU: a pod
	// that requests it is a GPU pod. It must equal the node agent's
	// --resource-name and the scheduler's managedResources. Default
	// "nvidia.com/gpu".
	ResourceName string `json:"resourceName"`

	// GPUContainerEnvFrom decides about envFrom sources in containers that
	// request ResourceName, whose variables the webhook cannot see:
	// "Refuse" (the default) refuses a source whose variable names could
	// start with NVIDIA_ (no prefix, or a prefix that could begin
	// NVIDIA_), because such a variable would override the GPUs kubelet
	// allocated; "Allow" admits every source, for clusters where the
	// device list does not travel through the environment (node agent
	// strategy volume-mounts or cdi-cri, and the NVIDIA container toolkit
	// set to accept-nvidia-visible-devices-envvar-when-unprivileged =
	// false). Under "Refuse" a container that does not request
	// ResourceName (an init, sidecar or ephemeral container of a GPU pod,
	// or any container of a pod in an opted-in namespace) may take such a
	// source only together with NVIDIA_VISIBLE_DEVICES=void under env,
	// which beats envFrom; the mutating webhook adds it in opted-in
	// namespaces.
	GPUContainerEnvFrom EnvFromPolicy `json:"gpuContainerEnvFrom"`

	// ExcludedNamespaces are never mutated, whatever their labels; the
	// registration's namespaceSelector leaves them out too, so no pod
	// there waits on the webhook. Default ["kube-system", "cert-manager"]
	// (cert-manager issues the webhook's own certificate); the release
	// namespace is always added by Registration.
	ExcludedNamespaces []string `json:"excludedNamespaces"`

	// NamespaceDefaultAnnotation is the Namespace annotation whose value
	// ("data" or "model") is the intent of pods that state none themselves
	// and have no controlling Job that does. Default
	// "gputopo.io/parallelism".
	NamespaceDefaultAnnotation string `json:"namespaceDefaultAnnotation"`

	// ClaimDeviceClasses are the DeviceClasses whose ResourceClaim
	// requests ask for GPUs: a pod that asks for GPUs through claims of
	// these classes gets its requirement derived and is routed as a pod
	// that requests the resource is (docs/dra.md). Keep equal to the
	// extender's dra.deviceClasses; the chart sets both from
	// extender.dra.deviceClasses. Default [gpu.nvidia.com]; empty: claim
	// pods are left alone.
	ClaimDeviceClasses []string `json:"claimDeviceClasses"`
}

// EnvFromPolicy is the value of WebhookConfiguration.GPUContainerEnvFrom.
type EnvFromPolicy string

const (
	// EnvFromRefuse refuses, in GPU containers, envFrom sources that could
	// set an NVIDIA_ variable.
	EnvFromRefuse EnvFromPolicy = "Refuse"
	// EnvFromAllow admits every envFrom source.
	EnvFromAllow EnvFromPolicy = "Allow"
)

// PolicyTable holds one Policy per intent. Intents are fixed (the values of
// gputopo.io/parallelism plus "none"), so the table is a struct: an unknown
// intent in a file is an error, not a silently ignored key.
type PolicyTable struct {
	// Model applies to intent "model". Default: requireNVLinkFromGPUs 2,
	// strategy highest_bandwidth.
	Model Policy `json:"model"`
	// Data applies to intent "data". Default: strategy numa_local.
	Data Policy `json:"data"`
	// None applies to pods with no intent anywhere. Default: strategy
	// lowest_fragmentation.
	None Policy `json:"none"`
}

// Policy is how one intent becomes a requirement.
type Policy struct {
	// Strategy chooses among the GPU sets that qualify. Empty means the
	// extender's default, lowest_fragmentation.
	Strategy v1alpha1.Strategy `json:"strategy"`
	// RequireNVLinkFromGPUs sets requireNVLink for pods requesting at least
	// this many GPUs; 0 never sets it. Default 2 for model, 0 otherwise
	// (a lone GPU has no peer to link to).
	RequireNVLinkFromGPUs int `json:"requireNVLinkFromGPUs"`
	// MinPairBandwidthGBps is copied into the requirement of pods that
	// request more than one GPU; GB/s bidirectional. Default 0 (no
	// minimum).
	MinPairBandwidthGBps int `json:"minPairBandwidthGBps"`
	// FallbackAfter, when set, is copied into the requirement of pods the
	// policy requires NVLink (or a minimum bandwidth) of: such a pod that
	// has been Pending this long accepts the best set without it, and its
	// placement record says it was degraded. Default unset: never fall
	// back (model-parallel pods wait for NVLink).
	FallbackAfter *metav1.Duration `json:"fallbackAfter,omitempty"`
}

// Requirement derives the requirement for a pod that requests gpus GPUs.
func (p Policy) Requirement(gpus int64) v1alpha1.Requirement {
	r := v1alpha1.Requirement{Strategy: p.Strategy}
	if p.RequireNVLinkFromGPUs > 0 && gpus >= int64(p.RequireNVLinkFromGPUs) {
		r.RequireNVLink = true
	}
	if gpus > 1 {
		r.MinPairBandwidthGBps = p.MinPairBandwidthGBps
	}
	if p.FallbackAfter != nil && r.Strict() {
		d := *p.FallbackAfter
		r.FallbackAfter = &d
	}
	return r
}

// For returns the policy of an intent; the empty intent is "none".
func (t PolicyTable) For(intent v1alpha1.Parallelism) Policy {
	switch intent {
	case v1alpha1.ParallelismModel:
		return t.Model
	case v1alpha1.ParallelismData:
		return t.Data
	}
	return t.None
}

// DefaultWebhookConfiguration returns the configuration used when no file
// is given; testdata/webhook/defaults.json pins it.
func DefaultWebhookConfiguration() WebhookConfiguration {
	return WebhookConfiguration{
		SchedulerName: v1alpha1.DefaultSchedulerName,
		PolicyTable: PolicyTable{
			Model: Policy{Strategy: v1alpha1.StrategyHighestBandwidth, RequireNVLinkFromGPUs: 2},
			Data:  Policy{Strategy: v1alpha1.StrategyNUMALocal},
			None:  Policy{Strategy: v1alpha1.StrategyLowestFragmentation},
		},
		SystemServiceAccounts:      []string{DefaultExtenderServiceAccount, DefaultNodeAgentServiceAccount},
		NodeAgentServiceAccounts:   []string{DefaultNodeAgentServiceAccount},
		ResourceName:               v1alpha1.ResourceGPU,
		GPUContainerEnvFrom:        EnvFromRefuse,
		ExcludedNamespaces:         []string{"kube-system", DefaultCertManagerNamespace},
		NamespaceDefaultAnnotation: v1alpha1.AnnotationParallelism,
		ClaimDeviceClasses:         []string{DefaultDRADriver},
	}
}

// ParseWebhook strictly decodes data, a YAML or JSON WebhookConfiguration
// (Decode), over DefaultWebhookConfiguration and validates the result,
// reporting every problem at once. Empty data gives the defaults.
func ParseWebhook(data []byte) (WebhookConfiguration, error) {
	c := DefaultWebhookConfiguration()
	if err := parse(data, &c, nil); err != nil {
		return WebhookConfiguration{}, err
	}
	return c, nil
}

// LoadWebhook reads and parses the file at path; an empty path gives the
// defaults.
func LoadWebhook(path string) (WebhookConfiguration, error) {
	if path == "" {
		return DefaultWebhookConfiguration(), nil
	}
	return load(path, "webhook", ParseWebhook)
}

// Validate reports every invalid field, with its path, at once.
func (c WebhookConfiguration) Validate() field.ErrorList {
	errs := validateTypeMeta(c.TypeMeta, WebhookAPIVersion, WebhookKind)

	p := field.NewPath("schedulerName")
	if c.SchedulerName == "" {
		errs = append(errs, field.Required(p, "name the scheduler profile that runs the gputopo extender, e.g. "+v1alpha1.DefaultSchedulerName))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(c.SchedulerName) {
			errs = append(errs, field.Invalid(p, c.SchedulerName, msg))
		}
	}

	pt := field.NewPath("policyTable")
	errs = append(errs, c.PolicyTable.Model.validate(pt.Child("model"))...)
	errs = append(errs, c.PolicyTable.Data.validate(pt.Child("data"))...)
	errs = append(errs, c.PolicyTable.None.validate(pt.Child("none"))...)

	// systemServiceAccounts may be empty: the extender writes the plan
	// through Bindings, which no webhook sees, and the node agents have
	// their own list.
	errs = append(errs, validateUserNames(field.NewPath("systemServiceAccounts"), c.SystemServiceAccounts)...)
	p = field.NewPath("nodeAgentServiceAccounts")
	if len(c.NodeAgentServiceAccounts) == 0 {
		errs = append(errs, field.Required(p, "list the node agent's service account user name (system:serviceaccount:<namespace>:<name>), or it cannot record allocated GPUs"))
	}
	errs = append(errs, validateUserNames(p, c.NodeAgentServiceAccounts)...)

	p = field.NewPath("resourceName")
	switch msgs := validation.IsQualifiedName(c.ResourceName); {
	case c.ResourceName == "":
		errs = append(errs, field.Required(p, "name the extended resource the node agent serves, e.g. "+v1alpha1.ResourceGPU))
	case len(msgs) > 0:
		for _, msg := range msgs {
			errs = append(errs, field.Invalid(p, c.ResourceName, msg))
		}
	case !strings.Contains(c.ResourceName, "/"):
		errs = append(errs, field.Invalid(p, c.ResourceName, "must be an extended resource name with a domain, e.g. "+v1alpha1.ResourceGPU))
	}

	p = field.NewPath("gpuContainerEnvFrom")
	if c.GPUContainerEnvFrom != EnvFromRefuse && c.GPUContainerEnvFrom != EnvFromAllow {
		errs = append(errs, field.NotSupported(p, c.GPUContainerEnvFrom, []EnvFromPolicy{EnvFromRefuse, EnvFromAllow}))
	}

	p = field.NewPath("excludedNamespaces")
	seen := sets.New[string]()
	for i, ns := range c.ExcludedNamespaces {
		if seen.Has(ns) {
			errs = append(errs, field.Duplicate(p.Index(i), ns))
			continue
		}
		seen.Insert(ns)
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(p.Index(i), ns, msg))
		}
	}

	errs = append(errs, validateDeviceClasses(field.NewPath("claimDeviceClasses"), c.ClaimDeviceClasses)...)

	p = field.NewPath("namespaceDefaultAnnotation")
	if c.NamespaceDefaultAnnotation == "" {
		errs = append(errs, field.Required(p, "name the Namespace annotation holding the default intent, e.g. "+v1alpha1.AnnotationParallelism))
	} else {
		for _, msg := range validation.IsQualifiedName(c.NamespaceDefaultAnnotation) {
			errs = append(errs, field.Invalid(p, c.NamespaceDefaultAnnotation, msg))
		}
	}
	return errs
}

// validateUserNames checks a list of service account user names.
func validateUserNames(p *field.Path, users []string) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[string]()
	for i, u := range users {
		ip := p.Index(i)
		if seen.Has(u) {
			errs = append(errs, field.Duplicate(ip, u))
			continue
		}
		seen.Insert(u)
		ns, name, err := serviceaccount.SplitUsername(u)
		if err != nil {
			errs = append(errs, field.Invalid(ip, u, "must be a service account user name: system:serviceaccount:<namespace>:<name>"))
			continue
		}
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(ip, u, "namespace: "+msg))
		}
		for _, msg := range validation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(ip, u, "name: "+msg))
		}
	}
	return errs
}

func (p Policy) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if p.RequireNVLinkFromGPUs < 0 {
		errs = append(errs, field.Invalid(path.Child("requireNVLinkFromGPUs"), p.RequireNVLinkFromGPUs, "must be 0 (never) or the GPU count from which NVLink is required"))
	}
	// The requirement the policy produces for a multi-GPU pod carries every
	// field, so validating it checks strategy and bandwidth with the same
	// rules and messages the extender's input gets.
	q := p
	q.FallbackAfter = nil
	errs = append(errs, q.Requirement(2).Validate(path)...)
	if f := p.FallbackAfter; f != nil {
		fp := path.Child("fallbackAfter")
		switch {
		case f.Duration <= 0:
			errs = append(errs, field.Invalid(fp, f.Duration.String(), `must be a positive duration such as "30m"; leave it out to never fall back`))
		case f.Duration > v1alpha1.MaxFallbackAfter:
			errs = append(errs, field.Invalid(fp, f.Duration.String(), fmt.Sprintf("must be at most %s", v1alpha1.MaxFallbackAfter)))
		case p.RequireNVLinkFromGPUs == 0 && p.MinPairBandwidthGBps == 0:
			errs = append(errs, field.Invalid(fp, f.Duration.String(), "applies only to a policy that sets requireNVLinkFromGPUs or minPairBandwidthGBps (there is nothing to fall back from); remove fallbackAfter or require NVLink"))
		}
	}
	return errs
}

// GPUResource is ResourceName as a resource name.
func (c WebhookConfiguration) GPUResource() corev1.ResourceName {
	return corev1.ResourceName(c.ResourceName)
}

// IsSystem reports whether user may write every system annotation.
func (c WebhookConfiguration) IsSystem(user string) bool {
	return slices.Contains(c.SystemServiceAccounts, user)
}

// IsNodeAgent reports whether user is a node agent, held to its own node.
func (c WebhookConfiguration) IsNodeAgent(user string) bool {
	return slices.Contains(c.NodeAgentServiceAccounts, user)
}

// Writers lists every user who may write some system annotation, each
// once.
func (c WebhookConfiguration) Writers() []string {
	out := slices.Clone(c.SystemServiceAccounts)
	for _, u := range c.NodeAgentServiceAccounts {
		if !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}

// IsExcluded reports whether namespace ns is never mutated.
func (c WebhookConfiguration) IsExcluded(ns string) bool {
	return slices.Contains(c.ExcludedNamespaces, ns)
}
