//go:build integration

package chart

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/cmd/gputopo/app"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/webhook"
)

// The chart's defaults, installed the way docs/install.md says.
var defaultRelease = release{name: "gputopo", namespace: "gputopo-system"}

// Every value that changes a rendered object differs from its default.
var customRelease = release{name: "topo", namespace: "gpu-platform", values: `
certManager:
  issuer: {name: corp-ca, kind: ClusterIssuer, group: cert-manager.io}
gpuResourceName: example.com/gpu
serviceMonitor:
  enabled: true
  labels: {release: prometheus}
networkPolicy:
  enabled: true
  metricsFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
      podSelector: {matchLabels: {app.kubernetes.io/name: prometheus}}
  extenderFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}
      podSelector: {matchLabels: {component: kube-scheduler}}
webhook:
  replicas: 3
  timeoutSeconds: 3
  excludedNamespaces: [monitoring, kube-system]
  policyTable:
    model: {strategy: highest_bandwidth, requireNVLinkFromGPUs: 4, minPairBandwidthGBps: 300, fallbackAfter: 45m}
  extraSystemServiceAccounts: ["system:serviceaccount:ops:gpu-admin"]
extender:
  replicas: 3
  antiAffinity: hard
  weights: {profile: design, utilizationBalance: 10, taskAffinity: 20, thermalPowerHeadroom: 30, fragmentation: 40}
scheduler:
  ignorable: true
  extenderHTTPTimeout: 8s
  image: {tag: v1.36.4}
nodeAgent:
  nvmlAccess: privileged
  topologyInterval: 2m
  kubeletRootDir: /var/lib/k0s/kubelet
image:
  repository: registry.example/gputopo
  tag: v9.9.9
`}

// A rollout: a shadow extender with its own image and fragmentation weight,
// and Prometheus telemetry for both extenders.
var shadowRelease = release{name: "rollout", namespace: "gpu-sched", values: `
serviceMonitor:
  enabled: true
extender:
  telemetry:
    source: prometheus
    prometheus: {url: "http://prometheus.monitoring:9090", selector: 'job="dcgm-exporter"'}
shadowExtender:
  enabled: true
  image: {tag: v0.2.0}
  logSampleRate: 0.25
  overrides:
    weights: {fragmentation: 40}
`}

// The plain-HTTP opt-out, with a shadow extender (mirrored to over HTTP)
// and NetworkPolicies that admit no scraper.
var plainHTTPRelease = release{name: "gputopo-plain", namespace: "gputopo-test", values: `
extender:
  tls: {enabled: false}
scheduler:
  extenderForClaimPods: true
shadowExtender:
  enabled: true
networkPolicy:
  enabled: true
`}

// want is what a release must render to.
type want struct {
	// tls: the verbs are served with mutual TLS.
	tls bool
	// networkPolicy: NetworkPolicies are rendered; scrapers: metricsFrom
	// admits the monitoring/prometheus peer; extenderFrom: the
	// kube-system/kube-scheduler peer may call the extender.
	networkPolicy, scrapers, extenderFrom bool
	// resourceName every component is given.
	resourceName string
	// claimPods: kube-scheduler calls the extender for every pod of the
	// profile (no managedResources), claim pods included.
	claimPods        bool
	weights          [7]int32 // utilization, affinity, thermal, fragmentation, bandwidth fit, conservation, island fit
	ignorable        bool
	httpTimeout      time.Duration
	extenderReplicas int32
	// issuer of the serving certificate; the chart's own CA when name is
	// "<fullname>-ca".
	issuerName, issuerKind string
	ownCA                  bool
	serviceMonitors        int
	excludedNamespaces     []string // beyond kube-system and the release namespace
	timeoutSeconds         int32
	extraSystemUsers       []string
	privilegedAgent        bool
	kubeletRoot            string
	image                  string
	schedulerImage         string
	modelPolicy            configv1alpha1.Policy
	// prometheus is the telemetry.prometheus block as written, before the
	// extender's defaulting; nil: source nodeGPUTopology.
	prometheus *configv1alpha1.PrometheusTelemetry
	// shadow: a shadow extender runs, with shadowImage, shadowWeights and
	// shadowLogRate.
	shadow        bool
	shadowImage   string
	shadowWeights [7]int32
	shadowLogRate float64
}

func wants() map[string]struct {
	rel  release
	want want
} {
	return map[string]struct {
		rel  release
		want want
	}{
		"default values": {rel: defaultRelease, want: want{
			tls: true, resourceName: v1alpha1.ResourceGPU,
			weights: placementWeights(), httpTimeout: 5 * time.Second, extenderReplicas: 2,
			issuerName: "gputopo-ca", issuerKind: "Issuer", ownCA: true,
			excludedNamespaces: []string{"cert-manager"}, timeoutSeconds: 5, kubeletRoot: "/var/lib/kubelet",
			image: "ghcr.io/gputopo/gputopo:0.3.0", schedulerImage: "registry.k8s.io/kube-scheduler:v1.37.2",
			modelPolicy: configv1alpha1.DefaultWebhookConfiguration().PolicyTable.Model,
		}},
		"existing issuer, ServiceMonitors, NetworkPolicies, other resource name, other weights, ignorable, 3 extenders": {rel: customRelease, want: want{
			tls: true, networkPolicy: true, scrapers: true, extenderFrom: true, resourceName: "example.com/gpu",
			weights: [7]int32{10, 20, 30, 40, 0, 0, 0}, ignorable: true, httpTimeout: 8 * time.Second, extenderReplicas: 3,
			issuerName: "corp-ca", issuerKind: "ClusterIssuer",
			serviceMonitors: 4, excludedNamespaces: []string{"monitoring"}, timeoutSeconds: 3,
			extraSystemUsers: []string{"system:serviceaccount:ops:gpu-admin"},
			privilegedAgent:  true, kubeletRoot: "/var/lib/k0s/kubelet",
			image: "registry.example/gputopo:v9.9.9", schedulerImage: "registry.k8s.io/kube-scheduler:v1.36.4",
			modelPolicy: configv1alpha1.Policy{Strategy: v1alpha1.StrategyHighestBandwidth, RequireNVLinkFromGPUs: 4, MinPairBandwidthGBps: 300,
				FallbackAfter: &metav1.Duration{Duration: 45 * time.Minute}},
		}},
		"shadow extender with other weights and Prometheus telemetry": {rel: shadowRelease, want: want{
			tls: true, resourceName: v1alpha1.ResourceGPU,
			weights: placementWeights(), httpTimeout: 5 * time.Second, extenderReplicas: 2,
			issuerName: "rollout-gputopo-ca", issuerKind: "Issuer", ownCA: true,
			serviceMonitors: 5, excludedNamespaces: []string{"cert-manager"}, timeoutSeconds: 5, kubeletRoot: "/var/lib/kubelet",
			image: "ghcr.io/gputopo/gputopo:0.3.0", schedulerImage: "registry.k8s.io/kube-scheduler:v1.37.2",
			modelPolicy: configv1alpha1.DefaultWebhookConfiguration().PolicyTable.Model,
			prometheus:  &configv1alpha1.PrometheusTelemetry{URL: "http://prometheus.monitoring:9090", Selector: `job="dcgm-exporter"`},
			shadow:      true, shadowImage: "ghcr.io/gputopo/gputopo:v0.2.0", shadowWeights: withFragmentation(placementWeights(), 40), shadowLogRate: 0.25,
		}},
		"plain HTTP opt-out with a shadow extender, NetworkPolicies and the extender for claim pods": {rel: plainHTTPRelease, want: want{
			networkPolicy: true, resourceName: v1alpha1.ResourceGPU, claimPods: true,
			weights: placementWeights(), httpTimeout: 5 * time.Second, extenderReplicas: 2,
			issuerName: "gputopo-plain-ca", issuerKind: "Issuer", ownCA: true,
			excludedNamespaces: []string{"cert-manager"}, timeoutSeconds: 5, kubeletRoot: "/var/lib/kubelet",
			image: "ghcr.io/gputopo/gputopo:0.3.0", schedulerImage: "registry.k8s.io/kube-scheduler:v1.37.2",
			modelPolicy: configv1alpha1.DefaultWebhookConfiguration().PolicyTable.Model,
			shadow:      true, shadowImage: "ghcr.io/gputopo/gputopo:0.3.0", shadowWeights: placementWeights(), shadowLogRate: 0.1,
		}},
	}
}

func TestChartLintsAndRendersWhatTheComponentsRead(t *testing.T) {
	for name, tc := range wants() {
		t.Run(name, func(t *testing.T) {
			tc.rel.lint(t)
			objs := tc.rel.render(t)
			r, w := tc.rel, tc.want
			for _, check := range []func(*testing.T, release, want, []*unstructured.Unstructured){
				checkSchedulerConfig, checkExtenderConfig, checkWebhookConfig, checkWebhookRegistration,
				checkCertificates, checkExtenderTLS, checkNodeAgentRBAC, checkNodeAgentPolicies, checkExtenderRBAC, checkLeaseRBAC,
				checkDeploymentArgs, checkNodeAgentDaemonSet, checkExtenderHA, checkMonitoring,
				checkShadowExtender, checkNetworkPolicies, checkResourceName,
			} {
				check(t, r, w, objs)
			}
			var crds []string
			for _, o := range ofKind(objs, "CustomResourceDefinition") {
				crds = append(crds, o.GetName())
			}
			slices.Sort(crds)
			if want := []string{"groupplans.gputopo.io", "nodegputopologies.gputopo.io"}; !slices.Equal(crds, want) {
				t.Errorf("rendered CRDs %v, want %v (from crds/)", crds, want)
			}
		})
	}
}

func checkSchedulerConfig(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	cfg, err := harness.ParseSchedulerConfig(configData(t, objs, fn+"-scheduler", "config.yaml"))
	if err != nil {
		t.Fatalf("scheduler ConfigMap: %v", err)
	}
	if got := len(cfg.Profiles); got != 1 || cfg.Profiles[0].SchedulerName == nil || *cfg.Profiles[0].SchedulerName != v1alpha1.DefaultSchedulerName {
		t.Errorf("profiles = %s, want one named %s", mustYAML(cfg.Profiles), v1alpha1.DefaultSchedulerName)
	}
	le := cfg.LeaderElection
	if le.LeaderElect == nil || !*le.LeaderElect || le.ResourceName != fn+"-scheduler" || le.ResourceNamespace != r.namespace {
		t.Errorf("leaderElection = %s, want its own Lease %s/%s-scheduler", mustYAML(le), r.namespace, fn)
	}
	wantExt := []schedconfigv1.Extender{{
		URLPrefix:        fmt.Sprintf("%s://%s-extender.%s.svc:8080/scheduler", scheme(w), fn, r.namespace),
		FilterVerb:       "filter",
		PrioritizeVerb:   "prioritize",
		BindVerb:         "bind",
		PreemptVerb:      "preempt",
		Weight:           10,
		EnableHTTPS:      w.tls,
		HTTPTimeout:      metav1.Duration{Duration: w.httpTimeout},
		NodeCacheCapable: true,
		ManagedResources: []schedconfigv1.ExtenderManagedResource{{Name: w.resourceName, IgnoredByScheduler: false}},
		Ignorable:        w.ignorable,
	}}
	if w.claimPods {
		wantExt[0].ManagedResources = nil
	}
	if w.tls {
		// Files of the client Secret; checkExtenderTLS checks the mount.
		dir := "/etc/kubernetes/gputopo-scheduler-tls/"
		wantExt[0].TLSConfig = &schedconfigv1.ExtenderTLSConfig{CertFile: dir + "tls.crt", KeyFile: dir + "tls.key", CAFile: dir + "ca.crt"}
	}
	if diff := cmp.Diff(wantExt, cfg.Extenders); diff != "" {
		t.Errorf("scheduler extenders (-want +got):\n%s", diff)
	}
}

// scheme of the extender's verbs port.
func scheme(w want) string {
	if w.tls {
		return "https"
	}
	return "http"
}

func checkExtenderConfig(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	checkExtenderConfigMap(t, objs, r.fullname()+"-extender", w.weights, w.prometheus, w.resourceName)
}

// checkExtenderConfigMap parses the ExtenderConfiguration in ConfigMap name
// as the extender does: it must have the weights, the telemetry source
// (prometheus, with the chart's defaults equal to the extender's, when
// prometheus is not nil) and otherwise the extender's own defaults.
// placementWeights are the extender's default weights (the placement
// profile), in want.weights order.
func placementWeights() [7]int32 {
	return weightsOf(configv1alpha1.DefaultExtenderConfiguration().Weights)
}

func weightsOf(w configv1alpha1.Weights) [7]int32 {
	return [7]int32{*w.UtilizationBalance, *w.TaskAffinity, *w.ThermalPowerHeadroom, *w.Fragmentation,
		*w.BandwidthFit, *w.CapabilityConservation, *w.IslandBestFit}
}

func withFragmentation(w [7]int32, f int32) [7]int32 {
	w[3] = f
	return w
}

func checkExtenderConfigMap(t *testing.T, objs []*unstructured.Unstructured, name string, weights [7]int32, prometheus *configv1alpha1.PrometheusTelemetry, resourceName string) {
	t.Helper()
	cfg, err := configv1alpha1.ParseExtender(configData(t, objs, name, "config.yaml"))
	if err != nil {
		t.Fatalf("ConfigMap %s is refused by the extender: %v", name, err)
	}
	got := weightsOf(cfg.Weights)
	if got != weights {
		t.Errorf("%s: weights = %v, want %v", name, got, weights)
	}
	def := configv1alpha1.DefaultExtenderConfiguration()
	if prometheus != nil {
		p := *prometheus
		def = &configv1alpha1.ExtenderConfiguration{Telemetry: configv1alpha1.Telemetry{Source: configv1alpha1.TelemetryPrometheus, Prometheus: &p}}
		configv1alpha1.SetExtenderDefaults(def)
	}
	if cfg.ResourceName != resourceName {
		t.Errorf("%s: resourceName = %q, want %q", name, cfg.ResourceName, resourceName)
	}
	// Everything but the weights and the resource name is the extender's
	// own default.
	def.Weights, def.ResourceName = cfg.Weights, cfg.ResourceName
	if diff := cmp.Diff(def, cfg); diff != "" {
		t.Errorf("%s: configuration beyond weights differs from the extender's defaults (-defaults +rendered):\n%s", name, diff)
	}
}

func checkWebhookConfig(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	cfg, err := configv1alpha1.ParseWebhook(configData(t, objs, fn+"-webhook", "config.yaml"))
	if err != nil {
		t.Fatalf("webhook ConfigMap is refused by the webhook: %v", err)
	}
	// The users allowed to write system annotations are the chart's own
	// service accounts, whatever the release is called.
	users := []string{
		"system:serviceaccount:" + r.namespace + ":" + find(t, objs, "ServiceAccount", fn+"-extender").GetName(),
		"system:serviceaccount:" + r.namespace + ":" + find(t, objs, "ServiceAccount", fn+"-nodeagent").GetName(),
	}
	users = append(users, w.extraSystemUsers...)
	if diff := cmp.Diff(users, cfg.SystemServiceAccounts); diff != "" {
		t.Errorf("systemServiceAccounts (-want +got):\n%s", diff)
	}
	excluded := append([]string{"kube-system", r.namespace}, w.excludedNamespaces...)
	if diff := cmp.Diff(excluded, cfg.ExcludedNamespaces); diff != "" {
		t.Errorf("excludedNamespaces (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(w.modelPolicy, cfg.PolicyTable.Model); diff != "" {
		t.Errorf("policyTable.model (-want +got):\n%s", diff)
	}
	def := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	if diff := cmp.Diff(def.Data, cfg.PolicyTable.Data); diff != "" {
		t.Errorf("policyTable.data differs from the webhook default (-want +got):\n%s", diff)
	}
	if cfg.SchedulerName != v1alpha1.DefaultSchedulerName {
		t.Errorf("schedulerName = %q, want %q", cfg.SchedulerName, v1alpha1.DefaultSchedulerName)
	}
}

// The chart's webhook configurations are webhook.Registration's, field for
// field; only the CA bundle is left to cert-manager's injector.
func checkWebhookRegistration(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	wantM, wantV, err := webhook.Registration(webhook.RegistrationOptions{
		Name: fn + "-webhook", ServiceName: fn + "-webhook", ServiceNamespace: r.namespace,
		ExcludedNamespaces: append([]string{"kube-system"}, w.excludedNamespaces...), TimeoutSeconds: w.timeoutSeconds,
		ResourceName: w.resourceName,
	})
	if err != nil {
		t.Fatalf("webhook.Registration: %v", err)
	}
	injectFrom := r.namespace + "/" + fn + "-webhook"
	var gotM admissionregistrationv1.MutatingWebhookConfiguration
	into(t, find(t, objs, "MutatingWebhookConfiguration", fn+"-webhook"), &gotM)
	var gotV admissionregistrationv1.ValidatingWebhookConfiguration
	into(t, find(t, objs, "ValidatingWebhookConfiguration", fn+"-webhook"), &gotV)
	for _, meta := range []*metav1.ObjectMeta{&gotM.ObjectMeta, &gotV.ObjectMeta} {
		if got := meta.Annotations["cert-manager.io/inject-ca-from"]; got != injectFrom {
			t.Errorf("%s: cert-manager.io/inject-ca-from = %q, want %q", meta.Name, got, injectFrom)
		}
		meta.Annotations, meta.Labels = nil, nil
	}
	if diff := cmp.Diff(wantM, &gotM); diff != "" {
		t.Errorf("MutatingWebhookConfiguration differs from webhook.Registration (-code +chart):\n%s", diff)
	}
	if diff := cmp.Diff(wantV, &gotV); diff != "" {
		t.Errorf("ValidatingWebhookConfiguration differs from webhook.Registration (-code +chart):\n%s", diff)
	}
	for _, h := range gotM.Webhooks {
		if *h.FailurePolicy != admissionregistrationv1.Fail || *h.TimeoutSeconds > webhook.MaxTimeoutSeconds {
			t.Errorf("webhook %s: failurePolicy %s timeout %d; want Fail and at most %d", h.Name, *h.FailurePolicy, *h.TimeoutSeconds, webhook.MaxTimeoutSeconds)
		}
	}
}

func checkCertificates(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	cert := find(t, objs, "Certificate", fn+"-webhook")
	svc := fn + "-webhook"
	find(t, objs, "Service", svc)
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	wantDNS := []string{svc, svc + "." + r.namespace, svc + "." + r.namespace + ".svc", svc + "." + r.namespace + ".svc.cluster.local"}
	if diff := cmp.Diff(wantDNS, dns); diff != "" {
		t.Errorf("serving certificate dnsNames (-want +got):\n%s", diff)
	}
	issuer, _, _ := unstructured.NestedStringMap(cert.Object, "spec", "issuerRef")
	if diff := cmp.Diff(map[string]string{"name": w.issuerName, "kind": w.issuerKind, "group": "cert-manager.io"}, issuer); diff != "" {
		t.Errorf("serving certificate issuerRef (-want +got):\n%s", diff)
	}
	// The webhook mounts the Secret the Certificate writes.
	secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	var dep appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-webhook"), &dep)
	if !slices.ContainsFunc(dep.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == secret }) {
		t.Errorf("webhook Deployment does not mount Secret %q of its Certificate", secret)
	}
	if w.ownCA {
		ca := find(t, objs, "Certificate", fn+"-ca")
		if isCA, _, _ := unstructured.NestedBool(ca.Object, "spec", "isCA"); !isCA {
			t.Errorf("Certificate %s-ca: isCA is not true", fn)
		}
		caIssuer := find(t, objs, "Issuer", fn+"-ca")
		caSecret, _, _ := unstructured.NestedString(ca.Object, "spec", "secretName")
		if got, _, _ := unstructured.NestedString(caIssuer.Object, "spec", "ca", "secretName"); got != caSecret {
			t.Errorf("CA Issuer uses Secret %q, the CA Certificate writes %q", got, caSecret)
		}
		self := find(t, objs, "Issuer", fn+"-selfsigned")
		if _, ok, _ := unstructured.NestedMap(self.Object, "spec", "selfSigned"); !ok {
			t.Errorf("Issuer %s-selfsigned is not selfSigned", fn)
		}
	} else if n := len(ofKind(objs, "Issuer")); n != 0 {
		t.Errorf("with an existing issuer the chart rendered %d Issuers, want none", n)
	}
}

func checkNodeAgentRBAC(t *testing.T, r release, _ want, objs []*unstructured.Unstructured) {
	var role rbacv1.ClusterRole
	into(t, find(t, objs, "ClusterRole", r.fullname()+"-nodeagent"), &role)
	if diff := cmp.Diff(nodeagent.RBACRules(), role.Rules); diff != "" {
		t.Errorf("node agent ClusterRole differs from nodeagent.RBACRules (-code +chart):\n%s", diff)
	}
	checkBoundTo(t, r, objs, "ClusterRoleBinding", r.fullname()+"-nodeagent", "ClusterRole", r.fullname()+"-nodeagent")
}

// The chart's admission policies for the node agent are
// nodeagent.AdmissionPolicies', field for field, bound to the agent's
// service account.
func checkNodeAgentPolicies(t *testing.T, r release, _ want, objs []*unstructured.Unstructured) {
	name := r.fullname() + "-nodeagent"
	policies, bindings, err := nodeagent.AdmissionPolicies(nodeagent.PolicyOptions{Name: name, Namespace: r.namespace, ServiceAccount: name})
	if err != nil {
		t.Fatalf("nodeagent.AdmissionPolicies: %v", err)
	}
	if got, want := len(ofKind(objs, "ValidatingAdmissionPolicy")), len(policies); got != want {
		t.Errorf("rendered %d ValidatingAdmissionPolicies, want %d", got, want)
	}
	for _, want := range policies {
		var got admissionregistrationv1.ValidatingAdmissionPolicy
		into(t, find(t, objs, "ValidatingAdmissionPolicy", want.Name), &got)
		got.Labels = nil
		if diff := cmp.Diff(want, &got); diff != "" {
			t.Errorf("ValidatingAdmissionPolicy %s differs from nodeagent.AdmissionPolicies (-code +chart):\n%s", want.Name, diff)
		}
	}
	for _, want := range bindings {
		var got admissionregistrationv1.ValidatingAdmissionPolicyBinding
		into(t, find(t, objs, "ValidatingAdmissionPolicyBinding", want.Name), &got)
		got.Labels = nil
		if diff := cmp.Diff(want, &got); diff != "" {
			t.Errorf("ValidatingAdmissionPolicyBinding %s differs from nodeagent.AdmissionPolicies (-code +chart):\n%s", want.Name, diff)
		}
	}
}

// The extender gets exactly what the extender's code says it uses: its
// ClusterRole is extender.ClusterRBACRules() and its Lease Role
// extender.LeaderElectionRBACRules(its --leader-election-id), each bound to
// the extender's service account and nothing else.
func checkExtenderRBAC(t *testing.T, r release, _ want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	var role rbacv1.ClusterRole
	into(t, find(t, objs, "ClusterRole", fn+"-extender"), &role)
	if diff := cmp.Diff(extender.ClusterRBACRules(), role.Rules); diff != "" {
		t.Errorf("extender ClusterRole differs from extender.ClusterRBACRules (-code +chart):\n%s", diff)
	}
	var lease rbacv1.Role
	into(t, find(t, objs, "Role", fn+"-extender"), &lease)
	if diff := cmp.Diff(extender.LeaderElectionRBACRules(fn+"-extender"), lease.Rules); diff != "" {
		t.Errorf("extender Role differs from extender.LeaderElectionRBACRules (-code +chart):\n%s", diff)
	}
	checkBoundTo(t, r, objs, "ClusterRoleBinding", fn+"-extender", "ClusterRole", fn+"-extender")
	checkBoundTo(t, r, objs, "RoleBinding", fn+"-extender", "Role", fn+"-extender")
	// extender.RBACRules, what the component tests grant in one
	// ClusterRole, is the same set of permissions on any Lease.
	all := append(extender.ClusterRBACRules(), rbacv1.PolicyRule{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "create", "update"}})
	if diff := cmp.Diff(all, extender.RBACRules()); diff != "" {
		t.Errorf("extender.RBACRules is not ClusterRBACRules plus the Lease verbs (-want +got):\n%s", diff)
	}
}

// checkBoundTo: the binding name of kind binds role roleKind/roleName to
// the service account of the same name as the binding, and to nobody else.
func checkBoundTo(t *testing.T, r release, objs []*unstructured.Unstructured, kind, name, roleKind, roleName string) {
	t.Helper()
	var b rbacv1.RoleBinding // same fields as a ClusterRoleBinding
	u := find(t, objs, kind, name).DeepCopy()
	u.SetKind("RoleBinding")
	into(t, u, &b)
	wantSubjects := []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: r.namespace}}
	if b.RoleRef.Kind != roleKind || b.RoleRef.Name != roleName || !cmp.Equal(wantSubjects, b.Subjects) {
		t.Errorf("%s %s binds %s %s to %s; want %s %s to %s", kind, name, b.RoleRef.Kind, b.RoleRef.Name, mustYAML(b.Subjects), roleKind, roleName, mustYAML(wantSubjects))
	}
	find(t, objs, "ServiceAccount", name)
}

// Each leader-elected component may renew exactly the Lease its flags or
// configuration name.
func checkLeaseRBAC(t *testing.T, r release, _ want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	for _, lease := range []string{fn + "-scheduler"} {
		var role rbacv1.Role
		into(t, find(t, objs, "Role", lease), &role)
		wantRules := []rbacv1.PolicyRule{
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{lease}, Verbs: []string{"get", "update"}},
		}
		if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
			t.Errorf("Role %s (-want +got):\n%s", lease, diff)
		}
		if role.Namespace != r.namespace {
			t.Errorf("Role %s in namespace %q, want %q", lease, role.Namespace, r.namespace)
		}
	}
	var dep appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-extender"), &dep)
	args := dep.Spec.Template.Spec.Containers[0].Args
	for _, a := range []string{"--leader-elect=true", "--leader-election-namespace=" + r.namespace, "--leader-election-id=" + fn + "-extender",
		"--kube-api-qps=50", "--kube-api-burst=100"} {
		if !slices.Contains(args, a) {
			t.Errorf("extender args %q lack %q", args, a)
		}
	}
	want := map[string][]string{
		fn + "-scheduler-kube-scheduler":   {"ClusterRole", "system:kube-scheduler"},
		fn + "-scheduler-volume-scheduler": {"ClusterRole", "system:volume-scheduler"},
	}
	for name, ref := range want {
		var b rbacv1.ClusterRoleBinding
		into(t, find(t, objs, "ClusterRoleBinding", name), &b)
		if b.RoleRef.Kind != ref[0] || b.RoleRef.Name != ref[1] || len(b.Subjects) != 1 || b.Subjects[0].Name != fn+"-scheduler" || b.Subjects[0].Namespace != r.namespace {
			t.Errorf("ClusterRoleBinding %s = %s", name, mustYAML(b))
		}
	}
}

// Every container's arguments parse with the gputopo command itself: a
// renamed or removed flag, or a wrong subcommand, fails here, not in a
// crash-looping pod.
func checkDeploymentArgs(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	containers := []struct{ kind, name, subcommand, image string }{
		{"Deployment", fn + "-webhook", "webhook", w.image},
		{"Deployment", fn + "-extender", "extender", w.image},
		{"DaemonSet", fn + "-nodeagent", "nodeagent", w.image},
	}
	if w.shadow {
		containers = append(containers, struct{ kind, name, subcommand, image string }{"Deployment", fn + "-extender-shadow", "extender", w.shadowImage})
	}
	for _, c := range containers {
		var spec corev1.PodSpec
		switch c.kind {
		case "Deployment":
			var d appsv1.Deployment
			into(t, find(t, objs, c.kind, c.name), &d)
			spec = d.Spec.Template.Spec
		default:
			var d appsv1.DaemonSet
			into(t, find(t, objs, c.kind, c.name), &d)
			spec = d.Spec.Template.Spec
		}
		ctr := spec.Containers[0]
		if ctr.Image != c.image {
			t.Errorf("%s %s: image %q, want %q", c.kind, c.name, ctr.Image, c.image)
		}
		if len(ctr.Command) != 0 {
			t.Errorf("%s %s: command %q overrides the image's entrypoint", c.kind, c.name, ctr.Command)
		}
		root := app.NewCommand(context.Background())
		sub, rest, err := root.Find(ctr.Args)
		if err != nil || sub.Name() != c.subcommand {
			t.Errorf("%s %s: args %q do not select `gputopo %s` (got %q, %v)", c.kind, c.name, ctr.Args, c.subcommand, sub.Name(), err)
			continue
		}
		if err := sub.ParseFlags(rest); err != nil {
			t.Errorf("%s %s: args %q do not parse with `gputopo %s` flags: %v", c.kind, c.name, ctr.Args, c.subcommand, err)
		}
		if n := sub.Flags().NArg(); n != 0 {
			t.Errorf("%s %s: stray arguments %q", c.kind, c.name, sub.Flags().Args())
		}
	}
	var sched appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-scheduler"), &sched)
	ctr := sched.Spec.Template.Spec.Containers[0]
	if ctr.Image != w.schedulerImage {
		t.Errorf("scheduler image %q, want %q", ctr.Image, w.schedulerImage)
	}
	if !slices.Contains(ctr.Command, "--config=/etc/kubernetes/gputopo-scheduler/config.yaml") {
		t.Errorf("scheduler command %q does not read the mounted configuration", ctr.Command)
	}
}

func checkNodeAgentDaemonSet(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	var ds appsv1.DaemonSet
	into(t, find(t, objs, "DaemonSet", r.fullname()+"-nodeagent"), &ds)
	spec := ds.Spec.Template.Spec
	// GFD's label or NFD's: two ORed node affinity terms.
	var labels []string
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				if e.Operator == corev1.NodeSelectorOpIn && slices.Equal(e.Values, []string{"true"}) {
					labels = append(labels, e.Key)
				}
			}
		}
	}
	if !slices.Equal(labels, []string{"nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"}) || len(spec.NodeSelector) != 0 {
		t.Errorf("node agent selects nodes by affinity labels %v and nodeSelector %v; want GFD's or NFD's label, no nodeSelector", labels, spec.NodeSelector)
	}
	ctr := spec.Containers[0]
	env := map[string]corev1.EnvVar{}
	for _, e := range ctr.Env {
		env[e.Name] = e
	}
	if e := env["NODE_NAME"]; e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME env = %+v, want fieldRef spec.nodeName", e)
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	// kubelet's device plugin directory is fixed whatever its root dir;
	// the PodResources socket follows the root dir.
	for _, p := range []string{"/var/lib/kubelet/device-plugins", w.kubeletRoot + "/pod-resources"} {
		if !slices.Contains(mapsValues(hostPaths), p) {
			t.Errorf("node agent hostPath volumes %v lack %s", hostPaths, p)
		}
	}
	for _, a := range []string{"--device-plugin-dir=/var/lib/kubelet/device-plugins", "--pod-resources-socket=" + w.kubeletRoot + "/pod-resources/kubelet.sock"} {
		if !slices.Contains(ctr.Args, a) {
			t.Errorf("node agent args %q lack %q", ctr.Args, a)
		}
	}
	if slices.ContainsFunc(ctr.Args, func(a string) bool { return strings.HasPrefix(a, "--simulate") }) {
		t.Errorf("node agent simulates GPUs by default: %q", ctr.Args)
	}
	privileged := ctr.SecurityContext != nil && ptr.Deref(ctr.SecurityContext.Privileged, false)
	if privileged != w.privilegedAgent {
		t.Errorf("node agent privileged = %v, want %v", privileged, w.privilegedAgent)
	}
	if !w.privilegedAgent && (spec.RuntimeClassName == nil || *spec.RuntimeClassName != "nvidia" || env["NVIDIA_VISIBLE_DEVICES"].Value != "all") {
		t.Errorf("node agent without privileges must run with runtimeClassName nvidia and NVIDIA_VISIBLE_DEVICES=all; got %v %+v", spec.RuntimeClassName, env["NVIDIA_VISIBLE_DEVICES"])
	}
}

func mapsValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

func checkExtenderHA(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	var dep appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-extender"), &dep)
	// Only the leader is Ready: a rolling update would wait forever for a
	// new replica to become Ready while an old one leads.
	if dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("extender Deployment strategy %q, want Recreate (only the Lease holder is Ready)", dep.Spec.Strategy.Type)
	}
	if ptr.Deref(dep.Spec.Replicas, 0) != w.extenderReplicas {
		t.Errorf("extender replicas = %d, want %d", ptr.Deref(dep.Spec.Replicas, 0), w.extenderReplicas)
	}
	aa := dep.Spec.Template.Spec.Affinity
	if aa == nil || aa.PodAntiAffinity == nil || len(aa.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution)+len(aa.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Errorf("extender has no pod anti-affinity: %s", mustYAML(aa))
	}
	var pdb policyv1.PodDisruptionBudget
	into(t, find(t, objs, "PodDisruptionBudget", fn+"-extender"), &pdb)
	if diff := cmp.Diff(dep.Spec.Selector, pdb.Spec.Selector); diff != "" {
		t.Errorf("extender PDB selects other pods than the Deployment (-deployment +pdb):\n%s", diff)
	}
	// The scheduler calls the Service; it must reach the verbs port, and
	// readiness must be the extender's leader-aware /readyz.
	var svc corev1.Service
	into(t, find(t, objs, "Service", fn+"-extender"), &svc)
	if diff := cmp.Diff(dep.Spec.Template.Labels, svc.Spec.Selector); diff != "" {
		t.Errorf("extender Service selector (-pod labels +selector):\n%s", diff)
	}
	ctr := dep.Spec.Template.Spec.Containers[0]
	if p := ctr.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		t.Errorf("extender readiness probe = %s, want GET /readyz", mustYAML(p))
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != extender.DefaultPort || svc.Spec.Ports[0].TargetPort.StrVal != scheme(w) ||
		!slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool {
			return p.Name == scheme(w) && p.ContainerPort == extender.DefaultPort
		}) {
		t.Errorf("extender Service ports = %s, container ports %s; want %d -> %s", mustYAML(svc.Spec.Ports), mustYAML(ctr.Ports), extender.DefaultPort, scheme(w))
	}
}

func checkMonitoring(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	if got := len(ofKind(objs, "ServiceMonitor")); got != w.serviceMonitors {
		t.Errorf("rendered %d ServiceMonitors, want %d", got, w.serviceMonitors)
	}
	// Every ServiceMonitor selects exactly one rendered Service, which has
	// the port it scrapes.
	for _, sm := range ofKind(objs, "ServiceMonitor") {
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		port := eps[0].(map[string]any)["port"]
		var matched []string
		for _, s := range ofKind(objs, "Service") {
			if labelsMatch(sel, s.GetLabels()) {
				matched = append(matched, s.GetName())
				ports, _, _ := unstructured.NestedSlice(s.Object, "spec", "ports")
				if !slices.ContainsFunc(ports, func(p any) bool { return p.(map[string]any)["name"] == port }) {
					t.Errorf("ServiceMonitor %s scrapes port %v that Service %s lacks", sm.GetName(), port, s.GetName())
				}
			}
		}
		if len(matched) != 1 {
			t.Errorf("ServiceMonitor %s selects Services %v, want exactly one", sm.GetName(), matched)
		}
	}
	cm := find(t, objs, "ConfigMap", r.fullname()+"-dashboard")
	dash, _, _ := unstructured.NestedString(cm.Object, "data", "gputopo.json")
	var parsed map[string]any
	if err := yaml.Unmarshal([]byte(dash), &parsed); err != nil || parsed["panels"] == nil {
		t.Fatalf("dashboard is not a Grafana dashboard JSON: %v", err)
	}
	for _, metric := range []string{
		"gputopo_extender_scheduling_latency_seconds", "gputopo_extender_filter_results_total", "gputopo_extender_prioritize_scores",
		"gputopo_extender_gpu_utilization_percent", "gputopo_extender_errors_total", "gputopo_extender_placements_total",
	} {
		if !strings.Contains(dash, metric) {
			t.Errorf("dashboard does not chart %s", metric)
		}
	}
}

func labelsMatch(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Bad values stop helm with a message that names the value and the fix,
// before anything reaches the cluster. These are the templates' own
// checks, run with --skip-schema-validation: values.schema.json refuses
// the wrong types, names and ranges among them first
// (TestChartSchemaRefusesUnknownAndMistypedValues), and the checks still
// stand where helm is told to skip it.
func TestChartRefusesBadValues(t *testing.T) {
	for name, tc := range map[string]struct {
		values, want string
	}{
		"webhook timeout above 5 seconds": {"webhook: {timeoutSeconds: 9}", "webhook.timeoutSeconds: 9 is out of range; must be between 1 and 5"},
		"unknown NVML access mode":        {"nodeAgent: {nvmlAccess: hostPath}", `nodeAgent.nvmlAccess: "hostPath" is not supported; use runtimeClass or privileged`},
		"unknown anti-affinity":           {"extender: {antiAffinity: always}", `extender.antiAffinity: "always" is not supported; use soft or hard`},
		"issuer of an unknown kind":       {"certManager: {issuer: {name: x, kind: Vault}}", `certManager.issuer.kind: "Vault" is not supported; use Issuer or ClusterIssuer`},
		"webhook and scheduler disagree":  {"scheduler: {schedulerName: other}", `webhook.schedulerName ("gputopo-scheduler") must equal scheduler.schedulerName ("other")`},
		"no extender":                     {"extender: {replicas: 0}", "extender.replicas: must be at least 1"},
		"Prometheus telemetry without a URL": {"extender: {telemetry: {source: prometheus}}",
			"extender.telemetry.prometheus.url: required with telemetry.source prometheus"},
		"unknown telemetry source": {"extender: {telemetry: {source: dcgm}}",
			`extender.telemetry.source: "dcgm" is not supported; use nodeGPUTopology or prometheus`},
		"shadow overrides with an unknown telemetry source": {"shadowExtender: {enabled: true, overrides: {telemetry: {source: dcgm}}}",
			`shadowExtender.overrides.telemetry.source: "dcgm" is not supported; use nodeGPUTopology or prometheus`},
		"mirroring more than every pod": {`extender: {shadow: {url: "http://shadow:8080", sampleRate: 2}}`,
			"extender.shadow.sampleRate: 2 is out of range; must be between 0 and 1"},
		"shadow log sample rate below 0": {"shadowExtender: {enabled: true, logSampleRate: -0.5}",
			"shadowExtender.logSampleRate: -0.5 is out of range; must be between 0 and 1"},
		"shadow without replicas": {"shadowExtender: {enabled: true, replicas: 0}",
			"shadowExtender.replicas: must be at least 1 while shadowExtender.enabled is true"},
		"GPU resource name without a domain": {"gpuResourceName: gpu",
			`gpuResourceName: "gpu" is not an extended resource name; use a domain-prefixed name such as nvidia.com/gpu`},
		"GPU resource name in the kubernetes.io namespace": {"gpuResourceName: kubernetes.io/gpu",
			`gpuResourceName: "kubernetes.io/gpu" is reserved for Kubernetes' own resources`},
		"deprecated resource name alias naming another resource": {"gpuResourceName: example.com/gpu\nnodeAgent: {resourceName: other.example/gpu}",
			`nodeAgent.resourceName ("other.example/gpu") and gpuResourceName ("example.com/gpu") differ`},
		"scraper peers that are not a list": {"networkPolicy: {enabled: true, metricsFrom: {namespaceSelector: {}}}",
			"networkPolicy.metricsFrom: must be a list of NetworkPolicyPeers"},
		"unknown scheduler mode": {"scheduler: {mode: inprocess}",
			`scheduler.mode: "inprocess" is not supported; use extender`},
		"plugin mode with a shadow": {"scheduler: {mode: plugin}\nshadowExtender: {enabled: true}",
			"the shadow mirrors the extender's verbs and needs scheduler.mode extender"},
		"negative API client rate": {"extender: {kubeAPIQPS: -5}",
			"extender.kubeAPIQPS: -5 must be 0 (the in-cluster client's default) or positive"},
		"plugin mode without a scheduler": {"scheduler: {mode: plugin, replicas: 0}",
			"scheduler.replicas: must be at least 1 in plugin mode"},
	} {
		t.Run(name, func(t *testing.T) {
			rel := release{name: "gputopo", namespace: "gputopo-system", values: tc.values}
			out, err := rel.helm(t, "template", rel.name, chartDir(), "--namespace", rel.namespace, "--kube-version", kubeVersion, "--skip-schema-validation")
			if err == nil {
				t.Fatalf("helm template accepted %q:\n%.400s", tc.values, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

// certs/ holds the chart's cert-manager objects for the default release,
// for installs without Helm; the two must not drift apart.
func TestCertsDirMatchesChart(t *testing.T) {
	objs := defaultRelease.render(t)
	dir := filepath.Join(harness.RepoRoot(), "certs")
	certsObjs := loadKustomization(t, dir)
	key := func(u *unstructured.Unstructured) string {
		return u.GetKind() + "/" + u.GetNamespace() + "/" + u.GetName()
	}
	fromChart := map[string]any{}
	for _, o := range objs {
		if strings.HasSuffix(o.GetAPIVersion(), "cert-manager.io/v1") {
			fromChart[key(o)] = o.Object["spec"]
		}
	}
	fromCerts := map[string]any{}
	for _, o := range certsObjs {
		if o.GetKind() == "Namespace" {
			if o.GetName() != defaultRelease.namespace {
				t.Errorf("certs/ creates namespace %q, want %q", o.GetName(), defaultRelease.namespace)
			}
			continue
		}
		fromCerts[key(o)] = o.Object["spec"]
	}
	if len(fromChart) != 6 {
		t.Fatalf("chart renders %d cert-manager objects, want 6 (self-signed Issuer, CA Certificate, CA Issuer, webhook and extender serving Certificates, scheduler client Certificate)", len(fromChart))
	}
	if diff := cmp.Diff(fromChart, fromCerts); diff != "" {
		t.Errorf("certs/ differs from the chart's default cert-manager objects (-chart +certs):\n%s", diff)
	}
}

// kustomization is the part of kustomize's format certs/ uses.
type kustomization struct {
	APIVersion string           `json:"apiVersion"`
	Kind       string           `json:"kind"`
	Namespace  string           `json:"namespace"`
	Labels     []map[string]any `json:"labels"`
	Resources  []string         `json:"resources"`
}

// loadKustomization reads the resources a kustomization lists, with its
// namespace applied, as `kubectl apply -k` would.
func loadKustomization(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatalf("read kustomization: %v", err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("certs/kustomization.yaml uses more than namespace, labels and resources: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Fatalf("certs/kustomization.yaml: apiVersion %q kind %q", k.APIVersion, k.Kind)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read certs/: %v", err)
	}
	for _, e := range entries {
		n := e.Name()
		if strings.HasSuffix(n, ".yaml") && n != "kustomization.yaml" && !slices.Contains(k.Resources, n) {
			t.Errorf("certs/%s is not listed in kustomization.yaml resources", n)
		}
	}
	var out []*unstructured.Unstructured
	for _, res := range k.Resources {
		b, err := os.ReadFile(filepath.Join(dir, res))
		if err != nil {
			t.Fatalf("kustomization resource: %v", err)
		}
		objs, err := decodeObjects(b)
		if err != nil {
			t.Fatalf("certs/%s: %v", res, err)
		}
		for _, o := range objs {
			if o.GetKind() != "Namespace" && k.Namespace != "" {
				if o.GetNamespace() != "" && o.GetNamespace() != k.Namespace {
					t.Errorf("certs/%s: %s %s in namespace %q, kustomization says %q", res, o.GetKind(), o.GetName(), o.GetNamespace(), k.Namespace)
				}
				o.SetNamespace(k.Namespace)
			}
		}
		out = append(out, objs...)
	}
	return out
}
