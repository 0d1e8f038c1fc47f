//go:build integration

package install

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"golang.org/x/sys/unix"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/test/kubelet"
	topomachine "github.com/gputopo/gputopo/topology/machine"
)

const (
	releaseName = "gputopo"
	releaseNS   = "gputopo-system"
	nodeName    = "gpu-node-1"
	machine     = "dgx-a100"
	teamNS      = "ml-team"
	// tenantNS is a namespace that did not opt in.
	tenantNS = "tenant"
	// trainImage is the workload's image: the pause image under this name.
	trainImage = "registry.example/train:1"
)

// The controllers a one-node cluster needs for the release: its
// Deployments and DaemonSet, service accounts and the root CA ConfigMap
// their tokens trust, the EndpointSlices kube-proxy routes Services with,
// the workload's Job, and garbage collection of what uninstall deletes.
var controllers = []string{
	"deployment-controller", "replicaset-controller", "daemonset-controller",
	"serviceaccount-controller", "root-ca-certificate-publisher-controller",
	"endpointslice-controller", "job-controller", "garbage-collector-controller",
	// The node agent's system-node-critical pods are counted by the
	// release's ResourceQuota, which admits pods once this controller has
	// counted its usage.
	"resourcequota-controller",
}

// cluster is the one-node cluster the chart is installed on.
type cluster struct {
	mode       string
	cp         *harness.ControlPlane
	k          *kubelet.Kubelet
	kubeconfig string
	dir        string
	// cdi is the node's CDI spec for its simulated GPUs, which containerd
	// applies for the chart's default device list strategy, cdi-cri.
	cdi *kubelet.CDISpec
	// toolkitConfig is the NVIDIA container toolkit configuration the node
	// agent reads through the chart's mount, and isolation the
	// gputopo_nodeagent_env_isolation series it must report for it.
	toolkitConfig, isolation string
}

// TestHelmInstall installs the chart with `helm install` on a one-node
// cluster with a real container runtime (containerd, runc) and kube-proxy,
// from the image `make image` built, imported rather than pulled. The test
// plays cert-manager: it issues the Secrets the chart's Certificates ask for
// and injects the webhooks' CA bundle, since cert-manager's controller
// cannot be built here. The node has a CDI spec for its simulated GPUs, as
// nvidia-ctk cdi generate writes on a real node, for the chart's default
// device list strategy, cdi-cri. Then the demo's model-parallel workload
// runs through the installed system and gets exactly its GPUs' CDI devices,
// CPU pods that ask for every GPU through their environment get none,
// every component's container is killed once, the release is upgraded with
// a changed value and uninstalled, and the test checks what is left.
func TestHelmInstall(t *testing.T) { installAndRun(t, "plugin") }

// TestHelmInstallExtenderMode is TestHelmInstall in the chart's default
// mode: the upstream kube-scheduler binary (bin/, in an image built here)
// calls the extender Deployment's leader through its Service, by its
// cluster DNS name (CoreDNS), over mutual TLS.
func TestHelmInstallExtenderMode(t *testing.T) { installAndRun(t, "extender") }

func installAndRun(t *testing.T, mode string) {
	if os.Geteuid() != 0 {
		t.Skip("a real kubelet and container runtime need root")
	}
	start := time.Now()
	c := startCluster(t, mode)
	values := c.values(t)
	if out, err := c.helm(t, "install", releaseName, chartDir(), "--namespace", releaseNS, "--create-namespace", "-f", values); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	t.Logf("injected: helm install %s in %s, %s mode, the node agent simulating a %s, the chart's default device list strategy", releaseName, releaseNS, mode, machine)
	c.actAsCertManager(t)
	c.waitReleaseReady(t, 4*time.Minute)
	t.Logf("checked: every pod of the release Running and Ready (%v since start), the node agent at system-node-critical through the release's ResourceQuota", time.Since(start).Round(time.Second))
	c.checkToolkitCheck(t)
	c.waitWebhookServes(t)
	c.checkLeader(t, "gputopo-scheduler")
	if mode == "extender" {
		c.checkLeader(t, "gputopo-extender")
	}

	var first *corev1.Pod
	t.Run("model-parallel Job through the installed system", func(t *testing.T) {
		defer c.dumpIfFailed(t)
		first = c.runJob(t, "train", 2, nil)
	})
	if first == nil {
		t.Fatal("no workload pod ran; the rest builds on it")
	}
	if mode == "extender" {
		t.Run("a client on the pod network cannot call the extender's verbs", func(t *testing.T) {
			c.podNetworkClient(t, first)
		})
	}
	t.Run("CPU pods asking for every GPU through env or envFrom get no GPU device, opted in or not", func(t *testing.T) {
		defer c.dumpIfFailed(t)
		c.envSelectsNoGPU(t)
	})
	t.Run("each component's container killed once: kubelet restarts it, probes gate readiness, no GPU issued twice", func(t *testing.T) {
		defer c.dumpIfFailed(t)
		c.killEachComponent(t)
		second := c.runJob(t, "train-after-restarts", 2, harness.PodGPUs(t, c.pod(t, first), v1alpha1.AnnotationAssignedGPUs))
		c.deleteJob(t, "train-after-restarts", second)
	})
	t.Run("helm upgrade with a changed value rolls the components", func(t *testing.T) {
		defer c.dumpIfFailed(t)
		c.upgrade(t, values)
	})
	t.Run("helm uninstall leaves nothing of the release", func(t *testing.T) {
		c.deleteJob(t, "train", first)
		c.uninstall(t)
	})
	t.Logf("suite: %v in all", time.Since(start).Round(time.Second))
}

// schedulerArchive is kube-scheduler from bin/ as an image (make image).
func schedulerArchive() string {
	return filepath.Join(harness.RepoRoot(), "_out", "kube-scheduler-image.tar")
}

func chartDir() string { return filepath.Join(harness.RepoRoot(), "charts", "gputopo") }

// startCluster starts kube-apiserver on an address pods reach, the
// controllers, the default kube-scheduler, kubelet on containerd with the images imported, and
// kube-proxy.
func startCluster(t *testing.T, mode string) *cluster {
	t.Helper()
	ip := hostIP(t)
	cp := harness.Start(t, harness.Options{PodReachableIP: ip})
	harness.InstallThirdPartyCRDs(t, cp)
	cp.StartControllerManagerWith(t, []string{"--root-ca-file=" + cp.CAFile()}, controllers...)
	// The cluster's own scheduler places the release's pods; the release's
	// gputopo-scheduler places the GPU workload.
	cp.StartScheduler(t, nil)
	gputopoImage, pauseImage := kubelet.Archives()
	pauseRef, err := kubelet.ImageRef(pauseImage)
	if err != nil {
		t.Fatal(err)
	}
	opts := kubelet.Options{
		NodeName: nodeName, NodeLabels: map[string]string{"nvidia.com/gpu.present": "true"},
		Containerd: &kubelet.ContainerdOptions{SandboxImage: pauseImage, Images: []string{gputopoImage},
			Aliases: map[string]string{trainImage: pauseRef}},
	}
	if mode == "extender" {
		// kube-scheduler reaches the extender by its Service's DNS name.
		opts.ClusterDNS = ip
		opts.Containerd.Images = append(opts.Containerd.Images, schedulerArchive())
	}
	// From here on this test holds the machine's kubelet lock: port 53,
	// the bridge and kube-proxy's chains are its alone.
	k := kubelet.Start(t, cp, opts)
	if mode == "extender" {
		kubelet.StartDNS(t, cp, ip)
	}
	kubelet.StartProxy(t, cp, nodeName)
	c := &cluster{mode: mode, cp: cp, k: k, dir: t.TempDir(), kubeconfig: cp.Kubeconfig(t, "gputopo-test-helm", "system:masters")}
	// The node's CDI spec, as nvidia-ctk cdi generate (or the GPU
	// operator) writes it on a real node, for the GPUs the node agent
	// simulates (their UUIDs follow from the node's name).
	f, err := topomachine.FixtureByName(machine)
	if err != nil {
		t.Fatal(err)
	}
	uuids := make([]string, f.GPUs)
	for i := range uuids {
		uuids[i] = topomachine.FixtureUUID(nodeName, i)
	}
	c.cdi = kubelet.WriteCDISpec(t, k.Containerd, configv1alpha1.DefaultCDIKind, uuids)
	t.Logf("injected: CDI spec %s with %d devices %s=<UUID>, each a fake /dev/nvidiaN and %sN=<UUID>", c.cdi.Path, len(uuids), c.cdi.Kind, kubelet.CDIEnvPrefix)
	t.Cleanup(func() {
		if t.Failed() {
			c.dump(t)
		}
	})
	return c
}

// hostIP is this machine's first global IPv4 address: kube-apiserver
// serves on it, and pods reach it through the kubernetes Service.
func hostIP(t *testing.T) string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		if i.Flags&net.FlagUp == 0 || i.Flags&net.FlagLoopback != 0 || strings.HasPrefix(i.Name, "gputopo-") {
			continue
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String()
			}
		}
	}
	t.Skip("no global IPv4 address for kube-apiserver to serve pods on")
	return ""
}

// values is the release's values file: the image built here (never
// pulled), the mode, two webhook, scheduler (and extender) replicas
// (leader election picks one of each), the node agent simulating machine
// on this kubelet and reading the toolkit configuration written here.
// Everything else, the device list strategy (cdi-cri) and the agent's
// priority class (system-node-critical) among it, is the chart's default.
func (c *cluster) values(t *testing.T) string {
	t.Helper()
	gputopoImage, _ := kubelet.Archives()
	ref, err := kubelet.ImageRef(gputopoImage)
	if err != nil {
		t.Fatal(err)
	}
	repo, tag := ref[:strings.LastIndex(ref, ":")], ref[strings.LastIndex(ref, ":")+1:]
	// The toolkit's configuration the node agent checks at start, through
	// the chart's read-only mount of its directory: hardened in extender
	// mode; in plugin mode with a malformed value, which the agent must
	// report and run on.
	toolkitDir := filepath.Join(c.dir, "nvidia-container-runtime")
	c.toolkitConfig = filepath.Join(toolkitDir, "config.toml")
	content, isolation := "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n", `{reason="envvar_ignored"} 1`
	if c.mode == "plugin" {
		content, isolation = "accept-nvidia-visible-devices-envvar-when-unprivileged = no\n", `{reason="config_error"} 0`
	}
	c.isolation = isolation
	if err := os.MkdirAll(toolkitDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.toolkitConfig, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	v := fmt.Sprintf(`image:
  repository: %s
  tag: %q
  pullPolicy: Never
scheduler:
  mode: %s
  replicas: 2
webhook:
  replicas: 2
nodeAgent:
  simulate: %s
  kubeletRootDir: %s
  runtimeClassName: ""
  reconcileInterval: 2s
  toolkitConfigDir: %s
`, repo, tag, c.mode, machine, c.k.RootDir, toolkitDir)
	if c.mode == "extender" {
		sref, err := kubelet.ImageRef(schedulerArchive())
		if err != nil {
			t.Fatal(err)
		}
		v += "extender:\n  replicas: 2\n"
		v = strings.Replace(v, "scheduler:\n", fmt.Sprintf("scheduler:\n  image:\n    repository: %s\n    tag: %q\n    pullPolicy: Never\n",
			sref[:strings.LastIndex(sref, ":")], sref[strings.LastIndex(sref, ":")+1:]), 1)
	}
	p := filepath.Join(c.dir, "values.yaml")
	if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (c *cluster) helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin, err := harness.Binary("helm")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append(args, "--kubeconfig", c.kubeconfig)...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+filepath.Join(c.dir, "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(c.dir, "helm-config"), "HELM_DATA_HOME="+filepath.Join(c.dir, "helm-data"))
	return cmd.CombinedOutput()
}

// actAsCertManager does what cert-manager's controller and CA injector
// would for the release: one CA (the chart's CA Certificate), a Secret
// with tls.crt, tls.key and ca.crt for each Certificate, signed for its
// DNS names, and the CA in the caBundle of every webhook configuration
// annotated cert-manager.io/inject-ca-from.
func (c *cluster) actAsCertManager(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	certs := &unstructured.UnstructuredList{}
	certs.SetAPIVersion("cert-manager.io/v1")
	certs.SetKind("CertificateList")
	if err := c.cp.Client.List(ctx, certs, client.InNamespace(releaseNS)); err != nil {
		t.Fatalf("list the release's Certificates: %v", err)
	}
	caKey, caCert := newCert(t, "gputopo-test-ca", nil, nil, nil)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caCert.Raw})
	caOf := map[string][]byte{}
	for _, crt := range certs.Items {
		secret, _, _ := unstructured.NestedString(crt.Object, "spec", "secretName")
		isCA, _, _ := unstructured.NestedBool(crt.Object, "spec", "isCA")
		dns, _, _ := unstructured.NestedStringSlice(crt.Object, "spec", "dnsNames")
		// cert-manager's subject CN is spec.commonName when set (the
		// extender lets in the scheduler's certificate by it).
		cn, _, _ := unstructured.NestedString(crt.Object, "spec", "commonName")
		if cn == "" {
			cn = crt.GetName()
		}
		key, cert := caKey, caCert
		if !isCA {
			key, cert = newCert(t, cn, dns, caKey, caCert)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: releaseNS, Name: secret,
				Annotations: map[string]string{"cert-manager.io/certificate-name": crt.GetName()}},
			Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{
				corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}),
				corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
				"ca.crt":                caPEM,
			},
		}
		if err := c.cp.Client.Create(ctx, s); err != nil {
			t.Fatalf("create Secret %s for Certificate %s: %v", secret, crt.GetName(), err)
		}
		caOf[releaseNS+"/"+crt.GetName()] = caPEM
		t.Logf("injected: Secret %s for Certificate %s (isCA %v, CN %s, dnsNames %v)", secret, crt.GetName(), isCA, cn, dns)
	}
	if len(certs.Items) == 0 {
		t.Fatal("the release created no cert-manager Certificate")
	}
	injected := 0
	muts := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	vals := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
	if err := c.cp.Client.List(ctx, muts); err != nil {
		t.Fatal(err)
	}
	if err := c.cp.Client.List(ctx, vals); err != nil {
		t.Fatal(err)
	}
	for i := range muts.Items {
		m := &muts.Items[i]
		if ca, ok := caOf[m.Annotations["cert-manager.io/inject-ca-from"]]; ok {
			for j := range m.Webhooks {
				m.Webhooks[j].ClientConfig.CABundle = ca
			}
			if err := c.cp.Client.Update(ctx, m); err != nil {
				t.Fatalf("inject the CA into %s: %v", m.Name, err)
			}
			injected++
		}
	}
	for i := range vals.Items {
		v := &vals.Items[i]
		if ca, ok := caOf[v.Annotations["cert-manager.io/inject-ca-from"]]; ok {
			for j := range v.Webhooks {
				v.Webhooks[j].ClientConfig.CABundle = ca
			}
			if err := c.cp.Client.Update(ctx, v); err != nil {
				t.Fatalf("inject the CA into %s: %v", v.Name, err)
			}
			injected++
		}
	}
	if injected != 2 {
		t.Fatalf("injected the CA into %d webhook configurations, want the release's mutating and validating ones", injected)
	}
	t.Logf("injected: the CA bundle into the release's %d webhook configurations", injected)
}

// newCert is a P-256 key and a certificate for name: a self-signed CA
// without a parent, else a serving certificate for dns signed by parent.
func newCert(t *testing.T, name string, dns []string, parentKey *ecdsa.PrivateKey, parent *x509.Certificate) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: dns,
	}
	signer, issuer := key, tmpl
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	} else {
		signer, issuer = parentKey, parent
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

// releasePods are the pods of the release.
func (c *cluster) releasePods(t *testing.T) []corev1.Pod {
	t.Helper()
	list := &corev1.PodList{}
	if err := c.cp.Client.List(context.Background(), list, client.InNamespace(releaseNS),
		client.MatchingLabels{"app.kubernetes.io/instance": releaseName}); err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// waitReleaseReady waits until the release's Deployments and DaemonSet
// have every replica available and every pod of it is Running and Ready.
func (c *cluster) waitReleaseReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	harness.Poll(t, timeout, "every pod of the release Running and Ready", func() (bool, string) {
		ctx := context.Background()
		deps := &appsv1.DeploymentList{}
		dss := &appsv1.DaemonSetList{}
		if err := c.cp.Client.List(ctx, deps, client.InNamespace(releaseNS)); err != nil {
			return false, err.Error()
		}
		if err := c.cp.Client.List(ctx, dss, client.InNamespace(releaseNS)); err != nil {
			return false, err.Error()
		}
		var want int32
		var notReady []string
		for _, d := range deps.Items {
			n := ptr.Deref(d.Spec.Replicas, 1)
			want += n
			avail := n
			if d.Spec.Template.Labels[componentLabel] == "extender" {
				avail = 1 // only the Lease holder is Ready, by design
			}
			if d.Status.ObservedGeneration < d.Generation || d.Status.UpdatedReplicas != n || d.Status.Replicas != n || d.Status.AvailableReplicas != avail {
				notReady = append(notReady, fmt.Sprintf("Deployment %s %d/%d available", d.Name, d.Status.AvailableReplicas, avail))
			}
		}
		for _, d := range dss.Items {
			want += d.Status.DesiredNumberScheduled
			if d.Status.ObservedGeneration < d.Generation || d.Status.DesiredNumberScheduled == 0 || d.Status.NumberReady != d.Status.DesiredNumberScheduled || d.Status.UpdatedNumberScheduled != d.Status.DesiredNumberScheduled {
				notReady = append(notReady, fmt.Sprintf("DaemonSet %s %d/%d ready", d.Name, d.Status.NumberReady, d.Status.DesiredNumberScheduled))
			}
		}
		pods := c.releasePods(t)
		for _, p := range pods {
			if p.DeletionTimestamp != nil {
				notReady = append(notReady, p.Name+" terminating")
			} else if !podReady(&p) && !standby(&p) {
				notReady = append(notReady, fmt.Sprintf("%s %s %s", p.Name, p.Status.Phase, containerStates(&p)))
			}
		}
		if why := oneLeader(pods); why != "" {
			notReady = append(notReady, why)
		}
		if len(deps.Items) == 0 || len(dss.Items) == 0 {
			notReady = append(notReady, fmt.Sprintf("%d Deployments, %d DaemonSets", len(deps.Items), len(dss.Items)))
		}
		if int32(len(pods)) != want {
			notReady = append(notReady, fmt.Sprintf("%d pods, want %d", len(pods), want))
		}
		return len(notReady) == 0, strings.Join(notReady, "; ")
	})
}

// componentLabel names a pod's component (webhook, extender, ...).
const componentLabel = "app.kubernetes.io/component"

// standby is an extender replica running without the Lease: by design not
// Ready, so that the Service routes to the leader only.
func standby(p *corev1.Pod) bool {
	if p.Labels[componentLabel] != "extender" || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running == nil {
			return false
		}
	}
	return true
}

// oneLeader is why the extender replicas among pods are not exactly one
// Ready leader ("" when they are, or when there are none).
func oneLeader(pods []corev1.Pod) string {
	n, ready := 0, 0
	for i := range pods {
		if pods[i].Labels[componentLabel] == "extender" && pods[i].DeletionTimestamp == nil {
			n++
			if podReady(&pods[i]) {
				ready++
			}
		}
	}
	if n > 0 && ready != 1 {
		return fmt.Sprintf("%d of %d extender replicas Ready, want the leader only", ready, n)
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func containerStates(p *corev1.Pod) string {
	var out []string
	for _, s := range p.Status.ContainerStatuses {
		st := "running"
		switch {
		case s.State.Waiting != nil:
			st = "waiting " + s.State.Waiting.Reason + " " + s.State.Waiting.Message
		case s.State.Terminated != nil:
			st = fmt.Sprintf("terminated %s (%d)", s.State.Terminated.Reason, s.State.Terminated.ExitCode)
		}
		if l := s.LastTerminationState.Terminated; l != nil {
			st += fmt.Sprintf(", last terminated %s (%d) %s", l.Reason, l.ExitCode, strings.TrimSpace(l.Message))
		}
		out = append(out, fmt.Sprintf("%s: %s ready=%v restarts=%d", s.Name, st, s.Ready, s.RestartCount))
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// waitWebhookServes waits until kube-apiserver reaches the installed
// webhook through its Service (kube-proxy programs the Service a moment
// after the pods are Ready): a server-side dry run of a Job in the opted-in
// namespace calls the Job webhook, fail-closed.
func (c *cluster) waitWebhookServes(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: teamNS, Labels: map[string]string{v1alpha1.LabelInjection: v1alpha1.InjectionEnabled}}}
	if err := c.cp.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	harness.Poll(t, time.Minute, "the webhook to answer through its Service", func() (bool, string) {
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: "probe",
				Annotations: map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel)}},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: trainImage}},
			}}},
		}
		if err := c.cp.Client.Create(ctx, job, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		if job.Spec.Template.Annotations[v1alpha1.AnnotationParallelism] == "" {
			return false, "the dry run's Job was not mutated"
		}
		return true, ""
	})
	t.Logf("checked: kube-apiserver reaches the installed webhook through its Service")
}

// runJob runs a model-parallel Job of one pod with gpus GPUs in the opted-in
// namespace and checks the installed system placed it: mutated by the
// webhook, bound by gputopo-scheduler to an NVLinked set, assigned-gpus
// equal to allocated-gpus, none of them in avoid, and, with the chart's
// default cdi-cri, the CDI devices kubelet passed containerd, the devices
// of the OCI spec containerd made and the process's /dev and CDI variables
// exactly those GPUs, with no NVIDIA_VISIBLE_DEVICES.
func (c *cluster) runJob(t *testing.T, name string, gpus int64, avoid []string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: name,
			Annotations: map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel)}},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](1), Completions: ptr.To[int32](1), BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](0),
				AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "main", Image: trainImage, ImagePullPolicy: corev1.PullIfNotPresent,
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{v1alpha1.ResourceGPU: q}, Limits: corev1.ResourceList{v1alpha1.ResourceGPU: q}}}},
			}},
		},
	}
	if err := c.cp.Client.Create(ctx, job); err != nil {
		t.Fatalf("create Job %s: %v", name, err)
	}
	var pod *corev1.Pod
	harness.Poll(t, 2*time.Minute, "the Job's pod to run with allocated-gpus", func() (bool, string) {
		list := &corev1.PodList{}
		if err := c.cp.Client.List(ctx, list, client.InNamespace(teamNS), client.MatchingLabels{batchv1.JobNameLabel: name}); err != nil {
			return false, err.Error()
		}
		if len(list.Items) != 1 {
			return false, fmt.Sprintf("%d pods", len(list.Items))
		}
		pod = &list.Items[0]
		msg := fmt.Sprintf("%s %s node %q %s", pod.Name, pod.Status.Phase, pod.Spec.NodeName, containerStates(pod))
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
				msg += ": " + cond.Message
			}
		}
		return pod.Status.Phase == corev1.PodRunning && pod.Annotations[v1alpha1.AnnotationAllocatedGPUs] != "", msg
	})
	if pod.Spec.SchedulerName != v1alpha1.DefaultSchedulerName || pod.Annotations[v1alpha1.AnnotationRequirement] == "" {
		t.Errorf("pod %s: schedulerName %q, requirement %q; the installed webhook did not mutate it", pod.Name, pod.Spec.SchedulerName, pod.Annotations[v1alpha1.AnnotationRequirement])
	}
	assigned := harness.PodGPUs(t, pod, v1alpha1.AnnotationAssignedGPUs)
	allocated := harness.PodGPUs(t, pod, v1alpha1.AnnotationAllocatedGPUs)
	if int64(len(assigned)) != gpus || !slices.Equal(assigned, allocated) {
		t.Errorf("assigned-gpus %v, allocated-gpus %v: want %d GPUs, equal", assigned, allocated, gpus)
	}
	for _, u := range assigned {
		if slices.Contains(avoid, u) {
			t.Errorf("GPU %s issued to %s while a running pod holds it", u, pod.Name)
		}
	}
	pl, err := v1alpha1.ParsePlacement(pod.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		t.Fatal(err)
	}
	if pl.Tier != v1alpha1.TierNVSwitch || pl.Node != nodeName {
		t.Errorf("placement %s; want an NVSwitch set on %s", pl, nodeName)
	}
	in, err := c.k.Containerd.Inspect(ctx, pod.Namespace, pod.Name, string(pod.UID), "main")
	if err != nil {
		t.Fatal(err)
	}
	var cdi []string
	for _, d := range in.Config.GetCDIDevices() {
		cdi = append(cdi, d.GetName())
	}
	sort.Strings(cdi)
	if want := c.cdi.DeviceNames(assigned); !slices.Equal(cdi, want) {
		t.Errorf("CDI devices kubelet asked containerd for: %v, want exactly assigned-gpus' %v", cdi, want)
	}
	wantDev := c.cdi.DeviceNodes(assigned)
	if got := gpuPaths(in.Spec.DevicePaths()); !slices.Equal(got, wantDev) {
		t.Errorf("GPU devices in the OCI spec containerd gave runc: %v, want %v", got, wantDev)
	}
	env, err := kubelet.Environ(in.PID)
	if err != nil {
		t.Fatal(err)
	}
	if got := kubelet.CDIEnvUUIDs(env); !slices.Equal(got, assigned) {
		t.Errorf("the CDI spec's variables in /proc/%d/environ name %v, want exactly assigned-gpus %v", in.PID, got, assigned)
	}
	if vis := kubelet.Lookup(env, v1alpha1.EnvVisibleDevices); len(vis) != 0 {
		t.Errorf("%s=%q in /proc/%d/environ; with cdi-cri the device plugin sets none", v1alpha1.EnvVisibleDevices, vis, in.PID)
	}
	dev, err := kubelet.GPUDeviceNodes(in.PID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dev, wantDev) {
		t.Errorf("GPU device nodes in the process's /dev: %v, want %v", dev, wantDev)
	}
	t.Logf("checked: %s mutated by the installed webhook, bound by gputopo-scheduler with placement %s, allocated-gpus = assigned-gpus = %v = the CDI devices kubelet passed, the process's /dev %v and its CDI variables, no %s", pod.Name, pl, assigned, dev, v1alpha1.EnvVisibleDevices)
	return pod
}

// gpuPaths are the /dev/nvidia* entries of paths.
func gpuPaths(paths []string) []string {
	var out []string
	for _, p := range paths {
		if strings.HasPrefix(p, "/dev/nvidia") {
			out = append(out, p)
		}
	}
	return out
}

// checkToolkitCheck checks what the node agent made of the toolkit
// configuration it read at start through the chart's mount: the
// gputopo_nodeagent_env_isolation series on its metrics port, and its log
// line (in plugin mode the malformed value, named with its file and key,
// and the agent running on).
func (c *cluster) checkToolkitCheck(t *testing.T) {
	t.Helper()
	var agent *corev1.Pod
	for _, p := range c.releasePods(t) {
		if p.Labels[componentLabel] == "nodeagent" {
			agent = &p
		}
	}
	if agent == nil || agent.Status.PodIP == "" {
		t.Fatalf("no running node agent pod with an IP (%v)", agent)
	}
	url := fmt.Sprintf("http://%s/metrics", net.JoinHostPort(agent.Status.PodIP, "9400"))
	var series string
	harness.Poll(t, time.Minute, "the node agent's env isolation series at "+url, func() (bool, string) {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return false, err.Error()
		}
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "gputopo_nodeagent_env_isolation{") {
				series = l
			}
		}
		return series != "", "no gputopo_nodeagent_env_isolation series"
	})
	if series != "gputopo_nodeagent_env_isolation"+c.isolation {
		t.Errorf("%s; want gputopo_nodeagent_env_isolation%s for %s", series, c.isolation, c.toolkitConfig)
	}
	want := "Container environments cannot select GPUs"
	if c.mode == "plugin" {
		want = c.toolkitConfig + ":1: accept-nvidia-visible-devices-envvar-when-unprivileged = no: not a boolean"
	}
	logs, _ := filepath.Glob(filepath.Join(c.k.Dir, "logs", releaseNS+"_"+agent.Name+"_*", "nodeagent", "*.log"))
	var text string
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		text += string(b)
	}
	if !strings.Contains(text, want) {
		t.Errorf("the node agent's log (%v) does not say %q", logs, want)
	}
	t.Logf("checked: the node agent read %s through the chart's read-only mount: %s, logged %q, and runs", c.toolkitConfig, series, want)
}

// envSelectsNoGPU runs, with the chart's defaults, CPU-only pods (no GPU
// request) that set NVIDIA_VISIBLE_DEVICES=all through env and through
// envFrom of a ConfigMap, in a namespace that did not opt in and in the
// opted-in one, on the real kubelet and containerd, and checks that none
// is given a GPU device: no CDI device in the ContainerConfig kubelet sent
// containerd, no CDI annotation, GPU device or device-list mount in the
// OCI spec containerd made for runc, and no GPU device node in the
// process's /dev. Admission may refuse such a pod (the webhook refuses a
// literal NVIDIA_VISIBLE_DEVICES in opted-in namespaces) or rewrite it;
// a refusal must name the variable, and counts as no device given.
func (c *cluster) envSelectsNoGPU(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := c.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenantNS}}); client.IgnoreAlreadyExists(err) != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{tenantNS, teamNS} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "all-gpus"}, Data: map[string]string{v1alpha1.EnvVisibleDevices: "all"}}
		if err := c.cp.Client.Create(ctx, cm); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
		for _, how := range []string{"env", "envFrom"} {
			ctr := corev1.Container{Name: "main", Image: trainImage, ImagePullPolicy: corev1.PullIfNotPresent}
			if how == "env" {
				ctr.Env = []corev1.EnvVar{{Name: v1alpha1.EnvVisibleDevices, Value: "all"}}
			} else {
				ctr.EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}}}}
			}
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "all-gpus-by-" + strings.ToLower(how)},
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To[int64](0),
					AutomountServiceAccountToken: ptr.To(false), Containers: []corev1.Container{ctr}},
			}
			what := fmt.Sprintf("%s/%s (%s=all by %s, no GPU request, namespace %s)", ns, p.Name, v1alpha1.EnvVisibleDevices, how,
				map[bool]string{true: "opted in", false: "not opted in"}[ns == teamNS])
			if err := c.cp.Client.Create(ctx, p); err != nil {
				if !strings.Contains(err.Error(), v1alpha1.EnvVisibleDevices) {
					t.Errorf("%s refused for another reason than its %s: %v", what, v1alpha1.EnvVisibleDevices, err)
					continue
				}
				t.Logf("checked: %s refused at admission, so given no device: %v", what, err)
				continue
			}
			harness.Poll(t, 2*time.Minute, what+" to run", func() (bool, string) {
				got := c.pod(t, p)
				return got.Status.Phase == corev1.PodRunning && len(got.Status.ContainerStatuses) > 0 && got.Status.ContainerStatuses[0].State.Running != nil,
					string(got.Status.Phase) + " " + containerStates(got)
			})
			p = c.pod(t, p)
			in, err := c.k.Containerd.Inspect(ctx, p.Namespace, p.Name, string(p.UID), "main")
			if err != nil {
				t.Fatal(err)
			}
			if d := in.Config.GetCDIDevices(); len(d) != 0 {
				t.Errorf("%s: kubelet asked containerd for CDI devices %v", what, d)
			}
			for k := range in.Spec.Annotations {
				if strings.HasPrefix(k, "cdi.k8s.io/") {
					t.Errorf("%s: CDI annotation %s=%q in the OCI spec", what, k, in.Spec.Annotations[k])
				}
			}
			if d := gpuPaths(in.Spec.DevicePaths()); len(d) != 0 {
				t.Errorf("%s: GPU devices %v in the OCI spec containerd gave runc", what, d)
			}
			for _, m := range in.Spec.Mounts {
				if m.Destination == nodeagent.DeviceListMountRoot || strings.HasPrefix(m.Destination, nodeagent.DeviceListMountRoot+"/") {
					t.Errorf("%s: device-list mount %s (from %s) in the OCI spec", what, m.Destination, m.Source)
				}
			}
			dev, err := kubelet.GPUDeviceNodes(in.PID)
			if err != nil {
				t.Fatal(err)
			}
			if len(dev) != 0 {
				t.Errorf("%s: GPU device nodes %v in the process's /dev", what, dev)
			}
			if a := p.Annotations[v1alpha1.AnnotationAllocatedGPUs]; a != "" {
				t.Errorf("%s: allocated-gpus %q", what, a)
			}
			env, err := kubelet.Environ(in.PID)
			if err != nil {
				t.Fatal(err)
			}
			vis := kubelet.Lookup(env, v1alpha1.EnvVisibleDevices)
			t.Logf("checked: %s ran with %s=%q in its environment and no GPU device: no CDI device from kubelet, none in the OCI spec, no device-list mount, no /dev/nvidia* in the process", what, v1alpha1.EnvVisibleDevices, vis)
			if err := c.cp.Client.Delete(ctx, p, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
			harness.Poll(t, time.Minute, "pod "+p.Name+" gone", func() (bool, string) {
				err := c.cp.Client.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{})
				return client.IgnoreNotFound(err) == nil && err != nil, fmt.Sprint(err)
			})
		}
	}
}

func (c *cluster) pod(t *testing.T, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	got := &corev1.Pod{}
	if err := c.cp.Client.Get(context.Background(), client.ObjectKeyFromObject(p), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// podNetworkClient calls the installed extender's filter and bind verbs
// from inside a workload pod's network namespace, through the extender
// Service's ClusterIP, as any pod could: without the scheduler's client
// certificate every verb must be refused (401, or the handshake).
func (c *cluster) podNetworkClient(t *testing.T, from *corev1.Pod) {
	t.Helper()
	svc := &corev1.Service{}
	if err := c.cp.Client.Get(context.Background(), client.ObjectKey{Namespace: releaseNS, Name: "gputopo-extender"}, svc); err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svc.Spec.Ports[0].Port))
	pid, err := c.k.Containerd.PID(context.Background(), from.Namespace, from.Name, string(from.UID), "main")
	if err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"filter", "bind"} {
		status, err := postFromNetns(pid, addr, "/scheduler/"+verb)
		switch {
		case err != nil && !strings.Contains(err.Error(), "certificate"):
			t.Errorf("POST /scheduler/%s from pod %s's network failed with %v; want a refusal naming the client certificate (is the Service reachable at all?)", verb, from.Name, err)
		case err == nil && status != http.StatusUnauthorized && status != http.StatusForbidden:
			t.Errorf("POST /scheduler/%s from pod %s's network: HTTP %d; want 401 or 403 without the scheduler's client certificate", verb, from.Name, status)
		default:
			t.Logf("checked: POST %s/scheduler/%s from pod %s's network namespace refused (HTTP %d, %v)", addr, verb, from.Name, status, err)
		}
	}
}

// postFromNetns POSTs an empty JSON body to https://addr/path from the
// network namespace of process pid, trusting any server certificate and
// presenting none.
func postFromNetns(pid int, addr, path string) (int, error) {
	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		// The thread enters the pod's network namespace for the dial and
		// returns to its own before it serves other goroutines again. It
		// must not exit instead: the test's child processes (kubelet,
		// containerd) get SIGKILL when the thread that started them exits
		// (Pdeathsig).
		runtime.LockOSThread()
		own, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer own.Close()
		ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{err: err}
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- result{err: fmt.Errorf("enter the pod's network namespace: %w", err)}
			return
		}
		conn, dialErr := net.DialTimeout("tcp", addr, 5*time.Second)
		if err := unix.Setns(int(own.Fd()), unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and ends with the goroutine
		if dialErr != nil {
			done <- result{err: dialErr}
			return
		}
		// The socket was created in the pod's namespace and stays there.
		tr := &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the attacker trusts anything
			DialContext:     func(context.Context, string, string) (net.Conn, error) { return conn, nil },
		}
		hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		resp, err := hc.Post("https://"+addr+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			done <- result{err: err}
			return
		}
		resp.Body.Close()
		done <- result{status: resp.StatusCode}
	}()
	r := <-done
	return r.status, r.err
}

// checkLeader checks that leader election picked one of deployment's
// pods: the Lease the chart installed names it as holder.
func (c *cluster) checkLeader(t *testing.T, deployment string) {
	t.Helper()
	var holder string
	harness.Poll(t, time.Minute, "a leader in Lease "+deployment, func() (bool, string) {
		l := &coordinationv1.Lease{}
		if err := c.cp.Client.Get(context.Background(), client.ObjectKey{Namespace: releaseNS, Name: deployment}, l); err != nil {
			return false, err.Error()
		}
		holder = ptr.Deref(l.Spec.HolderIdentity, "")
		return holder != "", "no holder"
	})
	var pods []string
	for _, p := range c.releasePods(t) {
		if strings.HasPrefix(p.Name, deployment+"-") {
			pods = append(pods, p.Name)
			if strings.HasPrefix(holder, p.Name) {
				t.Logf("checked: leader election picked %s of %d replicas (Lease holder %s)", p.Name, len(pods), holder)
				return
			}
		}
	}
	t.Errorf("Lease %s holder %q is none of the pods %v", deployment, holder, pods)
}

// killEachComponent SIGKILLs the container process of every pod of the
// release, one at a time, and waits until kubelet restarted it and its
// readiness probe passed again (an extender replica: until one replica
// leads and is Ready again, the restarted one leader or standby).
func (c *cluster) killEachComponent(t *testing.T) {
	t.Helper()
	for _, p := range c.releasePods(t) {
		if len(p.Spec.Containers) == 0 || len(p.Status.ContainerStatuses) == 0 {
			t.Fatalf("pod %s has no container status", p.Name)
		}
		name := p.Spec.Containers[0].Name
		var restarts int32
		var pid int
		// A leader that lost its Lease under load exits and is restarted:
		// wait for a running container.
		harness.Poll(t, 2*time.Minute, p.Name+"'s container running", func() (bool, string) {
			got := &corev1.Pod{}
			if err := c.cp.Client.Get(context.Background(), client.ObjectKeyFromObject(&p), got); err != nil || len(got.Status.ContainerStatuses) == 0 {
				return false, fmt.Sprint(err)
			}
			restarts = got.Status.ContainerStatuses[0].RestartCount
			var err error
			pid, err = c.k.Containerd.PID(context.Background(), p.Namespace, p.Name, string(p.UID), name)
			return err == nil, fmt.Sprint(err)
		})
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("kill %s/%s (pid %d): %v", p.Name, name, pid, err)
		}
		t.Logf("injected: SIGKILL to %s/%s (pid %d)", p.Name, name, pid)
		harness.Poll(t, 2*time.Minute, p.Name+" restarted by kubelet and Ready", func() (bool, string) {
			got := &corev1.Pod{}
			if err := c.cp.Client.Get(context.Background(), client.ObjectKeyFromObject(&p), got); err != nil {
				return false, err.Error()
			}
			if len(got.Status.ContainerStatuses) == 0 {
				return false, "no status"
			}
			if why := oneLeader(c.releasePods(t)); why != "" {
				return false, why
			}
			return got.Status.ContainerStatuses[0].RestartCount > restarts && (podReady(got) || standby(got)), containerStates(got)
		})
	}
	c.waitReleaseReady(t, 2*time.Minute)
	t.Logf("checked: every component restarted through kubelet and is Ready again")
}

// upgrade changes logVerbosity with helm upgrade and waits until every
// component runs with it.
func (c *cluster) upgrade(t *testing.T, values string) {
	t.Helper()
	if out, err := c.helm(t, "upgrade", releaseName, chartDir(), "--namespace", releaseNS, "-f", values, "--set", "logVerbosity=3"); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	t.Logf("injected: helm upgrade --set logVerbosity=3")
	harness.Poll(t, 3*time.Minute, "every component at --v=3", func() (bool, string) {
		var old []string
		for _, p := range c.releasePods(t) {
			argv := append(slices.Clone(p.Spec.Containers[0].Command), p.Spec.Containers[0].Args...)
			if !slices.Contains(argv, "--v=3") || !(podReady(&p) || standby(&p)) || p.DeletionTimestamp != nil {
				old = append(old, p.Name+" "+containerStates(&p))
			}
		}
		return len(old) == 0, fmt.Sprintf("not yet: %v", old)
	})
	c.waitReleaseReady(t, 2*time.Minute)
	t.Logf("checked: every pod of the release replaced, Ready, at --v=3")
}

// deleteJob deletes the Job and waits until its pod is gone.
func (c *cluster) deleteJob(t *testing.T, name string, p *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: teamNS, Name: name}}
	if err := c.cp.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	if err := c.cp.Client.Delete(ctx, p, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	harness.Poll(t, time.Minute, "pod "+p.Name+" gone", func() (bool, string) {
		err := c.cp.Client.Get(ctx, client.ObjectKeyFromObject(p), &corev1.Pod{})
		return client.IgnoreNotFound(err) == nil && err != nil, fmt.Sprint(err)
	})
}

// uninstall runs helm uninstall and checks that nothing of the release is
// left: no webhook configuration, workload, Service, ConfigMap, Secret
// other than the test's own, RBAC object, Lease, or pod.
func (c *cluster) uninstall(t *testing.T) {
	t.Helper()
	if out, err := c.helm(t, "uninstall", releaseName, "--namespace", releaseNS, "--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	t.Logf("injected: helm uninstall")
	ctx := context.Background()
	harness.Poll(t, 2*time.Minute, "the release's pods gone", func() (bool, string) {
		pods := c.releasePods(t)
		return len(pods) == 0, fmt.Sprintf("%d pods left", len(pods))
	})
	var left []string
	check := func(list client.ObjectList, opts ...client.ListOption) {
		if err := c.cp.Client.List(ctx, list, opts...); err != nil {
			t.Fatal(err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			t.Fatal(err)
		}
		for _, item := range items {
			o, ok := item.(client.Object)
			if !ok {
				t.Fatalf("%T is not an object", item)
			}
			if strings.Contains(o.GetName(), releaseName) || o.GetLabels()["app.kubernetes.io/instance"] == releaseName {
				left = append(left, fmt.Sprintf("%T %s/%s", list, o.GetNamespace(), o.GetName()))
			}
			if len(o.GetFinalizers()) > 0 && o.GetNamespace() == releaseNS {
				left = append(left, fmt.Sprintf("%T %s/%s with finalizers %v", list, o.GetNamespace(), o.GetName(), o.GetFinalizers()))
			}
		}
	}
	check(&admissionregistrationv1.MutatingWebhookConfigurationList{})
	check(&admissionregistrationv1.ValidatingWebhookConfigurationList{})
	check(&appsv1.DeploymentList{}, client.InNamespace(releaseNS))
	check(&appsv1.DaemonSetList{}, client.InNamespace(releaseNS))
	check(&corev1.ServiceList{}, client.InNamespace(releaseNS))
	check(&corev1.ConfigMapList{}, client.InNamespace(releaseNS))
	check(&coordinationv1.LeaseList{}, client.InNamespace(releaseNS))
	check(&corev1.ResourceQuotaList{}, client.InNamespace(releaseNS))
	check(&corev1.PodList{}, client.InNamespace(releaseNS))
	if len(left) > 0 {
		t.Errorf("left after helm uninstall: %s", strings.Join(left, "; "))
	}
	t.Logf("checked: no webhook configuration, workload, Service, ConfigMap, Lease, ResourceQuota or pod of the release left")
}

func (c *cluster) dumpIfFailed(t *testing.T) {
	if t.Failed() {
		c.dump(t)
	}
}

// dump logs what a failed run needs: the release's pods and their
// containers' last log lines (kubelet's pod log files).
func (c *cluster) dump(t *testing.T) {
	list := &corev1.PodList{}
	_ = c.cp.Client.List(context.Background(), list)
	for _, p := range list.Items {
		t.Logf("pod %s/%s %s node %q %s", p.Namespace, p.Name, p.Status.Phase, p.Spec.NodeName, containerStates(&p))
	}
	logs, _ := filepath.Glob(filepath.Join(c.k.Dir, "logs", "*", "*", "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		if len(b) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		t.Logf("%s:\n%s", strings.TrimPrefix(l, c.k.Dir), strings.Join(lines, "\n"))
	}
	t.Logf("kubelet:\n%s", c.k.Process.Tail(30))
}
