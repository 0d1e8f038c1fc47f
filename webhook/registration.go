package webhook

import (
	"fmt"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Names of the individual webhooks inside the configurations; they appear
// in every denial ("admission webhook "vpod.gputopo.io" denied the
// request: ...").
const (
	WebhookMutatePod       = "mpod.gputopo.io"
	WebhookMutateJob       = "mjob.gputopo.io"
	WebhookValidatePod     = "vpod.gputopo.io"
	WebhookValidatePodStat = "vpodstatus.gputopo.io"
)

// MaxTimeoutSeconds bounds the webhooks' timeout: pod creation waits on
// them, and a Job controller creating hundreds of pods multiplies it.
const MaxTimeoutSeconds = 5

// RegistrationOptions say where the apiserver reaches the webhook server.
// Set either the Service fields or URL.
type RegistrationOptions struct {
	// Name of both configuration objects. Default "gputopo-webhook".
	Name string
	// ServiceName and ServiceNamespace name the webhook Service; the
	// service namespace is the release namespace unless ReleaseNamespace
	// says otherwise.
	ServiceName      string
	ServiceNamespace string
	// ServicePort is the Service port. Default 443.
	ServicePort int32
	// URL is the server's base URL (https://host:port) when it is not
	// behind a Service; the handler paths are appended.
	URL string
	// CABundle is the PEM CA that signed the serving certificate. Empty
	// leaves it for cert-manager's CA injector to fill.
	CABundle []byte
	// ReleaseNamespace is where gputopo itself runs; it is never
	// admitted, so a webhook outage cannot block its own restart. Default
	// ServiceNamespace.
	ReleaseNamespace string
	// ExcludedNamespaces are left out besides kube-system and the release
	// namespace (WebhookConfiguration.ExcludedNamespaces).
	ExcludedNamespaces []string
	// TimeoutSeconds for each webhook, 1 to MaxTimeoutSeconds. Default 5.
	TimeoutSeconds int32
	// ResourceName is the GPU resource the match conditions look for
	// (WebhookConfiguration.ResourceName). Default nvidia.com/gpu.
	ResourceName string
}

// ForConfig returns o with what the registration takes from the webhook's
// own configuration: its resource name and excluded namespaces.
func (o RegistrationOptions) ForConfig(cfg configv1alpha1.WebhookConfiguration) RegistrationOptions {
	o.ResourceName = cfg.ResourceName
	o.ExcludedNamespaces = slices.Clone(cfg.ExcludedNamespaces)
	return o
}

// Names of the match conditions, as the apiserver reports them when one
// fails to evaluate.
const (
	MatchPodConcernsGPUs          = "pod-concerns-gpus"
	MatchJobConcernsGPUs          = "job-concerns-gpus"
	MatchGuardedAnnotationChanged = "guarded-annotation-changed"
)

// The match conditions are CEL over the object as the apiserver will store
// it (after every mutating webhook, for the validating ones). Webhooks
// that match no condition are not called, so a webhook outage blocks only
// what concerns GPUs. Every field access is optional (.?field.orValue),
// because mutating webhooks see objects before the apiserver has
// validated them, and an expression that fails to evaluate fails the
// request like the webhook would.

// annotationPrefix begins every gputopo annotation key.
var annotationPrefix = v1alpha1.GroupVersion.Group + "/"

// celString quotes s for CEL. Callers pass only annotation keys, resource
// names and prefixes, validated to hold no quote or backslash.
func celString(s string) string { return "'" + s + "'" }

// celSystemKeys is the CEL list of the system annotation keys.
func celSystemKeys() string { return celKeys(v1alpha1.SystemAnnotations) }

// celKeys is the CEL list of keys.
func celKeys(keys ...[]string) string {
	var quoted []string
	for _, list := range keys {
		for _, k := range list {
			quoted = append(quoted, celString(k))
		}
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// celRequests is true when an app or init container of the pod spec at
// spec lists resource under limits or requests, whatever the count (a
// count of 0 is judged by the webhook, which lets it pass). Ephemeral
// containers cannot request resources.
func celRequests(spec, resource string) string {
	r := celString(resource)
	return fmt.Sprintf("[%[1]s.?containers.orValue([]), %[1]s.?initContainers.orValue([])].exists(l, l.exists(c, %[2]s in c.?resources.?limits.orValue({}) || %[2]s in c.?resources.?requests.orValue({})))", spec, r)
}

// allContainers is the CEL list of the pod's container lists: app, init
// and ephemeral containers.
const allContainers = "[object.spec.?containers.orValue([]), object.spec.?initContainers.orValue([]), object.spec.?ephemeralContainers.orValue([])]"

// ephemeralContainers is the CEL list holding the pod's ephemeral
// containers only.
const ephemeralContainers = "[object.spec.?ephemeralContainers.orValue([])]"

// celSetsNVIDIAEnv is true when a container of lists names an env variable
// that begins with NVIDIA_.
func celSetsNVIDIAEnv(lists string) string {
	return lists + ".exists(l, l.exists(c, c.?env.orValue([]).exists(e, e.?name.orValue('').startsWith(" + celString(EnvPrefixNVIDIA) + "))))"
}

// celEnvFromCanSetNVIDIA is true when a container of lists takes an envFrom
// source whose prefix could produce a variable beginning with NVIDIA_
// (envFromCanSetNVIDIA): the source's keys live in a ConfigMap or Secret
// that no match condition can read, so the prefix decides.
func celEnvFromCanSetNVIDIA(lists string) string {
	p := "f.?prefix.orValue('')"
	return lists + ".exists(l, l.exists(c, c.?envFrom.orValue([]).exists(f, " + celString(EnvPrefixNVIDIA) + ".startsWith(" + p + ") || " + p + ".startsWith(" + celString(EnvPrefixNVIDIA) + "))))"
}

// celCarriesSystemAnnotation is true when the new object carries a system
// annotation or the old one did (oldObject is null on CREATE), which
// covers setting, changing and removing one.
func celCarriesSystemAnnotation() string {
	return celSystemKeys() + ".exists(k, k in object.metadata.?annotations.orValue({}) || (oldObject != null && k in oldObject.metadata.?annotations.orValue({})))"
}

// celGputopoAnnotationChanged is true on UPDATE when a gputopo.io/
// annotation (a system one, the requirement or the intent) is set, changed
// or removed.
func celGputopoAnnotationChanged() string {
	return "[object.metadata.?annotations.orValue({}), oldObject.metadata.?annotations.orValue({})].exists(m, m.exists(k, k.startsWith(" +
		celString(annotationPrefix) + ") && object.metadata.?annotations[?k] != oldObject.metadata.?annotations[?k]))"
}

// mutatingPodMatchExpression is the match condition of the pod mutator
// (opted-in namespaces only): the pod requests the GPU resource, sets an
// NVIDIA_ variable, takes an envFrom source that could set one (the
// mutator gives the containers without GPUs NVIDIA_VISIBLE_DEVICES=void,
// which beats envFrom), carries a system annotation, or uses
// ResourceClaims (which may ask for GPUs; the mutator reads them).
func mutatingPodMatchExpression(resource string) string {
	return celRequests("object.spec", resource) + " || " + celSetsNVIDIAEnv(allContainers) + " || " +
		celEnvFromCanSetNVIDIA(allContainers) + " || " + celCarriesSystemAnnotation() + " || " + celUsesClaims
}

// celUsesClaims is true when the pod lists ResourceClaims.
const celUsesClaims = "size(object.spec.?resourceClaims.orValue([])) > 0"

// validatingPodMatchExpression is the match condition of the pod validator
// (every namespace but the excluded ones). On CREATE: the pod requests the
// GPU resource, sets an NVIDIA_ variable (after mutation, which includes
// the void the mutator adds) or carries a system annotation. On UPDATE
// only what the validator judges on an update: a gputopo.io/ annotation
// set, changed or removed, and ephemeral containers being added that set an
// NVIDIA_ variable or take an envFrom that could. Container env and
// resources are immutable, so a label, finalizer or image change of a GPU
// pod never waits on the webhook: a webhook outage cannot wedge a Job's
// pods.
func validatingPodMatchExpression(resource string) string {
	return "request.operation == 'CREATE' ? (" +
		celRequests("object.spec", resource) + " || " + celSetsNVIDIAEnv(allContainers) + " || " + celCarriesSystemAnnotation() +
		") : (" + celGputopoAnnotationChanged() + " || (request.?subResource.orValue('') == 'ephemeralcontainers' && (" +
		celSetsNVIDIAEnv(ephemeralContainers) + " || " + celEnvFromCanSetNVIDIA(ephemeralContainers) + ")))"
}

// jobMatchExpression is the match condition of the Job webhook: the Job
// states an intent, its pod template carries a gputopo.io/ annotation
// (which the Job webhook judges early), or the template requests the GPU
// resource.
func jobMatchExpression(resource string) string {
	return celString(v1alpha1.AnnotationParallelism) + " in object.metadata.?annotations.orValue({})" +
		" || object.spec.?template.?metadata.?annotations.orValue({}).exists(k, k.startsWith(" + celString(annotationPrefix) + "))" +
		" || " + celRequests("object.spec.?template.?spec", resource)
}

// guardedAnnotationChanged is the CEL match condition of the status
// webhook: the apiserver calls it only when a pods/status write (which may
// change a pod's annotations) sets, changes or removes a system annotation
// or a group annotation, so kubelet status traffic never waits on it.
func guardedAnnotationChanged() string {
	return celKeys(v1alpha1.SystemAnnotations, v1alpha1.GroupAnnotations) + ".exists(k, object.metadata.?annotations[?k] != oldObject.metadata.?annotations[?k])"
}

// Registration returns the webhook configurations the chart installs and
// the tests use.
//
// Every webhook fails closed (failurePolicy Fail): failing open would let a
// user write assigned-gpus or run a pod with every GPU visible whenever the
// webhook is down. What an outage blocks is kept to what concerns GPUs:
// match conditions send the webhooks only pods that request the GPU
// resource, set an NVIDIA_ variable or carry a system annotation (the
// mutator also pods whose envFrom could set one), only updates that
// change a gputopo.io/ annotation or add ephemeral containers that could
// select devices, and only Jobs that state an intent or request GPUs; the excluded namespaces
// (kube-system, the release namespace, cert-manager's by default) are
// never sent at all. The mutating webhooks see only opted-in namespaces;
// the pod validator sees every namespace but the excluded ones, because
// the system annotations are protected everywhere and the node agent is the
// device plugin of every GPU pod. Bindings (pods/binding) are a subresource
// that no rule here matches: that is how the extender writes assigned-gpus
// and placement together with nodeName.
func Registration(o RegistrationOptions) (*admissionregistrationv1.MutatingWebhookConfiguration, *admissionregistrationv1.ValidatingWebhookConfiguration, error) {
	if errs := o.validate(); len(errs) > 0 {
		return nil, nil, fmt.Errorf("webhook registration: %w", errs.ToAggregate())
	}
	o = o.withDefaults()
	optedIn, everywhere := o.namespaceSelectors()
	res := o.ResourceName
	const (
		create = admissionregistrationv1.Create
		update = admissionregistrationv1.Update
	)
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "MutatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name},
	}
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingWebhookConfiguration"},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name},
	}
	for _, h := range []hook{
		{mutating: true, name: WebhookMutatePod, path: PathMutatePod, namespaces: optedIn, match: MatchPodConcernsGPUs, expression: mutatingPodMatchExpression(res), rules: rules(rule("", "pods", create), rule("", "pods/ephemeralcontainers", update))},
		{mutating: true, name: WebhookMutateJob, path: PathMutateJob, namespaces: optedIn, match: MatchJobConcernsGPUs, expression: jobMatchExpression(res), rules: rules(rule(batchv1.GroupName, "jobs", create))},
		{name: WebhookValidatePod, path: PathValidatePod, namespaces: everywhere, match: MatchPodConcernsGPUs, expression: validatingPodMatchExpression(res), rules: rules(rule("", "pods", create, update), rule("", "pods/ephemeralcontainers", update))},
		{name: WebhookValidatePodStat, path: PathValidatePod, namespaces: everywhere, match: MatchGuardedAnnotationChanged, expression: guardedAnnotationChanged(), rules: rules(rule("", "pods/status", update))},
	} {
		w := o.webhook(h)
		if h.mutating {
			mutating.Webhooks = append(mutating.Webhooks, mutatingWebhook(w))
		} else {
			validating.Webhooks = append(validating.Webhooks, w)
		}
	}
	return mutating, validating, nil
}

// withDefaults returns o with the defaults in place of unset fields.
func (o RegistrationOptions) withDefaults() RegistrationOptions {
	if o.Name == "" {
		o.Name = "gputopo-webhook"
	}
	if o.TimeoutSeconds == 0 {
		o.TimeoutSeconds = MaxTimeoutSeconds
	}
	if o.ReleaseNamespace == "" {
		o.ReleaseNamespace = o.ServiceNamespace
	}
	if o.ResourceName == "" {
		o.ResourceName = v1alpha1.ResourceGPU
	}
	if o.ServicePort == 0 {
		o.ServicePort = 443
	}
	return o
}

// namespaceSelectors returns the selectors of the opted-in namespaces and
// of every namespace but the excluded ones: kube-system, the release
// namespace and ExcludedNamespaces.
func (o RegistrationOptions) namespaceSelectors() (optedIn, everywhere *metav1.LabelSelector) {
	excluded := []string{"kube-system"}
	for _, ns := range append([]string{o.ReleaseNamespace}, o.ExcludedNamespaces...) {
		if ns != "" && !slices.Contains(excluded, ns) {
			excluded = append(excluded, ns)
		}
	}
	notExcluded := metav1.LabelSelectorRequirement{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: excluded}
	optedIn = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		notExcluded,
		{Key: v1alpha1.LabelInjection, Operator: metav1.LabelSelectorOpIn, Values: []string{v1alpha1.InjectionEnabled}},
	}}
	everywhere = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{notExcluded}}
	return optedIn, everywhere
}

// clientConfig says how the apiserver reaches the handler served at path:
// by URL when o has one, else through the Service.
func (o RegistrationOptions) clientConfig(path string) admissionregistrationv1.WebhookClientConfig {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: o.CABundle}
	if o.URL != "" {
		cc.URL = ptr.To(strings.TrimRight(o.URL, "/") + path)
		return cc
	}
	cc.Service = &admissionregistrationv1.ServiceReference{Name: o.ServiceName, Namespace: o.ServiceNamespace, Port: ptr.To(o.ServicePort), Path: ptr.To(path)}
	return cc
}

// hook is what sets one webhook apart; every webhook shares the failure,
// side-effect, timeout and match policies.
type hook struct {
	mutating          bool
	name, path        string
	namespaces        *metav1.LabelSelector
	match, expression string
	rules             []admissionregistrationv1.RuleWithOperations
}

// rules lists r.
func rules(r ...admissionregistrationv1.RuleWithOperations) []admissionregistrationv1.RuleWithOperations {
	return r
}

// rule matches ops on the namespaced resource of group, version v1.
func rule(group, resource string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
	return admissionregistrationv1.RuleWithOperations{
		Operations: ops,
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{resource},
			Scope: ptr.To(admissionregistrationv1.NamespacedScope),
		},
	}
}

// webhook is h with the policies every webhook shares, as a validating
// webhook.
func (o RegistrationOptions) webhook(h hook) admissionregistrationv1.ValidatingWebhook {
	return admissionregistrationv1.ValidatingWebhook{
		Name:                    h.name,
		ClientConfig:            o.clientConfig(h.path),
		Rules:                   h.rules,
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		TimeoutSeconds:          ptr.To(o.TimeoutSeconds),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		NamespaceSelector:       h.namespaces,
		AdmissionReviewVersions: []string{"v1"},
		MatchConditions:         []admissionregistrationv1.MatchCondition{{Name: h.match, Expression: h.expression}},
	}
}

// mutatingWebhook is w as a mutating webhook, called again when a later
// mutating webhook changes the object.
func mutatingWebhook(w admissionregistrationv1.ValidatingWebhook) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name: w.Name, ClientConfig: w.ClientConfig, Rules: w.Rules,
		FailurePolicy: w.FailurePolicy, SideEffects: w.SideEffects, TimeoutSeconds: w.TimeoutSeconds, MatchPolicy: w.MatchPolicy,
		NamespaceSelector: w.NamespaceSelector, AdmissionReviewVersions: w.AdmissionReviewVersions, MatchConditions: w.MatchConditions,
		ReinvocationPolicy: ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
	}
}

func (o RegistrationOptions) validate() field.ErrorList {
	var errs field.ErrorList
	root := field.NewPath("registration")
	switch {
	case o.URL != "" && (o.ServiceName != "" || o.ServiceNamespace != ""):
		errs = append(errs, field.Invalid(root.Child("url"), o.URL, "set either url or serviceName and serviceNamespace, not both"))
	case o.URL != "" && !strings.HasPrefix(o.URL, "https://"):
		errs = append(errs, field.Invalid(root.Child("url"), o.URL, "must start with https://; the apiserver calls webhooks over TLS only"))
	case o.URL == "" && (o.ServiceName == "" || o.ServiceNamespace == ""):
		errs = append(errs, field.Required(root.Child("serviceName"), "set serviceName and serviceNamespace of the webhook Service, or url"))
	}
	if o.TimeoutSeconds < 0 || o.TimeoutSeconds > MaxTimeoutSeconds {
		errs = append(errs, field.Invalid(root.Child("timeoutSeconds"), o.TimeoutSeconds, fmt.Sprintf("must be between 1 and %d (0 for the default, %d)", MaxTimeoutSeconds, MaxTimeoutSeconds)))
	}
	if o.ResourceName != "" {
		p := root.Child("resourceName")
		for _, msg := range validation.IsQualifiedName(o.ResourceName) {
			errs = append(errs, field.Invalid(p, o.ResourceName, msg))
		}
	}
	for i, ns := range o.ExcludedNamespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, field.Invalid(root.Child("excludedNamespaces").Index(i), ns, msg))
		}
	}
	if o.ServicePort < 0 || o.ServicePort > 65535 {
		errs = append(errs, field.Invalid(root.Child("servicePort"), o.ServicePort, "must be a port number (0 for the default, 443)"))
	}
	return errs
}
