package ledger_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology/machine"
)

// The fit index follows nodes that come, fill and go, across more nodes
// than one word of its sets holds, and reuses the places of nodes that
// left without mixing them up.
func TestFitIndexFollowsNodesThatComeFillAndGo(t *testing.T) {
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for i := range 150 {
		names = append(names, fmt.Sprintf("n-%03d", i))
	}
	l := newLedger(t, names...)
	fits := func(count int, linked bool) ledger.Fit {
		var got ledger.Fit
		l.Read(func(v ledger.View) { got = v.Fits(count, linked, -1, "") })
		return got
	}
	want := sets.New(names...)
	// Every third node holds a 6-GPU pod: 2 GPUs left there.
	for i := 0; i < len(names); i += 3 {
		uuids := []string{}
		for _, g := range f.Graph(names[i]).Status().GPUs[:6] {
			uuids = append(uuids, g.UUID)
		}
		l.UpsertPod(pod(fmt.Sprintf("p-%d", i), names[i], "", 6, uuids...))
		want.Delete(names[i])
	}
	// Every fifth node goes (its topology deleted, no Node object).
	for i := 1; i < len(names); i += 5 {
		l.DeleteTopology(names[i])
		want.Delete(names[i])
	}
	// New nodes take the places the gone ones left.
	for i := range 20 {
		name := fmt.Sprintf("new-%02d", i)
		st := f.Graph(name).Status()
		st.ObservedTime = metav1.NewTime(now)
		l.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: st})
		want.Insert(name)
	}
	for _, count := range []int{3, 8} {
		for _, linked := range []bool{false, true} {
			got := fits(count, linked)
			if !got.Nodes.Equal(want) {
				t.Errorf("Fits(%d, linked=%v): %d nodes, want %d; extra %v, missing %v", count, linked,
					got.Nodes.Len(), want.Len(), sets.List(got.Nodes.Difference(want)), sets.List(want.Difference(got.Nodes)))
			}
		}
	}
	all := fits(2, true)
	for i := 0; i < len(names); i += 3 {
		if i%5 != 1 && !all.Nodes.Has(names[i]) {
			t.Errorf("Fits(2, linked): %s (2 free GPUs) missing", names[i])
		}
	}
	// Fill every free node to 1 GPU: nothing fits 8, and the most any
	// node offers (2, on the nodes of 6-GPU pods) is named, first by name.
	for _, name := range sets.List(want) {
		var uuids []string
		for _, g := range f.Graph(name).Status().GPUs[:7] {
			uuids = append(uuids, g.UUID)
		}
		l.UpsertPod(pod("fill-"+name, name, "", 7, uuids...))
	}
	got := fits(8, false)
	if got.Nodes.Len() != 0 || got.Most != 2 || got.MostNode != "n-000" {
		t.Errorf("Fits(8) on full nodes = %d nodes, most %d on %q; want none, 2 on n-000", got.Nodes.Len(), got.Most, got.MostNode)
	}
}

// OnUsable is told when a node comes to offer GPUs it did not from its
// topology's or Node's side, and not when only its pods change.
func TestOnUsableFollowsWhatTheTopologyAndNodeOffer(t *testing.T) {
	clock := now
	l := ledger.New(ledger.Options{Clock: func() time.Time { return clock }, TopologyMaxAge: 15 * time.Minute})
	told := 0
	l.Report().OnUsable(func() { told++ })
	step := func(what string, want int, f func()) {
		t.Helper()
		told = 0
		f()
		if told != want {
			t.Errorf("%s: told %d times, want %d", what, told, want)
		}
	}
	step("a Node without GPUs' topology", 0, func() { l.UpsertNode(kubeletNode("a", 8, 8)) })
	step("its topology published", 1, func() { l.UpsertTopology(fixtureTopology(t, "dgx-a100", "a")) })
	step("the same topology again", 0, func() { l.UpsertTopology(fixtureTopology(t, "dgx-a100", "a")) })
	step("a pod bound there, then gone", 0, func() {
		p := pod("p", "a", "", 2)
		l.UpsertPod(p)
		l.DeletePod(key("p"), p.UID)
	})
	step("kubelet counting 4 GPUs (not trusted)", 0, func() { l.UpsertNode(kubeletNode("a", 4, 4)) })
	step("kubelet agreeing again", 1, func() { l.UpsertNode(kubeletNode("a", 8, 8)) })
	stale := fixtureTopology(t, "dgx-a100", "a")
	stale.Status.Stale, stale.Status.StaleReason = true, "NVML: timeout"
	step("the agent marking it stale", 0, func() { l.UpsertTopology(stale) })
	step("the agent reading it again", 1, func() { l.UpsertTopology(fixtureTopology(t, "dgx-a100", "a")) })
	step("another node joining with its topology", 1, func() { l.UpsertTopology(fixtureTopology(t, "dgx-a100", "b")) })
	// The agent is away 20 minutes (its topology is too old), then
	// publishes again.
	clock = now.Add(20 * time.Minute)
	step("the agent back after 20 minutes", 1, func() {
		o := fixtureTopology(t, "dgx-a100", "a")
		o.Status.ObservedTime = metav1.NewTime(clock)
		l.UpsertTopology(o)
	})
	step("its next refresh", 0, func() {
		o := fixtureTopology(t, "dgx-a100", "a")
		o.Status.ObservedTime = metav1.NewTime(clock.Add(time.Minute))
		l.UpsertTopology(o)
	})
	step("its topology deleted", 0, func() { l.DeleteTopology("b") })
	// A pending group member that a queue pins to a node by its
	// nodeSelector: told once, when the pin appears or changes.
	member := pod("m", "", "", 2)
	member.Annotations = map[string]string{v1alpha1.AnnotationGroup: "g", v1alpha1.AnnotationGroupSize: "2"}
	step("a group member created unpinned", 0, func() { l.UpsertPod(member) })
	member.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "a"}
	step("the member pinned", 1, func() { l.UpsertPod(member) })
	step("the same member again", 0, func() { l.UpsertPod(member) })
	alone := pod("s", "", "", 2)
	alone.Spec.NodeSelector = map[string]string{corev1.LabelHostname: "a"}
	step("a pinned pod of no group", 0, func() { l.UpsertPod(alone) })
}
