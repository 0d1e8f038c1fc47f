//go:build integration && peers

package ecosystem

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/demo"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology"
)

// NVIDIA's KAI-Scheduler (commit 72de64fc of github.com/NVIDIA/KAI-scheduler,
// bin/kai-* from hack/tools/kai.sh) in the peers bench, as a fresh install
// runs it, without its operator, admission webhook, queue and pod-group
// controllers (they keep status and serve GPU sharing; none of them takes
// part in placing whole-GPU pods):
//
//   - its scheduler, with the configuration the operator renders for the
//     default SchedulingShard (testdata/kai/scheduler-config.yaml), leader
//     election off;
//   - its binder, which binds what the scheduler decided (the scheduler
//     writes a BindRequest per pod, docs/developer/binder.md);
//   - its pod grouper, which makes each single pod's PodGroup
//     (docs/developer/pod-grouper.md);
//   - its CRDs (deployments/kai-scheduler/crds), its priority classes and
//     default queues (testdata/kai), a Topology of the fabric's levels
//     (docs/topology/README.md), and the GPU feature discovery labels of
//     each node (nvidia.com/gpu.count, nvidia.com/gpu.memory), which the
//     GPU operator KAI's docs ask for would write.
//
// KAI's pod grouper gives each pod of a batch/v1 Job its own PodGroup
// (docs/batch: "scheduled separately"), so a Job of several pods is a
// gang only through a PodGroup of its own: the bench creates one per such
// Job, as docs/topology/multilevel.md does (minMember = the Job's pods,
// KAI's "train" priority class the pod grouper gives Jobs, a preferred
// topology level of the fabric domain, as Kueue gets), and the Job's pods
// name it (annotation pod-group-name).
const (
	kaiScheduler = "kai-scheduler"
	kaiBinder    = "kai-binder"
	kaiGrouper   = "kai-podgrouper"
	kaiQueue     = "default-queue"
	kaiTopology  = "fabric"
)

// KAI-Scheduler's names (pkg/common/constants, pkg/podgrouper).
const (
	kaiQueueLabel       = "kai.scheduler/queue"
	kaiPodGroupAnnot    = "pod-group-name"
	kaiTrainPriority    = "train"
	kaiGPUCountLabel    = "nvidia.com/gpu.count"
	kaiGPUMemoryLabel   = "nvidia.com/gpu.memory"
	kaiNamespace        = "kai-scheduler"
	kaiReservationSpace = "kai-resource-reservation"
)

var kaiBindRequests = schema.GroupVersionResource{Group: "scheduling.run.ai", Version: "v1alpha2", Resource: "bindrequests"}

// kaiRun is KAI-Scheduler's processes of one bench run and the bindings
// its scheduler asked for (BindRequests, which the binder deletes once
// done, so they are watched as they come).
type kaiRun struct {
	scheduler *localcluster.Process
	mu        sync.Mutex
	requested map[string]string // namespace/pod: the node of its BindRequest
}

// kaiSource is KAI-Scheduler's source tree (peerSource).
func kaiSource(t *testing.T) string {
	t.Helper()
	return peerSource(t, "KAI_SRC", "kai-scheduler", "hack/tools/kai.sh", "deployments", "kai-scheduler", "crds")
}

// startKAI installs KAI-Scheduler's CRDs and objects on e, labels the
// nodes as GPU feature discovery would, and starts its scheduler, binder
// and pod grouper. levels are the Topology's node labels, top first.
func startKAI(t *testing.T, e *env, specs []demo.NodeSpec, graphs map[string]*topology.Graph, levels ...string) *kaiRun {
	t.Helper()
	ctx := harness.Context(t)
	crds := filepath.Join(kaiSource(t), "deployments", "kai-scheduler", "crds")
	if _, err := envtest.InstallCRDs(e.cp.Config, envtest.CRDInstallOptions{Paths: []string{crds}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install KAI-Scheduler's CRDs: %v", err)
	}
	for _, ns := range []string{kaiNamespace, kaiReservationSpace} {
		if err := e.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	var objs []*unstructured.Unstructured
	for _, f := range []string{"priorityclasses.yaml", "default-queues.yaml"} {
		more, err := kaiObjects(filepath.Join("testdata", "kai", f))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, more...)
	}
	var lv []any
	for _, l := range append(levels, corev1.LabelHostname) {
		lv = append(lv, map[string]any{"nodeLabel": l})
	}
	objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology",
		"metadata": map[string]any{"name": kaiTopology}, "spec": map[string]any{"levels": lv},
	}})
	for _, o := range objs {
		if err := e.cp.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
	for _, s := range specs {
		node, err := e.cp.Clientset.CoreV1().Nodes().Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		g := graphs[s.Name]
		node.Labels[kaiGPUCountLabel] = strconv.Itoa(g.Len())
		node.Labels[kaiGPUMemoryLabel] = strconv.FormatInt(max(g.GPUs()[0].MemoryMiB, 1024), 10)
		if _, err := e.cp.Clientset.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	k := &kaiRun{requested: map[string]string{}}
	dyn, err := dynamic.NewForConfig(e.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	w, err := dyn.Resource(kaiBindRequests).Namespace(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch KAI's BindRequests: %v", err)
	}
	t.Cleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			pod, _, _ := unstructured.NestedString(u.Object, "spec", "podName")
			node, _, _ := unstructured.NestedString(u.Object, "spec", "selectedNode")
			k.mu.Lock()
			k.requested[u.GetNamespace()+"/"+pod] = node
			k.mu.Unlock()
		}
	}()

	// Each process reads the kubeconfig from KUBECONFIG (controller-runtime's
	// loader), as a cluster admin; metrics, probes and leader election off.
	kubeconfig := "KUBECONFIG=" + e.cp.Kubeconfig(t, kaiScheduler, "system:masters")
	start := func(name, ready string, args ...string) *localcluster.Process {
		return startPeerProcess(t, name, ready, "hack/tools/kai.sh", []string{kubeconfig}, args...)
	}
	start(kaiBinder, "starting manager", "--scheduler-name="+kaiScheduler, "--resource-reservation-namespace="+kaiReservationSpace,
		"--metrics-bind-address=0", "--health-probe-bind-address=0", "--leader-elect=false")
	// Only pods that name their queue by label: a gang's pods name their
	// PodGroup instead, which the pod grouper would otherwise replace with
	// one PodGroup per pod of the Job.
	start(kaiGrouper, "starting manager", "--scheduler-name="+kaiScheduler, "--queue-label-key="+kaiQueueLabel,
		"--pod-label-selector="+kaiQueueLabel+"="+kaiQueue, "--metrics-bind-address=0", "--health-probe-bind-address=0", "--leader-elect=false")
	conf, err := filepath.Abs(filepath.Join("testdata", "kai", "scheduler-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	k.scheduler = start(kaiScheduler, "Start scheduling", "--scheduler-conf="+conf, "--scheduler-name="+kaiScheduler,
		"--namespace="+kaiNamespace, "--queue-label-key="+kaiQueueLabel, "--leader-elect=false",
		"--listen-address=127.0.0.1:0", "--plugin-server-port=0")
	return k
}

// kaiObjects reads the objects of a multi-document YAML file.
func kaiObjects(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// kaiJob sends a Job's pods to KAI-Scheduler: a single pod names KAI's
// default queue by label (the pod grouper makes its PodGroup); a Job of
// several pods gets a PodGroup of its own, created here before the Job,
// which its pods name. domain is the node label of the fabric domain its
// pods are preferred in.
func kaiJob(t *testing.T, e *env, job *unstructured.Unstructured, j peerJob, domain string) {
	t.Helper()
	_ = unstructured.SetNestedField(job.Object, kaiScheduler, "spec", "template", "spec", "schedulerName")
	if !j.grouped {
		labels := job.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[kaiQueueLabel] = kaiQueue
		job.SetLabels(labels)
		_ = unstructured.SetNestedField(job.Object, kaiQueue, "spec", "template", "metadata", "labels", kaiQueueLabel)
		return
	}
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup",
		"metadata": map[string]any{"name": j.name, "namespace": job.GetNamespace()},
		"spec": map[string]any{
			"minMember": int64(j.pods), "queue": kaiQueue, "priorityClassName": kaiTrainPriority,
			"topologyConstraint": map[string]any{"topology": kaiTopology, "preferredTopologyLevel": domain},
		},
	}}
	if err := e.cp.Client.Create(harness.Context(t), pg); err != nil {
		t.Fatalf("create PodGroup %s: %v", j.name, err)
	}
	_ = unstructured.SetNestedField(job.Object, j.name, "spec", "template", "metadata", "annotations", kaiPodGroupAnnot)
}

// decided says whether KAI-Scheduler placed p: its schedulerName, and a
// BindRequest of KAI's scheduler for p on the node p is bound to.
func (k *kaiRun) decided(p *corev1.Pod) error {
	if p.Spec.SchedulerName != kaiScheduler {
		return fmt.Errorf("schedulerName %q, want %s", p.Spec.SchedulerName, kaiScheduler)
	}
	k.mu.Lock()
	node, ok := k.requested[p.Namespace+"/"+p.Name]
	k.mu.Unlock()
	switch {
	case !ok:
		return fmt.Errorf("bound to %s without a BindRequest of KAI's scheduler", p.Spec.NodeName)
	case node != p.Spec.NodeName:
		return fmt.Errorf("bound to %s, KAI's BindRequest said %s", p.Spec.NodeName, node)
	}
	return nil
}
