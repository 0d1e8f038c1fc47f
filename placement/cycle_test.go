package placement

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// TestCycleFilterNodeFromParallelGoroutines asks one cycle about every node
// from 16 goroutines at once, as the framework's parallel Filter does
// (run under -race in make test-unit): each answer is the one Filter gives
// for the same node in one pass, and Score afterwards is Score's.
func TestCycleFilterNodeFromParallelGoroutines(t *testing.T) {
	x, names := mixedCore(t, []string{"dgx1-v100", "dgx-a100", "hgx-h100"}, 300, func(int) int { return -1 }, func(int) bool { return true })
	rng := rand.New(rand.NewPCG(3, 14))
	for i := range 200 {
		place(t, x, names, gpuPod(fmt.Sprintf("load-%d", i), 1+rng.IntN(4), reqAnn("")))
	}
	ctx := context.Background()
	pr := request(t, x, gpuPod("probe", 4, reqAnn(`{"requireNVLink":true,"strategy":"highest_bandwidth"}`)))
	want, err := x.Filter(ctx, pr, names)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		c := x.newCycle(ctx, pr)
		type answer struct {
			passed, unresolvable bool
			reason               string
		}
		got := make([]answer, len(names))
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				// Every goroutine walks all nodes, from its own start, so
				// that they race on the same memo entries.
				for k := range names {
					i := (k + w*len(names)/16) % len(names)
					p, u, r := c.FilterNode(names[i])
					if w == 0 {
						got[i] = answer{p, u, r}
					}
				}
			})
		}
		wg.Wait()
		var passed []string
		for i, name := range names {
			a := got[i]
			switch {
			case a.passed:
				passed = append(passed, name)
			case a.unresolvable && want.Unresolvable[name] != a.reason,
				!a.unresolvable && want.Failed[name] != a.reason:
				t.Fatalf("round %d, node %s: cycle says %+v; Filter says failed %q, unresolvable %q", round, name, a, want.Failed[name], want.Unresolvable[name])
			}
		}
		if len(passed) != len(want.Passed) || len(passed) == 0 || len(passed) == len(names) {
			t.Fatalf("round %d: cycle passed %d nodes, Filter %d, of %d", round, len(passed), len(want.Passed), len(names))
		}
		scores := c.Score(passed)
		direct, _ := x.Score(ctx, pr, passed, false, nil)
		for i, name := range passed {
			if scores[i] != direct[i] {
				t.Fatalf("round %d, node %s: cycle score %d, Score %d", round, name, scores[i], direct[i])
			}
		}
	}
}

// TestACycleDecidesOnOneSnapshot: every answer of one plugin cycle comes
// from the ledger as it was when the cycle began. A pod bound on the
// node mid-cycle is not seen by the cycle's filter or score (it is by
// the next cycle's), and the commit, which decides on the live ledger,
// refuses the GPUs that are gone.
func TestACycleDecidesOnOneSnapshot(t *testing.T) {
	x, _, names := bindCore(t, 2)
	ctx := context.Background()
	probe := bindPod("probe", 8, nil)
	x.ledger.UpsertPod(probe)
	plan := x.PreFilter(ctx, PreFilterInput{Pod: probe, Nodes: len(names)})
	if plan.Cycle == nil || plan.Refusal != "" {
		t.Fatalf("PreFilter: %+v, want a cycle", plan)
	}
	c := plan.Cycle
	if ok, _, why := c.FilterNode(names[0]); !ok {
		t.Fatalf("%s fails before anything changed: %s", names[0], why)
	}
	scores := c.Score(names)

	// Mid-cycle, another pod is bound to two GPUs of the first node.
	other := bindPod("other", 2, map[string]string{})
	other.Spec.NodeName = names[0]
	other.Status.Phase = corev1.PodRunning
	var uuids []string
	x.ledger.Read(func(v ledger.View) {
		for _, g := range v.Node(names[0]).Graph().GPUs()[:2] {
			uuids = append(uuids, g.UUID)
		}
	})
	other.Annotations[v1alpha1.AnnotationAssignedGPUs] = v1alpha1.FormatGPUList(uuids)
	x.ledger.UpsertPod(other)

	if ok, _, why := c.FilterNode(names[0]); !ok {
		t.Errorf("mid-cycle, the cycle's filter sees the change: %s fails with %q", names[0], why)
	}
	if got := c.Score(names); !slices.Equal(got, scores) {
		t.Errorf("mid-cycle, the cycle's score changed: %v, was %v", got, scores)
	}
	if res := x.Reserve(ctx, c.Request(), names[0]); res.Err == nil {
		t.Errorf("the commit took %v on %s, whose GPUs 0 and 1 went mid-cycle; want a refusal", res.UUIDs, names[0])
	}
	next := x.PreFilter(ctx, PreFilterInput{Pod: probe, Nodes: len(names)})
	if next.Cycle == nil {
		t.Fatalf("the next PreFilter: %+v, want a cycle", next)
	}
	if ok, _, _ := next.Cycle.FilterNode(names[0]); ok {
		t.Errorf("the next cycle still sees 8 free GPUs on %s", names[0])
	}
	if ok, _, why := next.Cycle.FilterNode(names[1]); !ok {
		t.Errorf("the next cycle refuses the untouched %s: %s", names[1], why)
	}
}
