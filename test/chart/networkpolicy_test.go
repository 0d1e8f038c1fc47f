//go:build integration

package chart

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// peer is a pod that opens a connection.
type peer struct {
	namespace string
	podLabels map[string]string
}

// admits evaluates NetworkPolicy ingress semantics: a pod selected by no
// policy takes everything; a selected pod takes a connection when some
// ingress rule of a selecting policy lists the port (or no ports) and
// names the peer (or no peers). A podSelector without namespaceSelector
// means the policy's namespace; a namespaceSelector matches the
// namespace's kubernetes.io/metadata.name label. ipBlocks name no pod.
func admits(t *testing.T, pols []networkingv1.NetworkPolicy, ns string, pod map[string]string, port int32, from peer) bool {
	t.Helper()
	sel := func(s *metav1.LabelSelector, l map[string]string) bool {
		ls, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			t.Fatalf("selector %v: %v", s, err)
		}
		return ls.Matches(labels.Set(l))
	}
	isolated := false
	for _, p := range pols {
		if p.Namespace != ns || !sel(&p.Spec.PodSelector, pod) {
			continue
		}
		isolated = true
		for _, rule := range p.Spec.Ingress {
			portOK := len(rule.Ports) == 0
			for _, rp := range rule.Ports {
				if rp.Port == nil || rp.Port.IntValue() == int(port) {
					portOK = true
				}
			}
			if !portOK {
				continue
			}
			if len(rule.From) == 0 {
				return true
			}
			for _, f := range rule.From {
				if f.IPBlock != nil {
					continue
				}
				nsOK := from.namespace == p.Namespace
				if f.NamespaceSelector != nil {
					nsOK = sel(f.NamespaceSelector, map[string]string{"kubernetes.io/metadata.name": from.namespace})
				}
				podOK := f.PodSelector == nil || sel(f.PodSelector, from.podLabels)
				if nsOK && podOK {
					return true
				}
			}
		}
	}
	return !isolated
}

// checkNetworkPolicies: with networkPolicy.enabled only gputopo-scheduler
// (and the extenderFrom peers) reach the extender's verbs, only the
// serving extender reaches the shadow, only metricsFrom peers reach any
// metrics port, and anyone reaches the webhook. Without it no policy is
// rendered.
func checkNetworkPolicies(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	rendered := ofKind(objs, "NetworkPolicy")
	if !w.networkPolicy {
		if len(rendered) != 0 {
			t.Errorf("networkPolicy.enabled is false, yet %d NetworkPolicies are rendered", len(rendered))
		}
		return
	}
	pols := make([]networkingv1.NetworkPolicy, len(rendered))
	for i, u := range rendered {
		into(t, u, &pols[i])
	}
	fn := r.fullname()
	podLabels := func(kind, name string) map[string]string {
		if kind == "DaemonSet" {
			var d appsv1.DaemonSet
			into(t, find(t, objs, kind, name), &d)
			return d.Spec.Template.Labels
		}
		var d appsv1.Deployment
		into(t, find(t, objs, kind, name), &d)
		return d.Spec.Template.Labels
	}
	ns := r.namespace
	extender, scheduler := podLabels("Deployment", fn+"-extender"), podLabels("Deployment", fn+"-scheduler")
	webhook, agent := podLabels("Deployment", fn+"-webhook"), podLabels("DaemonSet", fn+"-nodeagent")
	var (
		fromScheduler  = peer{ns, scheduler}
		fromExtender   = peer{ns, extender}
		fromWebhook    = peer{ns, webhook}
		impostor       = peer{"team-a", scheduler} // the scheduler's labels in another namespace
		anyone         = peer{"team-a", map[string]string{"app": "x"}}
		prometheus     = peer{"monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}}
		grafana        = peer{"monitoring", map[string]string{"app.kubernetes.io/name": "grafana"}}
		kubeScheduler  = peer{"kube-system", map[string]string{"component": "kube-scheduler"}}
		verbs, metrics = int32(8080), int32(9090)
	)
	type conn struct {
		what      string
		pod       map[string]string
		port      int32
		from      peer
		wantAdmit bool
	}
	conns := []conn{
		{"gputopo-scheduler to the extender's verbs", extender, verbs, fromScheduler, true},
		{"the webhook to the extender's verbs", extender, verbs, fromWebhook, false},
		{"a pod with the scheduler's labels in another namespace to the extender's verbs", extender, verbs, impostor, false},
		{"any pod to the extender's verbs", extender, verbs, anyone, false},
		{"the cluster's kube-scheduler to the extender's verbs", extender, verbs, kubeScheduler, w.extenderFrom},
		{"Prometheus to the extender's verbs", extender, verbs, prometheus, false},
		{"Prometheus to the extender's metrics", extender, metrics, prometheus, w.scrapers},
		{"Prometheus to the scheduler's metrics", scheduler, 10259, prometheus, w.scrapers},
		{"Prometheus to the webhook's metrics", webhook, 8080, prometheus, w.scrapers},
		{"Prometheus to the node agent's metrics", agent, 9400, prometheus, w.scrapers},
		{"another pod of the monitoring namespace to the extender's metrics", extender, metrics, grafana, false},
		{"any pod to the extender's metrics", extender, metrics, anyone, false},
		{"any pod to the scheduler's metrics", scheduler, 10259, anyone, false},
		{"any pod to the node agent's metrics", agent, 9400, anyone, false},
		{"any pod (kube-apiserver) to the webhook", webhook, 9443, anyone, true},
		{"any pod to the webhook's metrics", webhook, 8080, anyone, false},
	}
	if w.shadow {
		shadow := podLabels("Deployment", fn+"-extender-shadow")
		conns = append(conns,
			conn{"the serving extender to the shadow's verbs", shadow, verbs, fromExtender, true},
			conn{"gputopo-scheduler to the shadow's verbs", shadow, verbs, fromScheduler, false},
			conn{"any pod to the shadow's verbs", shadow, verbs, anyone, false},
			conn{"Prometheus to the shadow's metrics", shadow, metrics, prometheus, w.scrapers},
		)
	}
	for _, c := range conns {
		if got := admits(t, pols, ns, c.pod, c.port, c.from); got != c.wantAdmit {
			t.Errorf("%s (port %d): admitted %v, want %v", c.what, c.port, got, c.wantAdmit)
		}
	}
	for _, p := range pols {
		if len(p.Spec.PolicyTypes) != 1 || p.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
			t.Errorf("NetworkPolicy %s policyTypes %v, want [Ingress] (egress is not restricted)", p.Name, p.Spec.PolicyTypes)
		}
	}
}
