package placement

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// pinnedCore is four DGX A100 nodes, 0-1 in leaf a and 2-3 in leaf b,
// whose kubernetes.io/hostname is host-i.
func pinnedCore(t *testing.T) (*Core, []string) {
	t.Helper()
	return fabricCore(t, "dgx-a100", 4, func(i int) map[string]string {
		return map[string]string{"network.topology.nvidia.com/leaf": string(rune('a' + i/2)), corev1.LabelHostname: fmt.Sprintf("host-%d", i)}
	})
}

// pinnedPod is member i of group name (size members, 4 GPUs each,
// required in one leaf), pinned to host as Kueue's ungater pins it.
func pinnedPod(name string, i, size int, host string) *corev1.Pod {
	p := groupPod(name, i, size, 4, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: host}
	return p
}

// nodeOf is the node of host (pinnedCore's naming).
func nodeOf(host string) string { return "node-" + strings.TrimPrefix(host, "host-") }

func TestPinnedGroupIsPlacedOnItsPodsNodes(t *testing.T) {
	x, _ := pinnedCore(t)
	// Two pods of 4 GPUs would share one node if gputopo chose; pinned to
	// host-1 and host-0 they go there, each with 4 NVLink GPUs.
	hosts := []string{"host-1", "host-0"}
	pods := []*corev1.Pod{pinnedPod("kq", 0, 2, hosts[0]), pinnedPod("kq", 1, 2, hosts[1])}
	for _, p := range pods {
		x.ledger.UpsertPod(p)
	}
	for i, p := range pods {
		// kube-scheduler's NodeAffinity leaves the pinned node only.
		n, ans, pl := placeP(t, x, []string{nodeOf(hosts[i])}, p)
		if n != nodeOf(hosts[i]) {
			t.Fatalf("%s placed on %q (%s), want %s", p.Name, n, anyReason(ans), nodeOf(hosts[i]))
		}
		if len(pl.GPUIndices) != 4 || pl.Group != "ml/kq" || pl.Domain != "network.topology.nvidia.com/leaf=a" {
			t.Errorf("%s placement %+v, want 4 GPUs of group ml/kq in leaf a", p.Name, pl)
		}
	}
}

func TestPinnedGroupAcrossDomainsSaysSoAndHoldsNothing(t *testing.T) {
	x, names := pinnedCore(t)
	hosts := []string{"host-0", "host-2"} // leaves a and b
	pods := []*corev1.Pod{pinnedPod("split", 0, 2, hosts[0]), pinnedPod("split", 1, 2, hosts[1])}
	for _, p := range pods {
		x.ledger.UpsertPod(p)
	}
	for i, p := range pods {
		n, ans := place(t, x, []string{nodeOf(hosts[i])}, p)
		if n != "" {
			t.Fatalf("%s placed on %s across leaves", p.Name, n)
		}
		want := "group ml/split requires one leaf domain, but its pods' nodeSelectors (kubernetes.io/hostname, as a queue's topology-aware assignment writes them) pin them to nodes in 2: network.topology.nvidia.com/leaf=a, network.topology.nvidia.com/leaf=b"
		if len(ans.Unresolvable) != 1 || !strings.Contains(anyReason(ans), want) {
			t.Errorf("%s: answer %+v, want unresolvable with %q", p.Name, ans, want)
		}
	}
	if p := x.ledger.Report().GroupPlans(); len(p) != 0 {
		t.Errorf("plans held: %+v", p)
	}
	if c := x.Report().Counts(); c.Held+c.Reserved != 0 {
		t.Errorf("%d GPUs held, %d reserved; want none", c.Held, c.Reserved)
	}
	// Nothing is kept for it: a pod of 8 GPUs still takes node 0.
	if n, ans := place(t, x, names[:1], gpuPod("whole", 8, map[string]string{})); n != "node-0" {
		t.Errorf("8-GPU pod placed on %q (%s), want node-0", n, anyReason(ans))
	}
}

func TestGroupPinnedInPartIsPlannedAsBefore(t *testing.T) {
	x, names := pinnedCore(t)
	// One pod pinned, the other not: not a pinned group; the planner
	// chooses (both on one node of leaf a, as without pins), and the pinned
	// pod is refused elsewhere by kube-scheduler, not by gputopo's plan.
	a := pinnedPod("mixed", 0, 2, "host-3")
	b := groupPod("mixed", 1, 2, 4, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
	x.ledger.UpsertPod(a)
	x.ledger.UpsertPod(b)
	if n, ans := place(t, x, names, b); n == "" {
		t.Fatalf("unpinned member not placed: %s", anyReason(ans))
	}
}
