package allocator

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// benchAllocate runs the brute-force baseline and then the allocator on the
// same question, and reports the allocator's speedup over the baseline
// measured in the same process.
func benchAllocate(b *testing.B, g *topology.Graph, free topology.Mask, r topology.Request) {
	var bruteNs float64
	b.Run("bruteforce", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := BruteForce(g, free, r); err != nil {
				b.Fatal(err)
			}
		}
		bruteNs = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("allocate", func(b *testing.B) {
		a := New(0) // no memo: every iteration searches
		if _, err := a.Allocate(g, free, r); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := a.Allocate(g, free, r); err != nil {
				b.Fatal(err)
			}
		}
		if ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N); ns > 0 && bruteNs > 0 {
			b.ReportMetric(bruteNs/ns, "x-faster")
		}
	})
}

// benchUtil is a utilization vector with few ties, for
// balanced_utilization.
func benchUtil(n int) []int32 {
	util := make([]int32, n)
	for i := range util {
		util[i] = int32(i * 37 % 100)
	}
	return util
}

// benchDecisions times each decision (memo off), cycling through ks, and
// reports the median decision (wall time), the slowest k by the thread's
// CPU time (the largest of the per-k medians, so that one preemption on a
// busy machine does not count) and the share of heuristic answers.
func benchDecisions(b *testing.B, g *topology.Graph, free topology.Mask, s v1alpha1.Strategy, ks []int) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	a := New(0)
	util := benchUtil(g.Len())
	perK := make([][]time.Duration, len(ks))
	var all []time.Duration
	heuristic := 0
	i := 0
	for b.Loop() {
		ki := i % len(ks)
		i++
		r := topology.Request{Count: ks[ki], Requirement: v1alpha1.Requirement{Strategy: s}, Utilization: util}
		start, cpu := time.Now(), threadCPU()
		res, err := a.Allocate(g, free, r)
		d, c := time.Since(start), threadCPU()-cpu
		if err != nil {
			b.Fatal(err)
		}
		if res.Heuristic {
			heuristic++
		}
		perK[ki] = append(perK[ki], c)
		all = append(all, d)
	}
	b.ReportMetric(float64(median(all).Nanoseconds()), "p50-ns/decision")
	var worst time.Duration
	for _, ds := range perK {
		if len(ds) > 0 {
			worst = max(worst, median(ds))
		}
	}
	b.ReportMetric(float64(worst.Nanoseconds()), "worst-k-cpu-ns/decision")
	b.ReportMetric(100*float64(heuristic)/float64(max(i, 1)), "heuristic-%")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkAllocate_N8 is every 8-GPU fixture, every strategy and k, all
// GPUs free, memo off: the cases the allocator answered exactly before its
// work budget existed, which must cost no more than they did.
func BenchmarkAllocate_N8(b *testing.B) {
	for _, f := range machine.Fixtures() {
		if f.GPUs != 8 {
			continue
		}
		g := f.Graph("node-a")
		util := benchUtil(8)
		for _, s := range v1alpha1.Strategies {
			for k := 1; k <= 8; k++ {
				r := topology.Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s}, Utilization: util}
				b.Run(fmt.Sprintf("%s/%s/k=%d", f.Name, s, k), func(b *testing.B) {
					a := New(0)
					b.ReportAllocs()
					for b.Loop() {
						if _, err := a.Allocate(g, g.All(), r); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkAllocate_N16 is the DGX-2 (16 GPUs on NVSwitch, where every set
// ties on bandwidth: the hardest case for pruning) with GPUs 3 and 12 busy,
// against the brute-force baseline.
func BenchmarkAllocate_N16(b *testing.B) {
	g := mustFixture(b, "dgx2")
	free := g.All().Minus(topology.MaskOf(3, 12))
	for _, s := range v1alpha1.Strategies {
		for _, k := range []int{2, 4, 8} {
			r := req(k, s)
			if s == v1alpha1.StrategyBalancedUtilization {
				r.Utilization = benchUtil(g.Len())
			}
			b.Run(fmt.Sprintf("%s/k=%d", s, k), func(b *testing.B) {
				benchAllocate(b, g, free, r)
			})
		}
	}
}

// BenchmarkAllocate_DGX2 is the DGX-2 at every k and strategy, all GPUs
// free and with GPUs 3 and 12 busy; target: at most 500 µs per decision.
func BenchmarkAllocate_DGX2(b *testing.B) {
	g := mustFixture(b, "dgx2")
	for _, fr := range []struct {
		name string
		free topology.Mask
	}{{"all-free", g.All()}, {"3,12-busy", g.All().Minus(topology.MaskOf(3, 12))}} {
		for _, s := range v1alpha1.Strategies {
			for k := 1; k <= fr.free.Count(); k++ {
				b.Run(fmt.Sprintf("%s/%s/k=%d", fr.name, s, k), func(b *testing.B) {
					benchDecisions(b, g, fr.free, s, []int{k})
				})
			}
		}
	}
}

// BenchmarkAllocate_N64 is synthetic 64-GPU nodes, every strategy, each
// iteration one decision at the next k of 1..64: an NVSwitch node (every
// set ties), random NVLink graphs with near-equal bandwidths and a PCIe
// tree of many domains. Target: every decision within 10 ms.
func BenchmarkAllocate_N64(b *testing.B) {
	ks := make([]int, 64)
	for i := range ks {
		ks[i] = i + 1
	}
	for _, gr := range []struct {
		name string
		g    *topology.Graph
	}{
		{"nvswitch", machine.SyntheticNVSwitch(64)},
		{"random-nvlink-0.5", machine.SyntheticRandomNVLink(64, 0.5, 1)},
		{"random-nvlink-0.9", machine.SyntheticRandomNVLink(64, 0.9, 2)},
		{"pcie-tree", machine.SyntheticPCIe(64)},
	} {
		for _, s := range v1alpha1.Strategies {
			b.Run(fmt.Sprintf("%s/%s", gr.name, s), func(b *testing.B) {
				benchDecisions(b, gr.g, gr.g.All(), s, ks)
			})
		}
	}
}

// BenchmarkAllocate_N72 is synthetic 72-GPU nodes (an NVL72 domain seen as
// one node), searched through windows (wide.go), every strategy, each
// iteration one decision at the next k of 1..72: all GPUs free (the
// window of 64 chosen by shrink, heuristic) and with 10 busy (the window
// of the 62 free, exact within the budget). The NVSwitch node is also
// measured at topology.MaxGPUs. Target: every decision within 10 ms.
func BenchmarkAllocate_N72(b *testing.B) {
	for _, gr := range []struct {
		name string
		g    *topology.Graph
	}{
		{"nvswitch", machine.SyntheticNVSwitch(72)},
		{"random-nvlink-0.5", machine.SyntheticRandomNVLink(72, 0.5, 1)},
		{"random-nvlink-0.9", machine.SyntheticRandomNVLink(72, 0.9, 2)},
		{"pcie-tree", machine.SyntheticPCIe(72)},
		{"nvswitch-128", machine.SyntheticNVSwitch(topology.MaxGPUs)},
	} {
		for _, fr := range []struct {
			name string
			free topology.Mask
		}{{"all-free", gr.g.All()}, {"10-busy", gr.g.All().Minus(topology.MaskOf(0, 7, 13, 22, 31, 40, 47, 58, 64, 71))}} {
			ks := make([]int, fr.free.Count())
			for i := range ks {
				ks[i] = i + 1
			}
			for _, s := range v1alpha1.Strategies {
				b.Run(fmt.Sprintf("%s/%s/%s", gr.name, fr.name, s), func(b *testing.B) {
					benchDecisions(b, gr.g, fr.free, s, ks)
				})
			}
		}
	}
}

// BenchmarkAllocate_MemoHit is the cost of a repeated question: what a
// cluster of identical nodes pays per node after the first.
func BenchmarkAllocate_MemoHit(b *testing.B) {
	f := FixturesMust(b, "dgx2")
	a := New(1024)
	g := f.Graph("node-0")
	r := req(8, v1alpha1.StrategyHighestBandwidth)
	if _, err := a.Allocate(g, g.All(), r); err != nil {
		b.Fatal(err)
	}
	other := f.Graph("node-1") // identical machine: same hash
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Allocate(other, g.All(), r); err != nil {
			b.Fatal(err)
		}
	}
}
