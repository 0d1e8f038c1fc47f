//go:build integration

package chart

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology"
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
	bin, err := harness.Binary("kube-scheduler")
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
	p := harness.StartProcess(t, "kube-scheduler", bin, "--config="+path, "--bind-address=127.0.0.1", "--secure-port="+strconv.Itoa(port), "--v=2")
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the local scheduler's self-signed serving cert
	}}
	err = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("kube-scheduler exited: %v", err)
		}
		resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/healthz", port))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("kube-scheduler did not become healthy: %v\n%s", err, p.Tail(30))
	}
	return p
}

// The chart's KubeSchedulerConfiguration, run by the real kube-scheduler
// under the chart's scheduler service account, sends a GPU pod through the
// real extender (running under the chart's extender service account with
// the chart's ExtenderConfiguration and leader election): filter,
// prioritize and bind, ending with the pod bound to GPUs the extender
// chose. Only the extender URL is changed, from the in-cluster Service to
// the local listener.
func TestRenderedSchedulerConfigRunsThroughExtender(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)
	rel := defaultRelease
	fn := rel.fullname()
	objs := rel.render(t)
	createNamespace(t, cp, rel.namespace)

	// The chart's RBAC, for real: the components below run with nothing
	// else.
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := apply(ctx, cp, dyn, o, false); err != nil {
				t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}

	// Two GPU nodes with their topology, as the node agent publishes it:
	// with one feasible node kube-scheduler skips scoring, prioritize
	// included.
	nodes := map[string]string{"dgx-a100-0": "dgx-a100", "hgx-h100-0": "hgx-h100"}
	for nodeName, fixture := range nodes {
		cp.CreateGPUNode(t, nodeName, 8, map[string]string{"nvidia.com/gpu.present": "true"})
		fx, err := topology.FixtureByName(fixture)
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

	// The extender with the chart's configuration, flags and identity.
	cfg, err := extender.ParseConfiguration(configData(t, objs, fn+"-extender", "config.yaml"))
	if err != nil {
		t.Fatalf("extender ConfigMap: %v", err)
	}
	extUser, extGroups := serviceAccountUser(rel.namespace, fn+"-extender")
	opts := extender.NewOptions()
	opts.BindAddress, opts.Port, opts.MetricsBindAddress = "127.0.0.1", 0, "0"
	opts.Config = cfg
	opts.LeaderElect = true
	opts.LeaderElectionNamespace, opts.LeaderElectionID = rel.namespace, fn+"-extender"
	x, err := extender.New(cp.UserConfig(t, extUser, extGroups...), opts)
	if err != nil {
		t.Fatalf("extender: %v", err)
	}
	extCtx, stopExt := context.WithCancel(ctx)
	extDone := make(chan error, 1)
	go func() { extDone <- x.Start(extCtx) }()
	t.Cleanup(func() {
		stopExt()
		if err := <-extDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("extender: %v", err)
		}
	})
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		select {
		case err := <-extDone:
			return false, fmt.Errorf("extender stopped: %w", err)
		default:
		}
		return x.Ready(), nil
	}); err != nil {
		t.Fatalf("extender never became Ready under the chart's RBAC (caches, Lease %s/%s-extender): %v", rel.namespace, fn, err)
	}

	// The scheduler with the chart's configuration and identity.
	schedCfg, err := harness.ParseSchedulerConfig(configData(t, objs, fn+"-scheduler", "config.yaml"))
	if err != nil {
		t.Fatalf("scheduler ConfigMap: %v", err)
	}
	if len(schedCfg.Extenders) != 1 {
		t.Fatalf("scheduler config has %d extenders, want 1", len(schedCfg.Extenders))
	}
	schedCfg.Extenders[0].URLPrefix = strings.Replace(schedCfg.Extenders[0].URLPrefix,
		fmt.Sprintf("%s-extender.%s.svc:8080", fn, rel.namespace), x.APIAddr(), 1)
	if !strings.HasPrefix(schedCfg.Extenders[0].URLPrefix, "http://"+x.APIAddr()+"/") {
		t.Fatalf("extender urlPrefix %q does not name the chart's extender Service", schedCfg.Extenders[0].URLPrefix)
	}
	schedUser, schedGroups := serviceAccountUser(rel.namespace, fn+"-scheduler")
	startSchedulerAs(t, cp, schedCfg, schedUser, schedGroups)

	pod := harness.GPUPod("default", "train-0", 4)
	pod.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	pod.Annotations = map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatalf("create pod: %v", err)
	}
	got, err := cp.WaitForPod(ctx, pod.Namespace, pod.Name, 90*time.Second, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	if err != nil {
		t.Fatalf("gputopo-scheduler never bound the GPU pod: %v", err)
	}
	nodeName := got.Spec.NodeName
	if _, ok := nodes[nodeName]; !ok {
		t.Fatalf("pod bound to %q, want one of the GPU nodes %v", nodeName, nodes)
	}
	// Only the extender's bind writes assigned-gpus: the scheduler used the
	// bind verb, with GPUs of this node.
	uuids := strings.Split(got.Annotations[v1alpha1.AnnotationAssignedGPUs], ",")
	if len(uuids) != 4 {
		t.Fatalf("assigned-gpus = %q, want 4 GPUs bound by the extender", got.Annotations[v1alpha1.AnnotationAssignedGPUs])
	}
	known := map[string]bool{}
	for i := range 8 {
		known[topology.FixtureUUID(nodeName, i)] = true
	}
	for _, u := range uuids {
		if !known[u] {
			t.Errorf("assigned GPU %q is not a GPU of %s", u, nodeName)
		}
	}
	for _, phase := range []string{"filter", "prioritize", "bind"} {
		if n := verbCalls(t, x, phase); n < 1 {
			t.Errorf("extender saw %d %s calls, want at least 1", n, phase)
		}
	}

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
}

// verbCalls is how many requests the extender timed for phase.
func verbCalls(t *testing.T, x *extender.Extender, phase string) uint64 {
	t.Helper()
	families, err := x.Metrics().Registry.Gather()
	if err != nil {
		t.Fatalf("gather extender metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() != "gpu_extender_scheduling_latency_seconds" {
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
