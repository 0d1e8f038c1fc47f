//go:build integration

package security

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

const extenderUser = "gputopo-extender"

// tlsExtender is an extender replica serving its verbs over mutual TLS on
// the real control plane, with its certificates in a directory laid out
// as kubelet mounts a Secret.
type tlsExtender struct {
	x       *extender.Extender
	base    string // https://127.0.0.1:port
	ca      *harness.CA
	certDir string
}

// schedulerCN is the common name of gputopo-scheduler's client
// certificate, the one --client-allowed-names lets in (the chart renders
// its release's).
const schedulerCN = "gputopo-scheduler"

// startTLSExtender installs the extender's RBAC (extender.RBACRules), and
// runs an extender with --tls-cert-file, --tls-private-key-file,
// --client-ca-file and --client-allowed-names as the chart does.
func startTLSExtender(t *testing.T, cp *harness.ControlPlane) *tlsExtender {
	t.Helper()
	ctx := harness.Context(t)
	if _, err := cp.Clientset.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: extenderUser}, Rules: extender.RBACRules(),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRole: %v", err)
	}
	if _, err := cp.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: extenderUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: extenderUser},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: extenderUser}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRoleBinding: %v", err)
	}
	te := &tlsExtender{ca: harness.NewCA(t, "gputopo-ca"), certDir: filepath.Join(t.TempDir(), "extender-tls")}
	te.renew(t)
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	o := extender.NewOptions()
	o.BindAddress, o.Port, o.MetricsBindAddress = "127.0.0.1", port, "0"
	o.TLSCertFile = filepath.Join(te.certDir, "tls.crt")
	o.TLSPrivateKeyFile = filepath.Join(te.certDir, "tls.key")
	o.ClientCAFile = filepath.Join(te.certDir, "ca.crt")
	o.ClientAllowedNames = []string{schedulerCN}
	te.x = harness.StartExtender(t, klog.NewContext(context.Background(), klog.Background()), cp.UserConfig(t, extenderUser), o).Extender
	te.base = "https://127.0.0.1:" + strconv.Itoa(port)
	return te
}

// renew issues a new serving certificate into the Secret volume, as
// cert-manager does before the old one expires.
func (te *tlsExtender) renew(t *testing.T) {
	t.Helper()
	harness.WriteSecretVolume(t, te.certDir, te.ca.SecretData(t, harness.LeafSpec{
		CommonName: "gputopo-extender", DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, Usages: []string{"server auth"},
	}))
}

// client returns an HTTPS client that trusts the extender's CA and
// presents a client certificate signed by signer (nil: none) as the chart
// issues gputopo-scheduler's: its CN, for client auth.
func (te *tlsExtender) client(t *testing.T, signer *harness.CA) *http.Client {
	t.Helper()
	return te.clientWith(t, signer, harness.LeafSpec{CommonName: schedulerCN, Usages: []string{"client auth"}})
}

// clientWith is client with a certificate issued from spec.
func (te *tlsExtender) clientWith(t *testing.T, signer *harness.CA, spec harness.LeafSpec) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(te.ca.Cert)
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if signer != nil {
		crt, key := signer.Issue(t, spec)
		pair, err := tls.X509KeyPair(crt, key)
		if err != nil {
			t.Fatal(err)
		}
		// Sent whatever CAs the server asks for, as an attacker would.
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	tr := &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// post sends a verb and returns the status (0 when no HTTP answer came)
// and the body or the transport error.
func post(c *http.Client, url string, body any) (int, string) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := c.Post(url, "application/json", strings.NewReader(string(b)))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// gpuCluster creates GPU nodes with a DGX A100 topology each.
func gpuCluster(t *testing.T, cp *harness.ControlPlane, nodes map[string]map[string]string) {
	t.Helper()
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	for name, labels := range nodes {
		cp.CreateGPUNode(t, name, 8, labels)
		cp.PublishTopology(t, name, f)
	}
}

// As a client on the pod network: without a client certificate signed by
// the configured CA, no verb answers, under either path prefix.
func TestExtenderVerbsRefuseClientsWithoutCertificate(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	gpuCluster(t, cp, map[string]map[string]string{"gpu-a": nil})
	te := startTLSExtender(t, cp)
	pod := harness.GPUPod(metav1.NamespaceDefault, "victim", 2)
	pod.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	if err := cp.Client.Create(harness.Context(t), pod); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	args := extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"gpu-a"}}
	bind := extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: "gpu-a"}
	preempt := extenderv1.ExtenderPreemptionArgs{Pod: pod, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"gpu-a": {}}}
	verbs := map[string]any{"filter": args, "prioritize": args, "bind": bind, "preempt": preempt}

	stranger := harness.NewCA(t, "attacker-ca")
	for _, prefix := range []string{"", "/scheduler"} {
		for verb, body := range verbs {
			url := te.base + prefix + "/" + verb
			t.Run(fmt.Sprintf("%s without a client certificate", prefix+"/"+verb), func(t *testing.T) {
				status, msg := post(te.client(t, nil), url, body)
				if status != http.StatusUnauthorized || !strings.Contains(msg, "client certificate") {
					t.Errorf("POST %s = %d %q; want 401 asking for a client certificate", url, status, msg)
				}
			})
			t.Run(fmt.Sprintf("%s with a certificate of another CA", prefix+"/"+verb), func(t *testing.T) {
				// With TLS 1.3 the client may learn of the refusal as a
				// bad-certificate alert or as a broken connection when it
				// writes the request; either way no HTTP answer comes.
				status, msg := post(te.client(t, stranger), url, body)
				if status != 0 {
					t.Errorf("POST %s = %d %q; want the handshake refused, no HTTP answer", url, status, msg)
				}
			})
			t.Run(fmt.Sprintf("%s over plain HTTP", prefix+"/"+verb), func(t *testing.T) {
				status, msg := post(http.DefaultClient, strings.Replace(url, "https://", "http://", 1), body)
				if status == http.StatusOK {
					t.Errorf("plain HTTP POST %s = 200 %q; want refused", url, msg)
				}
			})
		}
	}
	got := &corev1.Pod{}
	if err := cp.Client.Get(harness.Context(t), client.ObjectKeyFromObject(pod), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "" {
		t.Fatalf("pod was bound to %s by an unauthenticated client", got.Spec.NodeName)
	}
	// The scheduler's certificate gets answers: the refusals above are
	// about the caller, not a broken server.
	if status, msg := post(te.client(t, te.ca), te.base+"/scheduler/filter", args); status != http.StatusOK || !strings.Contains(msg, "gpu-a") {
		t.Fatalf("filter with the scheduler's certificate = %d %q; want 200 passing gpu-a", status, msg)
	}
}

// As a holder of another certificate of the extender's own CA (one issued
// without usages, or to another name): the CA signed it, but it is not
// gputopo-scheduler's client certificate, so no verb answers it and no
// pod is bound. The scheduler's certificate still filters and binds.
func TestExtenderVerbsRefuseCertificatesOfTheCANotIssuedToTheScheduler(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	gpuCluster(t, cp, map[string]map[string]string{"gpu-a": nil})
	te := startTLSExtender(t, cp)
	ctx := harness.Context(t)
	pod := harness.GPUPod(metav1.NamespaceDefault, "victim", 2)
	pod.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	args := extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"gpu-a"}}
	bind := extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: "gpu-a"}
	preempt := extenderv1.ExtenderPreemptionArgs{Pod: pod, NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{"gpu-a": {}}}
	verbs := map[string]any{"filter": args, "prioritize": args, "bind": bind, "preempt": preempt}

	for _, tc := range []struct {
		name       string
		spec       harness.LeafSpec
		wantStatus int
		wantMsg    string
	}{{
		// Go's verification takes a leaf without extended key usages
		// as good for any usage; the handshake succeeds.
		name:       "a certificate of the CA with no extended key usage",
		spec:       harness.LeafSpec{CommonName: schedulerCN},
		wantStatus: http.StatusUnauthorized, wantMsg: "does not list the extended key usage client auth",
	}, {
		name:       "a client certificate of the CA for another name",
		spec:       harness.LeafSpec{CommonName: "gputopo-webhook", Usages: []string{"client auth"}},
		wantStatus: http.StatusForbidden, wantMsg: `CN "gputopo-webhook" is not allowed to call the verbs; --client-allowed-names allows "gputopo-scheduler"`,
	}} {
		c := te.clientWith(t, te.ca, tc.spec)
		for _, prefix := range []string{"", "/scheduler"} {
			for verb, body := range verbs {
				url := te.base + prefix + "/" + verb
				t.Run(tc.name+": "+prefix+"/"+verb, func(t *testing.T) {
					status, msg := post(c, url, body)
					var refusal struct{ Error string }
					_ = json.Unmarshal([]byte(msg), &refusal)
					if status != tc.wantStatus || !strings.Contains(refusal.Error, tc.wantMsg) {
						t.Errorf("POST %s = %d %q; want %d with an error containing %q", url, status, msg, tc.wantStatus, tc.wantMsg)
					}
				})
			}
		}
	}
	got := &corev1.Pod{}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "" {
		t.Fatalf("pod was bound to %s by a certificate that is not the scheduler's", got.Spec.NodeName)
	}

	scheduler := te.client(t, te.ca)
	if status, msg := post(scheduler, te.base+"/scheduler/filter", args); status != http.StatusOK || !strings.Contains(msg, "gpu-a") {
		t.Fatalf("filter with the scheduler's certificate = %d %q; want 200 passing gpu-a", status, msg)
	}
	status, msg := post(scheduler, te.base+"/scheduler/bind", bind)
	var res extenderv1.ExtenderBindingResult
	if err := json.Unmarshal([]byte(msg), &res); status != http.StatusOK || err != nil || res.Error != "" {
		t.Fatalf("bind with the scheduler's certificate = %d %q; want 200 without an error", status, msg)
	}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "gpu-a" || got.Annotations[v1alpha1.AnnotationAssignedGPUs] == "" {
		t.Fatalf("after the scheduler's bind the pod is on %q with GPUs %q; want gpu-a with GPUs", got.Spec.NodeName, got.Annotations[v1alpha1.AnnotationAssignedGPUs])
	}
}

// As a caller holding a valid client certificate (a stolen one, or a
// confused deputy): bind still refuses what kube-scheduler's gputopo
// profile would never send, says why, and leaves the pod unbound.
func TestAuthenticatedBindRefusesWhatTheSchedulerWouldNotSend(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	gpuCluster(t, cp, map[string]map[string]string{"gpu-a": {"pool": "train"}, "gpu-b": {"pool": "train"}})
	ctx := harness.Context(t)
	// gpu-b is reserved for infrastructure by a NoSchedule taint.
	node := &corev1.Node{}
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-b"}}), node); err != nil {
		t.Fatal(err)
	}
	node.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}}
	if err := cp.Client.Update(ctx, node); err != nil {
		t.Fatalf("taint gpu-b: %v", err)
	}
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("create kube-system: %v", err)
	}
	te := startTLSExtender(t, cp)
	scheduler := te.client(t, te.ca)

	mk := func(ns, name string, gpus int, mod func(*corev1.Pod)) *corev1.Pod {
		p := harness.GPUPod(ns, name, gpus)
		if gpus == 0 {
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		}
		p.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
		if mod != nil {
			mod(p)
		}
		if err := cp.Client.Create(ctx, p); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		return p
	}
	cases := []struct {
		name    string
		pod     *corev1.Pod
		node    string
		wantErr string // "" binds
	}{{
		name: "pod addressed to another scheduler",
		pod:  mk("kube-system", "other-scheduler", 0, func(p *corev1.Pod) { p.Spec.SchedulerName = "default-scheduler" }),
		node: "gpu-a", wantErr: `schedulerName "default-scheduler" is not a gputopo scheduler profile`,
	}, {
		name: "GPU pod addressed to another scheduler",
		pod:  mk(metav1.NamespaceDefault, "gpu-other-scheduler", 1, func(p *corev1.Pod) { p.Spec.SchedulerName = "default-scheduler" }),
		node: "gpu-a", wantErr: "is not a gputopo scheduler profile",
	}, {
		name: "pod that requests no GPU",
		pod:  mk(metav1.NamespaceDefault, "no-gpu", 0, nil),
		node: "gpu-a", wantErr: "requests no nvidia.com/gpu",
	}, {
		name: "node the pod's nodeSelector excludes",
		pod:  mk(metav1.NamespaceDefault, "selector", 1, func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "inference"} }),
		node: "gpu-a", wantErr: "nodeSelector or required node affinity excludes the node",
	}, {
		name: "node with a taint the pod does not tolerate",
		pod:  mk(metav1.NamespaceDefault, "taint", 1, nil),
		node: "gpu-b", wantErr: "does not tolerate the node's taint dedicated=infra:NoSchedule",
	}, {
		name: "node that does not exist",
		pod:  mk(metav1.NamespaceDefault, "ghost-node", 1, nil),
		node: "gpu-z", wantErr: "node gpu-z does not exist",
	}, {
		name: "a pod the scheduler would send binds",
		pod:  mk(metav1.NamespaceDefault, "fine", 2, func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"pool": "train"} }),
		node: "gpu-a",
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := extenderv1.ExtenderBindingArgs{PodName: tc.pod.Name, PodNamespace: tc.pod.Namespace, PodUID: tc.pod.UID, Node: tc.node}
			var res extenderv1.ExtenderBindingResult
			// The informer may not have delivered the new pod yet; bind
			// then reads it from the API server, so one call decides.
			status, body := post(scheduler, te.base+"/scheduler/bind", args)
			if status != http.StatusOK {
				t.Fatalf("bind = %d %q", status, body)
			}
			if err := json.Unmarshal([]byte(body), &res); err != nil {
				t.Fatalf("bind answer %q: %v", body, err)
			}
			got := &corev1.Pod{}
			if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(tc.pod), got); err != nil {
				t.Fatal(err)
			}
			if tc.wantErr == "" {
				if res.Error != "" || got.Spec.NodeName != tc.node || got.Annotations[v1alpha1.AnnotationAssignedGPUs] == "" {
					t.Fatalf("bind error %q, pod on %q with GPUs %q; want bound to %s with GPUs", res.Error, got.Spec.NodeName, got.Annotations[v1alpha1.AnnotationAssignedGPUs], tc.node)
				}
				return
			}
			if !strings.Contains(res.Error, tc.wantErr) {
				t.Errorf("bind error = %q; want it to contain %q", res.Error, tc.wantErr)
			}
			if got.Spec.NodeName != "" {
				t.Errorf("refused pod is bound to %s", got.Spec.NodeName)
			}
		})
	}
	if c := te.x.Core().Report().Counts(); c.Reserved != 0 || c.Held != 2 {
		t.Errorf("ledger after the refusals: %s; want only the bound pod's 2 GPUs held", c)
	}
}
