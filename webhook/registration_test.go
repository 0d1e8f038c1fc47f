package webhook

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// hookSummary is what the chart and the apiserver rely on, per webhook.
type hookSummary struct {
	Name, URL, ServicePath string
	Failure                admissionregistrationv1.FailurePolicyType
	SideEffects            admissionregistrationv1.SideEffectClass
	Timeout                int32
	Reinvocation           admissionregistrationv1.ReinvocationPolicyType
	Versions               []string
	Rules                  []admissionregistrationv1.RuleWithOperations
	Selector               *metav1.LabelSelector
	Conditions             []string // names
}

func conditionNames(mc []admissionregistrationv1.MatchCondition) []string {
	var out []string
	for _, c := range mc {
		out = append(out, c.Name)
	}
	return out
}

func summarize(m *admissionregistrationv1.MutatingWebhookConfiguration, v *admissionregistrationv1.ValidatingWebhookConfiguration) []hookSummary {
	var out []hookSummary
	cc := func(h *hookSummary, c admissionregistrationv1.WebhookClientConfig) {
		if c.URL != nil {
			h.URL = *c.URL
		}
		if c.Service != nil {
			h.ServicePath = fmt.Sprintf("%s/%s:%d%s", c.Service.Namespace, c.Service.Name, *c.Service.Port, *c.Service.Path)
		}
	}
	for _, w := range m.Webhooks {
		h := hookSummary{Name: w.Name, Failure: *w.FailurePolicy, SideEffects: *w.SideEffects, Timeout: *w.TimeoutSeconds,
			Reinvocation: *w.ReinvocationPolicy, Versions: w.AdmissionReviewVersions, Rules: w.Rules, Selector: w.NamespaceSelector,
			Conditions: conditionNames(w.MatchConditions)}
		cc(&h, w.ClientConfig)
		out = append(out, h)
	}
	for _, w := range v.Webhooks {
		h := hookSummary{Name: w.Name, Failure: *w.FailurePolicy, SideEffects: *w.SideEffects, Timeout: *w.TimeoutSeconds,
			Versions: w.AdmissionReviewVersions, Rules: w.Rules, Selector: w.NamespaceSelector, Conditions: conditionNames(w.MatchConditions)}
		cc(&h, w.ClientConfig)
		out = append(out, h)
	}
	return out
}

func TestRegistration(t *testing.T) {
	m, v, err := Registration(RegistrationOptions{ServiceName: "gputopo-webhook", ServiceNamespace: "gpu", ExcludedNamespaces: []string{"monitoring", "kube-system"}, CABundle: []byte("CA")})
	if err != nil {
		t.Fatal(err)
	}
	ns := func(optedIn bool) *metav1.LabelSelector {
		s := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"kube-system", "gpu", "monitoring"}}}}
		if optedIn {
			s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: "gputopo.io/injection", Operator: metav1.LabelSelectorOpIn, Values: []string{"enabled"}})
		}
		return s
	}
	rule := func(group string, res string, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
		return admissionregistrationv1.RuleWithOperations{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{res}, Scope: ptr.To(admissionregistrationv1.NamespacedScope)}}
	}
	const c, u = admissionregistrationv1.Create, admissionregistrationv1.Update
	want := []hookSummary{
		{Name: "mpod.gputopo.io", ServicePath: "gpu/gputopo-webhook:443/mutate-pod", Failure: "Fail", SideEffects: "None", Timeout: 5, Reinvocation: "IfNeeded", Versions: []string{"v1"},
			Rules: []admissionregistrationv1.RuleWithOperations{rule("", "pods", c), rule("", "pods/ephemeralcontainers", u)}, Selector: ns(true), Conditions: []string{"pod-concerns-gpus"}},
		{Name: "mjob.gputopo.io", ServicePath: "gpu/gputopo-webhook:443/mutate-job", Failure: "Fail", SideEffects: "None", Timeout: 5, Reinvocation: "IfNeeded", Versions: []string{"v1"},
			Rules: []admissionregistrationv1.RuleWithOperations{rule("batch", "jobs", c)}, Selector: ns(true), Conditions: []string{"job-concerns-gpus"}},
		{Name: "vpod.gputopo.io", ServicePath: "gpu/gputopo-webhook:443/validate-pod", Failure: "Fail", SideEffects: "None", Timeout: 5, Versions: []string{"v1"},
			Rules: []admissionregistrationv1.RuleWithOperations{rule("", "pods", c, u), rule("", "pods/ephemeralcontainers", u)}, Selector: ns(false), Conditions: []string{"pod-concerns-gpus"}},
		{Name: "vpodstatus.gputopo.io", ServicePath: "gpu/gputopo-webhook:443/validate-pod", Failure: "Fail", SideEffects: "None", Timeout: 5, Versions: []string{"v1"},
			Rules: []admissionregistrationv1.RuleWithOperations{rule("", "pods/status", u)}, Selector: ns(false), Conditions: []string{"guarded-annotation-changed"}},
	}
	if diff := cmp.Diff(want, summarize(m, v)); diff != "" {
		t.Errorf("webhooks (-want +got):\n%s", diff)
	}
	for _, w := range m.Webhooks {
		if string(w.ClientConfig.CABundle) != "CA" {
			t.Errorf("%s: CA bundle %q, want CA", w.Name, w.ClientConfig.CABundle)
		}
	}
	// The expressions are a contract with the chart, which renders the same
	// text; test/security proves on a real kube-apiserver what they match.
	wantExpr := map[string]string{
		"mpod.gputopo.io": mutatingPodExprDefault,
		"mjob.gputopo.io": `'gputopo.io/parallelism' in object.metadata.?annotations.orValue({})` +
			` || object.spec.?template.?metadata.?annotations.orValue({}).exists(k, k.startsWith('gputopo.io/'))` +
			` || [object.spec.?template.?spec.?containers.orValue([]), object.spec.?template.?spec.?initContainers.orValue([])].exists(l, l.exists(c,` +
			` 'nvidia.com/gpu' in c.?resources.?limits.orValue({}) || 'nvidia.com/gpu' in c.?resources.?requests.orValue({})))`,
		"vpod.gputopo.io": validatingPodExprDefault,
		"vpodstatus.gputopo.io": `['gputopo.io/assigned-gpus', 'gputopo.io/placement', 'gputopo.io/allocated-gpus',` +
			` 'gputopo.io/group', 'gputopo.io/group-size', 'gputopo.io/group-required-topology', 'gputopo.io/group-preferred-topology',` +
			` 'gputopo.io/slice-size', 'gputopo.io/slice-required-topology', 'gputopo.io/slice-preferred-topology']` +
			`.exists(k, object.metadata.?annotations[?k] != oldObject.metadata.?annotations[?k])`,
	}
	if diff := cmp.Diff(wantExpr, expressions(m, v)); diff != "" {
		t.Errorf("match conditions (-want +got):\n%s", diff)
	}
}

// The pod webhooks' match conditions for nvidia.com/gpu, clause by clause.
const (
	requestsGPUExpr = `[object.spec.?containers.orValue([]), object.spec.?initContainers.orValue([])].exists(l, l.exists(c,` +
		` 'nvidia.com/gpu' in c.?resources.?limits.orValue({}) || 'nvidia.com/gpu' in c.?resources.?requests.orValue({})))`
	allContainersExpr = `[object.spec.?containers.orValue([]), object.spec.?initContainers.orValue([]), object.spec.?ephemeralContainers.orValue([])]`
	ephemeralExpr     = `[object.spec.?ephemeralContainers.orValue([])]`
	nvidiaEnvExpr     = `.exists(l, l.exists(c, c.?env.orValue([]).exists(e, e.?name.orValue('').startsWith('NVIDIA_'))))`
	envFromExpr       = `.exists(l, l.exists(c, c.?envFrom.orValue([]).exists(f, 'NVIDIA_'.startsWith(f.?prefix.orValue('')) || f.?prefix.orValue('').startsWith('NVIDIA_'))))`
	systemAnnExpr     = `['gputopo.io/assigned-gpus', 'gputopo.io/placement', 'gputopo.io/allocated-gpus'].exists(k,` +
		` k in object.metadata.?annotations.orValue({}) || (oldObject != null && k in oldObject.metadata.?annotations.orValue({})))`
	annChangedExpr = `[object.metadata.?annotations.orValue({}), oldObject.metadata.?annotations.orValue({})].exists(m, m.exists(k,` +
		` k.startsWith('gputopo.io/') && object.metadata.?annotations[?k] != oldObject.metadata.?annotations[?k]))`

	mutatingPodExprDefault   = requestsGPUExpr + ` || ` + allContainersExpr + nvidiaEnvExpr + ` || ` + allContainersExpr + envFromExpr + ` || ` + systemAnnExpr + ` || size(object.spec.?resourceClaims.orValue([])) > 0`
	validatingPodExprDefault = `request.operation == 'CREATE' ? (` + requestsGPUExpr + ` || ` + allContainersExpr + nvidiaEnvExpr + ` || ` + systemAnnExpr +
		`) : (` + annChangedExpr + ` || (request.?subResource.orValue('') == 'ephemeralcontainers' && (` + ephemeralExpr + nvidiaEnvExpr + ` || ` + ephemeralExpr + envFromExpr + `)))`
)

// expressions maps each webhook to its match condition's expression.
func expressions(m *admissionregistrationv1.MutatingWebhookConfiguration, v *admissionregistrationv1.ValidatingWebhookConfiguration) map[string]string {
	out := map[string]string{}
	for _, w := range m.Webhooks {
		out[w.Name] = w.MatchConditions[0].Expression
	}
	for _, w := range v.Webhooks {
		out[w.Name] = w.MatchConditions[0].Expression
	}
	return out
}

func TestRegistrationResourceNameFromConfig(t *testing.T) {
	cfg := configv1alpha1.DefaultWebhookConfiguration()
	cfg.ResourceName = "example.com/gpu"
	cfg.ExcludedNamespaces = []string{"cert-manager", "monitoring"}
	m, v, err := Registration(RegistrationOptions{URL: "https://127.0.0.1:9443", ReleaseNamespace: "gpu"}.ForConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		WebhookMutatePod:   strings.ReplaceAll(mutatingPodExprDefault, "nvidia.com/gpu", "example.com/gpu"),
		WebhookValidatePod: strings.ReplaceAll(validatingPodExprDefault, "nvidia.com/gpu", "example.com/gpu"),
	}
	for name, expr := range expressions(m, v) {
		if strings.Contains(expr, "nvidia.com/gpu") {
			t.Errorf("%s still matches nvidia.com/gpu: %s", name, expr)
		}
		if w, ok := want[name]; ok && expr != w {
			t.Errorf("%s match condition = %s\nwant %s", name, expr, w)
		}
	}
	if diff := cmp.Diff([]string{"kube-system", "gpu", "cert-manager", "monitoring"}, v.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values); diff != "" {
		t.Errorf("excluded namespaces (-want +got):\n%s", diff)
	}
}

func TestRegistrationURL(t *testing.T) {
	m, v, err := Registration(RegistrationOptions{URL: "https://127.0.0.1:9443/", ReleaseNamespace: "gpu", TimeoutSeconds: 3})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{*m.Webhooks[0].ClientConfig.URL, *m.Webhooks[1].ClientConfig.URL, *v.Webhooks[0].ClientConfig.URL}
	want := []string{"https://127.0.0.1:9443/mutate-pod", "https://127.0.0.1:9443/mutate-job", "https://127.0.0.1:9443/validate-pod"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("URLs (-want +got):\n%s", diff)
	}
	if *v.Webhooks[0].TimeoutSeconds != 3 {
		t.Errorf("timeout %d, want 3", *v.Webhooks[0].TimeoutSeconds)
	}
	if diff := cmp.Diff([]string{"kube-system", "gpu"}, v.Webhooks[0].NamespaceSelector.MatchExpressions[0].Values); diff != "" {
		t.Errorf("excluded namespaces (-want +got):\n%s", diff)
	}
}

func TestRegistrationErrors(t *testing.T) {
	tests := map[string]struct {
		o    RegistrationOptions
		want string
	}{
		"neither service nor URL": {RegistrationOptions{}, "webhook registration: registration.serviceName: Required value: set serviceName and serviceNamespace of the webhook Service, or url"},
		"both service and URL": {RegistrationOptions{URL: "https://x", ServiceName: "s", ServiceNamespace: "n"},
			`webhook registration: registration.url: Invalid value: "https://x": set either url or serviceName and serviceNamespace, not both`},
		"plain HTTP URL": {RegistrationOptions{URL: "http://x"},
			`webhook registration: registration.url: Invalid value: "http://x": must start with https://; the apiserver calls webhooks over TLS only`},
		"timeout above 5 seconds": {RegistrationOptions{URL: "https://x", TimeoutSeconds: 10},
			"webhook registration: registration.timeoutSeconds: Invalid value: 10: must be between 1 and 5 (0 for the default, 5)"},
		"a resource name that would break out of the CEL string": {RegistrationOptions{URL: "https://x", ResourceName: "a/b') || true || ('"},
			`webhook registration: registration.resourceName: Invalid value: "a/b') || true || ('": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`},
		"an excluded namespace that is no name": {RegistrationOptions{URL: "https://x", ExcludedNamespaces: []string{"a b"}},
			`webhook registration: registration.excludedNamespaces[0]: Invalid value: "a b": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := Registration(tc.o)
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}
