//go:build integration

package extender_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
)

const cliqueLabel = "nvidia.com/gpu.clique"

// gb200Env is two GB200 NVL72 racks of 18 trays (4 GPUs each), tray i of
// rack r named rack-r-i, each rack's trays labelled with the rack's NVLink
// clique, every tray under one spine.
func gb200Env(t *testing.T) *env { return gb200Racks(t, 2) }

// gb200Racks is gb200Env with racks racks.
func gb200Racks(t *testing.T, racks int) *env {
	return newFabricEnv(t, "gb200-nvl72-tray", 4, 18*racks,
		func(i int) string { return fmt.Sprintf("rack-%d-%02d", i/18, i%18) },
		func(i int) map[string]string {
			return map[string]string{cliqueLabel: fmt.Sprintf("clique-%d", i/18), "network.topology.nvidia.com/spine": "s", "kubernetes.io/hostname": fmt.Sprintf("rack-%d-%02d", i/18, i%18)}
		})
}

// slicedGroupPods are the 32 pods × 4 GPUs of group name in 2 slices of 16,
// each required in one NVLink clique, the group in the spine; pod i carries
// rank i.
func slicedGroupPods(name string) []*corev1.Pod {
	pods := groupPods(name, 32, 4, "spine")
	for i, p := range pods {
		p.Annotations[v1alpha1.AnnotationSliceSize] = "16"
		p.Annotations[v1alpha1.AnnotationSliceRequiredTopology] = "nvlink"
		p.Annotations[v1alpha1.AnnotationRank] = fmt.Sprint(i)
		p.Annotations[v1alpha1.AnnotationRequirement] = modelParallel
	}
	return pods
}

// TestSlicedGroupOnTwoGB200Racks: on two GB200 NVL72 racks with two trays
// of rack 0 and one of rack 1 in use, a group of 32 pods × 4 GPUs in 2
// slices of 16 (by rank), each required in one NVLink clique, binds with
// each slice wholly inside one rack's clique, and the placement record
// names each pod's slice and its domain. A second such group (room for
// one tray per rack) waits saying which slice found no clique, and holds
// no GPU. Both modes.
func TestSlicedGroupOnTwoGB200Racks(t *testing.T) {
	eachModeOn(t, gb200Env, testSlicedGroupOnTwoGB200Racks)
}

func testSlicedGroupOnTwoGB200Racks(t *testing.T, e *env, s system) {
	busy := []*corev1.Pod{pinned("busy-0", 4, "rack-0-00"), pinned("busy-1", 4, "rack-0-01"), pinned("busy-2", 4, "rack-1-00")}
	createAll(t, e, busy)
	harness.Poll(t, time.Minute, "busy pods bound", func() (bool, string) {
		g := s.gauges(t)
		return g["held"]+g["reserved"] == 12, fmtGauges(g)
	})

	createAll(t, e, slicedGroupPods("llm"))
	harness.Poll(t, 3*time.Minute, "group llm bound", func() (bool, string) {
		nodes, bound := groupNodes(t, e, "llm")
		return bound == 32, fmt.Sprintf("%d of 32 bound, on %v", bound, nodes)
	})
	racks := map[int]map[string]bool{} // slice -> racks
	for _, p := range listPods(t, e) {
		if p.Annotations[v1alpha1.AnnotationGroup] != "llm" {
			continue
		}
		var rank int
		fmt.Sscan(p.Annotations[v1alpha1.AnnotationRank], &rank)
		rack := p.Spec.NodeName[:len("rack-0")]
		if racks[rank/16] == nil {
			racks[rank/16] = map[string]bool{}
		}
		racks[rank/16][rack] = true
		pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement])
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%s=clique-%s", cliqueLabel, rack[len("rack-"):])
		if pl.Slice != rank/16 || pl.SliceDomain != want || pl.Domain != "network.topology.nvidia.com/spine=s" {
			t.Errorf("pod %s (rank %d) on %s: placement slice %d in %q, group domain %q; want slice %d in %q in the spine", p.Name, rank, p.Spec.NodeName, pl.Slice, pl.SliceDomain, pl.Domain, rank/16, want)
		}
	}
	if len(racks) != 2 || len(racks[0]) != 1 || len(racks[1]) != 1 {
		t.Errorf("slices by rack %v: want each slice in one rack", racks)
	}

	// A second such group: one tray is left.
	createAll(t, e, slicedGroupPods("next"))
	waitReason(t, e, "next", 32, "group default/next needs 2 slices of 16 pods × 4 GPUs, each inside one nvlink domain, all in one spine domain: the largest free holds 1 of its 32 pods")
	g := s.gauges(t)
	if _, bound := groupNodes(t, e, "next"); bound != 0 || g["held"]+g["reserved"] != 12+128 {
		t.Errorf("the waiting group has %d pods bound; %s (want the busy pods' 12 GPUs and the first group's 128 held, nothing more)", bound, fmtGauges(g))
	}
	// The busy trays free: two trays in each clique, four in all. A group
	// of 3 trays in one slice fits by count, not in one clique: the pods
	// say which slice found no clique, and nothing is held.
	deletePods(t, e, busy)
	trio := groupPods("trio", 3, 4, "spine")
	for _, p := range trio {
		p.Annotations[v1alpha1.AnnotationSliceSize] = "3"
		p.Annotations[v1alpha1.AnnotationSliceRequiredTopology] = "nvlink"
	}
	createAll(t, e, trio)
	waitReason(t, e, "trio", 3, "group default/trio needs 1 slice of 3 pods × 4 GPUs inside one nvlink domain, all in one spine domain: slice 0 (3 pods) found no nvlink domain with room for it in network.topology.nvidia.com/spine=s; the roomiest left holds 2")
	g = s.gauges(t)
	if _, bound := groupNodes(t, e, "trio"); bound != 0 || g["held"]+g["reserved"] != 128 {
		t.Errorf("the waiting group has %d pods bound; %s (want the first group's 128 GPUs held, nothing more)", bound, fmtGauges(g))
	}
}

// waitReason waits until each of the size pods of group name says want in
// its PodScheduled condition.
func waitReason(t *testing.T, e *env, name string, size int, want string) {
	t.Helper()
	harness.Poll(t, time.Minute, "group "+name+"'s pods to say why they wait", func() (bool, string) {
		var msgs []string
		ok := true
		for _, p := range listPods(t, e) {
			if p.Annotations[v1alpha1.AnnotationGroup] == name {
				m := scheduledFalseMessage(&p)
				msgs = append(msgs, m)
				ok = ok && strings.Contains(m, want)
			}
		}
		return ok && len(msgs) == size, fmt.Sprintf("messages %q", msgs[:min(len(msgs), 2)])
	})
}

// TestSlicedGroupPreemptsInTheCliquesItTakes: three GB200 racks full of
// low-priority 4-GPU pods but for two free trays in rack 0 and four in
// rack 1. A high-priority group of 2 slices × 16 trays, each required in
// one clique, is bound with each slice in one rack of racks 0 and 1, the
// cliques where it evicts least: 14 + 12 pods evicted, only on the trays
// it takes, none in rack 2. Both modes.
func TestSlicedGroupPreemptsInTheCliquesItTakes(t *testing.T) {
	eachModeOn(t, func(t *testing.T) *env { return gb200Racks(t, 3) }, testSlicedGroupPreemptsInTheCliquesItTakes)
}

func testSlicedGroupPreemptsInTheCliquesItTakes(t *testing.T, e *env, s system) {
	priorityClasses(t, e)
	free := map[string]bool{"rack-0-03": true, "rack-0-10": true, "rack-1-02": true, "rack-1-07": true, "rack-1-12": true, "rack-1-17": true}
	var low []*corev1.Pod
	var lowNames []string
	nodeOf := map[string]string{}
	for _, n := range e.nodes {
		if free[n] {
			continue
		}
		p := withPriority(pinned("low-"+n, 4, n), "low")
		low = append(low, p)
		lowNames = append(lowNames, p.Name)
		nodeOf[p.Name] = n
	}
	createAll(t, e, low)
	harness.Poll(t, 2*time.Minute, "the low-priority pods bound", func() (bool, string) {
		g := s.gauges(t)
		return g["held"]+g["reserved"] == float64(4*len(low)), fmtGauges(g)
	})
	group := slicedGroupPods("llm")
	for _, p := range group {
		withPriority(p, "high")
	}
	createAll(t, e, group)
	harness.Poll(t, 3*time.Minute, "the sliced group bound whole", func() (bool, string) {
		nodes, bound := groupNodes(t, e, "llm")
		return bound == 32, fmt.Sprintf("%d of 32 bound on %v; %s", bound, nodes, s.tail())
	})
	racks := map[int]map[string]bool{}
	taken := map[string]bool{}
	for _, p := range listPods(t, e) {
		if p.Annotations[v1alpha1.AnnotationGroup] != "llm" {
			continue
		}
		var rank int
		fmt.Sscan(p.Annotations[v1alpha1.AnnotationRank], &rank)
		if racks[rank/16] == nil {
			racks[rank/16] = map[string]bool{}
		}
		racks[rank/16][p.Spec.NodeName[:len("rack-0")]] = true
		taken[p.Spec.NodeName] = true
	}
	if len(racks[0]) != 1 || len(racks[1]) != 1 || racks[0]["rack-2"] || racks[1]["rack-2"] {
		t.Errorf("slices by rack %v: want each slice in one of racks 0 and 1", racks)
	}
	evicted := evictedPerNode(t, e, lowNames, nodeOf)
	total := 0
	for n, k := range evicted {
		total += k
		if !taken[n] {
			t.Errorf("%d pods evicted on %s, which the group does not take", k, n)
		}
	}
	if total != 26 {
		t.Errorf("%d pods evicted, want 26 (14 in rack 0, 12 in rack 1): %v", total, evicted)
	}
	owner := map[string]string{}
	for _, p := range listPods(t, e) {
		if p.Spec.NodeName == "" {
			continue
		}
		for _, u := range harness.PodGPUs(t, &p, v1alpha1.AnnotationAssignedGPUs) {
			if o, dup := owner[u]; dup {
				t.Errorf("GPU %s issued to two live pods: %s and %s", u, o, p.Name)
			}
			owner[u] = p.Name
		}
	}
}

// TestSlicedGroupOnHGXLeaves: six leaves of eight HGX H100 servers under
// one spine, one server busy in each of the first two leaves. A group of
// 4 slices × 8 pods × 8 GPUs (by rank), slice level leaf, group level
// spine, binds with each slice on one whole free leaf. Both modes.
func TestSlicedGroupOnHGXLeaves(t *testing.T) {
	name := func(i int) string { return fmt.Sprintf("leaf-%d-%d", i/8, i%8) }
	eachModeOn(t, func(t *testing.T) *env {
		return newFabricEnv(t, "hgx-h100", 8, 48, name, func(i int) map[string]string {
			return map[string]string{leafLabel: fmt.Sprintf("l%d", i/8), "network.topology.nvidia.com/spine": "s", "kubernetes.io/hostname": name(i)}
		})
	}, testSlicedGroupOnHGXLeaves)
}

func testSlicedGroupOnHGXLeaves(t *testing.T, e *env, s system) {
	createAll(t, e, []*corev1.Pod{pinned("busy-0", 8, "leaf-0-0"), pinned("busy-1", 8, "leaf-1-0")})
	pods := groupPods("train", 32, 8, "spine")
	for i, p := range pods {
		p.Annotations[v1alpha1.AnnotationSliceSize] = "8"
		p.Annotations[v1alpha1.AnnotationSliceRequiredTopology] = "leaf"
		p.Annotations[v1alpha1.AnnotationRank] = fmt.Sprint(i)
	}
	createAll(t, e, pods)
	harness.Poll(t, 3*time.Minute, "group train bound", func() (bool, string) {
		nodes, bound := groupNodes(t, e, "train")
		return bound == 32, fmt.Sprintf("%d of 32 bound, on %v", bound, nodes)
	})
	leaves := map[int]map[string]bool{}
	for _, p := range listPods(t, e) {
		if p.Annotations[v1alpha1.AnnotationGroup] != "train" {
			continue
		}
		var rank int
		fmt.Sscan(p.Annotations[v1alpha1.AnnotationRank], &rank)
		if leaves[rank/8] == nil {
			leaves[rank/8] = map[string]bool{}
		}
		leaves[rank/8][p.Spec.NodeName[:len("leaf-0")]] = true
	}
	used := map[string]bool{}
	for sl, ls := range leaves {
		for l := range ls {
			if len(ls) != 1 || l == "leaf-0" || l == "leaf-1" || used[l] {
				t.Errorf("slice %d on leaves %v: want one free leaf of its own", sl, ls)
			}
			used[l] = true
		}
	}
}
