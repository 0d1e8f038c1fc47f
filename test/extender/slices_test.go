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
func gb200Env(t *testing.T) *env {
	return newFabricEnv(t, "gb200-nvl72-tray", 4, 36,
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

	createAll(t, e, slicedGroupPods("next"))
	want := "group default/next needs 2 slices of 16 pods × 4 GPUs, each inside one nvlink domain, all in one spine domain"
	harness.Poll(t, time.Minute, "the second group's pods to say why they wait", func() (bool, string) {
		var msgs []string
		ok := true
		for _, p := range listPods(t, e) {
			if p.Annotations[v1alpha1.AnnotationGroup] == "next" {
				m := scheduledFalseMessage(&p)
				msgs = append(msgs, m)
				ok = ok && strings.Contains(m, want) && strings.Contains(m, "found no nvlink domain")
			}
		}
		return ok && len(msgs) == 32, fmt.Sprintf("messages %q", msgs[:min(len(msgs), 2)])
	})
	g := s.gauges(t)
	if _, bound := groupNodes(t, e, "next"); bound != 0 || g["held"]+g["reserved"] != 12+128 {
		t.Errorf("the waiting group has %d pods bound; %s (want the busy pods' 12 GPUs and the first group's 128 held, nothing more)", bound, fmtGauges(g))
	}
}
