package allocator

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

func mustFixture(t testing.TB, name string) *topology.Graph {
	t.Helper()
	f, err := machine.FixtureByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return f.Graph("node-a")
}

func req(k int, s v1alpha1.Strategy) topology.Request {
	return topology.Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s}}
}

func mustAllocate(t *testing.T, g *topology.Graph, free topology.Mask, r topology.Request) topology.Result {
	t.Helper()
	res, err := New(0).Allocate(g, free, r)
	if err != nil {
		t.Fatalf("Allocate(free=%s, k=%d, %s): %v", free, r.Count, r.Requirement, err)
	}
	return res
}

func TestDGX1V100FourGPUsHighestBandwidthTakesAFullyNVLinkedQuad(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	res := mustAllocate(t, g, g.All(), req(4, v1alpha1.StrategyHighestBandwidth))
	set := topology.MaskOf(res.GPUs...)
	if set != topology.MaskOf(0, 1, 2, 3) && set != topology.MaskOf(4, 5, 6, 7) {
		t.Fatalf("got %v; want one of the two fully NVLinked quads", res.GPUs)
	}
	if res.Metrics.Tier != v1alpha1.TierNVLink || res.Metrics.MinPairGBps != 50 {
		t.Errorf("metrics %+v; want tier nvlink and min pair 50 GB/s", res.Metrics)
	}
	// With the first quad busy, the other one.
	res = mustAllocate(t, g, g.All().Minus(topology.MaskOf(1)), req(4, v1alpha1.StrategyHighestBandwidth))
	if diff := cmp.Diff(topology.MaskOf(4, 5, 6, 7), topology.MaskOf(res.GPUs...)); diff != "" {
		t.Errorf("with GPU 1 busy (-want +got):\n%s", diff)
	}
}

func TestDGX1V100TwoGPUsHighestBandwidthTakesADoubleLinkPair(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	for _, free := range []topology.Mask{g.All(), g.All().Minus(topology.MaskOf(0, 3)), topology.MaskOf(0, 1, 2, 5, 6)} {
		res := mustAllocate(t, g, free, req(2, v1alpha1.StrategyHighestBandwidth))
		if l := g.Link(res.GPUs[0], res.GPUs[1]); l.NVLinks != 2 || res.Metrics.MinPairGBps != 100 {
			t.Errorf("free=%s: got %v with %d NVLinks (%d GB/s); want a double-link pair", free, res.GPUs, l.NVLinks, res.Metrics.MinPairGBps)
		}
	}
}

func TestDGX1V100EightGPUsRingFollowsDoubleLinks(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	res := mustAllocate(t, g, g.All(), req(8, v1alpha1.StrategyHighestBandwidth))
	if res.Metrics.RingGBps != 100 {
		t.Fatalf("ring %d GB/s; want 100 (the double links form a ring)", res.Metrics.RingGBps)
	}
	for i, a := range res.GPUs {
		b := res.GPUs[(i+1)%len(res.GPUs)]
		if g.Bandwidth(a, b) < 100 {
			t.Errorf("ring order %v: %d-%d has %d GB/s", res.GPUs, a, b, g.Bandwidth(a, b))
		}
	}
}

func TestLowestFragmentationStreamKeepsAFullQuadFreeAsLongAsPossible(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	a := New(128)
	// GPU 4 is taken, so quad {4,5,6,7} is already broken: first fit
	// would take GPU 0 and break the other quad too.
	free := g.All().Minus(topology.MaskOf(4))
	for step := 1; !free.Empty(); step++ {
		res, err := a.Allocate(g, free, req(1, v1alpha1.StrategyLowestFragmentation))
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		// Best achievable island over every possible choice.
		best := 0
		for _, i := range free.Indices() {
			best = max(best, g.Metrics(topology.MaskOf(i), free).LeftLargestIsland)
		}
		if res.Metrics.LeftLargestIsland != best {
			t.Fatalf("step %d: took GPU %d leaving island %d; %d was possible", step, res.GPUs[0], res.Metrics.LeftLargestIsland, best)
		}
		if step <= 3 && free.Minus(topology.MaskOf(res.GPUs...)).Intersect(topology.MaskOf(0, 1, 2, 3)) != topology.MaskOf(0, 1, 2, 3) {
			t.Fatalf("step %d: took GPU %d, breaking quad {0,1,2,3} while GPUs 5-7 were free", step, res.GPUs[0])
		}
		free = free.Minus(topology.MaskOf(res.GPUs...))
	}
}

func TestLowestFragmentationOneGPUTakesTheWorstConnected(t *testing.T) {
	g := mustFixture(t, "pcie-8x-nvlink-pairs")
	// GPU 5's bridge partner 4 is busy: 5 is the free GPU whose loss costs
	// no NVLink pair.
	res := mustAllocate(t, g, g.All().Minus(topology.MaskOf(4)), req(1, v1alpha1.StrategyLowestFragmentation))
	if diff := cmp.Diff([]int{5}, res.GPUs); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestPairBridgedPCIeTwoGPUsTakesABridgedPair(t *testing.T) {
	g := mustFixture(t, "pcie-8x-nvlink-pairs")
	for _, tc := range []struct {
		free topology.Mask
		want topology.Mask
	}{
		{g.All(), topology.MaskOf(0, 1)},
		{topology.MaskOf(0, 2, 3, 5), topology.MaskOf(2, 3)},
		{topology.MaskOf(1, 2, 4, 5, 7), topology.MaskOf(4, 5)},
	} {
		res := mustAllocate(t, g, tc.free, req(2, v1alpha1.StrategyHighestBandwidth))
		if diff := cmp.Diff(tc.want, topology.MaskOf(res.GPUs...)); diff != "" {
			t.Errorf("free=%s (-want +got):\n%s", tc.free, diff)
		}
		if res.Metrics.MinPairGBps != 600 {
			t.Errorf("free=%s: min pair %d GB/s; want the bridge's 600", tc.free, res.Metrics.MinPairGBps)
		}
	}
}

func TestNUMALocalFourGPUsOnPCIeStaysUnderOneSocket(t *testing.T) {
	g := mustFixture(t, "pcie-8x")
	gpus := g.GPUs()
	for _, free := range []topology.Mask{g.All(), g.All().Minus(topology.MaskOf(0)), topology.MaskOf(0, 1, 4, 5, 6, 7), topology.MaskOf(0, 2, 3, 4, 5, 6, 7)} {
		res := mustAllocate(t, g, free, req(4, v1alpha1.StrategyNUMALocal))
		for _, i := range res.GPUs {
			if gpus[i].NUMANode != gpus[res.GPUs[0]].NUMANode {
				t.Errorf("free=%s: got %v spanning NUMA nodes", free, res.GPUs)
			}
		}
		if res.Metrics.Tier == v1alpha1.TierCrossSocket {
			t.Errorf("free=%s: tier %s", free, res.Metrics.Tier)
		}
	}
}

func TestBalancedUtilizationTakesTheLeastBusyGPUs(t *testing.T) {
	g := mustFixture(t, "dgx-a100")
	r := req(2, v1alpha1.StrategyBalancedUtilization)
	r.Utilization = []int32{90, 10, 80, 0, 50, 20, 70, 30}
	res := mustAllocate(t, g, g.All(), r)
	if diff := cmp.Diff(topology.MaskOf(1, 3), topology.MaskOf(res.GPUs...)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestDefaultStrategyIsLowestFragmentation(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	free := g.All().Minus(topology.MaskOf(4))
	got := mustAllocate(t, g, free, topology.Request{Count: 1})
	want := mustAllocate(t, g, free, req(1, v1alpha1.StrategyLowestFragmentation))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-lowest_fragmentation +default):\n%s", diff)
	}
}

func TestUnhealthyGPUsAreNeverChosen(t *testing.T) {
	f, _ := machine.FixtureByName("dgx-a100")
	gpus, links := f.Parts("node-a")
	gpus[0].Health = v1alpha1.GPUUnhealthy
	gpus[0].HealthReason = "XID 79"
	g, err := topology.NewGraph(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	res := mustAllocate(t, g, g.All(), req(7, v1alpha1.StrategyHighestBandwidth))
	if topology.MaskOf(res.GPUs...).Has(0) {
		t.Errorf("got %v including unhealthy GPU 0", res.GPUs)
	}
	_, err = New(0).Allocate(g, g.All(), req(8, v1alpha1.StrategyHighestBandwidth))
	wantInfeasible(t, err, "needs 8 GPUs; 7 of 8 are free and healthy (1 unhealthy)")
}

func wantInfeasible(t *testing.T, err error, reason string) {
	t.Helper()
	var inf *topology.InfeasibleError
	if !errors.As(err, &inf) {
		t.Fatalf("got %v (%T); want *topology.InfeasibleError", err, err)
	}
	if diff := cmp.Diff(reason, inf.Reason); diff != "" {
		t.Errorf("reason (-want +got):\n%s", diff)
	}
}

func TestInfeasibleRequestsExplainWhy(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fixture string
		free    topology.Mask
		req     topology.Request
		reason  string
	}{
		{"more GPUs than free", "dgx-a100", topology.MaskOf(0, 1, 2), req(4, ""),
			"needs 4 GPUs; 3 of 8 are free"},
		{"NVLink island too small", "dgx1-v100", topology.MaskOf(0, 1, 4, 5),
			topology.Request{Count: 4, Requirement: v1alpha1.Requirement{RequireNVLink: true}},
			"needs NVLink between 4 GPUs; largest free NVLink-connected set has 2"},
		{"no NVLink at all", "pcie-8x", topology.MaskOf(0, 1),
			topology.Request{Count: 2, Requirement: v1alpha1.Requirement{RequireNVLink: true}},
			"needs NVLink between 2 GPUs; largest free NVLink-connected set has 1"},
		{"memory per GPU", "dgx-a100", firstN(8),
			topology.Request{Count: 2, Requirement: v1alpha1.Requirement{GPUMemoryMiB: 80000}},
			"needs 80000 MiB per GPU; free GPUs have at most 40960 MiB"},
		{"pair bandwidth", "pcie-8x", firstN(8),
			topology.Request{Count: 4, Requirement: v1alpha1.Requirement{MinPairBandwidthGBps: 64}},
			"needs at least 64 GB/s between every pair of 4 GPUs; largest set of free GPUs meeting it has 2 (best pair: 64 GB/s)"},
		{"pair bandwidth over NVLink", "dgx1-v100", firstN(8),
			topology.Request{Count: 3, Requirement: v1alpha1.Requirement{RequireNVLink: true, MinPairBandwidthGBps: 100}},
			"needs at least 100 GB/s between every pair of 3 GPUs; largest set of free NVLink-connected GPUs meeting it has 2 (best pair: 100 GB/s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := mustFixture(t, tc.fixture)
			_, err := New(16).Allocate(g, tc.free, tc.req)
			wantInfeasible(t, err, tc.reason)
			_, err = BruteForce(g, tc.free, tc.req)
			wantInfeasible(t, err, tc.reason)
		})
	}
}

func TestBadRequestsAreErrorsNamingTheField(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	for _, tc := range []struct {
		name string
		req  topology.Request
		want string
	}{
		{"zero count", topology.Request{Count: 0}, "request count: 0; must be at least 1"},
		{"negative count", topology.Request{Count: -2}, "request count: -2"},
		{"more than the node has", topology.Request{Count: 9}, "request count: 9 GPUs requested but the node has 8"},
		{"unknown strategy", req(2, "fastest"), `request requirement.strategy: unknown strategy "fastest"`},
		{"negative bandwidth", topology.Request{Count: 2, Requirement: v1alpha1.Requirement{MinPairBandwidthGBps: -1}}, "minPairBandwidthGBps"},
		{"negative memory", topology.Request{Count: 2, Requirement: v1alpha1.Requirement{GPUMemoryMiB: -1}}, "gpuMemoryMiB"},
		{"utilization length", topology.Request{Count: 2, Utilization: []int32{1, 2}}, "request utilization: 2 entries; want none or one per GPU (8)"},
		{"utilization range", topology.Request{Count: 2, Utilization: []int32{0, 0, 0, 101, 0, 0, 0, 0}}, "request utilization[3]: 101"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for name, alloc := range map[string]func(*topology.Graph, topology.Mask, topology.Request) (topology.Result, error){
				"Allocate":   New(8).Allocate,
				"BruteForce": BruteForce,
			} {
				_, err := alloc(g, g.All(), tc.req)
				var inf *topology.InfeasibleError
				if err == nil || errors.As(err, &inf) {
					t.Fatalf("%s: got %v; want a bad-input error", name, err)
				}
				if !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: error %q does not contain %q", name, err, tc.want)
				}
			}
		})
	}
	if _, err := New(0).Allocate(nil, topology.MaskOf(0), topology.Request{Count: 1}); err == nil {
		t.Error("nil graph: want an error")
	}
}

func TestMemoReturnsTheSameAnswerAndIsBounded(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	a := New(2)
	first, err := a.Allocate(g, g.All(), req(4, v1alpha1.StrategyHighestBandwidth))
	if err != nil {
		t.Fatal(err)
	}
	want := copyResult(first)
	first.GPUs[0] = 99 // callers may keep and change their copy
	again, err := a.Allocate(g, g.All(), req(4, v1alpha1.StrategyHighestBandwidth))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, again); diff != "" {
		t.Errorf("memo hit (-want +got):\n%s", diff)
	}
	// Another node with the same hardware shares the entry.
	other := FixturesMust(t, "dgx1-v100").Graph("node-b")
	if _, err := a.Allocate(other, g.All(), req(4, v1alpha1.StrategyHighestBandwidth)); err != nil {
		t.Fatal(err)
	}
	if a.memoLen() != 1 {
		t.Errorf("memo holds %d entries after two identical questions on identical nodes; want 1", a.memoLen())
	}
	for k := 1; k <= 3; k++ {
		if _, err := a.Allocate(g, g.All(), req(k, v1alpha1.StrategyHighestBandwidth)); err != nil {
			t.Fatal(err)
		}
	}
	if a.memoLen() != 2 {
		t.Errorf("memo holds %d entries; want its bound 2", a.memoLen())
	}
	// Infeasible answers are remembered too, with their reason.
	_, err = a.Allocate(g, topology.MaskOf(0), req(2, ""))
	_, err2 := a.Allocate(g, topology.MaskOf(0), req(2, ""))
	if err == nil || err2 == nil || err.Error() != err2.Error() {
		t.Errorf("infeasible answers differ: %v vs %v", err, err2)
	}
}

func FixturesMust(t testing.TB, name string) machine.Fixture {
	t.Helper()
	f, err := machine.FixtureByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestMemoKeysBalancedUtilizationByUtilization(t *testing.T) {
	g := mustFixture(t, "dgx-a100")
	a := New(16)
	r := req(1, v1alpha1.StrategyBalancedUtilization)
	r.Utilization = []int32{0, 50, 50, 50, 50, 50, 50, 50}
	first, _ := a.Allocate(g, g.All(), r)
	r.Utilization = []int32{50, 50, 50, 50, 50, 50, 50, 0}
	second, _ := a.Allocate(g, g.All(), r)
	if diff := cmp.Diff([][]int{{0}, {7}}, [][]int{first.GPUs, second.GPUs}); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestAllocatorIsSafeForConcurrentUse(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	a := New(32)
	want := map[string]topology.Result{}
	for k := 1; k <= 8; k++ {
		for _, s := range v1alpha1.Strategies {
			res, err := BruteForce(g, g.All().Minus(topology.MaskOf(k-1)), req(k%7+1, s))
			if err != nil {
				t.Fatal(err)
			}
			want[fmt.Sprint(k, s)] = res
		}
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for rep := 0; rep < 20; rep++ {
				for k := 1; k <= 8; k++ {
					for _, s := range v1alpha1.Strategies {
						res, err := a.Allocate(g, g.All().Minus(topology.MaskOf(k-1)), req(k%7+1, s))
						if err != nil || !cmp.Equal(want[fmt.Sprint(k, s)], res) {
							select {
							case errs <- fmt.Sprintf("k=%d %s: %v %v", k, s, res, err):
							default:
							}
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

func TestObjectiveOrdersScoresLexicographically(t *testing.T) {
	g := mustFixture(t, "dgx1-v100")
	r := req(2, v1alpha1.StrategyHighestBandwidth)
	double := Objective(g, topology.MaskOf(0, 3), g.All(), r)
	single := Objective(g, topology.MaskOf(0, 1), g.All(), r)
	none := Objective(g, topology.MaskOf(0, 5), g.All(), r)
	if !double.Better(single) || !single.Better(none) || none.Better(double) {
		t.Errorf("want double > single > no NVLink: %v, %v, %v", double, single, none)
	}
	if double.Better(double) {
		t.Error("a score is not better than itself")
	}
	// Equal keys: lower indices win.
	a, b := Objective(g, topology.MaskOf(1, 2), g.All(), r), Objective(g, topology.MaskOf(5, 6), g.All(), r)
	if a.Keys == b.Keys && !a.Better(b) {
		t.Errorf("equal keys: {1,2} should beat {5,6}: %v %v", a, b)
	}
	if !strings.HasPrefix(double.String(), "highest_bandwidth{minPair=100 ring=100") {
		t.Errorf("String() = %s", double)
	}
}

func TestFragmentationTablesMatchDirectCounts(t *testing.T) {
	for _, name := range []string{"dgx1-v100", "dgx1-p100", "pcie-8x-nvlink-pairs", "dgx2"} {
		g := mustFixture(t, name)
		tabs := buildTables(g.NVAdjacency(), g.Len())
		step := topology.Bitset(1)
		if g.Len() > 8 {
			step = 97
		}
		for m := topology.Bitset(0); m <= g.All().Bitset(); m += step {
			got := []int{int(tabs.island[m]), int(tabs.pairs[m]), int(tabs.quads[m])}
			want := []int{topology.MaxClique(g.NVAdjacency(), m, nil), topology.CountPairs(g.NVAdjacency(), m), countQuads(g.NVAdjacency(), m)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%s mask %s (-direct +table):\n%s", name, m, diff)
			}
		}
	}
}

// TestShardedMemoKeepsItsBound: a memo large enough to be sharded still
// holds at most memoSize answers, and answers a repeated question as the
// search did.
func TestShardedMemoKeepsItsBound(t *testing.T) {
	a := New(minShardedMemo)
	if len(a.memo) != memoShards {
		t.Fatalf("a memo of %d has %d shards, want %d", minShardedMemo, len(a.memo), memoShards)
	}
	g := mustFixture(t, "dgx-a100")
	first := map[topology.Mask]topology.Result{}
	for m := 1; m < 256; m++ {
		free := topology.Mask{}
		for i := range 8 {
			if m&(1<<i) != 0 {
				free = free.With(i)
			}
		}
		for k := 1; k <= min(free.Count(), 8); k++ {
			res, err := a.Allocate(g, free, req(k, v1alpha1.StrategyHighestBandwidth))
			if err != nil {
				t.Fatal(err)
			}
			if k == 2 {
				first[free] = res
			}
		}
	}
	if n := a.memoLen(); n > minShardedMemo || n < minShardedMemo/2 {
		t.Errorf("memo holds %d answers after 1020 questions; want at most %d and most of them", n, minShardedMemo)
	}
	for free, want := range first {
		got, err := a.Allocate(g, free, req(2, v1alpha1.StrategyHighestBandwidth))
		if err != nil || !slices.Equal(got.GPUs, want.GPUs) {
			t.Fatalf("free %s: %v, %v; want %v as first answered", free, got.GPUs, err, want.GPUs)
		}
	}
}
