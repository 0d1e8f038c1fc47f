package extender

import (
	"context"
	"sync"
	"testing"

	"github.com/gputopo/gputopo/placement"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// TestCycleFilterNodeFromParallelGoroutines asks one cycle about every node
// from 16 goroutines at once, as the framework's parallel Filter does
// (run under -race in make test-unit): each answer is the one filter gives
// for the same node in one pass, and Score afterwards is prioritize's.
func TestCycleFilterNodeFromParallelGoroutines(t *testing.T) {
	x, names := benchCluster(t, 300)
	args := benchArgs(names)
	ctx := context.Background()
	want := x.Filter(ctx, args)
	pr, err := placement.ParseRequest(args.Pod, x.cfg.GPUResource(), x.core.Now())
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		c := x.core.NewCycle(ctx, pr)
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
			case a.unresolvable && want.FailedAndUnresolvableNodes[name] != a.reason,
				!a.unresolvable && want.FailedNodes[name] != a.reason:
				t.Fatalf("round %d, node %s: cycle says %+v; filter says failed %q, unresolvable %q", round, name, a, want.FailedNodes[name], want.FailedAndUnresolvableNodes[name])
			}
		}
		if len(passed) != len(*want.NodeNames) || len(passed) == 0 {
			t.Fatalf("round %d: cycle passed %d nodes, filter %d", round, len(passed), len(*want.NodeNames))
		}
		scores := c.Score(passed)
		list, err := x.Prioritize(ctx, &extenderv1.ExtenderArgs{Pod: args.Pod, NodeNames: &passed})
		if err != nil {
			t.Fatal(err)
		}
		for i, hp := range list {
			if scores[i] != hp.Score {
				t.Fatalf("round %d, node %s: cycle score %d, prioritize %d", round, hp.Host, scores[i], hp.Score)
			}
		}
	}
}
