package schedplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	corev1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// podInfo is a PodInfo that knows its Pod only.
type podInfo struct {
	fwk.PodInfo
	p *corev1.Pod
}

func (p podInfo) GetPod() *corev1.Pod { return p.p }

// clone is the framework's CycleState.Clone for the plugin's keys.
func (s *cycleState) clone() *cycleState {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := newState()
	for k, d := range s.m {
		c.m[k] = d.Clone()
	}
	return c
}

// bindOn puts a 1-GPU pod bound to GPU i of node (a fixture) into the
// ledger, as the informer would deliver it.
func (c *cluster) bindOn(t *testing.T, name, node, fixture string, i int) *corev1.Pod {
	t.Helper()
	fx, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	p := c.pod(t, name, 1, "")
	p.Spec.NodeName = node
	p.Annotations = map[string]string{v1alpha1.AnnotationAssignedGPUs: fx.Graph(node).GPU(i).UUID}
	c.x.Core().Feed().UpsertPod(p)
	return p
}

// selectVictims is kube-scheduler's SelectVictimsOnNode as it drives the
// plugin (default_preemption.go): on a copy of the cycle state it removes
// every candidate victim, asks Filter, then gives victims back one by one
// in the order given (most important first) and keeps each that still
// lets the pod fit. It returns the victims left, or nil and the status
// when the pod does not fit even with every victim gone.
func (c *cluster) selectVictims(t *testing.T, st *cycleState, pod *corev1.Pod, node fwk.NodeInfo, candidates []*corev1.Pod) ([]*corev1.Pod, *fwk.Status) {
	t.Helper()
	ctx := context.Background()
	s := st.clone()
	ext := c.p.PreFilterExtensions()
	for _, v := range candidates {
		if st := ext.RemovePod(ctx, s, pod, podInfo{p: v}, node); !st.IsSuccess() {
			t.Fatalf("RemovePod %s: %v", v.Name, st)
		}
	}
	if st := c.p.Filter(ctx, s, pod, node); !st.IsSuccess() {
		return nil, st
	}
	var victims []*corev1.Pod
	for _, v := range candidates {
		if st := ext.AddPod(ctx, s, pod, podInfo{p: v}, node); !st.IsSuccess() {
			t.Fatalf("AddPod %s: %v", v.Name, st)
		}
		if c.p.Filter(ctx, s, pod, node).IsSuccess() {
			continue // reprieved
		}
		if st := ext.RemovePod(ctx, s, pod, podInfo{p: v}, node); !st.IsSuccess() {
			t.Fatalf("RemovePod %s: %v", v.Name, st)
		}
		victims = append(victims, v)
	}
	return victims, nil
}

// TestPreemptionFreesAnNVLinkQuad: a DGX-1 V100 full of 1-GPU pods, and a
// 4-GPU model-parallel pod. PreFilter refuses it as Unschedulable (so the
// framework tries preemption) and leaves the cycle's state for Filter.
// Whatever order the victims are reprieved in, exactly 4 are kept as
// victims, and they free one of the two NVLink-connected quads; the
// cycle's own state is left as it was.
func TestPreemptionFreesAnNVLinkQuad(t *testing.T) {
	const fixture = "dgx1-v100"
	c := newCluster(t, fixture)
	node := c.nodes[0]
	name := node.Node().Name
	var bound []*corev1.Pod
	for i := range 8 {
		bound = append(bound, c.bindOn(t, fmt.Sprintf("low-%d", i), name, fixture, i))
	}
	pod := c.pod(t, "high", 4, modelNVLink)
	st := newState()
	if _, s := c.p.PreFilter(context.Background(), st, pod, c.nodes); s.Code() != fwk.Unschedulable {
		t.Fatalf("PreFilter on a full node: %v, want Unschedulable (preemption may help)", s)
	}
	quads := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	for _, order := range [][]int{{0, 1, 2, 3, 4, 5, 6, 7}, {7, 6, 5, 4, 3, 2, 1, 0}, {0, 4, 1, 5, 2, 6, 3, 7}, {6, 1, 3, 4, 0, 7, 2, 5}} {
		t.Run(fmt.Sprint(order), func(t *testing.T) {
			var cand []*corev1.Pod
			for _, i := range order {
				cand = append(cand, bound[i])
			}
			victims, s := c.selectVictims(t, st, pod, node, cand)
			if s != nil {
				t.Fatalf("with every pod gone the pod does not fit: %v", s)
			}
			var freed []int
			for _, v := range victims {
				freed = append(freed, slices.Index(bound, v))
			}
			slices.Sort(freed)
			if !slices.Equal(freed, quads[0]) && !slices.Equal(freed, quads[1]) {
				t.Errorf("victims on GPUs %v, want exactly one NVLink-connected quad %v", freed, quads)
			}
		})
	}
	if s := c.p.Filter(context.Background(), st, pod, node); s.IsSuccess() {
		t.Error("the cycle's own state passes the full node: a what-if leaked out of its copy")
	}
}

// TestPreemptionNeverHelpsWhereTheNodeCannotFit: a node that could never
// hold the pod stays unresolvable with its victims gone, so preemption
// evicts nothing there.
func TestPreemptionNeverHelpsWhereTheNodeCannotFit(t *testing.T) {
	const fixture = "pcie-8x"
	c := newCluster(t, fixture)
	node := c.nodes[0]
	var bound []*corev1.Pod
	for i := range 8 {
		bound = append(bound, c.bindOn(t, fmt.Sprintf("low-%d", i), node.Node().Name, fixture, i))
	}
	pod := c.pod(t, "high", 4, modelNVLink)
	st := newState()
	c.p.PreFilter(context.Background(), st, pod, c.nodes)
	victims, s := c.selectVictims(t, st, pod, node, bound)
	if s.Code() != fwk.UnschedulableAndUnresolvable || victims != nil {
		t.Fatalf("a PCIe node for an NVLink pod: victims %d, status %v; want none and UnschedulableAndUnresolvable", len(victims), s)
	}
}

// TestNominatedPodKeepsItsGPUs: a pod nominated to a node (it preempted
// there) counts as holding the GPUs it requests when the framework adds
// it; a pod of lower priority that would take them is refused on that
// copy, and the cycle's own state is unchanged.
func TestNominatedPodKeepsItsGPUs(t *testing.T) {
	const fixture = "dgx-a100"
	c := newCluster(t, fixture)
	node := c.nodes[0]
	for i := range 4 {
		c.bindOn(t, fmt.Sprintf("low-%d", i), node.Node().Name, fixture, i)
	}
	nominated := c.pod(t, "nominated", 4, "")
	pod := c.pod(t, "other", 2, "")
	st := newState()
	if s := c.filter(t, st, pod)[node.Node().Name]; !s.IsSuccess() {
		t.Fatalf("2 GPUs on a node with 4 free: %v", s)
	}
	s := st.clone()
	if st := c.p.PreFilterExtensions().AddPod(context.Background(), s, pod, podInfo{p: nominated}, node); !st.IsSuccess() {
		t.Fatal(st)
	}
	got := c.p.Filter(context.Background(), s, pod, node)
	if got.Code() != fwk.Unschedulable || !strings.Contains(got.Message(), "0 of 8 are free") {
		t.Errorf("with the nominated 4-GPU pod added: %v, want Unschedulable, no GPU left", got)
	}
	if got := c.p.Filter(context.Background(), st, pod, node); !got.IsSuccess() {
		t.Errorf("the cycle's own state after a copy was changed: %v", got)
	}
}

// TestWaitingGroupPodDoesNotPreempt: a group's pod that waits for its
// group is refused by Filter as unresolvable on every node, so
// preemption evicts nothing for one pod of a group that cannot be placed.
func TestWaitingGroupPodDoesNotPreempt(t *testing.T) {
	c := newCluster(t, "dgx-a100")
	pod := c.pod(t, "g-0", 8, "")
	pod.Annotations = map[string]string{v1alpha1.AnnotationGroup: "g", v1alpha1.AnnotationGroupSize: "3"}
	c.x.Core().Feed().UpsertPod(pod)
	st := newState()
	_, pre := c.p.PreFilter(context.Background(), st, pod, c.nodes)
	if pre.IsSuccess() {
		t.Fatalf("PreFilter of a group of 3 × 8 GPUs on one 8-GPU node passed")
	}
	got := c.p.Filter(context.Background(), st.clone(), pod, c.nodes[0])
	if got.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(got.Message(), "group") {
		t.Errorf("Filter of the waiting group's pod in preemption: %v, want UnschedulableAndUnresolvable naming the group", got)
	}
}

// TestPodFoundUnschedulableIsNotNarrowed: PreFilter narrows a pod to
// the nodes that can hold it now, unless kube-scheduler found the pod
// unschedulable before (those nodes failed other filters) and it could
// preempt (a pod of lower priority holds GPUs): then every node is
// filtered, so that its preemption may consider the others.
func TestPodFoundUnschedulableIsNotNarrowed(t *testing.T) {
	c := newCluster(t, "dgx-a100", "pcie-8x", "dgx1-v100")
	pod := c.pod(t, "big", 8, modelNVLink)
	high := int32(1000)
	pod.Spec.Priority = &high
	ctx := context.Background()
	res, s := c.p.PreFilter(ctx, newState(), pod, c.nodes)
	if !s.IsSuccess() || res.AllNodes() || res.NodeNames.Len() != 1 {
		t.Fatalf("first cycle: %v %v, want the DGX A100 alone", res, s)
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable}}
	if res, s = c.p.PreFilter(ctx, newState(), pod, c.nodes); !s.IsSuccess() || res.AllNodes() {
		t.Fatalf("found unschedulable, but no pod of lower priority holds GPUs: %v %v, want it narrowed (preemption cannot help)", res, s)
	}
	c.bindOn(t, "low", c.nodes[1].Node().Name, "pcie-8x", 0) // priority 0
	if res, s = c.p.PreFilter(ctx, newState(), pod, c.nodes); !s.IsSuccess() || !res.AllNodes() {
		t.Fatalf("found unschedulable, a pod of lower priority holds GPUs: %v %v, want every node", res, s)
	}
	never := corev1.PreemptNever
	pod.Spec.PreemptionPolicy = &never
	if res, s = c.p.PreFilter(ctx, newState(), pod, c.nodes); !s.IsSuccess() || res.AllNodes() {
		t.Fatalf("preemptionPolicy Never: %v %v, want it narrowed", res, s)
	}
}

// nodeWithPods is a NodeInfo that knows its Node and its pods, as
// kube-scheduler's snapshot has them.
type nodeWithPods struct {
	nodeInfo
	pods []fwk.PodInfo
}

func (n nodeWithPods) GetPods() []fwk.PodInfo { return n.pods }

// TestNominatedPodSeesItsVictimsGoneBeforeTheLedgerDoes: kube-scheduler's
// snapshot drops a preemption's victims before the ledger's informer
// handler does. The pod nominated to the node is not refused there (and
// does not preempt again elsewhere): PreFilter does not end its cycle, and
// Filter on its nominated node decides as the snapshot sees the node.
// Reserve still decides on the ledger, so it refuses until the ledger
// agrees. Another pod is not affected.
func TestNominatedPodSeesItsVictimsGoneBeforeTheLedgerDoes(t *testing.T) {
	const fixture = "dgx1-v100"
	c := newCluster(t, fixture)
	name := c.nodes[0].Node().Name
	var snapshot []fwk.PodInfo
	for i := range 8 {
		p := c.bindOn(t, fmt.Sprintf("low-%d", i), name, fixture, i)
		if i >= 4 {
			snapshot = append(snapshot, podInfo{p: p}) // 0-3 were evicted
		}
	}
	node := nodeWithPods{nodeInfo: c.nodes[0].(nodeInfo), pods: snapshot}
	pod := c.pod(t, "high", 4, modelNVLink)
	pod.Status.NominatedNodeName = name
	ctx := context.Background()
	st := newState()
	if _, s := c.p.PreFilter(ctx, st, pod, c.nodes); !s.IsSuccess() {
		t.Fatalf("PreFilter of the nominated pod: %v, want it to go on to Filter", s)
	}
	if s := c.p.Filter(ctx, st, pod, node); !s.IsSuccess() {
		t.Fatalf("Filter on the nominated node with its victims gone from the snapshot: %v", s)
	}
	if s := c.p.Reserve(ctx, st, pod, name); s.IsSuccess() {
		t.Error("Reserve succeeded while the ledger still counts the victims")
	}
	other := c.pod(t, "other", 4, modelNVLink)
	st = newState()
	if _, s := c.p.PreFilter(ctx, st, other, c.nodes); s.IsSuccess() {
		t.Errorf("a pod not nominated passed PreFilter on a node the ledger counts full")
	}
}

// TestGroupPlansOnTheSnapshotPodGroupPreemptionTries: kube-scheduler's
// pod-group preemption tries a waiting group through fresh cycles on a
// snapshot with its candidate victims taken out. Each pod of the group
// then passes PreFilter, on its own node of the plan made on that
// snapshot, Filter passes it there, and Reserve holds nothing in the
// ledger, where the victims still hold their GPUs. On a snapshot that
// agrees with the ledger the group waits, as before.
func TestGroupPlansOnTheSnapshotPodGroupPreemptionTries(t *testing.T) {
	c := newCluster(t, "dgx-a100", "dgx-a100")
	for n, ni := range c.nodes {
		for i := range 8 {
			c.bindOn(t, fmt.Sprintf("low-%d-%d", n, i), ni.Node().Name, "dgx-a100", i)
		}
	}
	var group []*corev1.Pod
	for i := range 2 {
		p := c.pod(t, fmt.Sprintf("g-%d", i), 8, "")
		p.Annotations = map[string]string{v1alpha1.AnnotationGroup: "g", v1alpha1.AnnotationGroupSize: "2"}
		c.x.Core().Feed().UpsertPod(p)
		group = append(group, p)
	}
	ctx := context.Background()
	if _, s := c.p.PreFilter(ctx, newState(), group[0], c.nodes); s.IsSuccess() {
		t.Fatalf("PreFilter on a snapshot that agrees with the full ledger passed")
	}
	// The snapshot without the victims.
	var empty []fwk.NodeInfo
	for _, ni := range c.nodes {
		empty = append(empty, nodeWithPods{nodeInfo: ni.(nodeInfo)})
	}
	held := c.x.Core().Report().Counts()
	seen := map[string]bool{}
	for _, p := range group {
		st := newState()
		res, s := c.p.PreFilter(ctx, st, p, empty)
		if !s.IsSuccess() || res.AllNodes() || res.NodeNames.Len() != 1 {
			t.Fatalf("PreFilter of %s on the snapshot without victims: %v %v, want its one node of the plan", p.Name, res, s)
		}
		node := res.NodeNames.UnsortedList()[0]
		if seen[node] {
			t.Errorf("two pods of the group sent to %s", node)
		}
		seen[node] = true
		var ni fwk.NodeInfo
		for _, n := range empty {
			if n.Node().Name == node {
				ni = n
			}
		}
		if f := c.p.Filter(ctx, st, p, ni); !f.IsSuccess() {
			t.Errorf("Filter of %s on %s: %v, want it to pass on the snapshot", p.Name, node, f)
		}
		if r := c.p.Reserve(ctx, st, p, node); !r.IsSuccess() {
			t.Errorf("Reserve of %s on %s: %v, want success without the ledger", p.Name, node, r)
		}
	}
	if got := c.x.Core().Report().Counts(); got != held {
		t.Errorf("ledger after the tries: %s, want it unchanged (%s)", got, held)
	}
}

// draHandle is a framework handle that serves DRA objects only.
type draHandle struct {
	fwk.Handle
	m fwk.SharedDRAManager
}

func (h draHandle) SharedDRAManager() fwk.SharedDRAManager { return h.m }

// TestNominatedClaimPodKeepsItsGPUs: a pod nominated to a node that asks
// for its GPUs through a ResourceClaim not allocated yet counts as
// holding them when the framework adds it, as a device-plugin pod does.
func TestNominatedClaimPodKeepsItsGPUs(t *testing.T) {
	const fixture = "dgx-a100"
	c := newCluster(t, fixture)
	cfg := c.x.Core().Config().DRA
	c.p.h = draHandle{m: claimsOnly{claims: map[string]*resourceapi.ResourceClaim{
		"ns/four": gpuClaim("four", exact("gpus", cfg.DeviceClasses[0], 4, resourceapi.DeviceAllocationModeExactCount)),
	}}}
	node := c.nodes[0]
	for i := range 4 {
		c.bindOn(t, fmt.Sprintf("low-%d", i), node.Node().Name, fixture, i)
	}
	nominated := claimingPod("four")
	nominated.UID = "nominated"
	pod := c.pod(t, "other", 2, "")
	st := newState()
	if s := c.filter(t, st, pod)[node.Node().Name]; !s.IsSuccess() {
		t.Fatalf("2 GPUs on a node with 4 free: %v", s)
	}
	s := st.clone()
	if st := c.p.PreFilterExtensions().AddPod(context.Background(), s, pod, podInfo{p: nominated}, node); !st.IsSuccess() {
		t.Fatal(st)
	}
	got := c.p.Filter(context.Background(), s, pod, node)
	if got.Code() != fwk.Unschedulable || !strings.Contains(got.Message(), "0 of 8 are free") {
		t.Errorf("with the nominated pod's 4-GPU claim added: %v, want Unschedulable, no GPU left", got)
	}
}
