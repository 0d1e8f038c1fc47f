package placement

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
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
