package extender

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

func scores(t *testing.T, x *Extender, args *extenderv1.ExtenderArgs) map[string]int64 {
	t.Helper()
	list, err := x.Prioritize(args)
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

func onlyWeight(u, a, h, f int32) *Configuration {
	c := &Configuration{Weights: Weights{UtilizationBalance: &u, TaskAffinity: &a, ThermalPowerHeadroom: &h, Fragmentation: &f}}
	SetDefaults(c)
	return c
}

func TestPrioritize(t *testing.T) {
	tests := []struct {
		name  string
		cfg   *Configuration
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
			x.ledger.UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "busy"), 50, 40, 100, 300))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(4).obj(), NodeNames: &[]string{"idle", "busy"}},
		// idle: 1 - 4/8 = 0.5 -> 5; busy: 1 - (4*0.5 + 4)/8 = 0.25 -> 3.
		want: map[string]int64{"idle": 5, "busy": 3},
	}, {
		name: "task affinity: same job on the node scores full, in the fabric clique half",
		cfg:  onlyWeight(0, 1, 0, 0),
		setup: func(t *testing.T, x *Extender) {
			for _, n := range []string{"t1", "t2", "t3"} {
				x.ledger.UpsertTopology(topo(t, "gb200-nvl72-tray", n))
			}
			x.ledger.UpsertPod(makePod("w0").gpus(1).job("train").node("t1").assigned(uuidsOn("t1", 0)...).obj())
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).job("train").obj(), NodeNames: &[]string{"t1", "t2", "idle"}},
		want: map[string]int64{"t1": 10, "t2": 5, "idle": 0},
	}, {
		name: "task affinity ignores other jobs and other namespaces",
		cfg:  onlyWeight(0, 1, 0, 0),
		setup: func(t *testing.T, x *Extender) {
			x.ledger.UpsertPod(makePod("w0").gpus(1).job("other").node("busy").assigned(uuidsOn("busy", 0)...).obj())
			p := makePod("w1").gpus(1).job("train").node("idle").assigned(uuidsOn("idle", 0)...).obj()
			p.Namespace = "team-b"
			x.ledger.UpsertPod(p)
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).job("train").obj(), NodeNames: &[]string{"idle", "busy"}},
		want: map[string]int64{"idle": 0, "busy": 0},
	}, {
		name: "thermal headroom: hot GPUs score lower, no telemetry is neutral",
		cfg:  onlyWeight(0, 0, 1, 0),
		setup: func(t *testing.T, x *Extender) {
			x.ledger.UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "idle"), 0, 30, 50, 300))
			x.ledger.UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "busy"), 0, 80, 50, 300))
			x.ledger.UpsertTopology(topo(t, "dgx1-v100", "dark"))
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
			x.ledger.UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "idle"), 0, 30, 0, 300))
		},
		args: &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(8).obj(), NodeNames: &[]string{"idle"}},
		// utilization 0, affinity 0, headroom 1, fragmentation 1 (nothing
		// left): 10 * (20 + 10) / 100 = 3.
		want: map[string]int64{"idle": 3},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, _ := newTestExtender(t, tc.cfg)
			x.ledger.UpsertTopology(topo(t, "dgx1-v100", "idle"))
			x.ledger.UpsertTopology(topo(t, "dgx1-v100", "busy"))
			if tc.setup != nil {
				tc.setup(t, x)
			}
			if diff := cmp.Diff(tc.want, scores(t, x, tc.args)); diff != "" {
				t.Errorf("scores (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPrioritizeMalformedRequirementIsAnError(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	_, err := x.Prioritize(&extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).req(`{"gpuMemoryMiB":-1}`).obj(), NodeNames: &[]string{"a"}})
	if err == nil || !strings.Contains(err.Error(), "gpuMemoryMiB") {
		t.Fatalf("err = %v, want one naming gpuMemoryMiB", err)
	}
}
