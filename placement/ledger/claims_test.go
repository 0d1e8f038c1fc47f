package ledger_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"

	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// uuidsAt are node's GPU UUIDs at indices.
func uuidsAt(t *testing.T, l *ledger.Ledger, node string, indices ...int) []string {
	t.Helper()
	var out []string
	l.Read(func(v ledger.View) {
		gpus := v.Node(node).Graph().GPUs()
		for _, i := range indices {
			out = append(out, gpus[i].UUID)
		}
	})
	return out
}

func mismatches(l *ledger.Ledger) int {
	var n int
	l.Read(func(v ledger.View) { n = v.ClaimMismatches() })
	return n
}

// A claim allocated by another scheduler holds its GPUs for its pod; one
// reserved for no pod holds them for itself; a claim gone frees them.
func TestClaimAllocationsHoldTheirGPUs(t *testing.T) {
	l := newLedger(t, "a")
	l.UpsertClaim(ledger.ClaimAllocation{Claim: key("c"), UID: "claim-c", Pod: key("p"), PodUID: "uid-p", Node: "a", UUIDs: uuidsAt(t, l, "a", 0, 1)})
	l.UpsertClaim(ledger.ClaimAllocation{Claim: key("d"), UID: "claim-d", Node: "a", UUIDs: uuidsAt(t, l, "a", 5)})
	if got := free(l, "a"); got != topology.MaskOf(2, 3, 4, 6, 7) {
		t.Fatalf("free with claims on 0, 1 and 5: %v", got.Indices())
	}
	var holder types.UID
	l.Read(func(v ledger.View) {
		for _, h := range v.Holders(v.Node("a")) {
			if h.Pod == key("p") {
				holder = h.UID
			}
		}
	})
	if holder != "uid-p" {
		t.Errorf("GPUs 0 and 1 held by %q, want the claim's pod uid-p", holder)
	}
	// The pod, bound by another scheduler, asks no GPUs of the device
	// plugin's resource: seen bound, and seen deleted, it keeps what its
	// allocated claim holds.
	p := pod("p", "a", "", 0)
	p.Spec.Containers[0].Resources.Limits = nil
	l.UpsertPod(p)
	l.DeletePod(key("p"), "uid-p")
	if got := free(l, "a"); got != topology.MaskOf(2, 3, 4, 6, 7) {
		t.Fatalf("free after the claim's pod came and went: %v, want the claims' GPUs still held", got.Indices())
	}
	l.DeleteClaim("claim-c")
	l.DeleteClaim("claim-d")
	if got := free(l, "a"); got.Count() != 8 {
		t.Errorf("free after the claims are gone: %v, want all 8", got.Indices())
	}
	if n := mismatches(l); n != 0 {
		t.Errorf("%d mismatches, want 0", n)
	}
}

// gputopo's own reservation is confirmed by the claim that allocates the
// same GPUs; a claim that allocates others replaces them (the allocation
// is the truth) and counts a mismatch, and the GPUs gputopo had chosen
// are free again.
func TestClaimConfirmsOrOverridesGputoposChoice(t *testing.T) {
	l := newLedger(t, "a")
	c, err := l.Reserve("uid-p", key("p"), "a", firstFree(2))
	if err != nil {
		t.Fatal(err)
	}
	l.UpsertClaim(ledger.ClaimAllocation{Claim: key("p-gpus"), UID: "claim-p", Pod: key("p"), PodUID: "uid-p", Node: "a", UUIDs: []string{c.UUIDs[1], c.UUIDs[0]}})
	if got := l.Report().Counts(); got.Held != 2 || got.Reserved != 0 || mismatches(l) != 0 {
		t.Fatalf("after the claim confirms the reservation: %s, %d mismatches; want 2 held, none reserved, 0 mismatches", got, mismatches(l))
	}
	if _, err := l.Reserve("uid-q", key("q"), "a", firstFree(2)); err != nil {
		t.Fatal(err)
	}
	l.UpsertClaim(ledger.ClaimAllocation{Claim: key("q-gpus"), UID: "claim-q", Pod: key("q"), PodUID: "uid-q", Node: "a", UUIDs: uuidsAt(t, l, "a", 6, 7)})
	if n := mismatches(l); n != 1 {
		t.Errorf("%d mismatches after a claim named other GPUs, want 1", n)
	}
	if got := free(l, "a"); got != topology.MaskOf(2, 3, 4, 5) {
		t.Errorf("free: %v, want 2-5 (p's 0-1 and q's claim's 6-7 held, q's own choice 2-3 given back)", got.Indices())
	}
}

// A node a DRA driver serves is trusted without the device plugin's
// counts; it is not while its Node also advertises the device plugin's
// resource, or while its slices list a GPU its topology does not, and
// says which in its reason.
func TestDRANodesAreServedOneWay(t *testing.T) {
	l := newLedger(t, "a")
	l.UpsertNode(kubeletNode("a", -1, -1))
	uuids := uuidsAt(t, l, "a", 0, 1, 2, 3, 4, 5, 6, 7)
	l.SetDRADevices("a", "gpu.nvidia.com", uuids)
	if st, why := judged(l, "a"); st == ledger.TopoUntrusted {
		t.Fatalf("DRA node untrusted: %s", why)
	}
	var alloc int
	var driver string
	l.Read(func(v ledger.View) { alloc, driver = v.Node("a").Allocatable(), v.Node("a").DRA() })
	if alloc != -1 || driver != "gpu.nvidia.com" {
		t.Errorf("DRA node: allocatable %d, driver %q; want -1 (not the device plugin's count) and gpu.nvidia.com", alloc, driver)
	}
	l.UpsertNode(kubeletNode("a", 8, 8))
	if _, why := judged(l, "a"); !strings.Contains(why, "served both by the device plugin (capacity 8 nvidia.com/gpu) and by DRA driver gpu.nvidia.com") {
		t.Errorf("node served both ways: reason %q", why)
	}
	l.UpsertNode(kubeletNode("a", -1, -1))
	l.SetDRADevices("a", "gpu.nvidia.com", append(uuids, "GPU-not-here"))
	if _, why := judged(l, "a"); !strings.Contains(why, "ResourceSlice lists GPU GPU-not-here, which the node's NodeGPUTopology does not") {
		t.Errorf("slice with a foreign UUID: reason %q", why)
	}
	l.SetDRADevices("a", "gpu.nvidia.com", nil)
	l.Read(func(v ledger.View) { alloc, driver = v.Node("a").Allocatable(), v.Node("a").DRA() })
	if alloc != 0 || driver != "" {
		t.Errorf("node the driver left: allocatable %d, driver %q; want 0 (its Node advertises none) and none", alloc, driver)
	}
}

// With a claim reader, a pod that asks no GPUs of the resource but some
// through its ResourceClaims is a GPU pod to the ledger, pending or not:
// a group of such pods is seen whole.
func TestPodsAskingThroughClaimsAreGPUPods(t *testing.T) {
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(ledger.Options{Clock: func() time.Time { return now }, ClaimGPUs: func(p *corev1.Pod) int {
		if len(p.Spec.ResourceClaims) == 0 {
			return 0
		}
		return 4
	}})
	st := f.Graph("a").Status()
	st.ObservedTime = metav1.NewTime(now)
	l.UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Status: st})
	for _, name := range []string{"g-0", "g-1", "plain"} {
		p := pod(name, "", "", 0)
		p.Spec.Containers[0].Resources.Limits = nil
		if name != "plain" {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: new(name + "-gpus")}}
			p.Annotations = map[string]string{v1alpha1.AnnotationGroup: "g", v1alpha1.AnnotationGroupSize: "2"}
		}
		l.UpsertPod(p)
	}
	var pending int
	var known bool
	l.Read(func(v ledger.View) {
		g, ok := v.Group("ns/g")
		known, pending = ok, len(g.Pending)
	})
	if !known || pending != 2 {
		t.Errorf("group of claim pods: known %v with %d pending, want both", known, pending)
	}
}
