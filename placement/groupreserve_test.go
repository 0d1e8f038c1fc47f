package placement

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/gputopo/gputopo/placement/ledger"
)

// reserveCase is two HGX H100 nodes in one leaf with reservations on
// after 10 minutes: node-0 is taken whole by "big", node-1 half by
// "half"; a group of two 8-GPU pods (created at groupEpoch) waits for
// both nodes. now moves the core's clock.
func reserveCase(t *testing.T, percent int32) (x *Core, names []string, now *time.Time, pods []*corev1.Pod) {
	t.Helper()
	x, names = groupCore(t, "hgx-h100", 2, func(int) string { return "a" })
	clock := groupEpoch
	now = &clock
	x.setClock(func() time.Time { return *now })
	f := &x.Config().Fabric
	f.ReserveAfter = metav1.Duration{Duration: 10 * time.Minute}
	f.ReserveMaxPercent = &percent
	f.ReserveMaxDuration = metav1.Duration{Duration: 30 * time.Minute}
	big := gpuPod("big", 8, map[string]string{})
	if n, ans := place(t, x, names, big); n == "" {
		t.Fatalf("big not placed: %s", anyReason(ans))
	}
	half := gpuPod("half", 4, map[string]string{})
	if n, ans := place(t, x, names, half); n == "" {
		t.Fatalf("half not placed: %s", anyReason(ans))
	}
	pods = []*corev1.Pod{big, half, groupPod("g", 0, 2, 8, nil), groupPod("g", 1, 2, 8, nil)}
	x.ledger.UpsertPod(pods[3])
	return x, names, now, pods
}

func gone(x *Core, p *corev1.Pod) {
	x.ledger.DeletePod(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, p.UID)
}

func withPriority(p *corev1.Pod, prio int32) *corev1.Pod {
	p.Spec.Priority = &prio
	return p
}

func TestWaitingGroupKeepsTheGPUsItNeedsFromLaterPods(t *testing.T) {
	x, names, now, pods := reserveCase(t, 100)
	g0 := pods[2]
	// Before reserveAfter the group waits and keeps nothing: a 2-GPU pod
	// takes half of what is left on node-1.
	*now = groupEpoch.Add(time.Minute)
	if n, _ := place(t, x, names, g0); n != "" {
		t.Fatalf("group pod placed on %s while node-0 is taken", n)
	}
	if r := x.ledger.Report().GroupReservations(); len(r) != 0 {
		t.Fatalf("reservations before reserveAfter: %+v", r)
	}
	early := gpuPod("early", 2, map[string]string{})
	if n, ans := place(t, x, names, early); n != "node-1" {
		t.Fatalf("early: node %q, reason %q; want node-1", n, anyReason(ans))
	}
	// Past reserveAfter the group keeps both nodes' GPUs (the only place it
	// fits), holding none of them.
	*now = groupEpoch.Add(11 * time.Minute)
	if n, _ := place(t, x, names, g0); n != "" {
		t.Fatalf("group pod placed on %s while it does not fit", n)
	}
	res := x.ledger.Report().GroupReservations()
	if len(res) != 1 || res[0].Group != "ml/g" || res[0].GPUs != 16 || res[0].Free != 2 || len(res[0].Nodes) != 2 {
		t.Fatalf("reservations %+v; want ml/g keeping 16 GPUs on both nodes, 2 of them free", res)
	}
	if p := x.ledger.Report().GroupPlans(); len(p) != 0 {
		t.Fatalf("the waiting group holds a plan: %+v", p)
	}
	// A later pod of the same priority is refused the kept GPUs, in words
	// naming the group; it is not unresolvable (it may fit later).
	late := gpuPod("late", 1, map[string]string{})
	n, ans := place(t, x, names, late)
	if n != "" || len(ans.Unresolvable) != 0 || !strings.Contains(ans.Failed["node-1"], "kept for group ml/g (since 2026-01-01T00:11:00Z)") {
		t.Fatalf("late: node %q, answer %+v; want refused on node-1 as kept for group ml/g since 11m", n, ans)
	}
	// A pod of higher priority is not held back by a lower one's group.
	urgent := withPriority(gpuPod("urgent", 1, map[string]string{}), 1000)
	if n, ans := place(t, x, names, urgent); n != "node-1" {
		t.Fatalf("urgent: node %q, reason %q; want node-1", n, anyReason(ans))
	}
	// The pods on the kept GPUs finish: the group is planned and placed, and
	// its reservation ends.
	for _, p := range []*corev1.Pod{pods[0], pods[1], early, urgent} {
		gone(x, p)
	}
	for _, p := range pods[2:] {
		if n, ans := place(t, x, names, p); n == "" {
			t.Fatalf("%s not placed once the GPUs freed: %s", p.Name, anyReason(ans))
		}
	}
	if r := x.ledger.Report().GroupReservations(); len(r) != 0 {
		t.Errorf("reservation kept after the group was planned: %+v", r)
	}
}

func TestGroupReservationIsBounded(t *testing.T) {
	// At most 25% of the 16 GPUs may be kept: the group needs all 16, so
	// nothing is kept and later pods are placed as before.
	x, names, now, pods := reserveCase(t, 25)
	*now = groupEpoch.Add(11 * time.Minute)
	if n, _ := place(t, x, names, pods[2]); n != "" {
		t.Fatalf("group pod placed on %s", n)
	}
	if r := x.ledger.Report().GroupReservations(); len(r) != 0 {
		t.Fatalf("reservation over reserveMaxPercent: %+v", r)
	}
	if n, ans := place(t, x, names, gpuPod("late", 1, map[string]string{})); n != "node-1" {
		t.Fatalf("late: node %q, reason %q; want node-1", n, anyReason(ans))
	}

	// With room for it, reservations are made from reserveAfter (10m)
	// after the group's pods were created until reserveMaxDuration (30m)
	// later, then never again: the window is the pods' own, so a new
	// decider keeps it.
	x, names, now, pods = reserveCase(t, 100)
	*now = groupEpoch.Add(11 * time.Minute)
	place(t, x, names, pods[2])
	*now = groupEpoch.Add(39 * time.Minute)
	place(t, x, names, pods[2])
	if r := x.ledger.Report().GroupReservations(); len(r) != 1 || !r[0].Since.Equal(groupEpoch.Add(11*time.Minute)) || !r[0].Made.Equal(groupEpoch.Add(39*time.Minute)) {
		t.Fatalf("reservations %+v; want one, first made at 11m, made again at 39m", r)
	}
	// Another member tried within reserveRefresh leaves it as it is.
	*now = groupEpoch.Add(39*time.Minute + 5*time.Second)
	x.ledger.UpsertPod(pods[3])
	place(t, x, names, pods[3])
	if r := x.ledger.Report().GroupReservations(); len(r) != 1 || !r[0].Made.Equal(groupEpoch.Add(39*time.Minute)) {
		t.Fatalf("reservations %+v; want the one made at 39m, kept", r)
	}
	for _, at := range []time.Duration{40 * time.Minute, 50 * time.Minute, time.Hour} {
		*now = groupEpoch.Add(at)
		place(t, x, names, pods[2])
		if r := x.ledger.Report().GroupReservations(); len(r) != 0 {
			t.Fatalf("reservation kept or made at %s, past reserveAfter + reserveMaxDuration: %+v", at, r)
		}
	}
	if n, ans := place(t, x, names, gpuPod("late", 1, map[string]string{})); n != "node-1" {
		t.Fatalf("late after the reservation ended: node %q, reason %q", n, anyReason(ans))
	}

	// Off (reserveAfter 0): nothing is kept however long the group waits.
	x, names, now, pods = reserveCase(t, 100)
	x.Config().Fabric.ReserveAfter = metav1.Duration{}
	*now = groupEpoch.Add(5 * time.Hour)
	place(t, x, names, pods[2])
	if r := x.ledger.Report().GroupReservations(); len(r) != 0 {
		t.Fatalf("reservation with reserveAfter 0: %+v", r)
	}
}

// The group is gone: its reservation goes with it.
func TestGroupReservationEndsWithTheGroup(t *testing.T) {
	x, names, now, pods := reserveCase(t, 100)
	*now = groupEpoch.Add(11 * time.Minute)
	place(t, x, names, pods[2])
	if r := x.ledger.Report().GroupReservations(); len(r) != 1 {
		t.Fatalf("reservations %+v, want one", r)
	}
	var kept int
	x.ledger.Read(func(v ledger.View) {
		v.Nodes(func(n *ledger.Node) { kept += len(n.Reservations()) })
	})
	if kept != 2 {
		t.Fatalf("%d node reservations, want one on each node", kept)
	}
	gone(x, pods[2])
	gone(x, pods[3])
	kept = 0
	x.ledger.Read(func(v ledger.View) {
		v.Nodes(func(n *ledger.Node) { kept += len(n.Reservations()) })
	})
	if r := x.ledger.Report().GroupReservations(); len(r) != 0 || kept != 0 {
		t.Fatalf("reservations %+v and %d on nodes after the group's pods went", r, kept)
	}
}

// declared gives pod p an activeDeadlineSeconds of d and, when started is
// not zero, a start time.
func declared(p *corev1.Pod, d time.Duration, started time.Time) *corev1.Pod {
	secs := int64(d / time.Second)
	p.Spec.ActiveDeadlineSeconds = &secs
	if !started.IsZero() {
		p.Status.StartTime = &metav1.Time{Time: started}
	}
	return p
}

// With every pod declaring how long it runs, a reservation knows when its
// group can start, and pods that end before then still get its GPUs.
func TestReservationBackfillsPodsThatEndBeforeTheGroupCanStart(t *testing.T) {
	x, names := groupCore(t, "hgx-h100", 2, func(int) string { return "a" })
	now := groupEpoch
	x.setClock(func() time.Time { return now })
	f := &x.Config().Fabric
	f.ReserveAfter = metav1.Duration{Duration: 10 * time.Minute}
	f.ReserveMaxPercent = ptrTo[int32](100)
	f.ReserveMaxDuration = metav1.Duration{Duration: 2 * time.Hour}
	// node-0 is free at 1h, node-1's pod ends at 30m.
	for _, p := range []*corev1.Pod{
		declared(gpuPod("big", 8, map[string]string{}), time.Hour, groupEpoch),
		declared(gpuPod("half", 4, map[string]string{}), 30*time.Minute, groupEpoch),
	} {
		if n, ans := place(t, x, names, p); n == "" {
			t.Fatalf("%s not placed: %s", p.Name, anyReason(ans))
		}
	}
	g := []*corev1.Pod{groupPod("g", 0, 2, 8, nil), groupPod("g", 1, 2, 8, nil)}
	x.ledger.UpsertPod(g[1])
	now = groupEpoch.Add(11 * time.Minute)
	place(t, x, names, g[0])
	var start time.Time
	x.ledger.Read(func(v ledger.View) {
		for _, r := range v.Node("node-1").Reservations() {
			start = r.Start
		}
	})
	if !start.Equal(groupEpoch.Add(time.Hour)) {
		t.Fatalf("reservation starts at %s, want 1h (when big ends)", start.Sub(groupEpoch))
	}
	// Ends at 31m, before 1h: placed on the kept GPUs of node-1.
	if n, ans := place(t, x, names, declared(gpuPod("short", 1, map[string]string{}), 20*time.Minute, time.Time{})); n != "node-1" {
		t.Fatalf("short: node %q, reason %q; want node-1", n, anyReason(ans))
	}
	// Would run past 1h, or does not say: refused there.
	for _, p := range []*corev1.Pod{declared(gpuPod("long", 1, map[string]string{}), 2*time.Hour, time.Time{}), gpuPod("silent", 1, map[string]string{})} {
		if n, ans := place(t, x, names, p); n != "" || !strings.Contains(ans.Failed["node-1"], "kept for group ml/g") {
			t.Fatalf("%s: node %q, answer %+v; want refused on node-1 as kept for group ml/g", p.Name, n, ans)
		}
	}

	// A reservation that would run out before its GPUs are free is not
	// made: with reserveMaxDuration 30m, 11m + 30m is before 1h.
	x.ledger.EndKeep("ml/g")
	f.ReserveMaxDuration = metav1.Duration{Duration: 30 * time.Minute}
	place(t, x, names, g[0])
	if r := x.ledger.Report().GroupReservations(); len(r) != 0 {
		t.Fatalf("reservations %+v; none can drain within reserveMaxDuration", r)
	}
}

// podAPI serves bind's pod reads from pods.
type podAPI struct {
	noAPI
	pods map[types.NamespacedName]*corev1.Pod
}

func (a podAPI) Pod(_ context.Context, key types.NamespacedName, _ types.UID) (*corev1.Pod, error) {
	if p, ok := a.pods[key]; ok {
		return p, nil
	}
	return nil, errNoAPI
}

// A group that has waited reserveAfter gets its reservation without any
// of its pods being tried (in extender mode kube-scheduler never asks
// about a pod while its own filters refuse every node); over
// reserveMaxPercent it gets none, and its pod is told so in an Event, once.
func TestWaitingGroupIsKeptForWithoutBeingTried(t *testing.T) {
	for _, c := range []struct {
		percent int32
		kept    bool
	}{{100, true}, {25, false}} {
		x, _, now, pods := reserveCase(t, c.percent)
		x.ledger.UpsertPod(pods[2])
		api := podAPI{pods: map[types.NamespacedName]*corev1.Pod{}}
		for _, p := range pods[2:] {
			api.pods[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = p
		}
		x.api = api
		rec := record.NewFakeRecorder(10)
		x.recorder = rec
		kept := func() bool {
			var ok bool
			x.ledger.Read(func(v ledger.View) { _, ok = v.Reservation("ml/g") })
			return ok
		}
		x.Upkeep().KeepForWaitingGroups(context.Background())
		if kept() {
			t.Fatalf("%d%%: GPUs kept before reserveAfter", c.percent)
		}
		*now = groupEpoch.Add(11 * time.Minute)
		x.Upkeep().KeepForWaitingGroups(context.Background())
		if kept() != c.kept {
			t.Errorf("%d%%: reservation %v after reserveAfter, want %v", c.percent, kept(), c.kept)
		}
		*now = now.Add(time.Minute)
		x.Upkeep().KeepForWaitingGroups(context.Background())
		close(rec.Events)
		var events []string
		for e := range rec.Events {
			events = append(events, e)
		}
		switch {
		case c.kept && len(events) != 0:
			t.Errorf("%d%%: events %v, want none", c.percent, events)
		case !c.kept && (len(events) != 1 || !strings.Contains(events[0], ReasonGroupReservationRefused) || !strings.Contains(events[0], "fabric.reserveMaxPercent (25%)")):
			t.Errorf("%d%%: events %v, want one %s naming fabric.reserveMaxPercent", c.percent, events, ReasonGroupReservationRefused)
		}
	}
}
