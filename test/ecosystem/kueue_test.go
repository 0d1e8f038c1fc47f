//go:build integration

package ecosystem

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

// KueueModule is the Kueue release whose controller manager make tools
// builds (hack/tools/kueue/go.mod pins the same version) and whose CRDs
// the tests install.
const KueueModule = "sigs.k8s.io/kueue@v0.17.0"

// Kueue's labels and annotations (sigs.k8s.io/kueue, apis/kueue).
const (
	kueueQueueLabel        = "kueue.x-k8s.io/queue-name"
	kueueRequiredTopology  = "kueue.x-k8s.io/podset-required-topology"
	kueuePreferredTopology = "kueue.x-k8s.io/podset-preferred-topology"
)

// startKueue runs Kueue's controller manager (bin/kueue) as a cluster
// admin beside JobSet's: its CRDs from the module source, its Job and
// JobSet integrations on, internal certificate management, leader
// election, metrics, probes and the visibility API server off.
//
// Kueue's webhooks for Jobs, JobSets and its own objects are registered
// from the module's manifests, pointed at its webhook server on a free
// local port with the harness's certificate: a Job or JobSet submitted to
// a queue is suspended by Kueue's own webhook. With its
// certificate management off, Kueue reads a metrics certificate from a
// fixed path (/etc/kueue/metrics/certs) even when metrics are off; the
// tier gives it one in a private mount namespace (an overlay on /etc seen
// by Kueue's process alone), so the machine's /etc is not touched.
func (e *env) startKueue(t *testing.T) {
	t.Helper()
	dir := harness.ModuleDir(t, KueueModule)
	if _, err := envtest.InstallCRDs(e.cp.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "config", "components", "crd", "bases")}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install Kueue's CRDs: %v", err)
	}
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	wio := e.cp.Env.WebhookInstallOptions
	// The webhooks of the integrations the tier enables and of Kueue's own
	// objects (the pod, Deployment and StatefulSet integrations are off).
	hooks := webhooksAt(t, filepath.Join(dir, "config", "components", "webhook", "manifests.yaml"), "kueue-", fmt.Sprintf("https://127.0.0.1:%d", port), wio.LocalServingCAData,
		"mjob.kb.io", "vjob.kb.io", "mjobset.kb.io", "vjobset.kb.io", "mclusterqueue.kb.io", "vclusterqueue.kb.io",
		"mresourceflavor.kb.io", "vresourceflavor.kb.io", "mworkload.kb.io", "vworkload.kb.io", "vcohort.kb.io")
	for _, obj := range hooks {
		if err := e.cp.Client.Create(harness.Context(t), obj); err != nil {
			t.Fatalf("register Kueue's webhook %s: %v", obj.GetName(), err)
		}
	}
	cfg := fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
manageJobsWithoutQueueName: false
internalCertManagement:
  enable: false
leaderElection:
  leaderElect: false
health:
  healthProbeBindAddress: "0"
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
integrations:
  frameworks: ["batch/job", "jobset.x-k8s.io/jobset"]
featureGates:
  VisibilityOnDemand: false
`, port, wio.LocalServingCertDir)
	tmp := t.TempDir()
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	script := `set -e
mount -t overlay overlay -o lowerdir=/etc,upperdir="$1/upper",workdir="$1/work" /etc
mkdir -p /etc/kueue/metrics/certs
cp "$2/tls.crt" "$2/tls.key" /etc/kueue/metrics/certs/
shift 2
exec "$@"`
	wrap := []string{"/usr/bin/unshare", "--mount", "--propagation", "private"}
	if os.Geteuid() != 0 {
		wrap = append(wrap, "--map-root-user")
	}
	wrap = append(wrap, "/bin/sh", "-c", script, "kueue", tmp, wio.LocalServingCertDir)
	e.startManager(t, "kueue", cfg, wrap, func(p *localcluster.Process) (bool, string) {
		if !p.LogContains(`"msg":"Starting workers"`) {
			return false, p.Tail(3)
		}
		// The webhook answers: a dry-run queued Job is suspended by it.
		probe := queued(indexedJob("probe", 1, 1, nil), "none")
		if err := e.cp.Client.Create(harness.Context(t), probe, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		s, _, _ := unstructured.NestedBool(probe.Object, "spec", "suspend")
		return s, "the queued dry-run Job is not suspended"
	})
}

// kueueObject is a kueue.x-k8s.io/v1beta2 object.
func kueueObject(kind, namespace, name string, spec map[string]any) *unstructured.Unstructured {
	meta := map[string]any{"name": name}
	if namespace != "" {
		meta["namespace"] = namespace
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": meta, "spec": spec,
	}}
}

// kueueQueue creates ClusterQueue queue with gpus GPUs of quota, its
// ResourceFlavor and a LocalQueue of the same name in ns. With topology
// the flavor holds the spine's nodes under Topology topology, whose levels
// are the node labels levels, then the hostname.
func (e *env) kueueQueue(t *testing.T, ns, queue string, gpus int, topology string, levels ...string) {
	t.Helper()
	flavor := map[string]any{}
	if topology != "" {
		flavor = map[string]any{"nodeLabels": map[string]any{spineLabel: "s"}, "topologyName": topology}
	}
	objs := []*unstructured.Unstructured{
		kueueObject("ResourceFlavor", "", queue, flavor),
		kueueObject("ClusterQueue", "", queue, map[string]any{
			"namespaceSelector": map[string]any{},
			"resourceGroups": []any{map[string]any{
				"coveredResources": []any{string(v1alpha1.ResourceGPU)},
				"flavors": []any{map[string]any{"name": queue, "resources": []any{
					map[string]any{"name": string(v1alpha1.ResourceGPU), "nominalQuota": strconv.Itoa(gpus)},
				}}},
			}},
		}),
		kueueObject("LocalQueue", ns, queue, map[string]any{"clusterQueue": queue}),
	}
	if topology != "" {
		var lv []any
		for _, l := range append(levels, corev1.LabelHostname) {
			lv = append(lv, map[string]any{"nodeLabel": l})
		}
		objs = append([]*unstructured.Unstructured{kueueObject("Topology", "", topology, map[string]any{"levels": lv})}, objs...)
	}
	for _, o := range objs {
		if err := e.cp.Client.Create(harness.Context(t), o); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	e.waitClusterQueueActive(t, queue)
}

// waitClusterQueueActive waits for Kueue to mark ClusterQueue queue
// Active.
func (e *env) waitClusterQueueActive(t *testing.T, queue string) {
	t.Helper()
	harness.Poll(t, time.Minute, "ClusterQueue "+queue+" active", func() (bool, string) {
		cq := &unstructured.Unstructured{}
		cq.SetAPIVersion("kueue.x-k8s.io/v1beta2")
		cq.SetKind("ClusterQueue")
		if err := e.cp.Client.Get(harness.Context(t), client.ObjectKey{Name: queue}, cq); err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(cq.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Active" {
				return m["status"] == "True", fmt.Sprintf("%v: %v", m["reason"], m["message"])
			}
		}
		return false, "no Active condition"
	})
}

// queued puts obj in Kueue's queue (Kueue's webhook suspends it).
func queued(obj *unstructured.Unstructured, queue string) *unstructured.Unstructured {
	labels := obj.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels[kueueQueueLabel] = queue
	obj.SetLabels(labels)
	return obj
}

// podsOf lists the pods of nsTeam whose group is group.
func podsOf(t *testing.T, e *env, group string) (pods []corev1.Pod, bound int) {
	t.Helper()
	for _, p := range listPods(t, e) {
		if p.Annotations[v1alpha1.AnnotationGroup] != group {
			continue
		}
		pods = append(pods, p)
		if p.Spec.NodeName != "" {
			bound++
		}
	}
	return pods, bound
}

// TestKueueAdmitsThenGputopoPlaces: Kueue v0.17.0's real controller
// manager beside JobSet's and gputopo, on two GB200 NVL72 racks. Both
// modes.
//
//   - Quota: a ClusterQueue of 32 GPUs. JobSet a (2 Jobs × 4 pods × 4
//     GPUs, each Job a slice in one clique) is admitted and bound whole.
//     JobSet b, the same, exceeds the quota left: it stays suspended, no
//     pod of it exists and gputopo holds nothing for it. Once a is
//     deleted, b is admitted and bound whole, each Job in one clique.
//   - Topology-aware scheduling: a Topology of cliques and hosts, a
//     ResourceFlavor of it and a queue of 64 GPUs. A model-parallel
//     Indexed Job of 4 pods × 4 GPUs required in one clique by Kueue:
//     Kueue assigns each pod a host (its nodeSelector, written by Kueue's
//     ungater), gputopo binds each pod on that host with 4 exact GPUs, the
//     group in one clique.
//   - The impossible combination: with every clique filled but for two
//     trays in each, a Job Kueue only prefers in one clique while gputopo
//     requires its group in one: Kueue assigns hosts in both
//     cliques; the pods stay Pending with gputopo's reason in their
//     events, gputopo holds nothing for them, and a plain pod still binds.
func TestKueueAdmitsThenGputopoPlaces(t *testing.T) {
	eachModeWith(t, envOptions{start: func(e *env, t *testing.T) { e.startJobSet(t); e.startKueue(t) }}, testKueueAdmitsThenGputopoPlaces)
}

func testKueueAdmitsThenGputopoPlaces(t *testing.T, e *env) {
	ctx := harness.Context(t)
	e.actAsKubelet(t)
	e.kueueQueue(t, nsTeam, "quota", 32, "")
	sliced := map[string]string{
		v1alpha1.AnnotationParallelism:           string(v1alpha1.ParallelismModel),
		v1alpha1.AnnotationGroupRequiredTopology: "spine",
		v1alpha1.AnnotationSliceRequiredTopology: "nvlink",
	}
	a := queued(jobSet("a", 2, 4, sliced), "quota")
	if err := e.cp.Client.Create(ctx, a); err != nil {
		t.Fatalf("create JobSet a: %v", err)
	}
	e.waitJobSetPlaced(t, "a")

	b := queued(jobSet("b", 2, 4, sliced), "quota")
	if err := e.cp.Client.Create(ctx, b); err != nil {
		t.Fatalf("create JobSet b: %v", err)
	}
	// b stays suspended while a holds the quota: give Kueue time to decide.
	harness.Poll(t, time.Minute, "Kueue to find JobSet b over quota", func() (bool, string) {
		msg := e.workloadCondition(t, "b", "QuotaReserved")
		return strings.Contains(msg, "False"), msg
	})
	if pods, _ := podsOf(t, e, "b"); len(pods) != 0 {
		t.Fatalf("JobSet b over quota has %d pods", len(pods))
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(b.GroupVersionKind())
	if err := e.cp.Client.Get(ctx, client.ObjectKeyFromObject(b), got); err != nil {
		t.Fatal(err)
	}
	if s, _, _ := unstructured.NestedBool(got.Object, "spec", "suspend"); !s {
		t.Errorf("JobSet b over quota is not suspended")
	}
	if h := e.held(t); h != 32 {
		t.Errorf("%d GPUs held or reserved with JobSet b suspended, want JobSet a's 32", h)
	}
	if err := e.cp.Client.Delete(ctx, a, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete JobSet a: %v", err)
	}
	e.waitJobSetPlaced(t, "b")
	if err := e.cp.Client.Delete(ctx, b, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete JobSet b: %v", err)
	}
	harness.Poll(t, time.Minute, "every GPU free after the JobSets", func() (bool, string) {
		left, h := len(listPods(t, e)), e.held(t)
		return left == 0 && h == 0, fmt.Sprintf("%d pods left, %d GPUs held", left, h)
	})

	// Topology-aware scheduling: Kueue chooses the hosts, gputopo the GPUs.
	e.kueueQueue(t, nsTeam, "tas", 64, "cliques", cliqueLabel)
	job := queued(indexedJob("tas", 4, 4, map[string]string{
		v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel),
		kueueRequiredTopology:          cliqueLabel,
	}), "tas")
	if err := e.cp.Client.Create(ctx, job); err != nil {
		t.Fatalf("create Job tas: %v", err)
	}
	harness.Poll(t, 2*time.Minute, "Job tas's 4 pods bound", func() (bool, string) {
		pods, bound := podsOf(t, e, "tas")
		return len(pods) == 4 && bound == 4, fmt.Sprintf("%d pods, %d bound: %s; workload %s", len(pods), bound, podStates(pods), e.workloadCondition(t, "tas", "Admitted"))
	})
	pods, _ := podsOf(t, e, "tas")
	cliques := map[string]bool{}
	for _, p := range pods {
		host := p.Spec.NodeSelector[corev1.LabelHostname]
		if host == "" || p.Spec.NodeName != host {
			t.Errorf("pod %s bound on %s, Kueue assigned %q", p.Name, p.Spec.NodeName, host)
		}
		cliques[p.Spec.NodeName[:len("rack-0")]] = true
		pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement])
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		if len(pl.GPUIndices) != 4 || pl.Node != p.Spec.NodeName {
			t.Errorf("pod %s: placement %+v, want 4 GPUs on %s", p.Name, pl, p.Spec.NodeName)
		}
	}
	if len(cliques) != 1 {
		t.Errorf("Job tas in racks %v, want one", cliques)
	}
	if err := e.cp.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete Job tas: %v", err)
	}

	// The impossible combination. Fill each rack but two trays with
	// plain pods (gputopo binds them; Kueue counts them as usage outside
	// its queues).
	for r := range 2 {
		for i := range 16 {
			p := harness.GPUPod(nsTeam, fmt.Sprintf("fill-%d-%02d", r, i), 4)
			p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: fmt.Sprintf("rack-%d-%02d", r, i)}
			if err := e.cp.Client.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	harness.Poll(t, 2*time.Minute, "the fill bound and Job tas gone", func() (bool, string) {
		bound, other := 0, 0
		for _, p := range listPods(t, e) {
			if strings.HasPrefix(p.Name, "fill-") {
				if p.Spec.NodeName != "" {
					bound++
				}
				continue
			}
			other++
		}
		return bound == 32 && other == 0, fmt.Sprintf("%d of 32 fill pods bound, %d other pods", bound, other)
	})
	split := queued(indexedJob("split", 4, 4, map[string]string{
		v1alpha1.AnnotationParallelism:           string(v1alpha1.ParallelismModel),
		v1alpha1.AnnotationGroupRequiredTopology: "nvlink",
		kueuePreferredTopology:                   cliqueLabel,
	}), "tas")
	if err := e.cp.Client.Create(ctx, split); err != nil {
		t.Fatalf("create Job split: %v", err)
	}
	harness.Poll(t, 2*time.Minute, "Job split's pods to say why they wait", func() (bool, string) {
		pods, bound := podsOf(t, e, "split")
		if bound > 0 {
			t.Fatalf("%d pods of Job split bound across cliques", bound)
		}
		var msgs []string
		for _, p := range pods {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
					msgs = append(msgs, c.Message)
				}
			}
		}
		said := 0
		for _, m := range msgs {
			if strings.Contains(m, "group team/split requires one nvlink domain, but its pods' nodeSelectors") && strings.Contains(m, "pin them to nodes in 2: nvidia.com/gpu.clique=clique-0, nvidia.com/gpu.clique=clique-1") {
				said++
			}
		}
		return len(pods) == 4 && said == 4, fmt.Sprintf("%d pods; %v", len(pods), msgs)
	})
	if h := e.held(t); h != 128 {
		t.Errorf("%d GPUs held or reserved, want the fill's 128 only", h)
	}
	// Nothing deadlocks: a plain pod still binds beside the waiting group.
	if err := e.cp.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: nsTeam, Name: "fill-0-00"}}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	plain := harness.GPUPod(nsTeam, "plain", 4)
	if err := e.cp.Client.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	harness.Poll(t, time.Minute, "a plain pod bound beside the waiting group", func() (bool, string) {
		p := &corev1.Pod{}
		if err := e.cp.Client.Get(ctx, client.ObjectKeyFromObject(plain), p); err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName != "", "unbound"
	})
}

// waitJobSetPlaced waits until JobSet name's 8 pods are bound and checks
// each of its Jobs lies in one clique.
func (e *env) waitJobSetPlaced(t *testing.T, name string) {
	t.Helper()
	harness.Poll(t, 2*time.Minute, "JobSet "+name+"'s 8 pods bound", func() (bool, string) {
		pods, bound := podsOf(t, e, name)
		return len(pods) == 8 && bound == 8, fmt.Sprintf("%d pods, %d bound; workload %s", len(pods), bound, e.workloadCondition(t, name, "QuotaReserved"))
	})
	pods, _ := podsOf(t, e, name)
	racks := map[string]map[string]bool{}
	for _, p := range pods {
		j := p.Labels["jobset.sigs.k8s.io/job-global-index"]
		if racks[j] == nil {
			racks[j] = map[string]bool{}
		}
		racks[j][p.Spec.NodeName[:len("rack-0")]] = true
	}
	for j, r := range racks {
		if len(r) != 1 {
			t.Errorf("JobSet %s's Job %s in racks %v, want one", name, j, r)
		}
	}
}

// workloadCondition is the condition of type of Kueue's Workload for the
// object named owner, in words.
func (e *env) workloadCondition(t *testing.T, owner, typ string) string {
	t.Helper()
	return e.workloadConditionIn(t, nsTeam, owner, typ)
}

// workloadConditionIn is workloadCondition in namespace ns.
func (e *env) workloadConditionIn(t *testing.T, ns, owner, typ string) string {
	t.Helper()
	l := &unstructured.UnstructuredList{}
	l.SetAPIVersion("kueue.x-k8s.io/v1beta2")
	l.SetKind("WorkloadList")
	if err := e.cp.Client.List(harness.Context(t), l, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	for _, w := range l.Items {
		for _, o := range w.GetOwnerReferences() {
			if o.Name != owner {
				continue
			}
			conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == typ {
					return fmt.Sprintf("%s=%v (%v: %v)", typ, m["status"], m["reason"], m["message"])
				}
			}
			return "workload " + w.GetName() + " without " + typ
		}
	}
	return "no workload for " + owner
}

// indexedJob is an Indexed Job of pods pods × gpus GPUs whose pod
// template carries annotations.
func indexedJob(name string, pods, gpus int, annotations map[string]string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "batch/v1",
		"kind":       "Job",
		"metadata":   map[string]any{"name": name, "namespace": nsTeam},
		"spec": map[string]any{
			"parallelism":    int64(pods),
			"completions":    int64(pods),
			"completionMode": "Indexed",
			"template": map[string]any{
				"metadata": map[string]any{"annotations": anyMap(annotations)},
				"spec": map[string]any{
					"restartPolicy": "Never",
					"containers": []any{map[string]any{
						"name": "trainer", "image": "trainer",
						"resources": map[string]any{"limits": map[string]any{string(v1alpha1.ResourceGPU): fmt.Sprint(gpus)}},
					}},
				},
			},
		},
	}}
}

// podStates says where each pod is and why it waits.
func podStates(pods []corev1.Pod) string {
	var out []string
	for _, p := range pods {
		st := fmt.Sprintf("%s on %q gates %d selector %v", p.Name, p.Spec.NodeName, len(p.Spec.SchedulingGates), p.Spec.NodeSelector)
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				st += ": " + c.Message
			}
		}
		out = append(out, st)
	}
	return strings.Join(out, "; ")
}
