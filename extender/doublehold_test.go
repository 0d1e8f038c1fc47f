package extender

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/client-go/tools/record"

	"github.com/gputopo/gputopo/topology/machine"
)

// drainEvents returns the Events recorded so far.
func drainEvents(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func doubleHeldGauge(t *testing.T, x *Extender) float64 {
	t.Helper()
	mfs, err := x.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "gputopo_extender_ledger_double_held_gpus" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("gputopo_extender_ledger_double_held_gpus not gathered")
	return 0
}

func TestDoubleHeldGPUReportedOnBothPods(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	rec := record.NewFakeRecorder(16)
	rec.IncludeObject = true
	runtimeOf(x).setRecorder(rec)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	x.core.Feed().UpsertPod(makePod("p1").gpus(2).node("a").assigned(uuidsOn("a", 0, 1)...).obj())
	x.core.Feed().UpsertPod(drifted("p2", []int{2, 3}, []int{1, 2}))

	gpu := machine.FixtureUUID("a", 1)
	events := drainEvents(rec)
	if len(events) != 2 {
		t.Fatalf("events %q, want one on each pod", events)
	}
	for i, other := range []string{"default/p2", "default/p1"} {
		for _, want := range []string{"Warning GPUDoubleHeld GPU " + gpu + " on node a is also held by pod " + other + ";", "involvedObject{kind=Pod,apiVersion=v1}"} {
			if !strings.Contains(events[i], want) {
				t.Errorf("event %d %q lacks %q", i, events[i], want)
			}
		}
	}
	if got := metricValue(t, x, "gputopo_extender_ledger_double_held_detections_total"); got != 1 {
		t.Errorf("detections = %v, want 1", got)
	}
	if got := doubleHeldGauge(t, x); got != 1 {
		t.Errorf("double-held gauge = %v, want 1", got)
	}

	// Resyncs of the same state record nothing more.
	x.core.Feed().UpsertPod(drifted("p2", []int{2, 3}, []int{1, 2}))
	if ev := drainEvents(rec); len(ev) > 0 {
		t.Errorf("a resync recorded %q", ev)
	}

	x.core.Feed().DeletePod(keyOf(makePod("p2").obj()), "uid-p2")
	if got := doubleHeldGauge(t, x); got != 0 {
		t.Errorf("double-held gauge after p2 ended = %v, want 0", got)
	}
	if got := metricValue(t, x, "gputopo_extender_ledger_double_held_detections_total"); got != 1 {
		t.Errorf("detections after the conflict cleared = %v, want still 1 (a counter)", got)
	}
}

func TestDoubleHeldEventsOnlyFromTheLeader(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	rec := record.NewFakeRecorder(16)
	runtimeOf(x).setRecorder(rec)
	runtimeOf(x).stopLeading() // a standby, or a leader still rebuilding
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	x.core.Feed().UpsertPod(makePod("p1").gpus(1).node("a").assigned(uuidsOn("a", 5)...).obj())
	x.core.Feed().UpsertPod(drifted("p2", []int{6}, []int{5}))
	if ev := drainEvents(rec); len(ev) > 0 {
		t.Errorf("a replica that does not serve recorded %q", ev)
	}
	if got := metricValue(t, x, "gputopo_extender_ledger_double_held_detections_total"); got != 1 {
		t.Errorf("detections = %v, want 1: every replica counts", got)
	}
	// On becoming the leader it reports what it found meanwhile.
	runtimeOf(x).lead()
	var reasons []string
	for _, e := range drainEvents(rec) {
		reasons = append(reasons, strings.Join(strings.Fields(e)[:2], " "))
	}
	if diff := cmp.Diff([]string{"Warning GPUDoubleHeld", "Warning GPUDoubleHeld"}, reasons); diff != "" {
		t.Errorf("events after becoming the leader (-want +got):\n%s", diff)
	}
}
