package placement

import (
	"context"
	"testing"
)

// Four empty HGX nodes: 0 and 1 in leaf a, 2 and 3 in leaf b. A first
// 8-GPU pod fills node 2; after it, single 1-GPU pods must go to leaf b
// (node 3), the fuller leaf, keeping leaf a whole for a group, although
// the node score rates nodes 0, 1 and 3 alike.
func TestPodOutsideGroupsGoesToTheFullerDomainAmongEqualNodes(t *testing.T) {
	x, names := groupCore(t, "hgx-h100", 4, func(i int) string {
		if i < 2 {
			return "a"
		}
		return "b"
	})
	if n, ans := place(t, x, names[2:3], gpuPod("whole", 8, map[string]string{})); n != "node-2" {
		t.Fatalf("whole on %q (%s), want node-2", n, anyReason(ans))
	}
	for _, name := range []string{"one", "two", "three"} {
		p := gpuPod(name, 1, map[string]string{})
		x.ledger.UpsertPod(p)
		pr := request(t, x, p)
		scores, _ := x.Score(context.Background(), pr, names, false, nil)
		// The first pod meets equal nodes 0, 1 and 3: packing decides.
		// Later ones find node-3 ahead by the node score already (it is
		// fuller), and packing has nothing to pass over.
		want := []int64{MaxScore - 1, MaxScore - 1, 0, MaxScore}
		packed := name == "one"
		if !packed {
			if scores[3] != MaxScore || scores[0] >= MaxScore-1 || scores[1] >= MaxScore-1 {
				t.Errorf("%s: scores %v, want node-3 at %d and nodes 0, 1 below %d", name, scores, MaxScore, MaxScore-1)
			}
		} else {
			for i := range want {
				if scores[i] != want[i] {
					t.Errorf("%s: scores %v, want %v", name, scores, want)
					break
				}
			}
		}
		// explain gives the same scores and says which nodes packing passed over.
		ex := x.Explain(context.Background(), pr, names)
		for i, e := range ex {
			if e.Passed && e.Score != scores[i] {
				t.Errorf("%s: explain scores %s %d, prioritize %d", name, e.Node, e.Score, scores[i])
			}
			if e.PackedOver != (packed && i < 2) {
				t.Errorf("%s: explain PackedOver on %s = %v", name, e.Node, e.PackedOver)
			}
		}
		if n, ans := place(t, x, names, p); n != "node-3" {
			t.Errorf("%s on %q (%s), want node-3", name, n, anyReason(ans))
		}
	}
}

// Without fabric labels nothing is passed over: the scores are the node
// score's alone.
func TestPodOutsideGroupsWithoutFabricLabelsIsScoredAsBefore(t *testing.T) {
	x, names := groupCore(t, "hgx-h100", 3, func(int) string { return "" })
	p := gpuPod("one", 1, map[string]string{})
	x.ledger.UpsertPod(p)
	pr := request(t, x, p)
	scores, _ := x.Score(context.Background(), pr, names, false, nil)
	for i, s := range scores {
		if s != MaxScore {
			t.Errorf("node-%d scores %d, want %d (equal empty nodes, no fabric)", i, s, MaxScore)
		}
	}
}
