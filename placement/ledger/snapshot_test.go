package ledger_test

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// nodeSummary is everything a decision reads of a node, as one string:
// two summaries differ exactly when a decision could.
func nodeSummary(v ledger.View, n *ledger.Node) string {
	if n == nil {
		return "<none>"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s size=%d free=%s used=%d unknown=%d alloc=%d cap=%d distrust=%q utilFree=%d topoErr=%q stale=%q observed=%s clique=%q",
		n.Name(), n.Size(), n.Free(), n.UsedCount(), n.UnknownHeld(), n.Allocatable(), n.Capacity(), n.UntrustedReason(),
		n.UtilFree(), n.TopologyError(), n.StaleReason(), n.Observed().UTC().Format(time.RFC3339), n.Clique())
	fmt.Fprintf(&b, " tel=%v util=%v domain0=%q", n.Telemetry(0), n.Utilization(0), n.Domain(0))
	for _, r := range n.Reservations() {
		fmt.Fprintf(&b, " keep[%s %d %s]", r.Group, r.Priority, r.GPUs)
	}
	for _, h := range v.Holders(n) {
		fmt.Fprintf(&b, " holder[%s reserved=%v %v +%d]", h.UID, h.Reserved, h.UUIDs, h.Unknown)
	}
	return b.String()
}

// summaries are every node's summary as v sees it, by name.
func summaries(v ledger.View, names []string) map[string]string {
	out := map[string]string{}
	for _, name := range names {
		out[name] = nodeSummary(v, v.Node(name))
	}
	return out
}

func liveSummaries(l *ledger.Ledger, names []string) (out map[string]string) {
	l.Read(func(v ledger.View) { out = summaries(v, names) })
	return out
}

func snapSummaries(s *ledger.Snapshot, names []string) (out map[string]string) {
	s.Read(func(v ledger.View) { out = summaries(v, names) })
	return out
}

func diff(a, b map[string]string) string {
	var out []string
	for k := range a {
		if a[k] != b[k] {
			out = append(out, fmt.Sprintf("%s:\n  %s\n  %s", k, a[k], b[k]))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, fmt.Sprintf("%s: only in the second: %s", k, b[k]))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestSnapshotSeesTheLedgerAsItWasAndEveryChangeReachesTheNext drives
// every kind of change the ledger takes (topologies, Nodes, pods, binds
// and their outcomes, groups' plans and what is kept for them,
// telemetry, deletes) and, around each: a snapshot taken before it still
// sees every node as it was, and one taken after sees every node as the
// live ledger does. A change path that does not mark its node fails the
// second check; a frozen copy that shares state with the live node fails
// the first.
func TestSnapshotSeesTheLedgerAsItWasAndEveryChangeReachesTheNext(t *testing.T) {
	clock := now
	l := ledger.New(ledger.Options{Clock: func() time.Time { return clock }, ExternalTelemetryMaxAge: time.Minute,
		Fabric: [][]string{{"rack"}}})
	names := []string{"a", "b", "c", "gone"}
	uuid := func(node string, i int) (u string) {
		l.Read(func(v ledger.View) { u = v.Node(node).Graph().GPUs()[i].UUID })
		return u
	}
	steps := []struct {
		what   string
		change func()
	}{
		{"topologies", func() {
			for _, n := range names {
				l.UpsertTopology(withTel(topo(t, "dgx-a100", n), 10))
			}
			l.TopologiesListed()
		}},
		{"Nodes with labels", func() {
			for _, n := range names[:3] {
				l.UpsertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"rack": "r1"}},
					Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(8, resource.DecimalSI)}, Capacity: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(8, resource.DecimalSI)}}})
			}
		}},
		{"a bound pod", func() { l.UpsertPod(pod("p1", "a", "job1", 2, uuid("a", 0), uuid("a", 1))) }},
		{"a reservation", func() {
			if _, err := l.Reserve("uid-r1", key("r1"), "b", firstFree(4)); err != nil {
				t.Fatal(err)
			}
		}},
		{"its Binding confirmed", func() { l.Confirm("uid-r1", "b", nil) }},
		{"a group's pods", func() {
			for _, name := range []string{"g-0", "g-1"} {
				p := pod(name, "", "", 8)
				p.Status.Phase = corev1.PodPending
				p.Annotations = map[string]string{v1alpha1.AnnotationGroup: "g", v1alpha1.AnnotationGroupSize: "2"}
				l.UpsertPod(p)
			}
		}},
		{"GPUs kept for the group", func() {
			if !l.KeepForGroup("ns/g", 0, "rack=r1", "rack", clock, map[string]topology.Mask{"c": topology.MaskOf(0, 1, 2, 3)}) {
				t.Fatal("the group's GPUs were not kept")
			}
		}},
		{"telemetry from the node agent", func() { l.UpsertTopology(withTel(topo(t, "dgx-a100", "c"), 90)) }},
		{"external telemetry", func() {
			samples := map[string]ledger.ExternalSample{}
			for i := range 8 {
				samples[uuid("a", i)] = ledger.ExternalSample{UtilizationPercent: 55, TemperatureC: 60, PowerWatts: 200, PowerLimitWatts: 400, Time: clock}
			}
			l.SetExternalTelemetry(ledger.ExternalTelemetry{"a": samples})
		}},
		{"external telemetry ages out", func() {
			clock = clock.Add(2 * time.Minute)
			l.RefreshExternalTelemetry()
		}},
		{"the keep ends", func() { l.EndKeep("ns/g") }},
		{"the pod finishes", func() { l.DeletePod(key("p1"), "uid-p1") }},
		{"a reservation released", func() { l.Release("uid-r1") }},
		{"a topology deleted", func() { l.DeleteTopology("gone") }},
		{"a Node relabelled", func() {
			l.UpsertNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"rack": "r2"}}})
		}},
	}
	prev := l.Snapshot("", "")
	for _, st := range steps {
		before := snapSummaries(prev, names)
		st.change()
		if d := diff(before, snapSummaries(prev, names)); d != "" {
			t.Errorf("after %s, the snapshot taken before it changed:\n%s", st.what, d)
		}
		next := l.Snapshot("", "")
		if d := diff(liveSummaries(l, names), snapSummaries(next, names)); d != "" {
			t.Errorf("after %s, a new snapshot differs from the live ledger:\n%s", st.what, d)
		}
		prev = next
	}
}

// TestSnapshotKeepsTheCyclesJobAndReservation: the job's placement and
// the pod's own reservation are as they were when the snapshot was
// taken.
func TestSnapshotKeepsTheCyclesJobAndReservation(t *testing.T) {
	l := newLedger(t, "a", "b")
	l.UpsertPod(pod("w0", "a", "job1", 2, firstUUID(t, l, "a")))
	if _, err := l.Reserve("uid-me", key("me"), "b", firstFree(8)); err != nil {
		t.Fatal(err)
	}
	s := l.Snapshot("ns/job1", "uid-me")
	l.UpsertPod(pod("w1", "b", "job1", 1, firstUUID(t, l, "b")))
	l.Release("uid-me")
	s.Read(func(v ledger.View) {
		aff := v.Affinity("ns/job1")
		if aff.Of(v.Node("a")) != 1 || aff.Of(v.Node("b")) != 0 {
			t.Errorf("job affinity a=%v b=%v, want the job on a only, as when the snapshot was taken", aff.Of(v.Node("a")), aff.Of(v.Node("b")))
		}
		if got := v.NodeFor("b", "uid-me").Free().Count(); got != 8 {
			t.Errorf("b as the pod sees it has %d free, want its own 8 reserved GPUs counted free", got)
		}
		if got := v.Node("b").Free().Count(); got != 0 {
			t.Errorf("b has %d free in the snapshot, want 0 (the reservation holds all 8)", got)
		}
	})
}

// withTel gives every GPU of o the compute utilization util, read now.
func withTel(o *v1alpha1.NodeGPUTopology, util int32) *v1alpha1.NodeGPUTopology {
	o.Status.Telemetry = nil
	for i := range o.Status.GPUs {
		o.Status.Telemetry = append(o.Status.Telemetry, v1alpha1.Telemetry{Index: i, UtilizationPercent: util, TemperatureC: 50, PowerWatts: 100, PowerLimitWatts: 400})
	}
	o.Status.TelemetryTime = metav1.NewTime(now)
	return o
}

// TestSnapshotsTakenAndReadWhileTheLedgerChanges takes and reads
// snapshots from several goroutines while pods come and go and a node's
// topology is deleted and published again (run under -race in make
// test-unit): every read of a snapshot sees one state per node, the same
// on every read.
func TestSnapshotsTakenAndReadWhileTheLedgerChanges(t *testing.T) {
	names := []string{"a", "b", "c"}
	l := newLedger(t, names...)
	uuids := map[string][]string{}
	l.Read(func(v ledger.View) {
		for _, n := range names {
			for _, g := range v.Node(n).Graph().GPUs() {
				uuids[n] = append(uuids[n], g.UUID)
			}
		}
	})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			n := names[i%len(names)]
			name := fmt.Sprintf("p%d", i%5)
			l.UpsertPod(pod(name, n, "job", 2, uuids[n][2*(i%4)], uuids[n][2*(i%4)+1]))
			if i%3 == 0 {
				l.DeletePod(key(name), types.UID("uid-"+name))
			}
			if i%50 == 0 {
				l.DeleteTopology("c")
				l.UpsertTopology(topo(t, "dgx-a100", "c"))
			}
		}
	})
	// A snapshot serves its reads for as long as fewer than
	// KeepSnapshots later ones were taken (the documented retention); a
	// reader descheduled for longer than that (it happens under -race on
	// a loaded machine) is counted, not judged, and most reads must be
	// judged.
	var judged, outlived atomic.Int64
	for range 4 {
		wg.Go(func() {
			for range 200 {
				s := l.Snapshot("ns/job", "")
				first := snapSummaries(s, names)
				var differ []string
				for _, n := range names {
					s.ReadNode(n, func(v ledger.View) {
						if got := nodeSummary(v, v.Node(n)); got != first[n] {
							differ = append(differ, fmt.Sprintf("one snapshot read %s twice: %q, then %q", n, first[n], got))
						}
					})
				}
				if ledger.SnapshotsSince(s) >= ledger.KeepSnapshots {
					outlived.Add(1)
					continue
				}
				judged.Add(1)
				for _, d := range differ {
					t.Error(d)
				}
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	if judged.Load() < 400 {
		t.Errorf("only %d of 800 snapshots were read within the retention of %d later snapshots (%d outlived it): the test judged too little", judged.Load(), ledger.KeepSnapshots, outlived.Load())
	}
}
