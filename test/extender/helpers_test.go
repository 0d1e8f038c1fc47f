//go:build integration

package extender_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

const (
	fixture       = "dgx1-v100"
	gpusPerNode   = 8
	extenderUser  = "gputopo-extender"
	modelParallel = `{"requireNVLink":true,"strategy":"highest_bandwidth"}`
)

// env is a control plane with GPU nodes from a fixture and the extender's
// RBAC installed.
type env struct {
	cp    *harness.ControlPlane
	nodes []string
	// gpus is each node's GPU count (0: gpusPerNode).
	gpus int
}

// totalGPUs is every node's GPUs.
func (e *env) totalGPUs() int {
	if e.gpus > 0 {
		return len(e.nodes) * e.gpus
	}
	return len(e.nodes) * gpusPerNode
}

// newFabricEnv is a control plane with n nodes of fixture fx (gpus GPUs
// each), node i named name(i) and carrying labels(i).
func newFabricEnv(t *testing.T, fx string, gpus, n int, name func(int) string, labels func(int) map[string]string) *env {
	t.Helper()
	e := newEnv(t, 0)
	f, err := machine.FixtureByName(fx)
	if err != nil {
		t.Fatal(err)
	}
	e.gpus = gpus
	for i := range n {
		e.nodes = append(e.nodes, name(i))
		createNodeWith(t, e.cp, name(i), gpus, labels(i))
		e.cp.PublishTopology(t, name(i), f)
	}
	return e
}

func newEnv(t *testing.T, nodes int) *env { return newEnvWith(t, nodes, harness.Options{}) }

// newEnvWith is newEnv on a control plane started with opts.
func newEnvWith(t *testing.T, nodes int, opts harness.Options) *env {
	t.Helper()
	cp := harness.Start(t, opts)
	ctx := harness.Context(t)
	cs := cp.Clientset
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: extenderUser}, Rules: extender.RBACRules(),
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRole: %v", err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: extenderUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: extenderUser},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: extenderUser}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ClusterRoleBinding: %v", err)
	}
	f, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{cp: cp}
	for i := range nodes {
		name := fmt.Sprintf("dgx-%d", i)
		e.nodes = append(e.nodes, name)
		createNode(t, cp, name)
		cp.PublishTopology(t, name, f)
	}
	return e
}

// createNode registers a Node with GPUs and removes the not-ready taint a
// bare control plane (no node lifecycle controller) leaves on it.
func createNode(t *testing.T, cp *harness.ControlPlane, name string) {
	t.Helper()
	createNodeWith(t, cp, name, gpusPerNode, nil)
}

// createNodeWith is createNode with gpus GPUs and labels.
func createNodeWith(t *testing.T, cp *harness.ControlPlane, name string, gpus int, labels map[string]string) {
	t.Helper()
	ctx := harness.Context(t)
	n, err := cp.Clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("96"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
		v1alpha1.ResourceGPU:  *resource.NewQuantity(int64(gpus), resource.DecimalSI),
	}
	n.Status.Capacity, n.Status.Allocatable = res, res
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now()}}
	if n, err = cp.Clientset.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update node status %s: %v", name, err)
	}
	n.Spec.Taints = nil
	if _, err := cp.Clientset.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("remove taints of node %s: %v", name, err)
	}
}

// runningExtender is an in-process extender replica.
type runningExtender struct {
	*localcluster.Extender
	port int
}

// stop ends the replica and returns what Start returned; safe to call
// more than once.
func (r *runningExtender) stop() error { return r.Stop() }

func (r *runningExtender) url() string { return "http://127.0.0.1:" + strconv.Itoa(r.port) }

// startExtender runs an extender as the extenderUser on port (0: a free
// one).
func startExtender(t *testing.T, e *env, port int, leaderElect bool) *runningExtender {
	t.Helper()
	return startExtenderWith(t, e, port, func(o *extender.Options) { o.LeaderElect = leaderElect })
}

// startExtenderWith is startExtender with options changed by mod.
func startExtenderWith(t *testing.T, e *env, port int, mod func(*extender.Options)) *runningExtender {
	t.Helper()
	if port == 0 {
		var err error
		if port, err = harness.FreePort(); err != nil {
			t.Fatal(err)
		}
	}
	o := extender.NewOptions()
	o.BindAddress, o.Port, o.MetricsBindAddress = "127.0.0.1", port, "127.0.0.1:0"
	o.LeaderElectionNamespace = metav1.NamespaceDefault
	o.LeaseDuration, o.RenewDeadline, o.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	mod(&o)
	x, err := localcluster.StartExtender(klog.NewContext(context.Background(), klog.Background()), e.cp.UserConfig(t, extenderUser), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = x.Stop() })
	return &runningExtender{Extender: x, port: port}
}

func waitReady(t *testing.T, rs ...*runningExtender) {
	t.Helper()
	for _, r := range rs {
		if err := r.WaitReady(harness.Context(t), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
}

// readyz asks the replica's HTTP probe, as kubelet would.
func readyz(r *runningExtender) bool {
	resp, err := http.Get(r.url() + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// startScheduler runs the real kube-scheduler with the chart's scheduler
// config, pointed at extenderURL (the path of the file's urlPrefix kept).
func startScheduler(t *testing.T, e *env, extenderURL string) *harness.Decider {
	t.Helper()
	return e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModeExtender, ExtenderURL: extenderURL})
}

// gpuPod is a pod for gputopo-scheduler requesting gpus GPUs.
func gpuPod(name string, gpus int64, requirement string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			SchedulerName: v1alpha1.DefaultSchedulerName,
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}},
			}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
	if requirement != "" {
		p.Annotations = map[string]string{v1alpha1.AnnotationRequirement: requirement}
	}
	return p
}

// createAll creates pods at once, from parallel clients' goroutines.
func createAll(t *testing.T, e *env, pods []*corev1.Pod) {
	t.Helper()
	if err := createAllErr(harness.Context(t), e, pods); err != nil {
		t.Fatal(err)
	}
}

func createAllErr(ctx context.Context, e *env, pods []*corev1.Pod) error {
	errs := make(chan error, len(pods))
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Go(func() {
			if _, err := e.cp.Clientset.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("create pod %s: %w", p.Name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return errors.Join(collect(errs)...)
}

func collect(ch chan error) []error {
	var out []error
	for err := range ch {
		out = append(out, err)
	}
	return out
}

func listPods(t *testing.T, e *env) []corev1.Pod {
	t.Helper()
	l, err := e.cp.Clientset.CoreV1().Pods(metav1.NamespaceDefault).List(harness.Context(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// boundGPUs sums the GPUs requested by bound pods.
func boundGPUs(pods []corev1.Pod) int {
	n := 0
	for i := range pods {
		if pods[i].Spec.NodeName != "" {
			n += int(gpuLimit(&pods[i]))
		}
	}
	return n
}

func gpuLimit(p *corev1.Pod) int64 {
	q := p.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPU]
	return q.Value()
}

// auditPods checks the invariants users rely on: every bound GPU pod
// carries assigned-gpus with as many GPUs as it asked for, all on its
// node; no GPU is in two live pods; no node is over capacity.
func auditPods(t *testing.T, pods []corev1.Pod) map[string]string {
	t.Helper()
	owner := map[string]string{}
	perNode := map[string]int{}
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName == "" {
			continue
		}
		uuids, err := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
		if err != nil || int64(len(uuids)) != gpuLimit(p) {
			t.Errorf("bound pod %s: assigned-gpus %q (err %v), want %d GPUs", p.Name, p.Annotations[v1alpha1.AnnotationAssignedGPUs], err, gpuLimit(p))
			continue
		}
		g := mustFixture(t).Graph(p.Spec.NodeName)
		for _, u := range uuids {
			if _, ok := g.IndexOf(u); !ok {
				t.Errorf("pod %s on %s got GPU %s of another node", p.Name, p.Spec.NodeName, u)
			}
			if o, dup := owner[u]; dup {
				t.Errorf("GPU %s issued to two live pods: %s and %s", u, o, p.Name)
			}
			owner[u] = p.Name
		}
		perNode[p.Spec.NodeName] += len(uuids)
	}
	for n, c := range perNode {
		if c > gpusPerNode {
			t.Errorf("node %s over capacity: %d GPUs assigned, has %d", n, c, gpusPerNode)
		}
	}
	return owner
}

func mustFixture(t *testing.T) machine.Fixture {
	t.Helper()
	f, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func deleteAll(t *testing.T, e *env) {
	t.Helper()
	ctx := harness.Context(t)
	if err := e.cp.Clientset.CoreV1().Pods(metav1.NamespaceDefault).DeleteCollection(ctx,
		metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		t.Fatalf("delete pods: %v", err)
	}
}

// The gputopo binary is built once per test run, into a directory
// TestMain removes.
var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// gputopoBinary builds cmd/gputopo (once per test run) and returns its path.
func gputopoBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "gputopo-extender-test-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "gputopo")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/gputopo")
		cmd.Dir = harness.RepoRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/gputopo: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// extenderProcess is the extender running as the gputopo binary.
type extenderProcess struct {
	*harness.Process
	port        int
	metricsPort int
}

func (p *extenderProcess) url() string { return "http://127.0.0.1:" + strconv.Itoa(p.port) }

// startExtenderProcess runs `gputopo extender` on port with kubeconfig's
// user (the extenderUser and its RBAC), /metrics on a free port, and the
// extra flags.
func startExtenderProcess(t *testing.T, name, kubeconfig string, port int, extra ...string) *extenderProcess {
	t.Helper()
	bin := gputopoBinary(t)
	metricsPort, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := harness.StartProcess(t, name, bin, append([]string{"extender",
		"--kubeconfig", kubeconfig,
		"--bind-address", "127.0.0.1",
		"--port", strconv.Itoa(port),
		"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(metricsPort),
		"--v=2"}, extra...)...)
	return &extenderProcess{Process: p, port: port, metricsPort: metricsPort}
}

// waitProcessReady waits for /readyz, as kubelet's readiness probe would,
// failing early if the process exits.
func waitProcessReady(t *testing.T, p *extenderProcess) {
	t.Helper()
	harness.Poll(t, time.Minute, p.Name+" Ready", func() (bool, string) {
		if exited, err := p.Exited(); exited {
			t.Fatalf("%s exited (%v):\n%s", p.Name, err, p.Tail(30))
		}
		resp, err := http.Get(p.url() + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// ledgerGauges reads gputopo_extender_ledger_gpus by state from the process's
// /metrics.
func ledgerGauges(t *testing.T, p *extenderProcess) map[string]float64 {
	t.Helper()
	g, err := localcluster.LedgerGPUs("http://127.0.0.1:" + strconv.Itoa(p.metricsPort) + "/metrics")
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return g
}

// scheduledFalseMessage is the message of the pod's PodScheduled=False
// condition, "" when it has none.
func scheduledFalseMessage(p *corev1.Pod) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return c.Message
		}
	}
	return ""
}
