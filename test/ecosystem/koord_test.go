//go:build integration && peers

package ecosystem

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/demo"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology"
)

// Koordinator (koord-scheduler v1.6.0, bin/koord-scheduler from
// hack/tools/koordinator.sh) in the peers bench, as its documentation
// sets it up, without its node agent (koordlet) and manager: the bench
// writes what koordlet would (each node's Device object with its GPUs'
// minors, resources, NUMA and PCIe topology, and the NVLink partition
// table koordlet annotates on NVLink machines; the node's Koordinator
// GPU resources) and runs koord-scheduler with the profile of
// config/manager/scheduler-config.yaml (leader election off).
const (
	KoordinatorModule = "github.com/koordinator-sh/koordinator@v1.6.0"
	koordScheduler    = "koord-scheduler"
	koordNamespace    = "koordinator-system"
)

// koordConfig is the module's config/manager/scheduler-config.yaml
// profile, leader election off, its kubeconfig to be filled in.
const koordConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %q
leaderElection:
  leaderElect: false
profiles:
  - pluginConfig:
    - name: NodeResourcesFit
      args:
        apiVersion: kubescheduler.config.k8s.io/v1
        kind: NodeResourcesFitArgs
        scoringStrategy:
          type: LeastAllocated
          resources:
            - name: cpu
              weight: 1
            - name: memory
              weight: 1
            - name: "kubernetes.io/batch-cpu"
              weight: 1
            - name: "kubernetes.io/batch-memory"
              weight: 1
    - name: LoadAwareScheduling
      args:
        apiVersion: kubescheduler.config.k8s.io/v1
        kind: LoadAwareSchedulingArgs
        filterExpiredNodeMetrics: false
        nodeMetricExpirationSeconds: 300
        resourceWeights:
          cpu: 1
          memory: 1
        usageThresholds:
          cpu: 65
          memory: 95
        estimatedScalingFactors:
          cpu: 85
          memory: 70
    - name: ElasticQuota
      args:
        apiVersion: kubescheduler.config.k8s.io/v1
        kind: ElasticQuotaArgs
        quotaGroupNamespace: koordinator-system
    plugins:
      preEnqueue:
        enabled:
          - name: Coscheduling
      queueSort:
        disabled:
          - name: "*"
        enabled:
          - name: Coscheduling
      preFilter:
        enabled:
          - name: Reservation
          - name: NodeNUMAResource
          - name: DeviceShare
          - name: Coscheduling
          - name: ElasticQuota
      filter:
        enabled:
          - name: LoadAwareScheduling
          - name: NodeNUMAResource
          - name: DeviceShare
          - name: Reservation
      postFilter:
        disabled:
          - name: "*"
        enabled:
          - name: Reservation
          - name: Coscheduling
          - name: ElasticQuota
          - name: DefaultPreemption
      preScore:
        enabled:
          - name: Reservation
      score:
        enabled:
          - name: LoadAwareScheduling
            weight: 1
          - name: NodeNUMAResource
            weight: 1
          - name: DeviceShare
            weight: 1
          - name: Reservation
            weight: 5000
      reserve:
        enabled:
          - name: LoadAwareScheduling
          - name: NodeNUMAResource
          - name: DeviceShare
          - name: Coscheduling
          - name: ElasticQuota
      permit:
        enabled:
          - name: Coscheduling
      preBind:
        enabled:
          - name: NodeNUMAResource
          - name: DeviceShare
          - name: Reservation
          - name: DefaultPreBind
      bind:
        disabled:
          - name: "*"
        enabled:
          - name: Reservation
          - name: DefaultBinder
      postBind:
        enabled:
          - name: Coscheduling
    schedulerName: koord-scheduler
`

// Koordinator's names (github.com/koordinator-sh/koordinator/apis/extension).
const (
	koordGPUCore          = "koordinator.sh/gpu-core"
	koordGPUMemory        = "koordinator.sh/gpu-memory"
	koordGPUMemoryRatio   = "koordinator.sh/gpu-memory-ratio"
	koordGPUPartitions    = "scheduling.koordinator.sh/gpu-partitions"
	koordPartitionSpec    = "scheduling.koordinator.sh/gpu-partition-spec"
	koordPartitionPolicy  = "node.koordinator.sh/gpu-partition-policy"
	koordDeviceAllocated  = "scheduling.koordinator.sh/device-allocated"
	koordGangName         = "gang.scheduling.koordinator.sh/name"
	koordGangMinAvailable = "gang.scheduling.koordinator.sh/min-available"
)

// koordPartition is one entry of Koordinator's GPU partition table.
type koordPartition struct {
	Minors          []int  `json:"minors"`
	GPULinkType     string `json:"gpuLinkType,omitempty"`
	AllocationScore int    `json:"allocationScore,omitempty"`
}

// koordPartitions is the partition table of a machine with the links of
// g, as koordlet annotates NVLink machines: per GPU count, the sets whose
// GPUs are all NVLinked to each other, and the whole machine when its
// ring runs on NVLink, each scored by its ring bandwidth (GB/s); nil for
// a machine without NVLink.
func koordPartitions(g *topology.Graph) map[int][]koordPartition {
	n := g.Len()
	nvlink := false
	for a := range n {
		for b := a + 1; b < n; b++ {
			nvlink = nvlink || g.NVLinked(a, b)
		}
	}
	if !nvlink {
		return nil
	}
	table := map[int][]koordPartition{}
	for mask := 1; mask < 1<<n; mask++ {
		var set []int
		for i := range n {
			if mask&(1<<i) != 0 {
				set = append(set, i)
			}
		}
		size := len(set)
		if size != 1 && size != 2 && size != 4 && size != n {
			continue
		}
		clique := true
		for i, a := range set {
			for _, b := range set[i+1:] {
				clique = clique && g.NVLinked(a, b)
			}
		}
		m := g.Metrics(topology.MaskOf(set...), topology.Mask{})
		onNVLink := m.Tier == v1alpha1.TierNVLink || m.Tier == v1alpha1.TierNVSwitch
		if !clique && !(size == n && onNVLink) {
			continue
		}
		table[size] = append(table[size], koordPartition{Minors: set, GPULinkType: "NVLink", AllocationScore: max(m.RingGBps, 1)})
	}
	return table
}

// startKoord installs Koordinator's CRDs, writes each node's Device and
// GPU resources as koordlet would, and starts koord-scheduler.
func startKoord(t *testing.T, e *env, specs []demo.NodeSpec, graphs map[string]*topology.Graph) *localcluster.Process {
	t.Helper()
	ctx := harness.Context(t)
	dir := harness.ModuleDir(t, KoordinatorModule)
	if _, err := envtest.InstallCRDs(e.cp.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "config", "crd", "bases")}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install Koordinator's CRDs: %v", err)
	}
	if err := e.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: koordNamespace}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		g := graphs[s.Name]
		var devices []any
		for _, gpu := range g.GPUs() {
			devices = append(devices, map[string]any{
				"type": "gpu", "id": gpu.UUID, "minor": int64(gpu.Index), "health": true,
				"resources": map[string]any{koordGPUCore: "100", koordGPUMemoryRatio: "100", koordGPUMemory: fmt.Sprintf("%dMi", max(gpu.MemoryMiB, 1024))},
				"topology": map[string]any{"socketID": int64(max(gpu.NUMANode, 0)), "nodeID": int64(max(gpu.NUMANode, 0)),
					"pcieID": strconv.Itoa(pcieSwitch(g, gpu.Index)), "busID": gpu.PCIBusID},
			})
		}
		dev := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "scheduling.koordinator.sh/v1alpha1", "kind": "Device",
			"metadata": map[string]any{"name": s.Name},
			"spec":     map[string]any{"devices": devices},
		}}
		table := koordPartitions(g)
		if table != nil {
			b, err := json.Marshal(table)
			if err != nil {
				t.Fatal(err)
			}
			dev.SetAnnotations(map[string]string{koordGPUPartitions: string(b)})
		}
		if err := e.cp.Client.Create(ctx, dev); err != nil {
			t.Fatalf("create Device %s: %v", s.Name, err)
		}
		node, err := e.cp.Clientset.CoreV1().Nodes().Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := int64(g.Len())
		mem := int64(0)
		for _, gpu := range g.GPUs() {
			mem += int64(max(gpu.MemoryMiB, 1024)) << 20
		}
		for _, l := range []corev1.ResourceList{node.Status.Capacity, node.Status.Allocatable} {
			l[koordGPUCore] = *resource.NewQuantity(100*n, resource.DecimalSI)
			l[koordGPUMemoryRatio] = *resource.NewQuantity(100*n, resource.DecimalSI)
			l[koordGPUMemory] = *resource.NewQuantity(mem, resource.BinarySI)
		}
		if _, err := e.cp.Clientset.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	bin, err := localcluster.Binary(koordScheduler)
	if err != nil {
		t.Fatalf("%v (hack/tools/koordinator.sh builds it; make bench-peers runs it)", err)
	}
	cfg := filepath.Join(t.TempDir(), "koord-scheduler.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, koordConfig, e.cp.Kubeconfig(t, koordScheduler, "system:masters")), 0o600); err != nil {
		t.Fatal(err)
	}
	// One change from Koordinator's defaults, in its favour: its
	// Coscheduling turns a gang's pods away at PreEnqueue until the whole
	// gang exists, and in the 1.28 framework it is built on a new pending
	// pod does not requeue its siblings, so the Job controller's pods,
	// created one by one, wait for the periodic flush of unschedulable
	// pods (5 min by default, checked every 30 s). 15 s keeps that within
	// the bench's wait.
	p := harness.StartProcess(t, koordScheduler, bin, "--config", cfg, "--secure-port=0", "--authentication-skip-lookup=true", "--v=2",
		"--pod-max-in-unschedulable-pods-duration=15s")
	harness.Poll(t, time.Minute, "koord-scheduler to start", func() (bool, string) {
		if exited, err := p.Exited(); exited {
			t.Fatalf("koord-scheduler exited: %v\n%s", err, p.Tail(40))
		}
		return p.LogContains("Starting Kubernetes Scheduler") || p.LogContains("Starting Koordinator Scheduler"), p.Tail(3)
	})
	return p
}

// pcieSwitch numbers the PCIe switch GPU i hangs off, as the node agent
// reads it: the lowest index of the GPUs it shares a switch with.
func pcieSwitch(g *topology.Graph, i int) int {
	for j := range i {
		if l := g.Link(i, j); l.PCIe == v1alpha1.PCIeSameSwitch {
			return j
		}
	}
	return i
}

// koordJob sends a Job's pods to koord-scheduler: each pod a member of
// the Job's gang (Koordinator's gang annotations) when it has several,
// and, for a model-parallel pod of more than one GPU, asking for a
// partition of NVLinked GPUs (the partition spec; BestEffort: the best
// partition free).
func koordJob(job *unstructured.Unstructured, j peerJob) {
	ann := map[string]string{}
	if j.grouped {
		ann[koordGangName] = j.name
		ann[koordGangMinAvailable] = strconv.Itoa(j.pods)
	}
	if j.intent == v1alpha1.ParallelismModel && j.gpus > 1 {
		ann[koordPartitionSpec] = `{"allocatePolicy":"BestEffort"}`
	}
	_ = unstructured.SetNestedField(job.Object, koordScheduler, "spec", "template", "spec", "schedulerName")
	if len(ann) > 0 {
		_ = unstructured.SetNestedField(job.Object, anyMap(ann), "spec", "template", "metadata", "annotations")
	}
}

// koordMinors are the GPU minors koord-scheduler allocated pod p.
func koordMinors(p *corev1.Pod) ([]int, error) {
	raw, ok := p.Annotations[koordDeviceAllocated]
	if !ok {
		return nil, fmt.Errorf("no %s annotation", koordDeviceAllocated)
	}
	var alloc map[string][]struct {
		Minor int32 `json:"minor"`
	}
	if err := json.Unmarshal([]byte(raw), &alloc); err != nil {
		return nil, fmt.Errorf("%s: %w", koordDeviceAllocated, err)
	}
	var out []int
	for _, d := range alloc["gpu"] {
		out = append(out, int(d.Minor))
	}
	slices.Sort(out)
	return out, nil
}
