package extender

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/google/go-cmp/cmp"
	"github.com/gputopo/gputopo/placement"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// TestSharedAnswersMatchPerNode: a request over many nodes shares answers
// between nodes of one topology and free GPUs (the evaluator's cache); it
// must decide exactly as one request per node, where nothing is shared.
// The cluster has more distinct (topology, free GPUs) pairs than the
// cache has slots, nodes without or with old telemetry, GPUs held by pods
// whose GPUs are not recorded, and a stale node.
func TestSharedAnswersMatchPerNode(t *testing.T) {
	// The cross-node terms compare a node with the others on purpose;
	// with them off, a node's score must not depend on its company.
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.Weights.BandwidthFit, cfg.Weights.CapabilityConservation = ptr[int32](0), ptr[int32](0)
	x, _ := newTestExtender(t, cfg)
	fixtures := []string{"dgx1-v100", "dgx-a100", "hgx-h100"}
	var names []string
	for i := range 240 {
		name := fmt.Sprintf("gpu-node-%03d", i)
		names = append(names, name)
		o := topo(t, fixtures[i%len(fixtures)], name)
		switch i % 5 {
		case 0: // no telemetry
		case 1:
			o = withTelemetry(o, int32(i%100), 30+int32(i%70), int32(50+i%350), 400)
			o.Status.TelemetryTime.Time = testNow.Add(-time.Hour) // too old to steer by
		default:
			o = withTelemetry(o, int32(i%100), 30+int32(i%70), int32(50+i%350), 400)
		}
		if i%37 == 0 {
			o.Status.Stale, o.Status.StaleReason = true, "NVML stopped answering"
		}
		x.core.Feed().UpsertTopology(o)
		x.core.Feed().UpsertNode(gpuNode(name, 8))
		// Held GPU pairs vary with i: 28 pairs × 3 topologies.
		if a, b := i%8, (i/8)%8; a != b {
			holdOn(x, "held-"+name, name, a, b)
		}
		if i%11 == 0 {
			x.core.Feed().UpsertPod(makePod("unrecorded-" + name).gpus(3).node(name).obj())
		}
	}
	x.core.Feed().UpsertPod(makePod("peer").gpus(1).job("train").node("gpu-node-004").assigned().obj())
	names = append(names, "no-such-node")

	pods := map[string]*podBuilder{
		"model parallel":       makePod("p").gpus(4).req(modelParallel).job("train"),
		"pair, no requirement": makePod("p").gpus(2),
		"single numa_local":    makePod("p").gpus(1).req(`{"strategy":"numa_local"}`),
		"balanced utilization": makePod("p").gpus(3).req(`{"strategy":"balanced_utilization"}`),
		"min bandwidth":        makePod("p").gpus(2).req(`{"minPairBandwidthGBps":100}`),
	}
	for name, pb := range pods {
		t.Run(name, func(t *testing.T) {
			pod := pb.obj()
			all := append([]string(nil), names...)
			gotFilter := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &all})
			gotScores, err := x.Prioritize(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &all})
			if err != nil {
				t.Fatal(err)
			}
			wantFilter := &extenderv1.ExtenderFilterResult{NodeNames: &[]string{}}
			var wantScores extenderv1.HostPriorityList
			var merits []float64
			for _, n := range names {
				one := []string{n}
				r := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &one})
				*wantFilter.NodeNames = append(*wantFilter.NodeNames, *r.NodeNames...)
				for k, v := range r.FailedNodes {
					if wantFilter.FailedNodes == nil {
						wantFilter.FailedNodes = extenderv1.FailedNodesMap{}
					}
					wantFilter.FailedNodes[k] = v
				}
				for k, v := range r.FailedAndUnresolvableNodes {
					if wantFilter.FailedAndUnresolvableNodes == nil {
						wantFilter.FailedAndUnresolvableNodes = extenderv1.FailedNodesMap{}
					}
					wantFilter.FailedAndUnresolvableNodes[k] = v
				}
				// Each node's merit from an evaluator of its own: no answer
				// shared with another node.
				pr, err := placement.ParseRequest(pod, x.cfg.GPUResource(), x.core.Now())
				if err != nil {
					t.Fatal(err)
				}
				merit := -1.0
				if ex := x.core.Explain(context.Background(), pr, []string{n}); ex[0].Passed {
					merit = ex[0].Merit
				}
				merits = append(merits, merit)
			}
			best := slices.Max(merits)
			for i, n := range names {
				hp := extenderv1.HostPriority{Host: n}
				if merits[i] >= 0 {
					hp.Score = min(max(10-int64(math.Round((best-merits[i])/placement.PrioritizeStep)), 0), 10)
				}
				wantScores = append(wantScores, hp)
			}
			if diff := cmp.Diff(wantFilter, gotFilter); diff != "" {
				t.Errorf("filter over all nodes differs from per-node filter (-per node +all):\n%s", diff)
			}
			if diff := cmp.Diff(wantScores, gotScores); diff != "" {
				t.Errorf("prioritize over all nodes differs from per-node prioritize (-per node +all):\n%s", diff)
			}
			// The cluster exercises what it claims to.
			if len(*gotFilter.NodeNames) == 0 || len(gotFilter.FailedNodes) == 0 {
				t.Errorf("passed %d, failed %d nodes: the cluster does not exercise both", len(*gotFilter.NodeNames), len(gotFilter.FailedNodes))
			}
			distinct := map[int64]bool{}
			for _, s := range gotScores {
				distinct[s.Score] = true
			}
			// Scores are relative to the request's best node (10), so two
			// levels already show discrimination among passing nodes.
			if len(distinct) < 2 {
				t.Errorf("only %d distinct scores: the cluster does not discriminate", len(distinct))
			}
		})
	}
}
