package topology

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

func TestGraphWithMoreThanMaxGPUsIsRefusedNamingCountAndLimit(t *testing.T) {
	gpus := syntheticGPUs("big", MaxGPUs+1)
	want := []string{"gpus: 129 GPUs listed", "at most 128"}
	_, err := NewGraph(gpus, nil)
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("NewGraph: got %v; want an error containing %q", err, w)
		}
	}
	_, err = FromStatus(&v1alpha1.NodeGPUTopologyStatus{GPUs: gpus})
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("FromStatus: got %v; want an error containing %q", err, w)
		}
	}
	if _, err := NewGraph(syntheticGPUs("max", MaxGPUs), nil); err == nil || strings.Contains(err.Error(), "at most") {
		t.Errorf("%d GPUs without links: got %v; want only missing-link errors", MaxGPUs, err)
	}
}

// largeCase is one request on a synthetic node of 64 GPUs.
type largeCase struct {
	name string
	g    *Graph
	free Mask
	req  Request
}

// adversarialCases are the 64-GPU requests the budget must hold on: an
// NVSwitch node (every set ties), random NVLink graphs with near-equal
// bandwidths (many ring levels, weak bounds), a PCIe tree of many domains,
// with and without constraints and busy GPUs.
func adversarialCases(short bool) []largeCase {
	graphs := []struct {
		name string
		g    *Graph
	}{
		{"nvswitch", syntheticNVSwitch(64)},
		{"random-nvlink-0.5", syntheticRandomNVLink(64, 0.5, 1)},
		{"random-nvlink-0.9", syntheticRandomNVLink(64, 0.9, 2)},
		{"pcie-tree", syntheticPCIe(64)},
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
					free Mask
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
						req: Request{Count: k, Requirement: v.r, Utilization: util},
					})
				}
			}
		}
	}
	return out
}

// checkAnswer asserts that res answers req on g with free GPUs free.
func checkAnswer(t *testing.T, name string, g *Graph, free Mask, req Request, res Result) {
	t.Helper()
	set := MaskOf(res.GPUs...)
	if len(res.GPUs) != req.Count || set.Count() != req.Count || !set.Minus(free.Intersect(g.Healthy())).Empty() || !meets(g, set, req.Requirement) {
		t.Fatalf("%s: result %v breaks the request", name, res.GPUs)
	}
	if got := g.Metrics(set, free.Intersect(g.Healthy())); res.Metrics.MinPairGBps != got.MinPairGBps || res.Metrics.SumGBps != got.SumGBps ||
		res.Metrics.LeftLargestIsland != got.LeftLargestIsland || res.Metrics.LeftNVLinkQuads != got.LeftNVLinkQuads {
		t.Fatalf("%s: metrics %+v; the set's are %+v", name, res.Metrics, got)
	}
	// Above RingExactMaxGPUs the ring is reported as the minimum pair.
	if len(res.GPUs) > 1 && len(res.GPUs) <= RingExactMaxGPUs && res.Metrics.RingGBps != ringOf(g, res.GPUs) {
		t.Fatalf("%s: ring %d GB/s but the order %v has %d", name, res.Metrics.RingGBps, res.GPUs, ringOf(g, res.GPUs))
	}
}

func TestAllocateStaysWithinTheBudgetOn64GPUAdversarialNodes(t *testing.T) {
	a := NewAllocator(0)
	heuristic, exact := 0, 0
	for _, c := range adversarialCases(testing.Short()) {
		res, w, err := a.decide(c.g, c.free.bits(), c.req)
		if w.used > SearchBudget {
			t.Errorf("%s: spent %d work units; the budget is %d", c.name, w.used, SearchBudget)
		}
		if err != nil {
			if _, ok := err.(*InfeasibleError); !ok || strings.Contains(err.Error(), "search budget") {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		if res.Heuristic != w.short {
			t.Errorf("%s: Heuristic %t but the budget ran out: %t", c.name, res.Heuristic, w.short)
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
	g := syntheticNVSwitch(64)
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
	a := NewAllocator(0)
	for _, s := range v1alpha1.Strategies {
		for k := 1; k <= 64; k++ {
			// Every set ties on bandwidth and fragmentation, and the
			// lowest indices fill the fewest PCIe domains; balanced
			// utilization takes the k least utilized GPUs.
			var want Mask
			if s == v1alpha1.StrategyBalancedUtilization {
				want = MaskOf(byUtil[:k]...)
			} else {
				want = firstK(g.all(), k).mask()
			}
			res, err := a.Allocate(g, g.All(), Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s}, Utilization: util})
			if err != nil {
				t.Fatal(err)
			}
			if res.Heuristic || MaskOf(res.GPUs...) != want {
				t.Errorf("%s k=%d: got %s (heuristic %t); want %s exactly", s, k, MaskOf(res.GPUs...), res.Heuristic, want)
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
			g := syntheticRandomNVLink(n, 0.2+0.3*float64(seed), seed)
			rng := rand.New(rand.NewPCG(seed, uint64(n)))
			a := NewAllocator(0)
			for _, s := range v1alpha1.Strategies {
				for k := 1; k <= n; k++ {
					free := g.All()
					if k < n-2 {
						free = free.Minus(MaskOf(rng.IntN(n)))
					}
					util := make([]int32, n)
					for i := range util {
						util[i] = int32(rng.IntN(3) * 30)
					}
					for _, r := range []v1alpha1.Requirement{{Strategy: s}, {Strategy: s, RequireNVLink: true}} {
						req := Request{Count: k, Requirement: r, Utilization: util}
						checkAgainstBruteForce(t, a, g, free, req)
					}
				}
			}
		}
	}
}

func TestHeuristicFlagIsSetExactlyWhenTheBudgetRunsOut(t *testing.T) {
	g := syntheticRandomNVLink(16, 0.6, 3)
	rng := rand.New(rand.NewPCG(7, 7))
	sawHeuristic, sawExact := 0, 0
	for _, extra := range []int64{0, 20_000, 200_000, 2_000_000, SearchBudget} {
		a := NewAllocator(0)
		for trial := 0; trial < 24; trial++ {
			free := maskBits(rng.Uint64()).Intersect(g.All())
			k := 1 + rng.IntN(max(free.Count(), 1))
			a.budget = finishReserve(k, g.Len()) + extra
			s := v1alpha1.Strategies[trial%len(v1alpha1.Strategies)]
			req := Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s}}
			name := fmt.Sprintf("budget %d free=%s k=%d %s", a.budget, free, k, s)
			res, w, err := a.decide(g, free.bits(), req)
			if err != nil {
				continue
			}
			if res.Heuristic != w.short {
				t.Fatalf("%s: Heuristic %t but the budget ran out: %t", name, res.Heuristic, w.short)
			}
			if w.used > a.budget {
				t.Fatalf("%s: spent %d", name, w.used)
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
	for _, f := range Fixtures() {
		g := f.Graph("node-a")
		a := NewAllocator(0)
		for _, s := range v1alpha1.Strategies {
			for _, r := range requirementsFor(f, s) {
				for k := 1; k <= f.GPUs; k++ {
					// The search gives up early or at once; the
					// heuristic answers with what is left.
					a.budget = finishReserve(k, g.Len()) + int64(k%3)*1500
					req := Request{Count: k, Requirement: r}
					res, err := a.Allocate(g, g.All().Minus(MaskOf(0)), req)
					_, bruteErr := BruteForce(g, g.All().Minus(MaskOf(0)), req)
					if (err == nil) != (bruteErr == nil) {
						t.Fatalf("%s k=%d %s: Allocate %v, BruteForce %v", f.Name, k, r, err, bruteErr)
					}
					if err == nil {
						checkAnswer(t, fmt.Sprintf("%s k=%d %s", f.Name, k, r), g, g.All().Minus(MaskOf(0)), req, res)
					}
				}
			}
		}
	}
}

func TestMemoRemembersHeuristicAnswers(t *testing.T) {
	g := syntheticRandomNVLink(64, 0.9, 2)
	a := NewAllocator(8)
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
	fresh, _ := NewAllocator(0).Allocate(g, g.All(), r)
	if diff := cmp.Diff(first, fresh); diff != "" {
		t.Errorf("fresh allocator (-first +fresh):\n%s", diff)
	}
}

func TestLargestCliqueMatchesExhaustiveSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for trial := 0; trial < 300; trial++ {
		n := 1 + rng.IntN(14)
		adj := make([]bitset, n)
		p := rng.Float64()
		for a := 0; a < n; a++ {
			for b := a + 1; b < n; b++ {
				if rng.Float64() < p {
					adj[a] |= 1 << b
					adj[b] |= 1 << a
				}
			}
		}
		set := bitset(rng.Uint64()) & (bitset(1)<<n - 1)
		want := 0
		for sub := set; ; sub = (sub - 1) & set {
			if isClique(adj, sub) {
				want = max(want, sub.Count())
			}
			if sub == 0 {
				break
			}
		}
		got, done := largestClique(adj, set, 0, 0, nil)
		if !done || got.Count() != want || !isClique(adj, got) || got&^set != 0 {
			t.Fatalf("trial %d: got %s (done %t); want a clique of %d inside %s", trial, got, done, want, set)
		}
		if size := maxClique(adj, set, nil); size != want {
			t.Fatalf("trial %d: maxClique %d; want %d", trial, size, want)
		}
		// A floor above the answer finds nothing; stop returns early.
		if m, _ := largestClique(adj, set, want+1, 0, nil); m != 0 {
			t.Fatalf("trial %d: floor %d found %s", trial, want+1, m)
		}
		if m, _ := largestClique(adj, set, 0, 1, nil); want > 0 && (m.Count() < 1 || !isClique(adj, m)) {
			t.Fatalf("trial %d: stop 1 found %s", trial, m)
		}
		budget := 5
		if size := maxClique(adj, set, &budget); size > want {
			t.Fatalf("trial %d: a budgeted search found %d > %d", trial, size, want)
		}
	}
}

func isClique(adj []bitset, set bitset) bool {
	for _, i := range set.Indices() {
		if set&^(1<<i)&^adj[i] != 0 {
			return false
		}
	}
	return true
}

func TestRingWithinMatchesEveryOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for trial := 0; trial < 300; trial++ {
		n := 3 + rng.IntN(14)
		levels := 1 + rng.IntN(12)
		g := buildSynthetic(fmt.Sprintf("ring-%d", trial), n, func(a, b int) v1alpha1.Link {
			return v1alpha1.Link{PCIe: v1alpha1.PCIeSameNUMA, BandwidthGBps: 10 * (1 + rng.IntN(levels))}
		})
		idx := g.All().Indices()
		best := 0
		if n <= 8 {
			permute(idx, 1, func(p []int) { best = max(best, ringOf(g, p)) })
		} else {
			// The Hamiltonian-cycle table is exact: the strongest level
			// with a cycle.
			for a := range idx {
				for b := a + 1; b < n; b++ {
					if bw := g.Bandwidth(a, b); bw > best && g.hamiltonCycle(idx, bw, false) != nil {
						best = bw
					}
				}
			}
		}
		for _, floor := range []int{0, best, best + 1} {
			v, ok, done := g.ringWithin(g.all(), floor, nil)
			if !done || ok != (best >= floor) || (ok && v != best) {
				t.Fatalf("trial %d (%d GPUs) floor %d: ringWithin = %d, %t, %t; best ring %d", trial, n, floor, v, ok, done, best)
			}
		}
		for _, bw := range []int{best, best + 10} {
			cycle, done := g.cycleAtLeast(idx, bw, nil)
			if !done || cycle != (g.hamiltonCycle(idx, bw, false) != nil) {
				t.Fatalf("trial %d (%d GPUs): cycleAtLeast(%d) = %t, %t; the table says otherwise", trial, n, bw, cycle, done)
			}
		}
		// Starved of work, it says so and keeps a ring it has seen.
		w := &work{limit: 0}
		if v, _, done := g.ringWithin(g.all(), 0, w); !done && (v > best || !w.short) {
			t.Fatalf("trial %d: out of work: ring %d (best %d), short %t", trial, v, best, w.short)
		}
		order := make([]int, n)
		if v := g.greedyRing(idx, order, n); v > best || ringOf(g, order) != v || MaskOf(order...) != g.All() || order[0] != 0 {
			t.Fatalf("trial %d: greedy ring %d with order %v (its ring %d); best %d", trial, v, order, ringOf(g, order), best)
		}
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
		want := g.hamiltonCycle(idx, g.Bandwidth(idx[0], idx[1]), true)
		got := set.Indices()
		completeRingOrder(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("set %s (-table +closed form):\n%s", set, diff)
		}
	}
}
