package extender

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/gputopo/gputopo/placement/ledger"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// TestTopologyNodesGaugeJudgesAsFilterDoes: gputopo_extender_topology_nodes
// counts each node once by the state filter would refuse it for, at the
// extender's clock and topologyMaxAge (15m by default).
func TestTopologyNodesGaugeJudgesAsFilterDoes(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	x.core.Feed().UpsertTopology(topo(t, "dgx-a100", "fresh"))
	old := topo(t, "dgx-a100", "old")
	old.Status.ObservedTime = metav1.NewTime(testNow.Add(-time.Hour))
	x.core.Feed().UpsertTopology(old)
	ahead := topo(t, "dgx-a100", "ahead")
	ahead.Status.ObservedTime = metav1.NewTime(testNow.Add(10 * time.Minute))
	x.core.Feed().UpsertTopology(ahead)
	stale := topo(t, "dgx-a100", "stale")
	stale.Status.Stale, stale.Status.StaleReason = true, "NVML: driver not loaded"
	x.core.Feed().UpsertTopology(stale)
	invalid := topo(t, "dgx-a100", "invalid")
	invalid.Status.GPUs = invalid.Status.GPUs[:0]
	x.core.Feed().UpsertTopology(invalid)
	x.core.Feed().UpsertNode(gpuNode("missing", 8))
	x.core.Feed().UpsertTopology(topo(t, "dgx-a100", "untrusted"))
	x.core.Feed().UpsertNode(kubeletNode("untrusted", 4, 4))

	want := map[string]int{ledger.TopologyFresh: 1, ledger.TopologyOld: 2, ledger.TopologyAgentStale: 1, ledger.TopologyInvalid: 1, ledger.TopologyMissing: 1, ledger.TopologyUntrusted: 1}
	if diff := cmp.Diff(want, x.core.Report().TopologyStates(testNow, 15*time.Minute)); diff != "" {
		t.Errorf("states (-want +got):\n%s", diff)
	}
	// Every node the gauge does not count as fresh fails filter.
	for _, n := range []string{"old", "ahead", "stale", "invalid", "missing", "untrusted"} {
		if v := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &[]string{n}}); v.NodeNames != nil && len(*v.NodeNames) > 0 {
			t.Errorf("node %s passes filter, but the gauge counts it as not fresh", n)
		}
	}
	// The refusals are counted by reason; the untrusted one by its own.
	if got := metricValue(t, x, "gputopo_extender_filter_results_total", "result", "failed", "reason", "untrusted_topology"); got != 1 {
		t.Errorf(`gputopo_extender_filter_results_total{result="failed",reason="untrusted_topology"} = %v, want 1`, got)
	}
	fams, err := x.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gauge := map[string]float64{}
	for _, f := range fams {
		if f.GetName() == "gputopo_extender_topology_nodes" {
			for _, m := range f.GetMetric() {
				gauge[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if diff := cmp.Diff(map[string]float64{ledger.TopologyFresh: 1, ledger.TopologyOld: 2, ledger.TopologyAgentStale: 1, ledger.TopologyInvalid: 1, ledger.TopologyMissing: 1, ledger.TopologyUntrusted: 1}, gauge); diff != "" {
		t.Errorf("gputopo_extender_topology_nodes (-want +got):\n%s", diff)
	}
	// With the age check off, age no longer counts.
	if got := x.core.Report().TopologyStates(testNow, 0)[ledger.TopologyOld]; got != 0 {
		t.Errorf("old nodes with the age check off = %d, want 0", got)
	}
}
