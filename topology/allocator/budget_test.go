package allocator

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// largeCase is one request on a synthetic node of 64 GPUs.
type largeCase struct {
	name string
	g    *topology.Graph
	free topology.Mask
	req  topology.Request
}

// adversarialCases are the 64-GPU requests the budget must hold on: an
// NVSwitch node (every set ties), random NVLink graphs with near-equal
// bandwidths (many ring levels, weak bounds), a PCIe tree of many domains,
// with and without constraints and busy GPUs.
func adversarialCases(short bool) []largeCase {
	graphs := []struct {
		name string
		g    *topology.Graph
	}{
		{"nvswitch", machine.SyntheticNVSwitch(64)},
		{"random-nvlink-0.5", machine.SyntheticRandomNVLink(64, 0.5, 1)},
		{"random-nvlink-0.9", machine.SyntheticRandomNVLink(64, 0.9, 2)},
		{"pcie-tree", machine.SyntheticPCIe(64)},
	}
	ks := []int{1, 2, 3, 4, 6, 8, 12, 13, 16, 17, 24, 32, 48, 62, 63, 64}
	if short {
		ks = []int{1, 4, 13, 32, 63}
	}
	util := make([]int32, 64)
	for i := range util {
		util[i] = int32(i * 37 % 100)
	}
	var out []largeCase
	for _, gr := range graphs {
		half := gr.g.All().Minus(maskBits(0x5555_0f0f_3333_00ff))
		for _, s := range v1alpha1.Strategies {
			for _, k := range ks {
				variants := []struct {
					name string
					free topology.Mask
					r    v1alpha1.Requirement
				}{
					{"all free", gr.g.All(), v1alpha1.Requirement{Strategy: s}},
					{"half free", half, v1alpha1.Requirement{Strategy: s}},
					{"nvlink", gr.g.All(), v1alpha1.Requirement{Strategy: s, RequireNVLink: true}},
					{"pair floor", half, v1alpha1.Requirement{Strategy: s, MinPairBandwidthGBps: 100}},
				}
				for vi, v := range variants {
					if short && vi > 1 {
						continue
					}
					out = append(out, largeCase{
						name: fmt.Sprintf("%s/%s/k=%d/%s", gr.name, s, k, v.name),
						g:    gr.g, free: v.free,
						req: topology.Request{Count: k, Requirement: v.r, Utilization: util},
					})
				}
			}
		}
	}
	return out
}

// checkAnswer asserts that res answers req on g with free GPUs free.
func checkAnswer(t *testing.T, name string, g *topology.Graph, free topology.Mask, req topology.Request, res topology.Result) {
	t.Helper()
	set := topology.MaskOf(res.GPUs...)
	if len(res.GPUs) != req.Count || set.Count() != req.Count || !set.Minus(free.Intersect(g.Healthy())).Empty() || !meets(g, set, req.Requirement) {
		t.Fatalf("%s: result %v breaks the request", name, res.GPUs)
	}
	if got := g.Metrics(set, free.Intersect(g.Healthy())); res.Metrics.MinPairGBps != got.MinPairGBps || res.Metrics.SumGBps != got.SumGBps ||
		res.Metrics.LeftLargestIsland != got.LeftLargestIsland || res.Metrics.LeftNVLinkQuads != got.LeftNVLinkQuads {
		t.Fatalf("%s: metrics %+v; the set's are %+v", name, res.Metrics, got)
	}
	// Above topology.RingExactMaxGPUs the ring is reported as the minimum pair.
	if len(res.GPUs) > 1 && len(res.GPUs) <= topology.RingExactMaxGPUs && res.Metrics.RingGBps != ringOf(g, res.GPUs) {
		t.Fatalf("%s: ring %d GB/s but the order %v has %d", name, res.Metrics.RingGBps, res.GPUs, ringOf(g, res.GPUs))
	}
}

func TestAllocateStaysWithinTheBudgetOn64GPUAdversarialNodes(t *testing.T) {
	a := New(0)
	heuristic, exact := 0, 0
	for _, c := range adversarialCases(testing.Short()) {
		res, w, err := a.decide(c.g, c.free.Bitset(), c.req)
		if w.Used > SearchBudget {
			t.Errorf("%s: spent %d work units; the budget is %d", c.name, w.Used, SearchBudget)
		}
		if err != nil {
			if _, ok := err.(*topology.InfeasibleError); !ok || strings.Contains(err.Error(), "search budget") {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if res.Heuristic != w.Short {
			t.Errorf("%s: Heuristic %t but the budget ran out: %t", c.name, res.Heuristic, w.Short)
		}
		checkAnswer(t, c.name, c.g, c.free, c.req, res)
		if res.Heuristic {
			heuristic++
		} else {
			exact++
		}
	}
	// Both outcomes must occur, or the test proves nothing about the flag.
	if heuristic == 0 || exact == 0 {
		t.Errorf("%d heuristic and %d exact answers; want some of each", heuristic, exact)
	}
}

func TestNVSwitch64AnswersEveryCountExactly(t *testing.T) {
	g := machine.SyntheticNVSwitch(64)
	util := make([]int32, 64)
	for i := range util {
		util[i] = int32(i * 37 % 100) // all different
	}
	byUtil := g.All().Indices()
	for i := 1; i < len(byUtil); i++ {
		for j := i; j > 0 && util[byUtil[j]] < util[byUtil[j-1]]; j-- {
			byUtil[j], byUtil[j-1] = byUtil[j-1], byUtil[j]
		}
	}
	a := New(0)
	for _, s := range v1alpha1.Strategies {
		for k := 1; k <= 64; k++ {
			// Every set ties on bandwidth and fragmentation, and the
			// lowest indices fill the fewest PCIe domains; balanced
			// utilization takes the k least utilized GPUs.
			var want topology.Mask
			if s == v1alpha1.StrategyBalancedUtilization {
				want = topology.MaskOf(byUtil[:k]...)
			} else {
				want = firstK(g.All().Bitset(), k).Mask()
			}
			res, err := a.Allocate(g, g.All(), topology.Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s}, Utilization: util})
			if err != nil {
				t.Fatal(err)
			}
			if res.Heuristic || topology.MaskOf(res.GPUs...) != want {
				t.Errorf("%s k=%d: got %s (heuristic %t); want %s exactly", s, k, topology.MaskOf(res.GPUs...), res.Heuristic, want)
			}
		}
	}
}

// TestAllocateIsExactOnRandomNodesOfUpTo12GPUs: on nodes this small the
// exact search always finishes within the budget, whatever the topology.
func TestAllocateIsExactOnRandomNodesOfUpTo12GPUs(t *testing.T) {
	seeds := uint64(3)
	if testing.Short() {
		seeds = 1
	}
	for _, n := range []int{6, 10, 12} {
		for seed := uint64(0); seed < seeds; seed++ {
			g := machine.SyntheticRandomNVLink(n, 0.2+0.3*float64(seed), seed)
			rng := rand.New(rand.NewPCG(seed, uint64(n)))
			a := New(0)
			for _, s := range v1alpha1.Strategies {
				for k := 1; k <= n; k++ {
					free := g.All()
					if k < n-2 {
						free = free.Minus(topology.MaskOf(rng.IntN(n)))
					}
					util := make([]int32, n)
					for i := range util {
						util[i] = int32(rng.IntN(3) * 30)
					}
					for _, r := range []v1alpha1.Requirement{{Strategy: s}, {Strategy: s, RequireNVLink: true}} {
						req := topology.Request{Count: k, Requirement: r, Utilization: util}
						checkAgainstBruteForce(t, a, g, free, req)
					}
				}
			}
		}
	}
}

func TestHeuristicFlagIsSetExactlyWhenTheBudgetRunsOut(t *testing.T) {
	g := machine.SyntheticRandomNVLink(16, 0.6, 3)
	rng := rand.New(rand.NewPCG(7, 7))
	sawHeuristic, sawExact := 0, 0
	for _, extra := range []int64{0, 20_000, 200_000, 2_000_000, SearchBudget} {
		a := New(0)
		for trial := 0; trial < 24; trial++ {
			free := maskBits(rng.Uint64()).Intersect(g.All())
			k := 1 + rng.IntN(max(free.Count(), 1))
			a.budget = finishReserve(k, g.Len()) + extra
			s := v1alpha1.Strategies[trial%len(v1alpha1.Strategies)]
			req := topology.Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s}}
			name := fmt.Sprintf("budget %d free=%s k=%d %s", a.budget, free, k, s)
			res, w, err := a.decide(g, free.Bitset(), req)
			if err != nil {
				continue
			}
			if res.Heuristic != w.Short {
				t.Fatalf("%s: Heuristic %t but the budget ran out: %t", name, res.Heuristic, w.Short)
			}
			if w.Used > a.budget {
				t.Fatalf("%s: spent %d", name, w.Used)
			}
			checkAnswer(t, name, g, free, req, res)
			if res.Heuristic {
				sawHeuristic++
				continue
			}
			sawExact++
			// No flag: the answer is the exact optimum, whatever the budget.
			want, err := BruteForce(g, free, req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, res); diff != "" {
				t.Fatalf("%s: not heuristic, yet differs from the optimum (-brute +allocate):\n%s", name, diff)
			}
		}
	}
	if sawHeuristic < 10 || sawExact < 10 {
		t.Errorf("%d heuristic and %d exact answers; want plenty of each", sawHeuristic, sawExact)
	}
}

func TestHeuristicAnswersMeetTheConstraintsOnEveryFixture(t *testing.T) {
	for _, f := range machine.Fixtures() {
		g := f.Graph("node-a")
		a := New(0)
		for _, s := range v1alpha1.Strategies {
			for _, r := range requirementsFor(f, s) {
				for k := 1; k <= f.GPUs; k++ {
					// The search gives up early or at once; the
					// heuristic answers with what is left.
					a.budget = finishReserve(k, g.Len()) + int64(k%3)*1500
					req := topology.Request{Count: k, Requirement: r}
					res, err := a.Allocate(g, g.All().Minus(topology.MaskOf(0)), req)
					_, bruteErr := BruteForce(g, g.All().Minus(topology.MaskOf(0)), req)
					if (err == nil) != (bruteErr == nil) {
						t.Fatalf("%s k=%d %s: Allocate %v, BruteForce %v", f.Name, k, r, err, bruteErr)
					}
					if err == nil {
						checkAnswer(t, fmt.Sprintf("%s k=%d %s", f.Name, k, r), g, g.All().Minus(topology.MaskOf(0)), req, res)
					}
				}
			}
		}
	}
}

func TestMemoRemembersHeuristicAnswers(t *testing.T) {
	g := machine.SyntheticRandomNVLink(64, 0.9, 2)
	a := New(8)
	r := req(16, v1alpha1.StrategyLowestFragmentation)
	first, err := a.Allocate(g, g.All(), r)
	if err != nil {
		t.Fatal(err)
	}
	if !first.Heuristic {
		t.Fatal("want a heuristic answer from this node; pick a harder case")
	}
	again, err := a.Allocate(g, g.All(), r)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, again); diff != "" {
		t.Errorf("memo hit (-first +again):\n%s", diff)
	}
	// Work is counted, not timed: a fresh allocator gives the same answer.
	fresh, _ := New(0).Allocate(g, g.All(), r)
	if diff := cmp.Diff(first, fresh); diff != "" {
		t.Errorf("fresh allocator (-first +fresh):\n%s", diff)
	}
}

func TestCompleteRingOrderIsTheRingTablesOrder(t *testing.T) {
	g := mustFixture(t, "dgx2") // NVSwitch: every link qualifies
	rng := rand.New(rand.NewPCG(9, 9))
	for trial := 0; trial < 60; trial++ {
		set := maskBits(rng.Uint64()).Intersect(g.All())
		if set.Count() < 4 {
			continue
		}
		idx := set.Indices()
		want := g.HamiltonCycle(idx, g.Bandwidth(idx[0], idx[1]))
		got := set.Indices()
		completeRingOrder(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("set %s (-table +closed form):\n%s", set, diff)
		}
	}
}
