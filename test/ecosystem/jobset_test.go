//go:build integration

// Package ecosystem runs gputopo beside the workload controllers users
// run, built at pinned versions by make tools (hack/tools/controllers.sh):
// their real controllers create the Jobs and pods, gputopo's webhook and
// scheduler place them.
package ecosystem

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
	"github.com/gputopo/gputopo/webhook"
)

// JobSetModule is the JobSet release whose controller make tools builds
// (hack/tools/controllers/go.mod pins the same version) and whose CRD the
// tests install.
const JobSetModule = "sigs.k8s.io/jobset@v0.11.1"

const (
	nsTeam      = "team"
	cliqueLabel = "nvidia.com/gpu.clique"
	spineLabel  = "network.topology.nvidia.com/spine"
)

// env is a control plane with gputopo's webhook registered and serving,
// the Job controller and garbage collector, gputopo deciding (plugin mode:
// gputopo-scheduler; extender mode: kube-scheduler calling an in-process
// extender) and JobSet's controller, on two GB200 NVL72 racks.
type env struct {
	cp    *harness.ControlPlane
	nodes []string
	// gpus is the GPUs of all nodes.
	gpus  int
	sched *harness.Decider
	// ext is the extender in extender mode (nil in plugin mode).
	ext *harness.Extender
}

const extenderUser = "gputopo-extender"

// envOptions shape an environment: its nodes (two GB200 NVL72 racks by
// default) and the workload controllers it runs besides the Job
// controller (JobSet's by default).
type envOptions struct {
	// nodes creates the nodes and publishes their topologies; nil: two
	// GB200 NVL72 racks (gb200Racks).
	nodes func(t *testing.T, e *env)
	// controllers are kube-controller-manager's controllers beyond job and
	// garbagecollector.
	controllers []string
	// start runs the workload controllers; nil: JobSet's.
	start func(e *env, t *testing.T)
	// configure, when set, changes the deciding scheduler's configuration.
	configure func(*schedconfigv1.KubeSchedulerConfiguration)
	// noDecider: gputopo decides nothing (no gputopo-scheduler, extender
	// or its kube-scheduler profile); the mode is then ignored.
	noDecider bool
}

// eachMode runs f once per mode, each on its own environment of two
// GB200 racks with JobSet's controller.
func eachMode(t *testing.T, f func(t *testing.T, e *env)) { eachModeWith(t, envOptions{}, f) }

// eachModeWith runs f once per mode, each on its own environment shaped
// by opts.
func eachModeWith(t *testing.T, opts envOptions, f func(t *testing.T, e *env)) {
	for _, m := range localcluster.Modes {
		t.Run(string(m), func(t *testing.T) { f(t, newEnv(t, m, opts)) })
	}
}

// gb200Racks creates 36 GB200 NVL72 trays of 4 GPUs, 18 per NVLink clique
// (rack), all under one spine.
func gb200Racks(t *testing.T, e *env) {
	t.Helper()
	f, err := machine.FixtureByName("gb200-nvl72-tray")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 36 {
		e.addNode(t, fmt.Sprintf("rack-%d-%02d", i/18, i%18), f, map[string]string{cliqueLabel: fmt.Sprintf("clique-%d", i/18), spineLabel: "s"})
	}
}

// addNode creates a node of machine f with labels and publishes its
// topology.
func (e *env) addNode(t *testing.T, name string, f machine.Fixture, labels map[string]string) {
	t.Helper()
	gpus := f.GPUs
	labels[corev1.LabelHostname] = name
	e.nodes = append(e.nodes, name)
	e.gpus += gpus
	e.cp.CreateGPUNode(t, name, gpus, labels)
	e.cp.PublishTopology(t, name, f)
}

// addDRANode creates a node of machine f whose GPUs a DRA driver serves:
// it advertises no nvidia.com/gpu (publishGPUs lists its devices), and its
// topology is published as the node agent does.
func (e *env) addDRANode(t *testing.T, name string, f machine.Fixture) {
	t.Helper()
	e.nodes = append(e.nodes, name)
	e.gpus += f.GPUs
	e.cp.CreateGPUNode(t, name, -1, map[string]string{corev1.LabelHostname: name})
	e.cp.PublishTopology(t, name, f)
}

// held is how many GPUs the deciding core's ledger holds or has reserved.
func (e *env) held(t *testing.T) int {
	t.Helper()
	if e.ext != nil {
		c := e.ext.Core().Report().Counts()
		return c.Held + c.Reserved
	}
	g, err := e.sched.CoreGauges()
	if err != nil {
		t.Fatal(err)
	}
	return int(g["held"] + g["reserved"])
}

func newEnv(t *testing.T, mode localcluster.Mode, opts envOptions) *env {
	t.Helper()
	mut, val, err := webhook.Registration(webhook.RegistrationOptions{ServiceName: "gputopo-webhook", ServiceNamespace: "gputopo-system", ResourceName: string(v1alpha1.ResourceGPU)})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{cp: harness.Start(t, harness.Options{WebhookInstallOptions: &envtest.WebhookInstallOptions{
		MutatingWebhooks:   []*admissionregistrationv1.MutatingWebhookConfiguration{mut},
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{val},
	}})}
	ctx := harness.Context(t)
	crds := filepath.Join(harness.ModuleDir(t, JobSetModule), "config", "components", "crd", "bases")
	if _, err := envtest.InstallCRDs(e.cp.Config, envtest.CRDInstallOptions{Paths: []string{crds}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install JobSet's CRD: %v", err)
	}
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsTeam, Labels: map[string]string{v1alpha1.LabelInjection: v1alpha1.InjectionEnabled}}},
		// No service account controller runs: pods need the account.
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nsTeam, Name: "default"}},
	} {
		if err := e.cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	if opts.nodes == nil {
		opts.nodes = gb200Racks
	}
	opts.nodes(t, e)
	e.startWebhook(t)
	// The Job controller creates the pods; the garbage collector deletes
	// them with their Job when JobSet restarts.
	e.cp.StartControllerManager(t, append([]string{"job", "garbagecollector"}, opts.controllers...)...)
	switch {
	case opts.noDecider:
	case mode == localcluster.ModePlugin:
		if err := localcluster.GrantExtenderRole(ctx, e.cp.Client, harness.SchedulerUser); err != nil {
			t.Fatal(err)
		}
		e.sched = e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin, Configure: opts.configure})
		harness.WaitCore(t, e.sched, localcluster.TotalGPUs(e.gpus))
	default:
		if err := localcluster.GrantExtenderRole(ctx, e.cp.Client, extenderUser); err != nil {
			t.Fatal(err)
		}
		port, err := harness.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		x := harness.StartExtender(t, context.Background(), e.cp.UserConfig(t, extenderUser),
			extender.Options{Port: port, BindAddress: "127.0.0.1", MetricsBindAddress: "0", Config: configv1alpha1.DefaultExtenderConfiguration()})
		e.ext = x
		e.sched = e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModeExtender, ExtenderURL: x.URL(), Configure: opts.configure})
	}
	if opts.start == nil {
		opts.start = (*env).startJobSet
	}
	opts.start(e, t)
	return e
}

// startWebhook runs gputopo's webhook where envtest registered it and waits
// until it mutates pods in the opted-in namespace.
func (e *env) startWebhook(t *testing.T) {
	t.Helper()
	wio := e.cp.Env.WebhookInstallOptions
	mgr, err := webhook.NewManager(configv1alpha1.DefaultWebhookConfiguration(), e.cp.Config, webhook.Options{
		Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		CertName: "tls.crt", KeyName: "tls.key", MetricsBindAddress: "0", HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatalf("webhook manager: %v", err)
	}
	run := localcluster.Go(context.Background(), mgr.Start)
	t.Cleanup(func() {
		if err := run.Stop(); err != nil {
			t.Errorf("webhook: %v", err)
		}
	})
	harness.Poll(t, time.Minute, "the webhook to mutate pods in "+nsTeam, func() (bool, string) {
		if exited, err := run.Exited(); exited {
			t.Fatalf("webhook stopped: %v", err)
		}
		probe := harness.GPUPod(nsTeam, "probe", 1)
		if err := e.cp.Client.Create(context.Background(), probe, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return probe.Spec.SchedulerName == v1alpha1.DefaultSchedulerName, "schedulerName " + probe.Spec.SchedulerName
	})
}

// startJobSet runs JobSet's controller manager (bin/jobset-controller) as
// a cluster admin, its configuration turning off its internal certificate
// management, leader election, metrics and probes. Its webhook server
// still starts (JobSet has no switch for it) and serves the harness's
// certificate on a free port, but it is not registered with the
// apiserver: the tests write the fields JobSet's defaulting webhook would
// default.
func (e *env) startJobSet(t *testing.T) {
	t.Helper()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := kubebuilderConfig("config.jobset.x-k8s.io/v1alpha1", port, e.cp.Env.WebhookInstallOptions.LocalServingCertDir)
	e.startManager(t, "jobset-controller", cfg, nil, func(p *localcluster.Process) (bool, string) {
		return p.LogContains("Starting workers"), p.Tail(3)
	})
}

// jobSet is a JobSet of replicas Jobs of pods pods × 4 GPUs each, whose
// replicated Job's template carries annotations.
func jobSet(name string, replicas, pods int, annotations map[string]string) *unstructured.Unstructured {
	js := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "jobset.x-k8s.io/v1alpha2",
		"kind":       "JobSet",
		"metadata":   map[string]any{"name": name, "namespace": nsTeam},
		"spec": map[string]any{
			// What JobSet's defaulting webhook would set.
			"successPolicy": map[string]any{"operator": "All"},
			"failurePolicy": map[string]any{"maxRestarts": int64(1)},
			"network":       map[string]any{"enableDNSHostnames": false},
			"replicatedJobs": []any{map[string]any{
				"name":     "rack",
				"replicas": int64(replicas),
				"template": map[string]any{
					"metadata": map[string]any{"annotations": anyMap(annotations)},
					"spec": map[string]any{
						"parallelism":    int64(pods),
						"completions":    int64(pods),
						"completionMode": "Indexed",
						"backoffLimit":   int64(0),
						"template": map[string]any{
							"spec": map[string]any{
								"restartPolicy": "Never",
								"containers": []any{map[string]any{
									"name": "trainer", "image": "trainer",
									"resources": map[string]any{"limits": map[string]any{string(v1alpha1.ResourceGPU): "4"}},
								}},
							},
						},
					},
				},
			}},
		},
	}}
	return js
}

func listPods(t *testing.T, e *env) []corev1.Pod {
	t.Helper()
	l, err := e.cp.Clientset.CoreV1().Pods(nsTeam).List(harness.Context(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestJobSetIsOneGroupOfSlices: a JobSet of 2 Jobs × 16 pods × 4 GPUs,
// model-parallel, required in one spine with each Job's pods in one NVLink
// clique, run by JobSet's real controller. gputopo's Job webhook makes the
// JobSet one group of 32 pods in 2 slices (each Job a slice, by its Job
// index); the Job controller creates the pods; gputopo-scheduler binds all
// 32, each Job wholly inside one rack, one rack per Job. When a pod fails
// and JobSet restarts (its failure policy recreates the Jobs), the new
// pods are a fresh group, bound whole, and nothing of the first is held;
// deleting the JobSet frees every GPU within seconds. Both modes.
func TestJobSetIsOneGroupOfSlices(t *testing.T) { eachMode(t, testJobSetIsOneGroupOfSlices) }

func testJobSetIsOneGroupOfSlices(t *testing.T, e *env) {
	ctx := harness.Context(t)
	js := jobSet("llm", 2, 16, map[string]string{
		v1alpha1.AnnotationParallelism:           string(v1alpha1.ParallelismModel),
		v1alpha1.AnnotationGroupRequiredTopology: "spine",
		v1alpha1.AnnotationSliceRequiredTopology: "nvlink",
	})
	if err := e.cp.Client.Create(ctx, js); err != nil {
		t.Fatalf("create JobSet: %v", err)
	}
	harness.Poll(t, 3*time.Minute, "the JobSet's 32 pods bound", func() (bool, string) {
		bound, n := 0, 0
		for _, p := range listPods(t, e) {
			n++
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound == 32, fmt.Sprintf("%d pods, %d bound", n, bound)
	})
	racks := map[string]map[string]bool{} // Job index -> racks
	for _, p := range listPods(t, e) {
		if g := p.Annotations[v1alpha1.AnnotationGroup]; g != "llm" || p.Annotations[v1alpha1.AnnotationGroupSize] != "32" || p.Annotations[v1alpha1.AnnotationSliceSize] != "16" {
			t.Errorf("pod %s: group %q of %s in slices of %s; want the JobSet's group llm of 32 in slices of 16", p.Name, g, p.Annotations[v1alpha1.AnnotationGroupSize], p.Annotations[v1alpha1.AnnotationSliceSize])
		}
		j := p.Labels["jobset.sigs.k8s.io/job-global-index"]
		if racks[j] == nil {
			racks[j] = map[string]bool{}
		}
		racks[j][p.Spec.NodeName[:len("rack-0")]] = true
		pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement])
		if err != nil {
			t.Fatal(err)
		}
		if strconv.Itoa(pl.Slice) != j || !strings.HasPrefix(pl.SliceDomain, cliqueLabel+"=") {
			t.Errorf("pod %s of Job %s: placed in slice %d, %q", p.Name, j, pl.Slice, pl.SliceDomain)
		}
	}
	if len(racks) != 2 || len(racks["0"]) != 1 || len(racks["1"]) != 1 {
		t.Fatalf("Jobs by rack %v: want each Job in one rack", racks)
	}
	for r := range racks["0"] {
		if racks["1"][r] {
			t.Errorf("both Jobs in %s: 32 trays do not fit one rack of 18", r)
		}
	}

	// A pod fails: its Job fails (backoffLimit 0) and JobSet restarts,
	// recreating both Jobs. The new pods are a fresh group (llm-r1), bound
	// whole as before; nothing of the first group is held.
	var first corev1.Pod
	for _, p := range listPods(t, e) {
		first = p
		break
	}
	first.Status.Phase = corev1.PodFailed
	if err := e.cp.Client.Status().Update(ctx, &first); err != nil {
		t.Fatalf("fail pod %s: %v", first.Name, err)
	}
	harness.Poll(t, 3*time.Minute, "the restarted JobSet's 32 pods bound as group llm-r1", func() (bool, string) {
		fresh, bound, old := 0, 0, 0
		for _, p := range listPods(t, e) {
			if p.DeletionTimestamp != nil {
				// No kubelet runs: confirm the deletion as it would once
				// the containers stopped.
				_ = e.cp.Clientset.CoreV1().Pods(nsTeam).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			}
			switch p.Annotations[v1alpha1.AnnotationGroup] {
			case "llm-r1":
				fresh++
				if p.Spec.NodeName != "" {
					bound++
				}
			default:
				old++
			}
		}
		var jobs []string
		if l, err := e.cp.Clientset.BatchV1().Jobs(nsTeam).List(ctx, metav1.ListOptions{}); err == nil {
			for _, j := range l.Items {
				var conds []string
				for _, c := range j.Status.Conditions {
					conds = append(conds, string(c.Type)+"="+string(c.Status))
				}
				jobs = append(jobs, fmt.Sprintf("%s failed=%d %v", j.Name, j.Status.Failed, conds))
			}
		}
		return fresh == 32 && bound == 32 && old == 0, fmt.Sprintf("%d pods of llm-r1, %d bound; %d pods of the first attempt left; jobs %v", fresh, bound, old, jobs)
	})
	harness.Poll(t, time.Minute, "the ledger to hold the new group's GPUs only", func() (bool, string) {
		h := e.held(t)
		return h == 128, fmt.Sprintf("%d GPUs held or reserved, want 128", h)
	})

	// Deleting the JobSet frees every GPU within seconds (the garbage
	// collector deletes its Jobs and their pods).
	if err := e.cp.Client.Delete(ctx, js, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete JobSet: %v", err)
	}
	e.waitAllFreed(t, "the JobSet", 30*time.Second)
}

// TestJobSetSlicesOnDGXLeaves: a JobSet of 2 Jobs × 4 pods × 4 GPUs,
// model-parallel, each Job a slice required inside one leaf, on five DGX
// A100 nodes under three leaves (one leaf of a single node: no Job fits
// it). All 8 pods are bound, each Job's 4 pods inside one leaf of two
// nodes, the two Jobs in the two such leaves; deleting the JobSet frees
// every GPU within seconds. Both modes.
func TestJobSetSlicesOnDGXLeaves(t *testing.T) {
	eachModeWith(t, envOptions{nodes: dgxLeaves}, testJobSetSlicesOnDGXLeaves)
}

func testJobSetSlicesOnDGXLeaves(t *testing.T, e *env) {
	ctx := harness.Context(t)
	js := jobSet("train", 2, 4, map[string]string{
		v1alpha1.AnnotationParallelism:           string(v1alpha1.ParallelismModel),
		v1alpha1.AnnotationSliceRequiredTopology: "leaf",
	})
	if err := e.cp.Client.Create(ctx, js); err != nil {
		t.Fatalf("create JobSet: %v", err)
	}
	harness.Poll(t, 2*time.Minute, "the JobSet's 8 pods bound", func() (bool, string) {
		bound, n := 0, 0
		for _, p := range listPods(t, e) {
			n++
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound == 8, fmt.Sprintf("%d pods, %d bound", n, bound)
	})
	leaves := map[string]map[string]bool{} // Job index -> leaves
	for _, p := range listPods(t, e) {
		if p.Annotations[v1alpha1.AnnotationGroup] != "train" || p.Annotations[v1alpha1.AnnotationGroupSize] != "8" || p.Annotations[v1alpha1.AnnotationSliceSize] != "4" {
			t.Errorf("pod %s: group %q of %s in slices of %s; want train of 8 in slices of 4", p.Name, p.Annotations[v1alpha1.AnnotationGroup], p.Annotations[v1alpha1.AnnotationGroupSize], p.Annotations[v1alpha1.AnnotationSliceSize])
		}
		j := p.Labels["jobset.sigs.k8s.io/job-global-index"]
		if leaves[j] == nil {
			leaves[j] = map[string]bool{}
		}
		leaves[j][strings.Split(p.Spec.NodeName, "-")[1]] = true
	}
	if len(leaves) != 2 || len(leaves["0"]) != 1 || len(leaves["1"]) != 1 || leaves["0"]["a"] || leaves["1"]["a"] {
		t.Fatalf("Jobs by leaf %v: want each Job in one leaf of two nodes", leaves)
	}
	if err := e.cp.Client.Delete(ctx, js, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete JobSet: %v", err)
	}
	e.waitAllFreed(t, "the JobSet", 30*time.Second)
}
