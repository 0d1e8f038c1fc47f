package webhook

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
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
	Conditions             int
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
			Reinvocation: *w.ReinvocationPolicy, Versions: w.AdmissionReviewVersions, Rules: w.Rules, Selector: w.NamespaceSelector}
		cc(&h, w.ClientConfig)
		out = append(out, h)
	}
	for _, w := range v.Webhooks {
		h := hookSummary{Name: w.Name, Failure: *w.FailurePolicy, SideEffects: *w.SideEffects, Timeout: *w.TimeoutSeconds,
			Versions: w.AdmissionReviewVersions, Rules: w.Rules, Selector: w.NamespaceSelector, Conditions: len(w.MatchConditions)}
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
			Rules: []admissionregistrationv1.RuleWithOperations{rule("", "pods", c), rule("", "pods/ephemeralcontainers", u)}, Selector: ns(true)},
		{Name: "mjob.gputopo.io", ServicePath: "gpu/gputopo-webhook:443/mutate-job", Failure: "Fail", SideEffects: "None", Timeout: 5, Reinvocation: "IfNeeded", Versions: []string{"v1"},
			Rules: []admissionregistrationv1.RuleWithOperations{rule("batch", "jobs", c)}, Selector: ns(true)},
		{Name: "vpod.gputopo.io", ServicePath: "gpu/gputopo-webhook:443/validate-pod", Failure: "Fail", SideEffects: "None", Timeout: 5, Versions: []string{"v1"},
			Rules: []admissionregistrationv1.RuleWithOperations{rule("", "pods", c, u), rule("", "pods/ephemeralcontainers", u)}, Selector: ns(false)},
		{Name: "vpodstatus.gputopo.io", ServicePath: "gpu/gputopo-webhook:443/validate-pod", Failure: "Fail", SideEffects: "None", Timeout: 5, Versions: []string{"v1"},
			Rules: []admissionregistrationv1.RuleWithOperations{rule("", "pods/status", u)}, Selector: ns(false), Conditions: 1},
	}
	if diff := cmp.Diff(want, summarize(m, v)); diff != "" {
		t.Errorf("webhooks (-want +got):\n%s", diff)
	}
	for _, w := range m.Webhooks {
		if string(w.ClientConfig.CABundle) != "CA" {
			t.Errorf("%s: CA bundle %q, want CA", w.Name, w.ClientConfig.CABundle)
		}
	}
	if want := `['gputopo.io/assigned-gpus', 'gputopo.io/placement', 'gputopo.io/allocated-gpus'].exists(k, object.metadata.?annotations[?k] != oldObject.metadata.?annotations[?k])`; v.Webhooks[1].MatchConditions[0].Expression != want {
		t.Errorf("match condition = %s, want %s", v.Webhooks[1].MatchConditions[0].Expression, want)
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
