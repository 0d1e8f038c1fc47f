package extender

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// fullNode fills node (a fixture machine) with 1-GPU pods of priority
// prio, one per GPU; pod i holds GPU i and started i minutes after
// testNow, so that the later pods are the less important.
func fullNode(t *testing.T, x *Extender, fixture, node string, prio int32) []types.UID {
	t.Helper()
	x.core.Feed().UpsertTopology(topo(t, fixture, node))
	fx, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	g := fx.Graph(node)
	var uids []types.UID
	for i := range g.Len() {
		p := makePod(fmt.Sprintf("%s-low-%d", node, i)).gpus(1).node(node).assigned(g.GPU(i).UUID).phase("Running").obj()
		p.Spec.Priority = &prio
		p.Status.StartTime = &metav1.Time{Time: testNow.Add(time.Duration(i) * time.Minute)}
		x.core.Feed().UpsertPod(p)
		uids = append(uids, p.UID)
	}
	return uids
}

func preemptArgs(pod any, victims map[string][]types.UID) *extenderv1.ExtenderPreemptionArgs {
	args := &extenderv1.ExtenderPreemptionArgs{NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}
	for node, uids := range victims {
		mv := &extenderv1.MetaVictims{}
		for _, u := range uids {
			mv.Pods = append(mv.Pods, &extenderv1.MetaPod{UID: string(u)})
		}
		args.NodeNameToMetaVictims[node] = mv
	}
	return args
}

func metaUIDs(mv *extenderv1.MetaVictims) []types.UID {
	var out []types.UID
	for _, p := range mv.Pods {
		out = append(out, types.UID(p.UID))
	}
	slices.Sort(out)
	return out
}

// TestPreemptFreesAnNVLinkQuad: kube-scheduler proposes 4 victims by count
// on a full DGX-1 V100 (the 4 youngest pods, spread over both NVLink
// quads). The extender answers with 4 victims that free one quad, the
// least important such set; on a PCIe node, where no eviction could give
// a 4-GPU model-parallel pod NVLink, the node is dropped. A pod's
// priority bounds what the extender adds: with victims of its own
// priority only, nothing is added and the node is dropped.
func TestPreemptFreesAnNVLinkQuad(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	v100 := fullNode(t, x, "dgx1-v100", "v100", 100)
	pcie := fullNode(t, x, "pcie-8x", "pcie", 100)
	high := makePod("high").gpus(4).req(`{"requireNVLink":true,"strategy":"highest_bandwidth"}`).obj()
	prio := int32(1000)
	high.Spec.Priority = &prio
	// kube-scheduler's count: the 4 youngest, GPUs 2, 3 (quad 0) and
	// 6, 7 (quad 1) in this order of start: 7, 6, 3, 2.
	args := preemptArgs(high, map[string][]types.UID{
		"v100": {v100[2], v100[3], v100[6], v100[7]},
		"pcie": {pcie[4], pcie[5], pcie[6], pcie[7]},
	})
	args.Pod = high
	res, err := x.Preempt(context.Background(), args)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := res.NodeNameToMetaVictims["pcie"]; ok {
		t.Error("the PCIe node was kept: no eviction gives the pod 4 NVLinked GPUs there")
	}
	mv := res.NodeNameToMetaVictims["v100"]
	if mv == nil {
		t.Fatalf("the DGX-1 V100 was dropped; result %v", res.NodeNameToMetaVictims)
	}
	// The least important quad: 4-7 holds the youngest pods.
	want := []types.UID{v100[4], v100[5], v100[6], v100[7]}
	slices.Sort(want)
	if got := metaUIDs(mv); !slices.Equal(got, want) {
		t.Errorf("victims %v, want quad 4-7 %v", got, want)
	}

	// Victims that already free a quad are kept as they are, none more.
	args = preemptArgs(high, map[string][]types.UID{"v100": {v100[0], v100[1], v100[2], v100[3]}})
	args.Pod = high
	res, err = x.Preempt(context.Background(), args)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := metaUIDs(res.NodeNameToMetaVictims["v100"]), []types.UID{v100[0], v100[1], v100[2], v100[3]}; !slices.Equal(got, want) {
		t.Errorf("victims %v, want kube-scheduler's quad 0-3 %v", got, want)
	}

	// A preemptor of the victims' own priority may evict none of the
	// others: the node is dropped.
	same := high.DeepCopy()
	p100 := int32(100)
	same.Spec.Priority = &p100
	args = preemptArgs(same, map[string][]types.UID{"v100": {v100[2], v100[3], v100[6], v100[7]}})
	args.Pod = same
	res, err = x.Preempt(context.Background(), args)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.NodeNameToMetaVictims) != 0 {
		t.Errorf("priority 100 over pods of priority 100: kept %v, want no node", res.NodeNameToMetaVictims)
	}
}

// TestPreemptLeavesGroupsAndPodsWithoutGPUs: a pod of a group gets no
// node (one pod's evictions cannot place a group); a pod without GPUs
// keeps kube-scheduler's victims; a malformed requirement is an error
// naming the field.
func TestPreemptLeavesGroupsAndPodsWithoutGPUs(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	v100 := fullNode(t, x, "dgx1-v100", "v100", 0)
	victims := map[string][]types.UID{"v100": {v100[0]}}
	member := makePod("member").gpus(8).annotate(v1alpha1.AnnotationGroup, "g").annotate(v1alpha1.AnnotationGroupSize, "2").obj()
	args := preemptArgs(nil, victims)
	args.Pod = member
	if res, err := x.Preempt(context.Background(), args); err != nil || len(res.NodeNameToMetaVictims) != 0 {
		t.Errorf("a group's pod: %v %v, want no node", res.NodeNameToMetaVictims, err)
	}
	args.Pod = makePod("cpu").obj()
	if res, err := x.Preempt(context.Background(), args); err != nil || len(res.NodeNameToMetaVictims) != 1 {
		t.Errorf("a pod without GPUs: %v %v, want kube-scheduler's victims", res.NodeNameToMetaVictims, err)
	}
	args.Pod = makePod("bad").gpus(2).req(`{"strategy":"nope"}`).obj()
	if _, err := x.Preempt(context.Background(), args); err == nil {
		t.Error("a malformed requirement was accepted")
	}
}
