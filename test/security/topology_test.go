//go:build integration

package security

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gputopo/gputopo/placement/ledger"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

// As a compromised node agent (it writes its own node's NodeGPUTopology):
// it publishes an 8-GPU NVSwitch machine on a node whose kubelet
// registered 4 GPUs, to attract the model-parallel pods that want the
// fastest links. The real kube-scheduler, through the extender's filter,
// refuses that node with a reason naming both counts, and the pod goes to
// the honest node; a pod that can only run there waits with the reason
// until kubelet and the topology agree. A node copying the honest node's
// GPU UUIDs later is refused too, and the honest node keeps working.
func TestTopologyThatDisagreesWithItsNodeIsRefused(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)
	a100, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	h100, err := machine.FixtureByName("hgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	cp.CreateGPUNode(t, "honest", 8, nil)
	cp.PublishTopology(t, "honest", a100)
	cp.CreateGPUNode(t, "liar", 4, nil) // kubelet's capacity: 4 nvidia.com/gpu
	cp.PublishTopology(t, "liar", h100) // the agent's claim: 8 H100 on NVSwitch
	te := startTLSExtender(t, cp)

	const want = "gputopo: node's NodeGPUTopology lists 8 GPUs but the Node advertises capacity 4 nvidia.com/gpu; the topology is not trusted until they agree; check the gputopo node agent on this node"

	// The verb kube-scheduler calls, with the scheduler's certificate.
	probe := harness.GPUPod(metav1.NamespaceDefault, "probe", 1)
	probe.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	status, msg := post(te.client(t, te.ca), te.base+"/scheduler/filter", extenderv1.ExtenderArgs{Pod: probe, NodeNames: &[]string{"honest", "liar"}})
	if status != http.StatusOK || !strings.Contains(msg, `"NodeNames":["honest"]`) || !strings.Contains(msg, want) || strings.Contains(msg, `"FailedAndUnresolvableNodes":{"liar"`) {
		t.Fatalf("filter = %d %s; want honest passed and liar failed (resolvable) with %q", status, msg, want)
	}

	clientDir := filepath.Join(t.TempDir(), "scheduler-tls")
	harness.WriteSecretVolume(t, clientDir, te.ca.SecretData(t, harness.LeafSpec{CommonName: schedulerCN, Usages: []string{"client auth"}}))
	cfg := harness.ChartSchedulerConfig(t, te.base)
	ext := &cfg.Extenders[0]
	ext.EnableHTTPS = true
	ext.TLSConfig = &schedconfigv1.ExtenderTLSConfig{
		CertFile: filepath.Join(clientDir, "tls.crt"), KeyFile: filepath.Join(clientDir, "tls.key"), CAFile: filepath.Join(clientDir, "ca.crt"),
	}
	sched := cp.StartScheduler(t, cfg)

	create := func(name string, gpus int, mod func(*corev1.Pod)) *corev1.Pod {
		p := harness.GPUPod(metav1.NamespaceDefault, name, gpus)
		p.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
		if mod != nil {
			mod(p)
		}
		if err := cp.Client.Create(ctx, p); err != nil {
			t.Fatalf("create pod %s: %v", name, err)
		}
		return p
	}
	bound := func(p *corev1.Pod) *corev1.Pod {
		t.Helper()
		got, err := cp.WaitForPod(ctx, p.Namespace, p.Name, time.Minute, func(p *corev1.Pod) bool {
			return p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationAssignedGPUs] != ""
		})
		if err != nil {
			t.Fatalf("%v\nscheduler log:\n%s", err, sched.Tail(30))
		}
		return got
	}

	// The pod the lie is for: 4 GPUs on NVLink, fastest ring first. The
	// claimed H100 NVSwitch ring would win; it goes to the honest A100.
	model := create("model", 4, func(p *corev1.Pod) {
		p.Annotations = map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`}
	})
	if got := bound(model); got.Spec.NodeName != "honest" {
		t.Errorf("model-parallel pod bound to %s, want honest: the liar's topology is not trusted", got.Spec.NodeName)
	}

	// A pod that only the liar's node may take waits, and says why.
	pinned := create("pinned", 1, func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "liar"}
	})
	harness.Poll(t, time.Minute, "the pinned pod's Unschedulable condition to name the untrusted topology", func() (bool, string) {
		got := &corev1.Pod{}
		if err := cp.Client.Get(ctx, client.ObjectKeyFromObject(pinned), got); err != nil {
			return false, err.Error()
		}
		if got.Spec.NodeName != "" {
			t.Fatalf("pinned pod bound to %s while its node's topology is untrusted", got.Spec.NodeName)
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && strings.Contains(c.Message, want) {
				return true, c.Message
			}
		}
		return false, fmt.Sprintf("conditions %v", got.Status.Conditions)
	})
	gauges := func() (untrusted, refused, duplicates float64) {
		fams, err := te.x.Metrics().Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				switch {
				case f.GetName() == "gputopo_extender_topology_nodes" && labels["state"] == ledger.TopologyUntrusted:
					untrusted = m.GetGauge().GetValue()
				case f.GetName() == "gputopo_extender_filter_results_total" && labels["reason"] == "untrusted_topology":
					refused = m.GetCounter().GetValue()
				case f.GetName() == "gputopo_extender_topology_duplicate_gpus":
					duplicates = m.GetGauge().GetValue()
				}
			}
		}
		return untrusted, refused, duplicates
	}
	if untrusted, refused, _ := gauges(); untrusted != 1 || refused < 2 {
		t.Errorf("topology_nodes{state=untrusted} = %v, filter_results{reason=untrusted_topology} = %v; want 1 and at least 2", untrusted, refused)
	}

	// kubelet comes to agree (its device plugin registered 8 GPUs): the
	// topology is trusted again and the pinned pod is bound.
	setNodeGPUs(t, cp, "liar", 8)
	harness.Poll(t, 30*time.Second, "the extender to trust the liar's topology once its Node agrees", func() (bool, string) {
		untrusted, _, _ := gauges()
		return untrusted == 0, fmt.Sprintf("topology_nodes{state=untrusted} = %v", untrusted)
	})
	// kube-scheduler retries a pod an extender refused on any cluster
	// event; its retry on the Node update itself may reach the extender
	// before the extender's informer has the update (docs/extender.md,
	// "Trusting a topology"). A live cluster's next event retries it; here
	// a label on the other node is that event.
	nudge := &corev1.Node{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Name: "honest"}, nudge); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(nudge.DeepCopy())
	nudge.Labels["gputopo.test/event"] = "after-liar-agreed"
	if err := cp.Client.Patch(ctx, nudge, patch); err != nil {
		t.Fatal(err)
	}
	if got := bound(pinned); got.Spec.NodeName != "liar" {
		t.Fatalf("pinned pod bound to %s, want liar", got.Spec.NodeName)
	}

	// Another node's agent publishes the honest node's GPU 7 as its own,
	// after the honest node did: the copy is refused, the honest node is
	// not.
	cp.CreateGPUNode(t, "copycat", 8, nil)
	copyTopology := &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: "copycat"}}
	if err := cp.Client.Create(ctx, copyTopology); err != nil {
		t.Fatal(err)
	}
	copyTopology.Status = a100.Graph("copycat").Status()
	copyTopology.Status.GPUs[7].UUID = machine.FixtureUUID("honest", 7)
	copyTopology.Status.ObservedTime = metav1.Now()
	if err := cp.Client.Status().Update(ctx, copyTopology); err != nil {
		t.Fatal(err)
	}
	wantCopy := "lists GPU " + machine.FixtureUUID("honest", 7) + ", which node honest's NodeGPUTopology listed first"
	harness.Poll(t, 30*time.Second, "filter to refuse the copying node", func() (bool, string) {
		status, msg := post(te.client(t, te.ca), te.base+"/filter", extenderv1.ExtenderArgs{Pod: probe, NodeNames: &[]string{"honest", "copycat"}})
		return status == http.StatusOK && strings.Contains(msg, `"NodeNames":["honest"]`) && strings.Contains(msg, wantCopy), fmt.Sprintf("%d %s", status, msg)
	})
	if _, _, duplicates := gauges(); duplicates != 1 {
		t.Errorf("topology_duplicate_gpus = %v, want 1", duplicates)
	}
	// The honest node takes pods all along.
	if got := bound(create("after-copy", 2, func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "honest"}
	})); got.Spec.NodeName != "honest" {
		t.Errorf("pod for the honest node bound to %s", got.Spec.NodeName)
	}
}

// setNodeGPUs sets the Node's capacity and allocatable of nvidia.com/gpu,
// as kubelet does when its device plugin registers gpus healthy devices.
func setNodeGPUs(t *testing.T, cp *harness.ControlPlane, name string, gpus int64) {
	t.Helper()
	ctx := context.Background()
	node := &corev1.Node{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Name: name}, node); err != nil {
		t.Fatal(err)
	}
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	node.Status.Capacity[v1alpha1.ResourceGPU] = q
	node.Status.Allocatable[v1alpha1.ResourceGPU] = q
	if err := cp.Client.Status().Update(ctx, node); err != nil {
		t.Fatalf("update status of node %s: %v", name, err)
	}
}
