//go:build integration

package chart

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

// serviceAccountUser returns the user name and groups the apiserver gives
// a pod running as service account ns/name.
func serviceAccountUser(ns, name string) (string, []string) {
	return "system:serviceaccount:" + ns + ":" + name, []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
}

// startSchedulerAs runs the real kube-scheduler with cfg as the given user,
// so that the chart's own RBAC, not the harness's bootstrap identity, is
// what the scheduler gets. Everything else is as harness.StartScheduler.
func startSchedulerAs(t *testing.T, cp *harness.ControlPlane, cfg *schedconfigv1.KubeSchedulerConfiguration, user string, groups []string) *harness.Process {
	t.Helper()
	return startSchedulerBinaryAs(t, cp, "kube-scheduler", cfg, user, groups)
}

// startSchedulerBinaryAs is startSchedulerAs with another kube-scheduler
// build from bin/ ("gputopo-scheduler", the plugin build).
func startSchedulerBinaryAs(t *testing.T, cp *harness.ControlPlane, name string, cfg *schedconfigv1.KubeSchedulerConfiguration, user string, groups []string) *harness.Process {
	t.Helper()
	bin, err := harness.Binary(name)
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.ClientConnection.Kubeconfig = cp.Kubeconfig(t, user, groups...)
	doc, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatalf("encode scheduler config: %v", err)
	}
	path := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		t.Fatalf("write scheduler config: %v", err)
	}
	port, err := harness.FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	p := harness.StartProcess(t, name, bin, "--config="+path, "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port), "--v=2")
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the local scheduler's self-signed serving cert
	}}
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("%s exited: %v", name, err)
		}
		resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/healthz", port))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("%s did not become healthy: %v\n%s", name, err, p.Tail(30))
	}
	return p
}

// The chart's KubeSchedulerConfiguration, run by the real kube-scheduler
// under the chart's scheduler service account, sends a GPU pod through the
// real extender (running under the chart's extender service account with
// the chart's arguments, ExtenderConfiguration and leader election) over
// mutual TLS: filter, prioritize and bind, ending with the pod bound to
// GPUs the extender chose. The certificates are what cert-manager would
// issue for the chart's Certificates, laid out as kubelet mounts their
// Secrets; each component reads them at the paths the chart gives it. The
// extender URL's host is the only change, from the in-cluster Service to
// the local listener, and the scheduler still verifies the Service name.
// Before the scheduler runs, clients without its certificate cannot bind
// the pod; after, a renewed client certificate is picked up by the running
// kube-scheduler.
func TestRenderedSchedulerConfigRunsThroughExtender(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)
	rel := defaultRelease
	fn := rel.fullname()
	objs := rel.render(t)
	createNamespace(t, cp, rel.namespace)

	applyRBAC(t, cp, objs)
	nodes := createGPUNodes(t, cp)

	// cert-manager's part: one CA signs the chart's two Certificates as
	// their specs say. kubelet's part: each Secret lies in a directory of
	// its own, as a Secret volume.
	ca := harness.NewCA(t, fn+"-ca")
	servingSecret, servingSpec, _ := certificateSpec(t, objs, fn+"-extender")
	clientSecret, clientSpec, _ := certificateSpec(t, objs, fn+"-scheduler-client")
	secretDirs := map[string]string{servingSecret: t.TempDir(), clientSecret: t.TempDir()}
	harness.WriteSecretVolume(t, secretDirs[servingSecret], ca.SecretData(t, servingSpec))
	harness.WriteSecretVolume(t, secretDirs[clientSecret], ca.SecretData(t, clientSpec))
	// mounted is where the file a container reads at p lies here.
	mounted := func(kind string, spec corev1.PodSpec, p string) string {
		t.Helper()
		secret, key, ok := secretFile(spec, spec.Containers[0], p)
		dir, known := secretDirs[secret]
		if !ok || !known {
			t.Fatalf("%s reads %s, which is in no Secret of the chart's Certificates (Secret %q)", kind, p, secret)
		}
		return filepath.Join(dir, key)
	}

	// The extender with the chart's arguments, configuration and identity.
	cfg, err := configv1alpha1.ParseExtender(configData(t, objs, fn+"-extender", "config.yaml"))
	if err != nil {
		t.Fatalf("extender ConfigMap: %v", err)
	}
	var extDep appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-extender"), &extDep)
	extSpec := extDep.Spec.Template.Spec
	opts := extenderOptions(t, "serving extender", extSpec.Containers[0].Args)
	if opts.TLSCertFile == "" || opts.ClientCAFile == "" || !opts.LeaderElect {
		t.Fatalf("the chart's extender runs without TLS, a client CA or leader election: %q", extSpec.Containers[0].Args)
	}
	opts.TLSCertFile = mounted("extender", extSpec, opts.TLSCertFile)
	opts.TLSPrivateKeyFile = mounted("extender", extSpec, opts.TLSPrivateKeyFile)
	opts.ClientCAFile = mounted("extender", extSpec, opts.ClientCAFile)
	opts.BindAddress, opts.Port, opts.MetricsBindAddress = "127.0.0.1", 0, "0"
	opts.ConfigFile, opts.Config = "", cfg
	extUser, extGroups := serviceAccountUser(rel.namespace, fn+"-extender")
	extCfg := cp.UserConfig(t, extUser, extGroups...)
	x := harness.StartExtender(t, ctx, extCfg, opts)
	addr := x.APIAddr()

	// The scheduler's configuration, pointed at the local listener.
	schedCfg, err := harness.ParseSchedulerConfig(configData(t, objs, fn+"-scheduler", "config.yaml"))
	if err != nil {
		t.Fatalf("scheduler ConfigMap: %v", err)
	}
	if len(schedCfg.Extenders) != 1 || schedCfg.Extenders[0].TLSConfig == nil {
		t.Fatalf("scheduler config has extenders %s; want one, with tlsConfig", mustYAML(schedCfg.Extenders))
	}
	ext := &schedCfg.Extenders[0]
	u, err := url.Parse(ext.URLPrefix)
	if err != nil || u.Scheme != "https" {
		t.Fatalf("extender urlPrefix %q is not https", ext.URLPrefix)
	}
	serviceHost := u.Hostname()
	u.Host = addr
	ext.URLPrefix = u.String()
	// The connection goes to 127.0.0.1; the certificate is checked against
	// the Service name the rendered URL gives, as it is in the cluster.
	ext.TLSConfig.ServerName = serviceHost
	var schedDep appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-scheduler"), &schedDep)
	schedSpec := schedDep.Spec.Template.Spec
	ext.TLSConfig.CertFile = mounted("scheduler", schedSpec, ext.TLSConfig.CertFile)
	ext.TLSConfig.KeyFile = mounted("scheduler", schedSpec, ext.TLSConfig.KeyFile)
	ext.TLSConfig.CAFile = mounted("scheduler", schedSpec, ext.TLSConfig.CAFile)

	pod := harness.GPUPod("default", "train-0", 4)
	pod.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	pod.Annotations = map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatalf("create pod: %v", err)
	}

	// Before the scheduler runs: nobody without its certificate binds the
	// pending pod.
	unauthorizedBindsFail(t, addr, serviceHost, ca, pod, "dgx-a100-0")
	var still corev1.Pod
	if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pod), &still); err != nil || still.Spec.NodeName != "" {
		t.Fatalf("after the refused binds the pod is on node %q (err %v), want unbound", still.Spec.NodeName, err)
	}

	schedUser, schedGroups := serviceAccountUser(rel.namespace, fn+"-scheduler")
	startSchedulerAs(t, cp, schedCfg, schedUser, schedGroups)

	got := waitBoundByExtender(t, cp, pod, nodes)
	for _, phase := range []string{"filter", "prioritize", "bind"} {
		if n := verbCalls(t, x.Extender, phase); n < 1 {
			t.Errorf("extender saw %d %s calls, want at least 1", n, phase)
		}
	}
	t.Logf("checked: kube-scheduler bound %s to %s through the extender over mutual TLS", got.Name, got.Spec.NodeName)

	// Both leader-elected components hold their own Leases.
	for _, name := range []string{fn + "-scheduler", fn + "-extender"} {
		var lease coordinationv1.Lease
		if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: rel.namespace, Name: name}, &lease); err != nil {
			t.Errorf("Lease %s/%s: %v", rel.namespace, name, err)
			continue
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			t.Errorf("Lease %s/%s has no holder", rel.namespace, name)
		}
	}

	// Renewal: cert-manager rewrites the scheduler's client Secret and the
	// running kube-scheduler must present the new certificate. To tell the
	// two apart, the new one comes from another CA, and the extender is
	// restarted trusting only that CA, so the old certificate is refused
	// from then on; the restart also closes the scheduler's open
	// connections, which would otherwise carry on with the handshake they
	// made with the old certificate.
	renewed := harness.NewCA(t, fn+"-ca-renewed")
	renewedCert, renewedKey := renewed.Issue(t, clientSpec)
	harness.WriteSecretVolume(t, secretDirs[clientSecret], map[string][]byte{"tls.crt": renewedCert, "tls.key": renewedKey, "ca.crt": ca.PEM})
	_ = x.Stop()
	clientCA := filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(clientCA, renewed.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	opts.Port, _ = strconv.Atoi(port)
	opts.ClientCAFile = clientCA
	x = harness.StartExtender(t, ctx, extCfg, opts)
	second := harness.GPUPod("default", "train-1", 2)
	second.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	if err := cp.Client.Create(ctx, second); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	got = waitBoundByExtender(t, cp, second, nodes)
	if n := verbCalls(t, x.Extender, "bind"); n < 1 {
		t.Errorf("the restarted extender saw %d bind calls, want at least 1", n)
	}
	t.Logf("checked: after its client certificate was renewed, the running kube-scheduler bound %s to %s through the extender", got.Name, got.Spec.NodeName)
}

// applyRBAC applies the chart's ServiceAccounts and RBAC, for real: the
// components a test runs get nothing else.
func applyRBAC(t *testing.T, cp *harness.ControlPlane, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := apply(harness.Context(t), cp, dyn, o, false); err != nil {
				t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
}

// createGPUNodes registers two GPU nodes with their topology, as the node
// agent publishes it (with one feasible node kube-scheduler skips scoring),
// and returns their fixtures by name.
func createGPUNodes(t *testing.T, cp *harness.ControlPlane) map[string]string {
	t.Helper()
	ctx := harness.Context(t)
	nodes := map[string]string{"dgx-a100-0": "dgx-a100", "hgx-h100-0": "hgx-h100"}
	for nodeName, fixture := range nodes {
		cp.CreateGPUNode(t, nodeName, 8, map[string]string{"nvidia.com/gpu.present": "true"})
		fx, err := machine.FixtureByName(fixture)
		if err != nil {
			t.Fatal(err)
		}
		ngt := &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
		if err := cp.Client.Create(ctx, ngt); err != nil {
			t.Fatalf("create NodeGPUTopology: %v", err)
		}
		ngt.Status = fx.Graph(nodeName).Status()
		ngt.Status.ObservedTime = metav1.Now()
		if err := cp.Client.Status().Update(ctx, ngt); err != nil {
			t.Fatalf("publish NodeGPUTopology status: %v", err)
		}
	}
	return nodes
}

// waitBoundByExtender waits until pod is bound to one of nodes with GPUs
// of that node in assigned-gpus, which only the extender's bind writes.
func waitBoundByExtender(t *testing.T, cp *harness.ControlPlane, pod *corev1.Pod, nodes map[string]string) *corev1.Pod {
	t.Helper()
	got, err := cp.WaitForPod(harness.Context(t), pod.Namespace, pod.Name, 90*time.Second, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	if err != nil {
		t.Fatalf("gputopo-scheduler never bound GPU pod %s: %v", pod.Name, err)
	}
	nodeName := got.Spec.NodeName
	if _, ok := nodes[nodeName]; !ok {
		t.Fatalf("pod %s bound to %q, want one of the GPU nodes %v", pod.Name, nodeName, nodes)
	}
	want, err := v1alpha1.PodGPUDemand(&pod.Spec, v1alpha1.ResourceGPU)
	if err != nil {
		t.Fatalf("pod %s: %v", pod.Name, err)
	}
	uuids := strings.Split(got.Annotations[v1alpha1.AnnotationAssignedGPUs], ",")
	if int64(len(uuids)) != want {
		t.Fatalf("pod %s: assigned-gpus = %q, want %d GPUs bound by the extender", pod.Name, got.Annotations[v1alpha1.AnnotationAssignedGPUs], want)
	}
	known := map[string]bool{}
	for i := range 8 {
		known[machine.FixtureUUID(nodeName, i)] = true
	}
	for _, u := range uuids {
		if !known[u] {
			t.Errorf("pod %s: assigned GPU %q is not a GPU of %s", pod.Name, u, nodeName)
		}
	}
	return got
}

// unauthorizedBindsFail sends the bind kube-scheduler would send for pod
// on node, from clients that lack the scheduler's certificate: plain HTTP,
// HTTPS without a client certificate, and HTTPS with a client certificate
// of another CA. Each must be refused.
func unauthorizedBindsFail(t *testing.T, addr, serverName string, ca *harness.CA, pod *corev1.Pod, node string) {
	t.Helper()
	body, err := json.Marshal(extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	other := harness.NewCA(t, "not-the-chart-ca")
	otherCert, otherKey := other.Issue(t, harness.LeafSpec{CommonName: "gputopo-scheduler", Usages: []string{"client auth"}})
	otherPair, err := tls.X509KeyPair(otherCert, otherKey)
	if err != nil {
		t.Fatal(err)
	}
	post := func(scheme string, cert *tls.Certificate) (int, error) {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots, ServerName: serverName}
		if cert != nil {
			// Sent whatever CAs the server names as acceptable (a client
			// given Certificates would send none of another CA).
			tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
		resp, err := hc.Post(scheme+"://"+addr+"/scheduler/bind", "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		return resp.StatusCode, nil
	}
	if code, err := post("http", nil); err == nil && code != http.StatusBadRequest {
		t.Errorf("plain HTTP bind: status %d, want the TLS listener's 400", code)
	}
	if code, err := post("https", nil); err != nil || code != http.StatusUnauthorized {
		t.Errorf("HTTPS bind without a client certificate: status %d (err %v), want 401", code, err)
	}
	if code, err := post("https", &otherPair); err == nil {
		t.Errorf("HTTPS bind with a client certificate of another CA: status %d, want the TLS handshake refused", code)
	}
}

// verbCalls is how many requests the extender timed for phase.
func verbCalls(t *testing.T, x *extender.Extender, phase string) uint64 {
	t.Helper()
	families, err := x.Metrics().Registry.Gather()
	if err != nil {
		t.Fatalf("gather extender metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "gputopo_extender_scheduling_latency_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "phase" && l.GetValue() == phase {
					return m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return 0
}
