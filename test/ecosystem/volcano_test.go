//go:build integration && peers

package ecosystem

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

// Volcano (commit ed72c7c8 of github.com/volcano-sh/volcano, bin/vc-* from
// hack/tools/volcano.sh) in the peers bench, as its installer runs it
// (installer/helm/chart/volcano), without its admission webhooks (they
// validate and default objects; the bench writes valid ones) and agent:
//
//   - vc-scheduler with the installer's scheduler configuration plus the
//     network-topology-aware plugin as the user guide enables it
//     (testdata/volcano/volcano-scheduler.conf), leader election off;
//   - vc-controller-manager with its default controllers, among them the
//     PodGroup controller, which makes the PodGroup of a pod that names
//     none (for a batch/v1 Job's pod, one per Job, minMember 1), and the
//     queue controller, which opens the default queue the scheduler
//     creates;
//   - its CRDs (config/crd/volcano/bases, config/crd/jobflow/bases), and
//     HyperNodes of the fabric (docs/user-guide/
//     how_to_use_network_topology_aware_scheduling.md, 3.2.2: built by
//     hand): one of tier 1 per fabric domain (the nodes of one value of
//     its label, named as Volcano's discovery from labels names them),
//     and one of tier 2, the spine, over them.
//
// A Job of several pods is a gang through a PodGroup of its own, created
// before the Job and named by its pods (annotation
// scheduling.k8s.io/group-name, as in docs/user-guide/
// how_to_use_svc_plugin.md): minMember = the Job's pods, and the
// network topology constraint hard with highestTierAllowed 2, under which
// the allocate action tries each tier-1 HyperNode (one fabric domain)
// before the tier-2 one (the spine), the use case of docs/design/
// Network Topology Aware Scheduling.md: a preference for one domain, as
// Kueue and KAI get.
const (
	vcScheduler     = "vc-scheduler"
	vcControllers   = "vc-controller-manager"
	vcSchedulerName = "volcano"
	vcQueue         = "default"
	vcNamespace     = "volcano-system"
	vcSpine         = "spine"
)

// Volcano's names (volcano.sh/apis).
const (
	vcGroupNameAnnot = "scheduling.k8s.io/group-name"
	vcQueueOpen      = "Open"
)

var (
	vcQueues     = schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "queues"}
	vcHyperNodes = schema.GroupVersionResource{Group: "topology.volcano.sh", Version: "v1alpha1", Resource: "hypernodes"}
)

// volcanoRun is Volcano's processes of one bench run and the bindings its
// scheduler reported (its Scheduled events, watched as they come).
type volcanoRun struct {
	scheduler   *localcluster.Process
	controllers *localcluster.Process
	mu          sync.Mutex
	assigned    map[string]string // namespace/pod: the node of Volcano's Scheduled event
	// settled is when events still on their way are given up on: the
	// scheduler records its event after the binding, asynchronously.
	settled time.Time
}

// volcanoSource is Volcano's source tree (peerSource).
func volcanoSource(t *testing.T) string {
	t.Helper()
	return peerSource(t, "VOLCANO_SRC", "volcano", "hack/tools/volcano.sh", "config", "crd", "volcano", "bases")
}

// startVolcano installs Volcano's CRDs and the HyperNodes of the fabric
// on e (tier 1: the nodes of each fabric domain, the value of the
// domain's node label in domainOf; tier 2: the spine over them), starts its controller manager and scheduler, and
// waits for the default queue to open.
func startVolcano(t *testing.T, e *env, domainOf map[string]string) *volcanoRun {
	t.Helper()
	ctx := harness.Context(t)
	src := volcanoSource(t)
	// All of them: the controller manager's default controllers (jobs,
	// job flows, cron jobs...) wait for their informers to sync.
	crds := []string{filepath.Join(src, "config", "crd", "volcano", "bases"), filepath.Join(src, "config", "crd", "jobflow", "bases")}
	if _, err := envtest.InstallCRDs(e.cp.Config, envtest.CRDInstallOptions{Paths: crds, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install Volcano's CRDs: %v", err)
	}
	if err := e.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: vcNamespace}}); err != nil {
		t.Fatal(err)
	}

	// Members by name, as Volcano's own discovery from node labels writes
	// them (pkg/controllers/hypernode/discovery/label, utils.BuildMembers).
	nodesOf := map[string][]any{}
	for node, d := range domainOf {
		nodesOf[d] = append(nodesOf[d], map[string]any{"type": "Node", "selector": map[string]any{"exactMatch": map[string]any{"name": node}}})
	}
	domains := slices.Sorted(maps.Keys(nodesOf))
	var spine []any
	for _, d := range domains {
		if err := e.cp.Client.Create(ctx, volcanoHyperNode(d, 1, nodesOf[d]...)); err != nil {
			t.Fatalf("create HyperNode %s: %v", d, err)
		}
		spine = append(spine, map[string]any{"type": "HyperNode", "selector": map[string]any{"exactMatch": map[string]any{"name": d}}})
	}
	if err := e.cp.Client.Create(ctx, volcanoHyperNode(vcSpine, 2, spine...)); err != nil {
		t.Fatalf("create HyperNode %s: %v", vcSpine, err)
	}

	v := &volcanoRun{assigned: map[string]string{}}
	// Volcano's scheduler reports each binding it made as a Scheduled
	// event of its own (source volcano): the proof it decided the pod.
	w, err := e.cp.Clientset.CoreV1().Events(metav1.NamespaceAll).Watch(ctx, metav1.ListOptions{FieldSelector: "reason=Scheduled"})
	if err != nil {
		t.Fatalf("watch Scheduled events: %v", err)
	}
	t.Cleanup(w.Stop)
	go func() {
		for ev := range w.ResultChan() {
			evt, ok := ev.Object.(*corev1.Event)
			if !ok || ev.Type == watch.Deleted || evt.Source.Component != vcSchedulerName || evt.InvolvedObject.Kind != "Pod" {
				continue
			}
			i := strings.LastIndex(evt.Message, " to ")
			if i < 0 {
				continue
			}
			v.mu.Lock()
			v.assigned[evt.InvolvedObject.Namespace+"/"+evt.InvolvedObject.Name] = evt.Message[i+len(" to "):]
			v.mu.Unlock()
		}
	}()

	kubeconfig := e.cp.Kubeconfig(t, vcScheduler, "system:masters")
	// DEBUG_SOCKET_DIR: the scheduler's log-level socket, which would
	// otherwise go to /tmp/klog-socks, shared by every run on the machine.
	env := []string{"DEBUG_SOCKET_DIR=" + t.TempDir()}
	start := func(name, ready string, args ...string) *localcluster.Process {
		return startPeerProcess(t, name, ready, "hack/tools/volcano.sh", env, args...)
	}
	// The installer's flags, less TLS, health and metrics endpoints; -v=2
	// as the bench's other schedulers log (the installer's 3 and 4 cost
	// CPU the row measures).
	v.controllers = start(vcControllers, "PodgroupController is running", "--kubeconfig="+kubeconfig,
		"--scheduler-name="+vcSchedulerName, "--leader-elect=false", "--logtostderr", "-v=2")
	conf, err := filepath.Abs(filepath.Join("testdata", "volcano", "volcano-scheduler.conf"))
	if err != nil {
		t.Fatal(err)
	}
	v.scheduler = start(vcScheduler, "Scheduler completes Initialization", "--kubeconfig="+kubeconfig,
		"--scheduler-conf="+conf, "--scheduler-name="+vcSchedulerName, "--leader-elect=false", "--logtostderr", "-v=2")

	// The scheduler creates the default queue; its controller opens it,
	// and the proportion plugin allocates only from open queues.
	dyn, err := dynamic.NewForConfig(e.cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	harness.Poll(t, time.Minute, "Volcano's default queue to open", func() (bool, string) {
		q, err := dyn.Resource(vcQueues).Get(ctx, vcQueue, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		state, _, _ := unstructured.NestedString(q.Object, "status", "state")
		return state == vcQueueOpen, "state " + state
	})
	hns, err := dyn.Resource(vcHyperNodes).List(ctx, metav1.ListOptions{})
	if err != nil || len(hns.Items) != len(domains)+1 {
		t.Fatalf("Volcano's HyperNodes: %d listed, want %d: %v", len(hns.Items), len(domains)+1, err)
	}
	return v
}

// volcanoHyperNode is a HyperNode of tier with members.
func volcanoHyperNode(name string, tier int64, members ...any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "topology.volcano.sh/v1alpha1", "kind": "HyperNode",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"tier": tier, "members": members},
	}}
}

// volcanoJob sends a Job's pods to Volcano: a single pod gets its
// PodGroup from the PodGroup controller; a Job of several pods gets a
// PodGroup of its own, created here before the Job, which its pods name:
// minMember and minResources the whole Job (as Volcano's own Job
// controller writes them), preferring one fabric domain (tier 1) over
// the spine (tier 2).
func volcanoJob(t *testing.T, e *env, job *unstructured.Unstructured, j peerJob) {
	t.Helper()
	if err := unstructured.SetNestedField(job.Object, vcSchedulerName, "spec", "template", "spec", "schedulerName"); err != nil {
		t.Fatalf("Job %s: %v", j.name, err)
	}
	if !j.grouped {
		return
	}
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
		"metadata": map[string]any{"name": j.name, "namespace": job.GetNamespace()},
		"spec": map[string]any{
			"minMember":       int64(j.pods),
			"queue":           vcQueue,
			"minResources":    map[string]any{v1alpha1.ResourceGPU: fmt.Sprint(j.pods * j.gpus)},
			"networkTopology": map[string]any{"mode": "hard", "highestTierAllowed": int64(2)},
		},
	}}
	if err := e.cp.Client.Create(harness.Context(t), pg); err != nil {
		t.Fatalf("create PodGroup %s: %v", j.name, err)
	}
	if err := unstructured.SetNestedField(job.Object, j.name, "spec", "template", "metadata", "annotations", vcGroupNameAnnot); err != nil {
		t.Fatalf("Job %s: %v", j.name, err)
	}
}

// decided says whether Volcano placed p: its schedulerName, and a
// Scheduled event of Volcano's scheduler for p on the node p is bound to.
func (v *volcanoRun) decided(p *corev1.Pod) error {
	if p.Spec.SchedulerName != vcSchedulerName {
		return fmt.Errorf("schedulerName %q, want %s", p.Spec.SchedulerName, vcSchedulerName)
	}
	v.mu.Lock()
	if v.settled.IsZero() {
		v.settled = time.Now().Add(10 * time.Second)
	}
	node, ok := v.assigned[p.Namespace+"/"+p.Name]
	for !ok && time.Now().Before(v.settled) {
		v.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		v.mu.Lock()
		node, ok = v.assigned[p.Namespace+"/"+p.Name]
	}
	v.mu.Unlock()
	switch {
	case !ok:
		return fmt.Errorf("bound to %s without a Scheduled event of Volcano's scheduler", p.Spec.NodeName)
	case node != p.Spec.NodeName:
		return fmt.Errorf("bound to %s, Volcano's Scheduled event said %s", p.Spec.NodeName, node)
	}
	return nil
}
