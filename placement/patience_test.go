package placement

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// patienceCase is an offline core with an HGX H100 ("fast", NVSwitch,
// 900 GB/s rings) taken whole by "busy" and a DGX-1 V100 ("slow", a
// hybrid cube mesh whose 4-GPU rings are far below half of that) free,
// with its clock at groupEpoch + at. busy started at groupEpoch and
// declares activeDeadlineSeconds of 5 minutes: the evidence that the
// H100 frees.
func patienceCase(t *testing.T) (x *Core, names []string, now *time.Time, busy *corev1.Pod) {
	t.Helper()
	x, names, now, busy = patienceCluster(t)
	busy.Spec.ActiveDeadlineSeconds = ptr.To[int64](300)
	if n, ans := place(t, x, []string{"fast"}, busy); n != "fast" {
		t.Fatalf("busy not placed on fast: %s", anyReason(ans))
	}
	return x, names, now, busy
}

// patienceCluster is patienceCase's cluster with busy not yet placed and
// declaring nothing.
func patienceCluster(t *testing.T) (x *Core, names []string, now *time.Time, busy *corev1.Pod) {
	t.Helper()
	x = offlineCore(t)
	clock := groupEpoch
	now = &clock
	x.setClock(func() time.Time { return *now })
	names = []string{feedMachine(t, x, "fast", "hgx-h100", 8), feedMachine(t, x, "slow", "dgx1-v100", 8)}
	busy = gpuPod("busy", 8, map[string]string{})
	busy.Status.StartTime = ptr.To(metav1.NewTime(groupEpoch))
	return x, names, now, busy
}

// finish reports pod p, placed by place, as having run to its end (a pod
// that started).
func finish(x *Core, p *corev1.Pod, node string) {
	done := p.DeepCopy()
	done.Spec.NodeName = node
	done.Status.Phase = corev1.PodSucceeded
	x.ledger.UpsertPod(done)
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
	x.setClock(func() time.Time { return groupEpoch.Add(time.Minute) })
	if n, ans := place(t, x, names, modelPod("m", 4)); n != "slow" {
		t.Fatalf("with the H100 untrusted: node %q, reason %q; want slow", n, anyReason(ans))
	}
	feedMachine(t, x, "liar", "hgx-h100", 8)
	// A pod bound there (its GPUs not yet recorded) declares it ends
	// within the wait: the evidence that the machine frees.
	ending := gpuPod("ending", 4, map[string]string{})
	ending.Spec.NodeName, ending.Spec.ActiveDeadlineSeconds = "liar", ptr.To[int64](60)
	x.ledger.UpsertPod(ending)
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

// Without evidence that faster GPUs free (no pod that ran there ended
// lately, none declares when it ends), a model pod takes the best free
// set at once: the H100's holder may run for days. A pod that never
// started (a bind no kubelet ran) and a preemption victim are no such
// evidence; a pod that ran and ended is.
func TestPatienceWaitsOnlyOnEvidenceOfFasterGPUsFreeing(t *testing.T) {
	x, names, now, busy := patienceCluster(t)
	busy.Status.StartTime = nil
	if n, ans := place(t, x, []string{"fast"}, busy); n != "fast" {
		t.Fatalf("busy not placed on fast: %s", anyReason(ans))
	}
	*now = groupEpoch.Add(time.Minute)
	if n, ans := place(t, x, names, modelPod("first", 2)); n != "slow" {
		t.Fatalf("no evidence: node %q, reason %q; want slow at once", n, anyReason(ans))
	}
	// busy never started: deleted, it says nothing of the next pod there.
	gone(x, busy)
	victim := gpuPod("victim", 8, map[string]string{})
	victim.Status.StartTime = ptr.To(metav1.NewTime(groupEpoch))
	if n, ans := place(t, x, []string{"fast"}, victim); n != "fast" {
		t.Fatalf("victim not placed on fast: %s", anyReason(ans))
	}
	if n, ans := place(t, x, names, modelPod("second", 2)); n != "slow" {
		t.Fatalf("after a pod that never started was deleted: node %q, reason %q; want slow at once", n, anyReason(ans))
	}
	// A preemption victim's GPUs go to the pod that preempted it.
	evicted := victim.DeepCopy()
	evicted.Spec.NodeName = "fast"
	evicted.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: corev1.PodReasonPreemptionByScheduler}}
	x.ledger.UpsertPod(evicted)
	gone(x, evicted)
	ran := gpuPod("ran", 8, map[string]string{})
	ran.Status.StartTime = ptr.To(metav1.NewTime(groupEpoch))
	if n, ans := place(t, x, []string{"fast"}, ran); n != "fast" {
		t.Fatalf("ran not placed on fast: %s", anyReason(ans))
	}
	if n, ans := place(t, x, names, modelPod("third", 2)); n != "slow" {
		t.Fatalf("after a preemption victim went: node %q, reason %q; want slow at once", n, anyReason(ans))
	}
	// A pod that ran and ended there is churn: the next model pod waits.
	finish(x, ran, "fast")
	next := gpuPod("next", 8, map[string]string{})
	if n, ans := place(t, x, []string{"fast"}, next); n != "fast" {
		t.Fatalf("next not placed on fast: %s", anyReason(ans))
	}
	*now = groupEpoch.Add(2 * time.Minute)
	m := modelPod("m", 2)
	m.CreationTimestamp = metav1.NewTime(*now)
	n, ans := place(t, x, names, m)
	if n != "" || !strings.Contains(ans.Unresolvable["slow"], "8 GPUs expected to free there in time") {
		t.Fatalf("after a pod that ran ended: node %q, slow node's reason %q; want it to wait for the H100", n, ans.Unresolvable["slow"])
	}
}

// The GPUs expected to free are shared by the pods that wait for them in
// creation order: once the pods ahead ask for all of them, the next takes
// the best free set at once (the tail of a burst is not stranded).
func TestPodsAheadUseUpWhatIsExpectedToFree(t *testing.T) {
	x, names, now, _ := patienceCase(t) // busy's 8 GPUs free within 5 minutes
	*now = groupEpoch.Add(time.Minute)
	first, second := modelPod("a-first", 4), modelPod("b-second", 4)
	third := modelPod("c-third", 4)
	for _, p := range []*corev1.Pod{first, second, third} {
		x.ledger.UpsertPod(p) // all pending, created in the same second
	}
	for _, p := range []*corev1.Pod{first, second} {
		n, ans := place(t, x, names, p)
		if n != "" || !strings.Contains(ans.Unresolvable["slow"], "8 GPUs expected") {
			t.Fatalf("%s: node %q, slow node's reason %q; want it to wait", p.Name, n, ans.Unresolvable["slow"])
		}
	}
	if n, ans := place(t, x, names, third); n != "slow" {
		t.Fatalf("third pod, 8 GPUs asked ahead of it: node %q, reason %q; want slow at once", n, anyReason(ans))
	}
}

// Bind's choice runs under the ledger's lock (ledger.Reserve): the
// patience of a model pod decided there must not take the lock again,
// or binds wait forever on a writer that waits on them (a burst of pods
// stopped binding that way). Many model pods inside their patience bind
// at once to a few nodes while the ledger is written to; every bind must
// end.
func TestModelPodBindsUnderContentionAllEnd(t *testing.T) {
	x := offlineCore(t)
	var names []string
	for i := range 4 {
		names = append(names, feedMachine(t, x, fmt.Sprintf("node-%d", i), "dgx1-v100", 8))
	}
	x.setClock(func() time.Time { return groupEpoch.Add(time.Minute) })
	stop := make(chan struct{})
	var writes sync.WaitGroup
	writes.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			feedMachine(t, x, names[i%len(names)], "dgx1-v100", 8)
		}
	})
	done := make(chan struct{})
	var bound atomic.Int32
	go func() {
		defer close(done)
		var binds sync.WaitGroup
		for i := range 16 {
			binds.Go(func() {
				p := modelPod(fmt.Sprintf("m%02d", i), 2)
				x.ledger.UpsertPod(p)
				pr := request(t, x, p)
				if res := x.Reserve(context.Background(), pr, names[i%len(names)]); res.Err == nil {
					bound.Add(1)
				}
			})
		}
		binds.Wait()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("binds still waiting after 30s (%d of 16 ended): the ledger's lock is taken twice", bound.Load())
	}
	close(stop)
	writes.Wait()
	if got := bound.Load(); got != 16 {
		t.Errorf("%d of 16 model pods reserved; want all (each node holds 4 pairs)", got)
	}
}
