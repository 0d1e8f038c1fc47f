//go:build integration

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/test/kubelet"
	"github.com/gputopo/gputopo/topology/machine"
	"github.com/gputopo/gputopo/webhook"
)

const (
	// nodeName is the one real node: a kubelet whose device plugin is the
	// node agent on a simulated DGX A100.
	nodeName    = "dgx-a100-1"
	fixtureName = "dgx-a100"
	nodeGPUs    = 8
	// nsTeam opted in to gputopo; nsPlain did not.
	nsTeam  = "ml-team"
	nsPlain = "plain"
	// The components run as the service accounts the webhook trusts with
	// the system annotations, with exactly the RBAC each documents.
	extenderUser = configv1alpha1.DefaultExtenderServiceAccount
	agentUser    = configv1alpha1.DefaultNodeAgentServiceAccount
)

// env is the whole system on one machine. The extender, the webhook, the
// node agent and kube-scheduler can be stopped and started again on the
// same addresses, as a crashed and rescheduled replica comes back behind
// its Service.
type env struct {
	// resource is the GPU resource name every component is configured
	// with (the chart's gpuResourceName).
	resource corev1.ResourceName

	cp  *harness.ControlPlane
	k   *kubelet.Kubelet
	sim *nvmlsim.Simulator
	pr  *nodeagent.PodResourcesClient
	// prAlloc asks kubelet which devices it can hand out now.
	prAlloc podresourcesapi.PodResourcesListerClient

	// dir outlives every scenario: logs and configs of restarted parts.
	dir     string
	logger  klog.Logger
	logPath string

	// sched decides: kube-scheduler calling the extender on extPort, or
	// in plugin mode gputopo-scheduler, whose core's ledger gauges the
	// audit checks too (CoreGauges).
	sched *harness.Decider

	// plugin is plugin mode: gputopo-scheduler decides in-process and no
	// HTTP extender runs. ext is then an observer: a core fed by the same
	// informers (localcluster.StartCore) that the drift audit and the
	// scenarios read holdings and reasons from.
	plugin bool

	extPort int
	ext     *localcluster.Extender

	hookRun *localcluster.Running

	agent   *nodeagent.Agent
	agentRn *localcluster.Running
	// agentStrategies are the node agent's device list strategies
	// (default envvar) for its next start.
	agentStrategies []string

	// fault, when set, is applied to the next Binding an extender writes.
	faultMu sync.Mutex
	fault   *bindFault
}

// setup starts everything and returns once a GPU pod can go the whole way.
func setup(t *testing.T) *env {
	t.Helper()
	return setupWith(t, v1alpha1.ResourceGPU)
}

// setupWith is setup with every component (webhook, extender, scheduler
// profile, node agent) configured for the GPU resource name resource, as
// the chart's gpuResourceName renders them.
func setupWith(t *testing.T, resource corev1.ResourceName) *env {
	t.Helper()
	return setupMode(t, resource, false)
}

// setupMode is setupWith in extender mode or, with plugin, in plugin mode.
func setupMode(t *testing.T, resource corev1.ResourceName, plugin bool) *env {
	t.Helper()
	return setupEnv(t, resource, plugin, false)
}

// setupEnv is setupMode with kubelet on the fake runtime or, with
// containerd, on containerd and runc: the pods' containers then really
// run, from the pause image imported under the name the pods give
// (trainImage), and visible reads their processes' environment.
func setupEnv(t *testing.T, resource corev1.ResourceName, plugin, containerd bool) *env {
	t.Helper()
	start := time.Now()
	e := &env{dir: t.TempDir(), resource: resource, plugin: plugin}
	// kubelet runs in the test's working directory, and when it removes a
	// container it deletes the files matching "<log path>*"; the fake
	// runtime reports no log path, so the pattern is "*". Give it an empty
	// directory rather than this package's sources.
	cwd := filepath.Join(e.dir, "kubelet-cwd")
	if err := os.Mkdir(cwd, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(cwd)
	logFile, err := os.Create(filepath.Join(e.dir, "components.log"))
	if err != nil {
		t.Fatal(err)
	}
	e.logPath = logFile.Name()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last lines of the in-process components' log (%s):\n%s", e.logPath, tail(e.logPath, 60))
		}
		_ = logFile.Close()
	})
	e.logger = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(2)))

	mut, val, err := webhook.Registration(webhook.RegistrationOptions{ServiceName: "gputopo-webhook", ServiceNamespace: "gputopo-system", ResourceName: string(resource)})
	if err != nil {
		t.Fatal(err)
	}
	e.cp = harness.Start(t, harness.Options{WebhookInstallOptions: &envtest.WebhookInstallOptions{
		MutatingWebhooks:   []*admissionregistrationv1.MutatingWebhookConfiguration{mut},
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{val},
	}})
	ctx := context.Background()

	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsTeam, Labels: map[string]string{v1alpha1.LabelInjection: v1alpha1.InjectionEnabled}}},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsPlain}},
		// No service account controller runs: pods need the account.
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nsTeam, Name: "default"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nsPlain, Name: "default"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "default"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gputopo-extender"}, Rules: extender.RBACRules()},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gputopo-nodeagent"}, Rules: nodeagent.RBACRules()},
		binding("gputopo-extender", extenderUser),
		binding("gputopo-nodeagent", agentUser),
	} {
		if err := e.cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}

	if plugin {
		// The chart binds the extender's ClusterRole to the scheduler's
		// service account in plugin mode.
		if err := localcluster.GrantExtenderRole(ctx, e.cp.Client, harness.SchedulerUser); err != nil {
			t.Fatal(err)
		}
	}
	e.startWebhook(t)
	if e.extPort, err = harness.FreePort(); err != nil {
		t.Fatal(err)
	}
	if plugin {
		e.startObserver(t)
	} else {
		e.startExtender(t)
	}
	t.Cleanup(func() {
		if err := e.ext.Stop(); err != nil {
			t.Errorf("extender: %v", err)
		}
		if err := e.hookRun.Stop(); err != nil {
			t.Errorf("webhook: %v", err)
		}
	})
	t.Cleanup(func() {
		if e.sched == nil {
			return
		}
		e.sched.Stop()
		if t.Failed() {
			t.Logf("last lines of %s log (%s):\n%s", e.sched.Name, e.sched.LogPath, e.sched.Tail(40))
		}
	})
	e.startScheduler(t, false)
	e.cp.StartControllerManager(t, "job-controller")

	kopts := kubelet.Options{NodeName: nodeName}
	if containerd {
		_, pause := kubelet.Archives()
		ref, err := kubelet.ImageRef(pause)
		if err != nil {
			t.Fatal(err)
		}
		// The workload is the pause process under the pods' image name:
		// it runs until deleted, and its environment is what the
		// runtime gave it.
		kopts.Containerd = &kubelet.ContainerdOptions{SandboxImage: pause, Aliases: map[string]string{trainImage: ref}}
	}
	e.k = kubelet.Start(t, e.cp, kopts)
	f, err := machine.FixtureByName(fixtureName)
	if err != nil {
		t.Fatal(err)
	}
	e.sim = nvmlsim.New(f, nodeName)
	e.sim.SetJitter(false)
	e.startAgent(t)
	t.Cleanup(func() { e.stopAgent(t) })
	if e.pr, err = nodeagent.DialPodResources(e.k.PodResourcesSocket); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.pr.Close() })
	conn, err := grpc.NewClient("unix://"+e.k.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	e.prAlloc = podresourcesapi.NewPodResourcesListerClient(conn)
	e.waitKubeletGPUs(t, nodeGPUs)
	harness.Poll(t, time.Minute, "the extender to see the node's 8 GPUs", func() (bool, string) {
		c := e.ext.Core().Report().Counts()
		return c.Total == nodeGPUs && c.Free == nodeGPUs, c.String()
	})
	harness.WaitCore(t, e.sched, localcluster.AtLeast(nodeGPUs))
	t.Logf("setup: control plane, webhook, extender, kube-scheduler, kube-controller-manager (job), kubelet %s and node agent (%s) up in %v",
		nodeName, fixtureName, time.Since(start).Round(time.Second))
	return e
}

func binding(name, user string) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
}

// startScheduler (re)starts the deciding scheduler: kube-scheduler with
// the chart's profile calling the extender on extPort, its ignorable flag
// set as given, or in plugin mode gputopo-scheduler with the chart's
// plugin profile, once its core decides. Every part is configured for the
// environment's GPU resource.
func (e *env) startScheduler(t *testing.T, ignorable bool) {
	t.Helper()
	if e.sched != nil {
		e.sched.Stop()
	}
	mode := harness.ModeExtender
	if e.plugin {
		mode = harness.ModePlugin
	}
	// Not cp.StartDecider: a scenario restarts the scheduler, which must
	// outlive the scenario's subtest; setupEnv's cleanup stops it.
	d, err := localcluster.StartDecider(localcluster.DeciderOptions{
		Mode: mode, Kubeconfig: e.cp.Kubeconfig(t, harness.SchedulerUser), Dir: e.dir, ResourceName: string(e.resource),
		ExtenderURL: "http://127.0.0.1:" + strconv.Itoa(e.extPort), Ignorable: ignorable,
	})
	if err != nil {
		e.sched = nil
		t.Fatal(err)
	}
	e.sched = d
	harness.WaitCore(t, e.sched, nil)
}

// startObserver runs, in plugin mode, a core fed by the same informers as
// gputopo-scheduler's, as the extender's service account, serving nothing.
func (e *env) startObserver(t *testing.T) {
	t.Helper()
	o := extender.Options{MetricsBindAddress: "0", Config: configv1alpha1.DefaultExtenderConfiguration()}
	o.Config.ResourceName = string(e.resource)
	x, err := localcluster.StartCore(klog.NewContext(context.Background(), e.logger.WithName("observer")), e.cp.UserConfig(t, extenderUser), o)
	if err != nil {
		t.Fatalf("observer: %v", err)
	}
	e.ext = x
	e.waitExtenderReady(t, x)
}

// startWebhook runs the webhook server where envtest registered it and
// waits until it serves and its cache has seen the opted-in namespace.
func (e *env) startWebhook(t *testing.T) {
	t.Helper()
	wio := e.cp.Env.WebhookInstallOptions
	hookCfg := configv1alpha1.DefaultWebhookConfiguration()
	hookCfg.ResourceName = string(e.resource)
	mgr, err := webhook.NewManager(hookCfg, e.cp.Config, webhook.Options{
		Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		CertName: "tls.crt", KeyName: "tls.key", MetricsBindAddress: "0", HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatalf("webhook manager: %v", err)
	}
	e.hookRun = localcluster.Go(context.Background(), mgr.Start)
	harness.Poll(t, time.Minute, "the webhook to serve TLS", func() (bool, string) {
		if exited, err := e.hookRun.Exited(); exited {
			t.Fatalf("webhook stopped: %v", err)
		}
		_, err := e.servedCert()
		return err == nil, fmt.Sprint(err)
	})
	// The webhook reads namespaces from its cache: a dry-run GPU pod is
	// mutated once the cache has the opt-in label.
	harness.Poll(t, time.Minute, "the webhook to mutate pods in "+nsTeam, func() (bool, string) {
		probe := e.gpuPod(nsTeam, "probe", 1)
		if err := e.cp.Client.Create(context.Background(), probe, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return probe.Spec.SchedulerName == v1alpha1.DefaultSchedulerName, "schedulerName " + probe.Spec.SchedulerName
	})
}

// servedCert is the leaf certificate the webhook server presents now.
func (e *env) servedCert() ([]byte, error) {
	wio := e.cp.Env.WebhookInstallOptions
	addr := net.JoinHostPort(wio.LocalServingHost, strconv.Itoa(wio.LocalServingPort))
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // reads the served certificate only
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Raw, nil
}

func (e *env) stopWebhook(t *testing.T) {
	t.Helper()
	if err := e.hookRun.Stop(); err != nil {
		t.Errorf("webhook: %v", err)
	}
}

// startExtender runs a fresh extender on extPort and waits until Ready.
func (e *env) startExtender(t *testing.T) {
	t.Helper()
	e.ext, _ = e.newExtender(t, extender.Options{Port: e.extPort})
	e.waitExtenderReady(t, e.ext)
}

// newExtender starts an extender as its service account with o (bound to
// loopback, no metrics), its API calls through a faultTransport.
func (e *env) newExtender(t *testing.T, o extender.Options) (*localcluster.Extender, *faultTransport) {
	t.Helper()
	o.BindAddress, o.MetricsBindAddress = "127.0.0.1", "0"
	if o.Config == nil {
		o.Config = configv1alpha1.DefaultExtenderConfiguration()
	}
	o.Config.ResourceName = string(e.resource)
	cfg := e.cp.UserConfig(t, extenderUser)
	ft := &faultTransport{e: e}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { ft.next = rt; return ft })
	x, err := localcluster.StartExtender(klog.NewContext(context.Background(), e.logger), cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return x, ft
}

func (e *env) waitExtenderReady(t *testing.T, x *localcluster.Extender) {
	t.Helper()
	if err := x.WaitReady(harness.Context(t), time.Minute); err != nil {
		t.Fatal(err)
	}
}

func (e *env) stopExtender(t *testing.T) {
	t.Helper()
	if err := e.ext.Stop(); err != nil {
		t.Errorf("extender: %v", err)
	}
}

// bindFault acts on an extender's next Binding.
type bindFault struct {
	mode faultMode
	// skip Bindings pass untouched before the fault acts.
	skip       int
	hit        chan struct{} // closed when the Binding is held
	release    chan struct{} // closed by the test to let the held call go on
	releaseOne sync.Once
	// result is the apiserver's answer to the Binding (killAfterWrite and
	// hold).
	result error
	done   chan struct{} // closed once result is set
}

type faultMode int

const (
	// killBeforeWrite: the extender dies after reserving the GPUs in its
	// ledger, before the Binding reaches the apiserver.
	killBeforeWrite faultMode = iota
	// killAfterWrite: the extender dies right after the apiserver wrote
	// the Binding; it never learns the outcome and never replies.
	killAfterWrite
	// hold: the Binding waits until released, then goes to the apiserver
	// (a bind in flight while the test acts).
	hold
)

func newBindFault(mode faultMode) *bindFault {
	return &bindFault{mode: mode, hit: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
}

func (f *bindFault) free() { f.releaseOne.Do(func() { close(f.release) }) }

var errKilled = errors.New("extender killed by the test")

// faultTransport carries one extender instance's API calls. A killed
// instance reaches the apiserver no more, as a dead process would not.
type faultTransport struct {
	next http.RoundTripper
	e    *env
	dead atomic.Bool
}

func (f *faultTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if f.dead.Load() {
		return nil, errKilled
	}
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/binding") {
		return f.next.RoundTrip(r)
	}
	f.e.faultMu.Lock()
	fault := f.e.fault
	if fault != nil && fault.skip > 0 {
		fault.skip--
		fault = nil
	} else {
		f.e.fault = nil
	}
	f.e.faultMu.Unlock()
	if fault == nil {
		return f.next.RoundTrip(r)
	}
	forward := func() (*http.Response, error) {
		resp, err := f.next.RoundTrip(r)
		switch {
		case err != nil:
			fault.result = err
		case resp.StatusCode >= 300:
			fault.result = fmt.Errorf("binding answered %s", resp.Status)
		}
		close(fault.done)
		return resp, err
	}
	switch fault.mode {
	case killBeforeWrite:
		f.dead.Store(true)
		close(fault.done)
	case killAfterWrite:
		f.dead.Store(true)
		if resp, err := forward(); err == nil {
			resp.Body.Close()
		}
	case hold:
		close(fault.hit)
		<-fault.release
		return forward()
	}
	close(fault.hit)
	<-fault.release
	return nil, errKilled
}

func (e *env) injectBindFault(f *bindFault) {
	e.faultMu.Lock()
	defer e.faultMu.Unlock()
	e.fault = f
}

// startAgent runs the node agent on the simulator and waits until it is
// ready and registered with kubelet.
func (e *env) startAgent(t *testing.T) {
	t.Helper()
	ready := make(chan *nodeagent.Agent, 1)
	// The webhook lets a node agent write allocated-gpus only on pods of
	// the node its credential names; a pod-bound token carries the name
	// in the user's extra, impersonated here.
	cfg := rest.CopyConfig(e.cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: agentUser, Extra: map[string][]string{serviceaccount.NodeNameKey: {nodeName}}}
	e.agentRn = localcluster.Go(klog.NewContext(context.Background(), e.logger.WithName("nodeagent")), func(ctx context.Context) error {
		return nodeagent.RunWithNVML(ctx, cfg, nodeagent.Options{
			NodeAgentConfiguration: configv1alpha1.NodeAgentConfiguration{
				NodeName: nodeName, ResourceName: string(e.resource), DeviceListStrategies: e.agentStrategies,
				DevicePluginDir: kubelet.DevicePluginDir, PodResourcesSocket: e.k.PodResourcesSocket,
				TopologyInterval:   metav1.Duration{Duration: 5 * time.Minute},
				TelemetryInterval:  metav1.Duration{Duration: 30 * time.Second},
				ReconcileInterval:  metav1.Duration{Duration: 2 * time.Second},
				MetricsBindAddress: "0",
			},
			Ready: func(a *nodeagent.Agent) { ready <- a },
		}, e.sim.NVML())
	})
	select {
	case e.agent = <-ready:
	case <-e.agentRn.Done():
		_, err := e.agentRn.Exited()
		t.Fatalf("node agent stopped before it was ready: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("node agent not ready after 90s")
	}
	harness.Poll(t, time.Minute, "the device plugin to register with kubelet", func() (bool, string) {
		return e.agent.Plugin.Registrations() > 0, "not registered"
	})
}

func (e *env) stopAgent(t *testing.T) {
	t.Helper()
	if err := e.agentRn.Stop(); err != nil {
		t.Errorf("node agent: %v", err)
	}
}

// waitKubeletGPUs waits until kubelet's device manager holds want healthy
// GPUs from the node agent and the Node reports them allocatable: then a
// pod bound to the node is admitted with its GPUs rather than failed,
// also right after kubelet or the agent restarted.
func (e *env) waitKubeletGPUs(t *testing.T, want int64) {
	t.Helper()
	harness.Poll(t, time.Minute, fmt.Sprintf("kubelet to hold %d healthy %s", want, e.resource), func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := e.prAlloc.GetAllocatableResources(ctx, &podresourcesapi.AllocatableResourcesRequest{})
		if err != nil {
			return false, err.Error()
		}
		n := 0
		for _, d := range resp.GetDevices() {
			if d.ResourceName == string(e.resource) {
				n += len(d.DeviceIds)
			}
		}
		return int64(n) == want, fmt.Sprintf("%d allocatable devices", n)
	})
	e.waitAllocatable(t, want)
}

func (e *env) waitAllocatable(t *testing.T, want int64) {
	t.Helper()
	harness.Poll(t, time.Minute, fmt.Sprintf("node %s to have %d allocatable %s", nodeName, want, e.resource), func() (bool, string) {
		node := &corev1.Node{}
		if err := e.cp.Client.Get(context.Background(), client.ObjectKey{Name: nodeName}, node); err != nil {
			return false, err.Error()
		}
		q := node.Status.Allocatable[e.resource]
		return q.Value() == want, fmt.Sprintf("allocatable %s", q.String())
	})
}

// gpuPod is a pod (not created) with one container requesting gpus GPUs,
// as a user writes it: no scheduler name, no gputopo annotations.
func gpuPod(namespace, name string, gpus int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec:       podSpec(gpus),
	}
}

// gpuPod is gpuPod with the environment's GPU resource name.
func (e *env) gpuPod(namespace, name string, gpus int64) *corev1.Pod {
	p := gpuPod(namespace, name, gpus)
	p.Spec = podSpecOf(gpus, e.resource)
	return p
}

func podSpec(gpus int64) corev1.PodSpec { return podSpecOf(gpus, v1alpha1.ResourceGPU) }

func podSpecOf(gpus int64, name corev1.ResourceName) corev1.PodSpec {
	spec := corev1.PodSpec{
		RestartPolicy:                 corev1.RestartPolicyNever,
		TerminationGracePeriodSeconds: ptr.To[int64](0),
		AutomountServiceAccountToken:  ptr.To(false),
		Containers:                    []corev1.Container{{Name: "main", Image: trainImage}},
	}
	if gpus > 0 {
		q := *resource.NewQuantity(gpus, resource.DecimalSI)
		spec.Containers[0].Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{name: q},
			Limits:   corev1.ResourceList{name: q},
		}
	}
	return spec
}

func (e *env) create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := e.cp.Client.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s/%s: %v", obj, obj.GetNamespace(), obj.GetName(), err)
	}
}

func (e *env) getPod(t *testing.T, namespace, name string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{}
	if err := e.cp.Client.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, p); err != nil {
		t.Fatalf("get pod %s/%s: %v", namespace, name, err)
	}
	return p
}

func (e *env) waitPod(t *testing.T, p *corev1.Pod, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	got, err := e.cp.WaitForPod(context.Background(), p.Namespace, p.Name, timeout, cond)
	if err != nil {
		t.Fatalf("waiting for %s: %v; annotations %v", what, err, got.Annotations)
	}
	return got
}

func isRunning(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }

// scheduledFalse is the PodScheduled=False condition, if the pod has one.
func scheduledFalse(p *corev1.Pod) (corev1.PodCondition, bool) {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c, true
		}
	}
	return corev1.PodCondition{}, false
}

// trainImage is the image of the test's GPU pods.
const trainImage = "registry.example/train:1"

// visible is the NVIDIA_VISIBLE_DEVICES the runtime received for the
// pod's (this incarnation's) container "main", sorted; ok is false when
// the runtime created none. On containerd it is read from the running
// process's environment, and a variable set other than exactly once is
// reported as not ok.
func (e *env) visible(p *corev1.Pod) ([]string, bool) {
	if e.k.Containerd != nil {
		env, err := e.environ(p, "main")
		if err != nil {
			return nil, false
		}
		vals := kubelet.Lookup(env, v1alpha1.EnvVisibleDevices)
		if len(vals) != 1 {
			return nil, false
		}
		return kubelet.EnvList(vals[0]), true
	}
	var env map[string]string
	for _, c := range e.k.Runtime.ContainersOf(p.Namespace, p.Name) {
		if c.PodUID == string(p.UID) {
			env = c.Env
		}
	}
	if env == nil {
		return nil, false
	}
	return kubelet.EnvList(env[v1alpha1.EnvVisibleDevices]), true
}

// environ is the environment of the running process of container name
// of pod p, on containerd.
func (e *env) environ(p *corev1.Pod, name string) ([]string, error) {
	pid, err := e.pid(p, name)
	if err != nil {
		return nil, err
	}
	return kubelet.Environ(pid)
}

// pid is the host PID of container name of pod p, on containerd.
func (e *env) pid(p *corev1.Pod, name string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.k.Containerd.PID(ctx, p.Namespace, p.Name, string(p.UID), name)
}

// deletePods deletes the named pods (all pods of the namespace when none
// are named) at once and waits until they are gone from the API, kubelet
// and the extender's ledger.
func (e *env) deletePods(t *testing.T, namespace string, names ...string) {
	t.Helper()
	ctx := context.Background()
	list := &corev1.PodList{}
	if err := e.cp.Client.List(ctx, list, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	gone := map[types.UID]bool{}
	for i := range list.Items {
		p := &list.Items[i]
		if len(names) > 0 && !slices.Contains(names, p.Name) {
			continue
		}
		gone[p.UID] = true
		if err := e.cp.Client.Delete(ctx, p, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
			t.Fatalf("delete pod %s: %v", p.Name, err)
		}
	}
	harness.Poll(t, time.Minute, "deleted pods to be gone", func() (bool, string) {
		list := &corev1.PodList{}
		if err := e.cp.Client.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return false, err.Error()
		}
		for i := range list.Items {
			p := &list.Items[i]
			if !gone[p.UID] {
				continue
			}
			// Job pods carry the Job controller's tracking finalizer;
			// with the Job gone nobody else removes it.
			if len(p.Finalizers) > 0 {
				patch := client.MergeFrom(p.DeepCopy())
				p.Finalizers = nil
				_ = e.cp.Client.Patch(ctx, p, patch)
			}
			return false, "pod " + p.Name + " still in the API"
		}
		for _, h := range e.ext.Core().Report().Holdings() {
			if gone[h.PodUID] {
				return false, "ledger still holds " + h.Pod.String()
			}
		}
		prs, err := e.pr.List(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range prs {
			if p.Namespace == namespace && (len(names) == 0 || slices.Contains(names, p.Name)) {
				return false, "kubelet still lists " + p.Name
			}
		}
		return true, ""
	})
}

// deleteJob deletes a Job, leaving its pods (no garbage collector runs);
// deletePods removes them.
func (e *env) deleteJob(t *testing.T, namespace, name string) {
	t.Helper()
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := e.cp.Client.Delete(context.Background(), job, client.PropagationPolicy(metav1.DeletePropagationOrphan)); client.IgnoreNotFound(err) != nil {
		t.Fatalf("delete job %s: %v", name, err)
	}
	harness.Poll(t, 30*time.Second, "job "+name+" to be gone", func() (bool, string) {
		err := e.cp.Client.Get(context.Background(), client.ObjectKeyFromObject(job), job)
		if err == nil && len(job.Finalizers) > 0 {
			patch := client.MergeFrom(job.DeepCopy())
			job.Finalizers = nil
			_ = e.cp.Client.Patch(context.Background(), job, patch)
		}
		return err != nil && client.IgnoreNotFound(err) == nil, fmt.Sprint(err)
	})
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}
