//go:build integration

package schedbench_test

import (
	"testing"
	"time"

	"github.com/gputopo/gputopo/test/harness"
)

// A burst of GPU pods created at once on a mixed cluster with room for
// all of them (the throughput benchmark's fleet and pod mix, a third of
// the GPUs asked) is bound in full in both modes: no model-parallel pod
// is held back waiting for NVSwitch GPUs that nothing says will free (patience,
// docs/extender.md "Waiting for a faster set") while NVLink quads and
// pairs are free, and no bind of one waits forever on the ledger's lock
// (placement.TestModelPodBindsUnderContentionAllEnd). 1,000 nodes and
// 1,000 pods, the benchmark's smallest size, about 80 s: the size at which
// the plugin build of ccc156b left most of a burst Pending (in 5 of 6
// repetitions of the throughput benchmark, and on the one try of this
// test; at 500 nodes and 600 pods on one try in two).
func TestBurstOnAMixedClusterIsBoundInFull(t *testing.T) {
	const nodes, pods = 1000, 1000
	cp, x := start(t)
	ctx := harness.Context(t)
	begin := time.Now()
	if err := createNodes(ctx, cp, fixtures, 0, nodes); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d nodes created in %s", nodes, time.Since(begin).Round(time.Millisecond))
	waitLedger(t, x.Extender, nodes)
	specs := podMix(pods)
	for _, mode := range []string{modeExtender, modePlugin} {
		stop, schedulerName := startMode(t, cp, mode, nodes, x.URL(), "")
		r := runPhase(t, cp, mode, nodes, "burst-"+modeSlug[mode], schedulerName, specs)
		stop()
		settle(t, cp, x, mode, nodes)
		if r.unscheduled > 0 {
			t.Errorf("%s: %d of %d pods of a burst left Pending on a cluster with room", mode, r.unscheduled, r.pods)
		}
	}
}
