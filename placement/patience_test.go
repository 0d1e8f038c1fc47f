package placement

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// patienceCase is an offline core with an HGX H100 ("fast", NVSwitch,
// 900 GB/s rings) taken whole by "busy" and a DGX-1 V100 ("slow", a
// hybrid cube mesh whose 4-GPU rings are far below half of that) free,
// with its clock at groupEpoch + at.
func patienceCase(t *testing.T) (x *Core, names []string, now *time.Time, busy *corev1.Pod) {
	t.Helper()
	x = offlineCore(t)
	clock := groupEpoch
	now = &clock
	x.SetClock(func() time.Time { return *now })
	names = []string{feedMachine(t, x, "fast", "hgx-h100", 8), feedMachine(t, x, "slow", "dgx1-v100", 8)}
	busy = gpuPod("busy", 8, map[string]string{})
	if n, ans := place(t, x, []string{"fast"}, busy); n != "fast" {
		t.Fatalf("busy not placed on fast: %s", anyReason(ans))
	}
	return x, names, now, busy
}

// feedMachine feeds x node name of fixture fx whose Node advertises
// advertised GPUs, and returns the name.
func feedMachine(t *testing.T, x *Core, name, fx string, advertised int) string {
	t.Helper()
	f, err := machine.FixtureByName(fx)
	if err != nil {
		t.Fatal(err)
	}
	g := f.Graph(name)
	gpus := corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(int64(advertised), resource.DecimalSI)}
	x.ledger.UpsertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Capacity: gpus, Allocatable: gpus}})
	st := g.Status()
	st.ObservedTime = metav1.NewTime(groupEpoch)
	x.ledger.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: st})
	return name
}

func modelPod(name string, gpus int) *corev1.Pod {
	return gpuPod(name, gpus, map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth"}`})
}

func TestModelPodWaitsForAFasterSetWithinItsPatience(t *testing.T) {
	x, names, now, _ := patienceCase(t)
	// A minute after its creation the model-parallel pod is refused the
	// V100's sets (their rings are under half of the H100's 900 GB/s);
	// no eviction there would help, so the node is unresolvable.
	*now = groupEpoch.Add(time.Minute)
	m := modelPod("m", 4)
	n, ans := place(t, x, names, m)
	if n != "" {
		t.Fatalf("model pod placed on %s during its patience", n)
	}
	slow := ans.Unresolvable["slow"]
	for _, want := range []string{"under 50% of the 900 GB/s", "waits 9m0s more", "patience.bandwidthWait"} {
		if !strings.Contains(slow, want) {
			t.Errorf("slow node's reason %q lacks %q", slow, want)
		}
	}
	if _, ok := ans.Failed["fast"]; !ok {
		t.Errorf("fast node (full now) not refused as resolvable: %+v", ans)
	}
	// A pod that asks for no bandwidth takes the V100 at once.
	if n, ans := place(t, x, names, gpuPod("data", 2, map[string]string{})); n != "slow" {
		t.Fatalf("data-parallel pod: node %q, reason %q; want slow", n, anyReason(ans))
	}
	// Past its patience it takes the best free set, as it would without.
	*now = groupEpoch.Add(10*time.Minute + time.Second)
	if n, ans := place(t, x, names, m); n != "slow" {
		t.Fatalf("model pod after its patience: node %q, reason %q; want slow", n, anyReason(ans))
	}
}

func TestModelPodTakesTheFasterSetThatFreesWithinItsPatience(t *testing.T) {
	x, names, now, busy := patienceCase(t)
	m := modelPod("m", 4)
	*now = groupEpoch.Add(time.Minute)
	if n, _ := place(t, x, names, m); n != "" {
		t.Fatalf("model pod placed on %s during its patience", n)
	}
	gone(x, busy)
	*now = groupEpoch.Add(3 * time.Minute)
	if n, ans := place(t, x, names, m); n != "fast" {
		t.Fatalf("model pod once the H100 freed: node %q, reason %q; want fast", n, anyReason(ans))
	}
}

func TestPatienceLeavesGroupsAndIsOffAtZero(t *testing.T) {
	x, names, now, _ := patienceCase(t)
	*now = groupEpoch.Add(time.Minute)
	x.Config().Patience.BandwidthWait = &metav1.Duration{}
	if n, ans := place(t, x, names, modelPod("m", 2)); n != "slow" {
		t.Fatalf("patience off: node %q, reason %q; want slow", n, anyReason(ans))
	}
	x.Config().Patience.BandwidthWait = &metav1.Duration{Duration: 10 * time.Minute}
	// A group of two 2-GPU model pods is planned whole where it fits now:
	// patience is for pods outside groups.
	g0, g1 := groupPod("g", 0, 2, 2, nil), groupPod("g", 1, 2, 2, nil)
	x.ledger.UpsertPod(g1)
	if n, ans := place(t, x, names, g0); n != "slow" {
		t.Fatalf("group pod: node %q, reason %q; want slow", n, anyReason(ans))
	}
	// A 1-GPU model pod asks no bandwidth between GPUs: never held back.
	if n, ans := place(t, x, names, modelPod("one", 1)); n != "slow" {
		t.Fatalf("1-GPU model pod: node %q, reason %q; want slow", n, anyReason(ans))
	}
}

// A requirement's fallbackAfter shorter than the patience ends the wait:
// the pod asked to wait that long for its links, not longer for speed.
func TestPatienceEndsWithTheRequirementsFallback(t *testing.T) {
	x, names, now, _ := patienceCase(t)
	m := gpuPod("m", 4, map[string]string{v1alpha1.AnnotationRequirement: `{"requireNVLink":true,"strategy":"highest_bandwidth","fallbackAfter":"5m"}`})
	*now = groupEpoch.Add(3 * time.Minute)
	if n, ans := place(t, x, names, m); n != "" || !strings.Contains(ans.Unresolvable["slow"], "waits 2m0s more") {
		t.Fatalf("at 3m: node %q, slow node's reason %q; want refused, 2m left", n, ans.Unresolvable["slow"])
	}
	*now = groupEpoch.Add(5*time.Minute + time.Second)
	if n, ans := place(t, x, names, m); n != "slow" {
		t.Fatalf("past fallbackAfter: node %q, reason %q; want slow", n, anyReason(ans))
	}
}

// A node whose topology is not trusted (a compromised agent claiming a
// faster machine than kubelet reports) does not raise the bar: the pod
// takes the best trusted set at once. Once the claim is trusted, it waits.
func TestPatienceCountsOnlyTrustedMachines(t *testing.T) {
	x := offlineCore(t)
	names := []string{feedMachine(t, x, "slow", "dgx1-v100", 8), feedMachine(t, x, "liar", "hgx-h100", 4)}
	x.SetClock(func() time.Time { return groupEpoch.Add(time.Minute) })
	if n, ans := place(t, x, names, modelPod("m", 4)); n != "slow" {
		t.Fatalf("with the H100 untrusted: node %q, reason %q; want slow", n, anyReason(ans))
	}
	feedMachine(t, x, "liar", "hgx-h100", 8)
	if n, ans := place(t, x, []string{"slow"}, modelPod("m2", 4)); n != "" || !strings.Contains(ans.Unresolvable["slow"], "900 GB/s") {
		t.Fatalf("with the H100 trusted: node %q, slow node's reason %q; want refused for the 900 GB/s machine", n, ans.Unresolvable["slow"])
	}
}

// Only the machines the pod's own rules allow set its bar: a pod pinned to
// the V100 by its nodeSelector, or one that does not tolerate the H100's
// taint, takes the V100 at once.
func TestPatienceCountsOnlyTheMachinesThePodMayUse(t *testing.T) {
	x, names, now, _ := patienceCase(t)
	*now = groupEpoch.Add(time.Minute)
	slowNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "slow", Labels: map[string]string{"pool": "v100"}}}
	slowNode.Status.Capacity = corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(8, resource.DecimalSI)}
	slowNode.Status.Allocatable = slowNode.Status.Capacity
	x.ledger.UpsertNode(slowNode)
	pinned := modelPod("pinned", 2)
	pinned.Spec.NodeSelector = map[string]string{"pool": "v100"}
	if n, ans := place(t, x, names, pinned); n != "slow" {
		t.Fatalf("pod pinned to the V100: node %q, reason %q; want slow", n, anyReason(ans))
	}
	fastNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "team", Value: "llm", Effect: corev1.TaintEffectNoSchedule}}}}
	fastNode.Status.Capacity = slowNode.Status.Capacity
	fastNode.Status.Allocatable = slowNode.Status.Capacity
	x.ledger.UpsertNode(fastNode)
	if n, ans := place(t, x, names, modelPod("other", 2)); n != "slow" {
		t.Fatalf("pod that does not tolerate the H100's taint: node %q, reason %q; want slow", n, anyReason(ans))
	}
	tolerant := modelPod("tolerant", 2)
	tolerant.Spec.Tolerations = []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "llm", Effect: corev1.TaintEffectNoSchedule}}
	if n, ans := place(t, x, names, tolerant); n != "" || !strings.Contains(ans.Unresolvable["slow"], "900 GB/s") {
		t.Fatalf("pod that tolerates the taint: node %q, slow node's reason %q; want it to wait for the H100", n, ans.Unresolvable["slow"])
	}
}

// A pod that could preempt (a lower-priority pod holds GPUs) does not
// wait: waiting would have kube-scheduler evict that pod for a faster set,
// where without patience the pod starts on the slower one and evicts no
// one.
func TestPodThatCouldPreemptDoesNotWait(t *testing.T) {
	x, names, now, _ := patienceCase(t)
	*now = groupEpoch.Add(time.Minute)
	if n, ans := place(t, x, names, withPriority(modelPod("urgent", 4), 1000)); n != "slow" {
		t.Fatalf("high-priority model pod: node %q, reason %q; want slow at once", n, anyReason(ans))
	}
}
