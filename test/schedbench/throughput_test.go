//go:build schedbench

package schedbench_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gputopo/gputopo/test/harness"
)

func TestSchedulerThroughput(t *testing.T) {
	sizes := envInts(t, "SCHEDBENCH_NODES", "500,1000")
	podCount := envInts(t, "SCHEDBENCH_PODS", "500")[0]
	reps := envInts(t, "SCHEDBENCH_REPS", "1")[0]
	modes := selectedModes(t)
	cp, x := start(t)
	ctx := harness.Context(t)
	noop := startNoopExtender(t, cp)

	pods := podMix(podCount)
	var results []phase
	made := 0
	for _, n := range sizes {
		if n < made {
			t.Fatalf("SCHEDBENCH_NODES must ascend; got %v", sizes)
		}
		start := time.Now()
		if err := createNodes(ctx, cp, fixtures, made, n); err != nil {
			t.Fatal(err)
		}
		made = n
		t.Logf("nodes=%d created in %s", n, time.Since(start).Round(time.Millisecond))
		waitLedger(t, x.Extender, n)

		for rep := range reps {
			// Rotate the order so that no scheduler always runs first
			// (a fresh apiserver cache) or last.
			for i := range modes {
				mode := modes[(i+rep)%len(modes)]
				ns := fmt.Sprintf("%s-%d-%d", modeSlug[mode], n, rep)
				stop, schedulerName := startMode(t, cp, mode, n, x.URL(), noop)
				r := runPhase(t, cp, mode, n, ns, schedulerName, pods)
				r.rep = rep
				stop()
				settle(t, cp, x, mode, n)
				results = append(results, r)
			}
		}
	}
	table := render(results)
	fmt.Println(table)
	if out := os.Getenv("SCHEDBENCH_OUT"); out != "" {
		// go test runs in the package directory; a relative path means
		// the repository root, where make runs.
		if !filepath.IsAbs(out) {
			out = filepath.Join(harness.RepoRoot(), out)
		}
		if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range results {
		if r.unscheduled > 0 {
			t.Errorf("%s on %d nodes (repetition %d): %d of %d pods not bound; the figures above are not comparable", r.name, r.nodes, r.rep+1, r.unscheduled, r.pods)
		}
	}
}
