package allocator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// requirementsFor returns the requirement variants the property test runs
// for a fixture: none, NVLink required, a pair bandwidth floor between the
// machine's PCIe and NVLink figures, and a memory floor no GPU meets.
func requirementsFor(f machine.Fixture, s v1alpha1.Strategy) []v1alpha1.Requirement {
	return []v1alpha1.Requirement{
		{Strategy: s},
		{Strategy: s, RequireNVLink: true},
		{Strategy: s, MinPairBandwidthGBps: machine.PCIeBandwidthGBps(f.PCIeGen, v1alpha1.PCIeSameNUMA)},
		{Strategy: s, MinPairBandwidthGBps: 100, GPUMemoryMiB: f.MemoryMiB},
		{Strategy: s, GPUMemoryMiB: f.MemoryMiB + 1},
	}
}

// checkAgainstBruteForce asserts that Allocate and BruteForce agree exactly:
// the same error kind and reason, or the same set with equal objective.
func checkAgainstBruteForce(t *testing.T, a *Allocator, g *topology.Graph, free topology.Mask, req topology.Request) {
	t.Helper()
	got, gotErr := a.Allocate(g, free, req)
	want, wantErr := BruteForce(g, free, req)
	name := fmt.Sprintf("free=%s k=%d req=%s", free, req.Count, req.Requirement)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%s: Allocate error %v, BruteForce error %v", name, gotErr, wantErr)
	}
	if wantErr != nil {
		var gi, wi *topology.InfeasibleError
		if !errors.As(gotErr, &gi) || !errors.As(wantErr, &wi) {
			t.Fatalf("%s: want infeasible errors, got %v and %v", name, gotErr, wantErr)
		}
		if gi.Reason != wi.Reason {
			t.Fatalf("%s: reasons differ: %q vs %q", name, gi.Reason, wi.Reason)
		}
		return
	}
	gotScore := Objective(g, topology.MaskOf(got.GPUs...), free, req)
	wantScore := Objective(g, topology.MaskOf(want.GPUs...), free, req)
	if gotScore.Keys != wantScore.Keys {
		t.Fatalf("%s: Allocate %v scores %v; BruteForce optimum %v scores %v", name, got.GPUs, gotScore, want.GPUs, wantScore)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("%s: same objective but different result (-brute +allocate):\n%s", name, diff)
	}
	if len(got.GPUs) != req.Count || !meets(g, topology.MaskOf(got.GPUs...), req.Requirement) || !topology.MaskOf(got.GPUs...).Minus(free.Intersect(g.Healthy())).Empty() {
		t.Fatalf("%s: result %v breaks the request", name, got.GPUs)
	}
}

func TestAllocateMatchesBruteForceOnEveryFixture(t *testing.T) {
	for _, f := range machine.Fixtures() {
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			g := f.Graph("node-a")
			a := New(0)
			rng := rand.New(rand.NewPCG(1, uint64(f.GPUs)))
			masks := []topology.Mask{}
			if f.GPUs <= 8 {
				for m := topology.Bitset(0); m <= g.All().Bitset(); m++ {
					masks = append(masks, m.Mask())
				}
			} else {
				masks = append(masks, g.All())
				samples := 400
				if testing.Short() {
					samples = 40
				}
				for range samples {
					masks = append(masks, maskBits(rng.Uint64()).Intersect(g.All()))
				}
			}
			for mi, free := range masks {
				util := make([]int32, f.GPUs)
				for i := range util {
					util[i] = int32(rng.IntN(4) * 25) // ties are common, as on real nodes
				}
				for _, s := range v1alpha1.Strategies {
					reqs := requirementsFor(f, s)
					for k := 1; k <= f.GPUs; k++ {
						if f.GPUs > 8 && k != 1+mi%f.GPUs && k != 2 && k != 4 && k != 8 {
							continue
						}
						for ri, r := range reqs {
							if ri > 0 && (mi+k+ri)%3 != 0 {
								continue // constrained variants on a third of the cases
							}
							checkAgainstBruteForce(t, a, g, free, topology.Request{Count: k, Requirement: r, Utilization: util})
						}
					}
				}
			}
		})
	}
}
