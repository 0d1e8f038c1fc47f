package placement

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// cliqueCore is an offline core fed racks GB200 NVL72 racks of 18 trays (4
// GPUs each), rack r's trays in clique "rack-r"; every rack under one
// spine.
func cliqueCore(t *testing.T, racks int) (*Core, []string) {
	t.Helper()
	return fabricCore(t, "gb200-nvl72-tray", 18*racks, func(i int) map[string]string {
		return map[string]string{"nvidia.com/gpu.clique": fmt.Sprintf("rack-%d", i/18), "network.topology.nvidia.com/spine": "s"}
	})
}

// slicedPods are the size pods of group name asking 4 GPUs each, in slices
// of slice pods required in one NVLink clique, the group in one spine;
// ranked: each pod carries its rank.
func slicedPods(name string, size, slice int, ranked bool) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range size {
		ann := map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "spine",
			v1alpha1.AnnotationSliceSize: fmt.Sprint(slice), v1alpha1.AnnotationSliceRequiredTopology: "nvlink"}
		if ranked {
			ann[v1alpha1.AnnotationRank] = fmt.Sprint(i)
		}
		out = append(out, groupPod(name, i, size, 4, ann))
	}
	return out
}

// placeAll upserts pods, then places each; it returns each pod's node
// ("" when not placed) and the last refusal.
func placeAll(t *testing.T, x *Core, names []string, pods []*corev1.Pod) ([]string, string, []v1alpha1.Placement) {
	t.Helper()
	for _, p := range pods {
		x.ledger.UpsertPod(p)
	}
	var nodes []string
	var placements []v1alpha1.Placement
	why := ""
	for _, p := range pods {
		n, ans, pl := placeP(t, x, names, p)
		if n == "" {
			why = anyReason(ans)
		}
		nodes = append(nodes, n)
		placements = append(placements, pl)
	}
	return nodes, why, placements
}

// rackOf is node name's rack in cliqueCore.
func rackOf(name string) int {
	var i int
	fmt.Sscanf(name, "node-%d", &i)
	return i / 18
}

// TestSlicedGroupPutsEachSliceInOneClique: on two GB200 racks with some
// trays of each in use, a group of 32 pods × 4 GPUs in 2 slices of 16 lays
// each slice (by the pods' ranks) in one rack's NVLink clique, where a
// group without slices required in the spine may cross racks. A second
// such group waits, saying which slice found no clique, and holds nothing.
func TestSlicedGroupPutsEachSliceInOneClique(t *testing.T) {
	for _, ranked := range []bool{true, false} {
		t.Run(fmt.Sprintf("ranked=%v", ranked), func(t *testing.T) {
			x, names := cliqueCore(t, 2)
			// Two trays of rack 0 and one of rack 1 in use: 16 free in
			// rack 0, 17 in rack 1.
			for i, n := range []string{"node-0", "node-1", "node-18"} {
				p := gpuPod(fmt.Sprintf("busy-%d", i), 4, map[string]string{})
				p.Spec.NodeName = n
				x.ledger.UpsertPod(p)
			}
			nodes, why, placements := placeAll(t, x, names, slicedPods("llm", 32, 16, ranked))
			racks := map[int]map[int]bool{} // slice -> racks
			for i, n := range nodes {
				if n == "" {
					t.Fatalf("llm-%d not placed: %s", i, why)
				}
				if n == "node-0" || n == "node-1" || n == "node-18" {
					t.Errorf("llm-%d on busy tray %s", i, n)
				}
			}
			for i, n := range nodes {
				p := placements[i]
				if p.SliceDomain == "" || p.Domain != "network.topology.nvidia.com/spine=s" {
					t.Errorf("llm-%d placement %+v: want its slice's domain and the spine", i, p)
				}
				s := p.Slice
				if ranked && s != i/16 {
					t.Errorf("llm-%d is in slice %d, want %d (its rank / 16)", i, s, i/16)
				}
				if p.SliceDomain != fmt.Sprintf("nvidia.com/gpu.clique=rack-%d", rackOf(n)) {
					t.Errorf("llm-%d on %s records slice domain %q", i, n, p.SliceDomain)
				}
				if racks[s] == nil {
					racks[s] = map[int]bool{}
				}
				racks[s][rackOf(n)] = true
			}
			if len(racks) != 2 || len(racks[0]) != 1 || len(racks[1]) != 1 {
				t.Errorf("slices by rack %v: want each of 2 slices in one rack", racks)
			}
			// A second group of the same shape: 1 tray free per rack.
			_, why, _ = placeAll(t, x, names, slicedPods("next", 32, 16, ranked))
			for _, want := range []string{"group ml/next needs 2 slices of 16 pods × 4 GPUs, each inside one nvlink domain, all in one spine domain"} {
				if !strings.Contains(why, want) {
					t.Errorf("second group's reason %q, want it to contain %q", why, want)
				}
			}
			for _, gp := range x.Report().GroupPlans() {
				if gp.Key == "ml/next" {
					t.Errorf("the waiting group holds a plan: %+v", gp)
				}
			}
		})
	}
}

// TestSliceThatFitsNoDomainSaysWhichAndWhy: a slice bigger than a clique
// is unresolvable in words; a slice level wider than the group's is
// refused with both fields; a third slice with room only across racks
// waits saying which slice found no clique.
// TestUnslicedGroupCrossesCliques is the same cluster and group without
// slices: required in the spine only, its second half of ranks spans both
// racks, which is what slices prevent.
func TestUnslicedGroupCrossesCliques(t *testing.T) {
	x, names := cliqueCore(t, 2)
	for i, n := range []string{"node-0", "node-1", "node-18"} {
		p := gpuPod(fmt.Sprintf("busy-%d", i), 4, map[string]string{})
		p.Spec.NodeName = n
		x.ledger.UpsertPod(p)
	}
	var pods []*corev1.Pod
	for i := range 32 {
		pods = append(pods, groupPod("llm", i, 32, 4, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "spine"}))
	}
	nodes, why, _ := placeAll(t, x, names, pods)
	racks := map[int]bool{}
	for i, n := range nodes {
		if n == "" {
			t.Fatalf("llm-%d not placed: %s", i, why)
		}
		if i >= 16 {
			racks[rackOf(n)] = true
		}
	}
	if len(racks) != 2 {
		t.Errorf("ranks 16-31 of the group without slices lie in racks %v; this cluster was meant to show a half crossing racks", racks)
	}
}

func TestSliceThatFitsNoDomainSaysWhichAndWhy(t *testing.T) {
	x, names := cliqueCore(t, 2)
	_, why, _ := placeAll(t, x, names, slicedPods("huge", 40, 20, false))
	if want := "no nvlink domain holds a slice even with every GPU free (the largest holds 18 of its 20 pods)"; !strings.Contains(why, want) {
		t.Errorf("reason %q, want %q", why, want)
	}
	wide := slicedPods("wide", 4, 2, false)
	for _, p := range wide {
		p.Annotations[v1alpha1.AnnotationGroupRequiredTopology] = "nvlink"
		p.Annotations[v1alpha1.AnnotationSliceRequiredTopology] = "spine"
	}
	if _, why, _ := placeAll(t, x, names, wide); !strings.Contains(why, v1alpha1.AnnotationSliceRequiredTopology) || !strings.Contains(why, "is wider than") {
		t.Errorf("reason %q, want the slice level refused as wider than the group's", why)
	}
	// 3 slices of 12: two racks hold one each, with 6 trays left in each:
	// no third clique.
	_, why, _ = placeAll(t, x, names, slicedPods("three", 36, 12, false))
	if want := "slice 2 (12 pods) found no nvlink domain with room for it in network.topology.nvidia.com/spine=s; the roomiest left holds 6"; !strings.Contains(why, want) {
		t.Errorf("reason %q, want %q", why, want)
	}
	if p := x.Report().GroupPlans(); len(p) != 0 {
		t.Errorf("plans held: %+v", p)
	}
	if h := x.Report().Holdings(); len(h) != 0 {
		t.Errorf("GPUs held: %+v", h)
	}
}

// TestSlicesOnHGXLeaves: six leaves of eight HGX H100 nodes under one
// spine, one node busy in each of the first two leaves. A group of 4
// slices × 8 pods × 8 GPUs (by rank), slice level leaf, group level spine,
// puts each slice on one whole leaf: the four free leaves.
func TestSlicesOnHGXLeaves(t *testing.T) {
	x, names := fabricCore(t, "hgx-h100", 48, func(i int) map[string]string {
		return map[string]string{"network.topology.nvidia.com/leaf": fmt.Sprintf("leaf-%d", i/8), "network.topology.nvidia.com/spine": "s"}
	})
	for i, n := range []string{"node-0", "node-8"} {
		p := gpuPod(fmt.Sprintf("busy-%d", i), 8, map[string]string{})
		p.Spec.NodeName = n
		x.ledger.UpsertPod(p)
	}
	var pods []*corev1.Pod
	for i := range 32 {
		pods = append(pods, groupPod("train", i, 32, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "spine",
			v1alpha1.AnnotationSliceSize: "8", v1alpha1.AnnotationSliceRequiredTopology: "leaf", v1alpha1.AnnotationRank: fmt.Sprint(i)}))
	}
	nodes, why, placements := placeAll(t, x, names, pods)
	leaves := map[int]map[int]bool{}
	for i, n := range nodes {
		if n == "" {
			t.Fatalf("train-%d not placed: %s", i, why)
		}
		var k int
		fmt.Sscanf(n, "node-%d", &k)
		if leaves[i/8] == nil {
			leaves[i/8] = map[int]bool{}
		}
		leaves[i/8][k/8] = true
		if want := fmt.Sprintf("network.topology.nvidia.com/leaf=leaf-%d", k/8); placements[i].SliceDomain != want || placements[i].Slice != i/8 {
			t.Errorf("train-%d on %s: slice %d in %q, want slice %d in %q", i, n, placements[i].Slice, placements[i].SliceDomain, i/8, want)
		}
	}
	used := map[int]bool{}
	for s, ls := range leaves {
		if len(ls) != 1 {
			t.Errorf("slice %d spans leaves %v", s, ls)
		}
		for l := range ls {
			if l < 2 || used[l] {
				t.Errorf("slice %d on leaf %d: want one of the four free leaves, each slice its own", s, l)
			}
			used[l] = true
		}
	}
}

// fillRacksLow binds a low-priority (100) pod to every tray of names but
// node-3 and node-10 (rack 0) and node-20, 25, 30, 35 (rack 1): a sliced
// group of 2 × 16 trays evicts least in racks 0 and 1. It returns the low
// pods by node.
func fillRacksLow(t *testing.T, x *Core, names []string) map[string]*corev1.Pod {
	t.Helper()
	free := map[string]bool{"node-3": true, "node-10": true, "node-20": true, "node-25": true, "node-30": true, "node-35": true}
	f, err := machine.FixtureByName("gb200-nvl72-tray")
	if err != nil {
		t.Fatal(err)
	}
	low := int32(100)
	out := map[string]*corev1.Pod{}
	for _, n := range names {
		if free[n] {
			continue
		}
		g := f.Graph(n)
		var uuids []string
		for i := range g.Len() {
			uuids = append(uuids, g.GPU(i).UUID)
		}
		p := gpuPod("low-"+n, 4, map[string]string{v1alpha1.AnnotationAssignedGPUs: strings.Join(uuids, ",")})
		p.Spec.NodeName, p.Spec.Priority = n, &low
		x.ledger.UpsertPod(p)
		out[n] = p
	}
	return out
}

// preemptingSlicedGroup is three GB200 racks filled by fillRacksLow and
// a group of 2 slices × 16 pods of priority 1000 in the ledger, pending;
// the nodes' names, the low pods by node and the group's pods.
func preemptingSlicedGroup(t *testing.T) (*Core, []string, map[string]*corev1.Pod, []*corev1.Pod) {
	t.Helper()
	x, names := cliqueCore(t, 3)
	low := fillRacksLow(t, x, names)
	pods := slicedPods("llm", 32, 16, true)
	high := int32(1000)
	for _, p := range pods {
		p.Spec.Priority = &high
		x.ledger.UpsertPod(p)
	}
	return x, names, low, pods
}

// TestSlicedGroupIsPlacedWhereItPreempted: once the victims of a sliced
// group's preemption are gone, the group's plan puts each pod on the node
// its preemption nominated it to. The two racks it evicted in are then
// equally free, and a plan that swapped its slices between them would put
// each pod on a node another pod of the group is nominated to, which
// kube-scheduler's resource fit refuses it (a nominated pod counts there
// against every pod of no higher priority), pods waiting on each other.
func TestSlicedGroupIsPlacedWhereItPreempted(t *testing.T) {
	x, names, low, pods := preemptingSlicedGroup(t)
	high := *pods[0].Spec.Priority
	gp := x.Preemption().PlanGroup(context.Background(), request(t, x, pods[0]), high, nil)
	if gp == nil {
		t.Fatal("no preemption plan")
	}
	for n, vs := range gp.Victims {
		for range vs {
			p := low[n]
			x.ledger.DeletePod(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, p.UID)
		}
	}
	for _, p := range pods {
		p.Status.NominatedNodeName = gp.Slot(p.UID)
	}
	nodes, why, _ := placeAll(t, x, names, pods)
	for i, n := range nodes {
		if want := pods[i].Status.NominatedNodeName; n != want {
			t.Errorf("llm-%d (slice %d) placed on %q, nominated to %s (rack %d) by its preemption; %s", i, i/16, n, want, rackOf(want), why)
		}
	}
}

// TestSlicedGroupPreemptsWhereItEvictsLeast: three GB200 racks full of
// low-priority 4-GPU pods, but for two free trays in rack 0 and four in
// rack 1. A high-priority group of 2 slices × 16 trays (by rank), each in
// one clique, plans on racks 0 and 1, the cliques where it evicts least:
// 14 + 12 victims, all on the trays it takes, each slice in one rack.
func TestSlicedGroupPreemptsWhereItEvictsLeast(t *testing.T) {
	x, names := cliqueCore(t, 3)
	fillRacksLow(t, x, names)
	pods := slicedPods("llm", 32, 16, true)
	var prs []Request
	for _, p := range pods {
		x.ledger.UpsertPod(p)
		prs = append(prs, request(t, x, p))
	}
	gp := x.Preemption().PlanGroup(context.Background(), prs[0], 1000, nil)
	if gp == nil {
		t.Fatal("no preemption plan for a group of priority 1000 over pods of priority 100")
	}
	victims := 0
	for n, vs := range gp.Victims {
		victims += len(vs)
		if rackOf(n) == 2 {
			t.Errorf("victims on %s, in rack 2, which the group does not take", n)
		}
	}
	if victims != 26 {
		t.Errorf("%d victims, want 26 (14 in rack 0, 12 in rack 1)", victims)
	}
	racks := map[int]map[int]bool{}
	for i, p := range pods {
		n := gp.Slot(p.UID)
		if n == "" {
			t.Fatalf("llm-%d has no slot in the plan", i)
		}
		if racks[i/16] == nil {
			racks[i/16] = map[int]bool{}
		}
		racks[i/16][rackOf(n)] = true
	}
	if len(racks[0]) != 1 || len(racks[1]) != 1 || racks[0][2] || racks[1][2] {
		t.Errorf("slices by rack %v: want each slice in one of racks 0 and 1", racks)
	}
	if gp.Domain != "network.topology.nvidia.com/spine=s" {
		t.Errorf("plan domain %q", gp.Domain)
	}
}

// TestWaitingSlicedGroupKeepsEachSliceInOneDomain: the slots a waiting
// sliced group keeps are whole slices, each inside one domain, the domain
// whose slots free soonest first; nil when the domains cannot hold every
// slice.
func TestWaitingSlicedGroupKeepsEachSliceInOneDomain(t *testing.T) {
	later := groupEpoch.Add(time.Hour)
	slot := func(node string, ready time.Time, held int) reserveSlot {
		return reserveSlot{node: node, ready: ready, held: held}
	}
	dom := func(node string) string { return node[:1] }
	// a: three slots free now; b: two now, two in an hour; c: one.
	slots := []reserveSlot{slot("a1", time.Time{}, 0), slot("a2", time.Time{}, 0), slot("a3", time.Time{}, 0),
		slot("b1", time.Time{}, 0), slot("b2", time.Time{}, 0), slot("b3", later, 4), slot("b4", later, 4), slot("c1", time.Time{}, 0)}
	soonestFirst(slots)
	got := soonestSlices(slots, 2, 2, dom)
	var nodes []string
	for _, s := range got {
		nodes = append(nodes, s.node)
	}
	if want := "a1 a2 b1 b2"; strings.Join(nodes, " ") != want {
		t.Errorf("kept %v, want %s (a slice in a, one in b, both free now)", nodes, want)
	}
	if got := soonestSlices(slots, 3, 3, dom); got != nil {
		t.Errorf("3 slices of 3 kept %v; only a and b hold 3", got)
	}
}

// TestKubernetesPodGroupWithSlices: a PodGroup (gang of 32, the spine)
// whose own annotations cut it into slices of 16 in one clique is placed
// with each slice (by the pods' ranks) in one rack; malformed slice
// annotations on a PodGroup keep its pods Pending with the field named.
func TestKubernetesPodGroupWithSlices(t *testing.T) {
	x, names := cliqueCore(t, 2)
	pg := func(name string, ann map[string]string) *schedulingv1beta1.PodGroup {
		return &schedulingv1beta1.PodGroup{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml", Annotations: ann},
			Spec: schedulingv1beta1.PodGroupSpec{
				SchedulingPolicy:      schedulingv1beta1.PodGroupSchedulingPolicy{Gang: &schedulingv1beta1.GangSchedulingPolicy{MinCount: 32}},
				SchedulingConstraints: &schedulingv1beta1.PodGroupSchedulingConstraints{Topology: []schedulingv1beta1.TopologyConstraint{{Key: "network.topology.nvidia.com/spine"}}},
			},
		}
	}
	x.ledger.UpsertPodGroup(pg("llm", map[string]string{v1alpha1.AnnotationSliceSize: "16", v1alpha1.AnnotationSliceRequiredTopology: "nvlink"}))
	x.ledger.UpsertPodGroup(pg("bad", map[string]string{v1alpha1.AnnotationSliceSize: "12", v1alpha1.AnnotationSliceRequiredTopology: "nvlink"}))
	members := func(group string) []*corev1.Pod {
		var out []*corev1.Pod
		for i := range 32 {
			p := gpuPod(fmt.Sprintf("%s-%d", group, i), 4, map[string]string{v1alpha1.AnnotationRank: fmt.Sprint(i)})
			p.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptrTo(group)}
			out = append(out, p)
		}
		return out
	}
	nodes, why, placements := placeAll(t, x, names, members("llm"))
	racks := map[int]map[int]bool{}
	for i, n := range nodes {
		if n == "" {
			t.Fatalf("llm-%d not placed: %s", i, why)
		}
		if placements[i].Slice != i/16 {
			t.Errorf("llm-%d in slice %d, want %d", i, placements[i].Slice, i/16)
		}
		if racks[i/16] == nil {
			racks[i/16] = map[int]bool{}
		}
		racks[i/16][rackOf(n)] = true
	}
	if len(racks[0]) != 1 || len(racks[1]) != 1 {
		t.Errorf("slices by rack %v: want each slice in one rack", racks)
	}
	_, why, _ = placeAll(t, x, names, members("bad")[:1])
	if want := `PodGroup ml/bad: metadata.annotations[gputopo.io/slice-size]: Invalid value: "12": must divide the group's size 32`; !strings.Contains(why, want) {
		t.Errorf("reason %q, want %q", why, want)
	}
}

// TestSlicedGroupPreemptionKeepsItsSlicesWhereItsPodsAreNominated: the
// preemption plan of a sliced group is made again for each pod while the
// victims leave one by one. Once six pods of one slice have their
// victims gone and are nominated in its rack, that rack is the cheaper
// for either slice (by cost alone the slices would swap racks); the plan
// still keeps each slice in its rack and each nominated pod on its node,
// so no pod is nominated into the other slice's rack. Either slice; and
// with the victims gone before their preemptors' nominations reach the
// ledger (the core keeps the plan its pods evict for).
func TestSlicedGroupPreemptionKeepsItsSlicesWhereItsPodsAreNominated(t *testing.T) {
	for c := range 4 {
		s, seen := c%2, c < 2
		t.Run(fmt.Sprintf("slice %d, nominations seen %v", s, seen), func(t *testing.T) {
			x, _, low, pods := preemptingSlicedGroup(t)
			high := *pods[0].Spec.Priority
			plan := func() *GroupPreemption {
				gp := x.Preemption().PlanGroup(context.Background(), request(t, x, pods[0]), high, nil)
				if gp == nil {
					t.Fatal("no preemption plan")
				}
				return gp
			}
			first := plan()
			rackOfSlice := map[int]int{}
			for i, p := range pods {
				rackOfSlice[i/16] = rackOf(first.Slot(p.UID))
			}
			for _, p := range pods[16*s : 16*s+6] {
				n := first.Slot(p.UID)
				if v := low[n]; v != nil {
					x.ledger.DeletePod(types.NamespacedName{Namespace: v.Namespace, Name: v.Name}, v.UID)
				}
				if seen {
					p.Status.NominatedNodeName = n
					x.ledger.UpsertPod(p)
				}
			}
			again := plan()
			for i, p := range pods {
				n := again.Slot(p.UID)
				if rackOf(n) != rackOfSlice[i/16] {
					t.Errorf("llm-%d (slice %d) planned on %s, rack %d; the first plan had its slice in rack %d", i, i/16, n, rackOf(n), rackOfSlice[i/16])
				}
				if nom := p.Status.NominatedNodeName; nom != "" && n != nom {
					t.Errorf("llm-%d planned on %s, nominated to %s", i, n, nom)
				}
			}
		})
	}
}

// TestKeptPreemptionPlanIsForgotten: the preemption plan a group's pods
// evict for is kept while they use it, and forgotten by the periodic
// sweep once unused for preemptionKept.
func TestKeptPreemptionPlanIsForgotten(t *testing.T) {
	x, _, _, pods := preemptingSlicedGroup(t)
	high := *pods[0].Spec.Priority
	if x.Preemption().PlanGroup(context.Background(), request(t, x, pods[0]), high, nil) == nil {
		t.Fatal("no preemption plan")
	}
	if x.keptPreemption("ml/llm", nil) == nil {
		t.Fatal("the group's preemption plan is not kept")
	}
	now := x.now()
	x.now = func() time.Time { return now.Add(preemptionKept + time.Second) }
	x.Upkeep().Sweep()
	n := 0
	x.preempting.Range(func(any, any) bool { n++; return true })
	if n != 0 {
		t.Errorf("%d preemption plans kept after %v unused", n, preemptionKept)
	}
}
