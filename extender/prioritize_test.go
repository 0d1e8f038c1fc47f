package extender

import (
	"context"
	"math"
	"strings"
	"testing"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement"

	"github.com/google/go-cmp/cmp"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// merits is each node's merit for the pod on the 0..10 scale (0 where it
// fails filter): the weighted terms before prioritize makes them relative
// to the best node.
func merits(t *testing.T, x *Extender, args *extenderv1.ExtenderArgs) map[string]int64 {
	t.Helper()
	pr, err := x.request(args)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, e := range x.core.Explain(context.Background(), pr, nodeNames(args)) {
		out[e.Node] = int64(math.Round(10 * e.Merit))
	}
	return out
}

func scores(t *testing.T, x *Extender, args *extenderv1.ExtenderArgs) map[string]int64 {
	t.Helper()
	list, err := x.Prioritize(context.Background(), args)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, h := range list {
		if h.Score < extenderv1.MinExtenderPriority || h.Score > extenderv1.MaxExtenderPriority {
			t.Errorf("score %d for %s outside 0..10", h.Score, h.Host)
		}
		out[h.Host] = h.Score
	}
	return out
}

func onlyWeight(u, a, h, f int32) *configv1alpha1.ExtenderConfiguration {
	return only(configv1alpha1.Weights{UtilizationBalance: &u, TaskAffinity: &a, ThermalPowerHeadroom: &h, Fragmentation: &f})
}

// only is a configuration with the given weights and every other weight 0.
func only(w configv1alpha1.Weights) *configv1alpha1.ExtenderConfiguration {
	for _, p := range []**int32{&w.UtilizationBalance, &w.TaskAffinity, &w.ThermalPowerHeadroom, &w.Fragmentation, &w.BandwidthFit, &w.CapabilityConservation, &w.IslandBestFit} {
		if *p == nil {
			*p = ptr[int32](0)
		}
	}
	c := &configv1alpha1.ExtenderConfiguration{Weights: w}
	configv1alpha1.SetExtenderDefaults(c)
	return c
}

func TestPrioritizeTerms(t *testing.T) {
	tests := []struct {
		name  string
		cfg   *configv1alpha1.ExtenderConfiguration
		setup func(t *testing.T, x *Extender)
		args  *extenderv1.ExtenderArgs
		want  map[string]int64
	}{{
		name: "utilization balance: the emptier node scores higher",
		cfg:  onlyWeight(1, 0, 0, 0),
		setup: func(t *testing.T, x *Extender) {
			holdOn(x, "h", "busy", 0, 1, 2, 3)
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(2).obj(), NodeNames: &[]string{"idle", "busy"}},
		// idle: 1 - 2/8 = 0.75 -> 8 (rounded); busy: 1 - 6/8 = 0.25 -> 3.
		want: map[string]int64{"idle": 8, "busy": 3},
	}, {
		name: "utilization balance reads telemetry of free GPUs",
		cfg:  onlyWeight(1, 0, 0, 0),
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "busy"), 50, 40, 100, 300))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(4).obj(), NodeNames: &[]string{"idle", "busy"}},
		// idle: 1 - 4/8 = 0.5 -> 5; busy: 1 - (4*0.5 + 4)/8 = 0.25 -> 3.
		want: map[string]int64{"idle": 5, "busy": 3},
	}, {
		name: "task affinity: same job on the node scores full, in the fabric clique half",
		cfg:  onlyWeight(0, 1, 0, 0),
		setup: func(t *testing.T, x *Extender) {
			for _, n := range []string{"t1", "t2", "t3"} {
				x.core.Feed().UpsertTopology(topo(t, "gb200-nvl72-tray", n))
			}
			x.core.Feed().UpsertPod(makePod("w0").gpus(1).job("train").node("t1").assigned(uuidsOn("t1", 0)...).obj())
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).job("train").obj(), NodeNames: &[]string{"t1", "t2", "idle"}},
		want: map[string]int64{"t1": 10, "t2": 5, "idle": 0},
	}, {
		name: "task affinity ignores other jobs and other namespaces",
		cfg:  onlyWeight(0, 1, 0, 0),
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertPod(makePod("w0").gpus(1).job("other").node("busy").assigned(uuidsOn("busy", 0)...).obj())
			p := makePod("w1").gpus(1).job("train").node("idle").assigned(uuidsOn("idle", 0)...).obj()
			p.Namespace = "team-b"
			x.core.Feed().UpsertPod(p)
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).job("train").obj(), NodeNames: &[]string{"idle", "busy"}},
		want: map[string]int64{"idle": 0, "busy": 0},
	}, {
		name: "thermal headroom: hot GPUs score lower, no telemetry is neutral",
		cfg:  onlyWeight(0, 0, 1, 0),
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "idle"), 0, 30, 50, 300))
			x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "busy"), 0, 80, 50, 300))
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "dark"))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &[]string{"idle", "busy", "dark"}},
		// idle: min(1, 1-50/300) = 0.83 -> 8; busy: (85-80)/55 = 0.09 -> 1.
		want: map[string]int64{"idle": 8, "busy": 1, "dark": 5},
	}, {
		name: "fragmentation: a placement that keeps a free NVLink quad scores higher",
		cfg:  onlyWeight(0, 0, 0, 1),
		setup: func(t *testing.T, x *Extender) {
			// busy: 0 and 7 held; a 2-GPU pod then cannot leave a quad.
			holdOn(x, "h", "busy", 0, 7)
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(2).obj(), NodeNames: &[]string{"idle", "busy"}},
		// idle: leaves 6 free with a quad intact: 4/min(6,4) = 1 -> 10;
		// busy: leaves 4 free whose largest island is at best 3: 3/4 -> 8.
		want: map[string]int64{"idle": 10, "busy": 8},
	}, {
		name: "nodes that would not pass filter score 0",
		setup: func(t *testing.T, x *Extender) {
			holdOn(x, "h", "busy", 0, 1, 2, 3, 4, 5, 6, 7)
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &[]string{"busy", "nowhere"}},
		want: map[string]int64{"busy": 0, "nowhere": 0},
	}, {
		name: "default weights combine the components",
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "idle"), 0, 30, 0, 300))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(8).obj(), NodeNames: &[]string{"idle"}},
		// utilization 0; headroom, fragmentation, island fit and
		// conservation 1 (nothing left, the only node); no job, so no
		// affinity; no bandwidth asked, so no bandwidth fit.
		want: map[string]int64{"idle": func() int64 {
			w, _ := configv1alpha1.WeightProfile(configv1alpha1.WeightsPlacement)
			u, h, f, c, i := float64(*w.UtilizationBalance), float64(*w.ThermalPowerHeadroom), float64(*w.Fragmentation), float64(*w.CapabilityConservation), float64(*w.IslandBestFit)
			return int64(math.Round(10 * (h + f + c + i) / (u + h + f + c + i)))
		}()},
	}, {
		name: "design profile combines the first four components",
		cfg:  profile(configv1alpha1.WeightsDesign),
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "idle"), 0, 30, 0, 300))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(8).obj(), NodeNames: &[]string{"idle"}},
		// utilization 0, headroom 1, fragmentation 1; no job, so no
		// affinity: 10 * (20 + 10) / (40 + 20 + 10) = 4.
		want: map[string]int64{"idle": 4},
	}, {
		name: "bandwidth fit: a model-parallel pod prefers the node with the best ring",
		cfg:  only(configv1alpha1.Weights{BandwidthFit: ptr[int32](1)}),
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertTopology(topo(t, "dgx-a100", "a100"))
			x.core.Feed().UpsertTopology(topo(t, "pcie-8x", "pcie"))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(4).req(`{"strategy":"highest_bandwidth"}`).obj(), NodeNames: &[]string{"a100", "idle", "pcie"}},
		// a100: 600 GB/s ring, the best -> 10; the dgx1-v100 quad's ring
		// has a single-link hop (50/600) and pcie-8x's best ring is PCIe:
		// both round to 1.
		want: map[string]int64{"a100": 10, "idle": 1, "pcie": 1},
	}, {
		name: "bandwidth fit does not count for a pod that does not ask for bandwidth",
		cfg:  only(configv1alpha1.Weights{BandwidthFit: ptr[int32](1), Fragmentation: ptr[int32](0), UtilizationBalance: ptr[int32](1)}),
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertTopology(topo(t, "dgx-a100", "a100"))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(4).obj(), NodeNames: &[]string{"a100", "idle"}},
		// Utilization alone: both 1 - 4/8 -> 5.
		want: map[string]int64{"a100": 5, "idle": 5},
	}, {
		name: "capability conservation: a pod that needs no bandwidth prefers the plain PCIe node",
		cfg:  only(configv1alpha1.Weights{CapabilityConservation: ptr[int32](1)}),
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertTopology(topo(t, "dgx-a100", "a100"))
			x.core.Feed().UpsertTopology(topo(t, "pcie-8x", "pcie"))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &[]string{"a100", "idle", "pcie"}},
		// Capability (peak pair bandwidth x largest NVLink clique):
		// pcie-8x the least -> 10, dgx-a100 the most -> 0, dgx1-v100 in
		// between on a log scale.
		want: map[string]int64{"a100": 0, "idle": conservationScore(t, "pcie-8x", "dgx-a100", "dgx1-v100"), "pcie": 10},
	}, {
		name: "island best fit: a small pod fills the partly used island",
		cfg:  only(configv1alpha1.Weights{IslandBestFit: ptr[int32](1)}),
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertTopology(topo(t, "pcie-8x-nvlink-pairs", "pairs"))
			x.core.Feed().UpsertTopology(topo(t, "pcie-8x-nvlink-pairs", "broken"))
			holdOn(x, "h", "broken", 0)
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &[]string{"pairs", "broken"}},
		// broken: GPU 1 completes the pair 0-1 (island fill 1) and fills 2
		// of 8 GPUs: (1 + 2/8)/2 -> 6; pairs: the pod breaks an intact
		// pair (1/2) and fills 1 of 8: (1/2 + 1/8)/2 -> 3.
		want: map[string]int64{"pairs": 3, "broken": 6},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, _ := newTestExtender(t, tc.cfg)
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "idle"))
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "busy"))
			if tc.setup != nil {
				tc.setup(t, x)
			}
			if diff := cmp.Diff(tc.want, merits(t, x, tc.args)); diff != "" {
				t.Errorf("merits on 0..10 (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPrioritizeScoresAreRelativeToTheBest checks the scale kube-scheduler
// sees: the best node 10, every other node one point lower per
// placement.PrioritizeStep of merit it lacks.
func TestPrioritizeScoresAreRelativeToTheBest(t *testing.T) {
	x, _ := newTestExtender(t, onlyWeight(1, 0, 0, 0))
	for _, n := range []string{"idle", "one", "two", "half"} {
		x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", n))
	}
	holdOn(x, "h1", "one", 7)
	holdOn(x, "h2", "two", 6, 7)
	holdOn(x, "h4", "half", 4, 5, 6, 7)
	args := &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &[]string{"idle", "one", "two", "half"}}
	// Merits (utilization alone): idle 7/8, one 6/8, two 5/8, half 3/8:
	// each held GPU costs 1/8 = 6.25 steps of 2%.
	step := func(held int) int64 { return max(10-int64(math.Round(float64(held)/8/placement.PrioritizeStep)), 0) }
	want := map[string]int64{"idle": 10, "one": step(1), "two": step(2), "half": step(4)}
	if diff := cmp.Diff(want, scores(t, x, args)); diff != "" {
		t.Errorf("scores (-want +got):\n%s", diff)
	}
	if want["one"] <= want["two"] || want["two"] < 0 {
		t.Fatalf("test premise: scores %v do not separate one and two held GPUs", want)
	}
}

func TestPrioritizeMalformedRequirementIsAnError(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	_, err := x.Prioritize(context.Background(), &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).req(`{"gpuMemoryMiB":-1}`).obj(), NodeNames: &[]string{"a"}})
	if err == nil || !strings.Contains(err.Error(), "gpuMemoryMiB") {
		t.Fatalf("err = %v, want one naming gpuMemoryMiB", err)
	}
}

func profile(name string) *configv1alpha1.ExtenderConfiguration {
	c := &configv1alpha1.ExtenderConfiguration{Weights: configv1alpha1.Weights{Profile: name}}
	configv1alpha1.SetExtenderDefaults(c)
	return c
}

// conservationScore is capability conservation's score on machine on,
// between the least and the most capable machines of the candidates.
func conservationScore(t *testing.T, least, most, on string) int64 {
	t.Helper()
	capOf := func(name string) float64 {
		f, err := machine.FixtureByName(name)
		if err != nil {
			t.Fatal(err)
		}
		g := f.Graph("n")
		return ledger.CapabilityOf(g, g.Metrics(topology.Mask{}, g.All()).LeftLargestIsland)
	}
	s := 1 - math.Log(capOf(on)/capOf(least))/math.Log(capOf(most)/capOf(least))
	if s <= 0 || s >= 1 {
		t.Fatalf("%s scores %.2f between %s and %s; the test needs a machine strictly between", on, s, least, most)
	}
	return int64(math.Round(10 * s))
}
