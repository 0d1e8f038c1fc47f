package allocator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// wideTwin builds a node of n > 64 GPUs and, independently through
// topology.NewGraph, the node of its first 64 GPUs with the same links: with GPUs
// 64.. busy, the large node must answer exactly as the small one.
func wideTwin(t *testing.T, n int, seed uint64) (big, small *topology.Graph) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 11))
	gpus := machine.SyntheticGPUs("twin", n)
	links := make([]v1alpha1.Link, 0, n*(n-1)/2)
	for a := 0; a < n; a++ {
		gpus[a].NUMANode = a * 2 / topology.WindowGPUs % 2
		for b := a + 1; b < n; b++ {
			lvl := v1alpha1.PCIeCrossSocket
			if b < topology.WindowGPUs {
				lvl = machine.SyntheticPCIeLevel(topology.WindowGPUs, a, b)
			}
			l := v1alpha1.Link{A: a, B: b, PCIe: lvl, P2P: true, BandwidthGBps: machine.PCIeBandwidthGBps(5, lvl)}
			if rng.Float64() < 0.6 {
				l.NVLinks = 1 + rng.IntN(4)
				l.BandwidthGBps = 50 * l.NVLinks
			}
			links = append(links, l)
		}
	}
	var err error
	if big, err = topology.NewGraph(gpus, links); err != nil {
		t.Fatal(err)
	}
	var smallLinks []v1alpha1.Link
	for _, l := range links {
		if l.B < topology.WindowGPUs {
			smallLinks = append(smallLinks, l)
		}
	}
	if small, err = topology.NewGraph(gpus[:topology.WindowGPUs], smallLinks); err != nil {
		t.Fatal(err)
	}
	return big, small
}

// A large node with at most 64 free GPUs is searched through the window of
// its free GPUs: the answer, its metrics and its exactness are those of
// the same machine built without the busy GPUs.
func TestLargeNodeWithFewFreeGPUsAnswersAsTheSmallNode(t *testing.T) {
	for _, n := range []int{72, topology.MaxGPUs} {
		big, small := wideTwin(t, n, uint64(n))
		rng := rand.New(rand.NewPCG(3, uint64(n)))
		for trial := 0; trial < 12; trial++ {
			free := maskBits(rng.Uint64() | rng.Uint64()) // GPUs 64.. busy
			for _, s := range v1alpha1.Strategies {
				for _, k := range []int{1, 2, 4, 8} {
					if k > free.Count() {
						continue
					}
					util := make([]int32, n)
					for i := range util {
						util[i] = int32(rng.IntN(101))
					}
					r := topology.Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s, RequireNVLink: trial%3 == 0}}
					bigReq, smallReq := r, r
					bigReq.Utilization, smallReq.Utilization = util, util[:topology.WindowGPUs]
					got, gotErr := New(0).Allocate(big, free, bigReq)
					want, wantErr := New(0).Allocate(small, free, smallReq)
					name := fmt.Sprintf("n=%d trial %d %s k=%d nvlink=%t", n, trial, s, k, r.Requirement.RequireNVLink)
					if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != strings.Replace(wantErr.Error(), "of 64 are free", fmt.Sprintf("of %d are free", n), 1)) {
						t.Fatalf("%s: large node %v; small node %v", name, gotErr, wantErr)
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Fatalf("%s (-small +large):\n%s", name, diff)
					}
					if gotErr == nil {
						m := big.Metrics(topology.MaskOf(got.GPUs...), free)
						if got.Heuristic {
							// A heuristic answer may report the best ring its
							// budget found (topology.Result.Heuristic).
							m.RingGBps = got.Metrics.RingGBps
						}
						if m != got.Metrics {
							t.Fatalf("%s: Metrics %+v; the allocation reported %+v", name, m, got.Metrics)
						}
						if a, b := Objective(big, topology.MaskOf(got.GPUs...), free, bigReq), Objective(small, topology.MaskOf(want.GPUs...), free, smallReq); a != b {
							t.Fatalf("%s: Objective %s on the large node, %s on the small", name, a, b)
						}
					}
				}
			}
		}
	}
}

// With more than 64 GPUs free, every request is answered, meets its
// requirement, reports the metrics Metrics computes and says it is a
// heuristic answer; on an NVSwitch node (every set optimal) it is as good
// as any.
func TestLargeNodeWithManyFreeGPUsAnswersEveryRequest(t *testing.T) {
	graphs := []struct {
		name string
		g    *topology.Graph
	}{
		{"nvswitch-72", machine.SyntheticNVSwitch(72)},
		{"random-nvlink-0.5-72", machine.SyntheticRandomNVLink(72, 0.5, 1)},
		{"random-nvlink-0.9-72", machine.SyntheticRandomNVLink(72, 0.9, 2)},
		{"pcie-tree-72", machine.SyntheticPCIe(72)},
		{"nvswitch-128", machine.SyntheticNVSwitch(topology.MaxGPUs)},
	}
	ks := []int{1, 2, 4, 8, 16, 33, 64, 65, 71, 72, 100, 128}
	if testing.Short() {
		ks = []int{1, 8, 65, 72}
	}
	for _, gr := range graphs {
		g := gr.g
		for _, s := range v1alpha1.Strategies {
			for _, k := range ks {
				if k > g.Len() {
					continue
				}
				for _, r := range []v1alpha1.Requirement{{Strategy: s}, {Strategy: s, RequireNVLink: true}, {Strategy: s, MinPairBandwidthGBps: 100}} {
					req := topology.Request{Count: k, Requirement: r, Utilization: benchUtil(g.Len())}
					name := fmt.Sprintf("%s %s k=%d %+v", gr.name, s, k, r)
					res, err := New(0).Allocate(g, g.All(), req)
					if err != nil {
						var inf *topology.InfeasibleError
						if !errors.As(err, &inf) || !strings.Contains(gr.name, "random") && !strings.Contains(gr.name, "pcie") {
							t.Fatalf("%s: %v", name, err)
						}
						continue
					}
					checkAnswer(t, name, g, g.All(), req, res)
					if k < g.Len() && !res.Heuristic {
						t.Errorf("%s: an answer from a window of the free GPUs must say Heuristic", name)
					}
					if k == g.Len() && res.Heuristic {
						t.Errorf("%s: taking every GPU is exact", name)
					}
					if strings.HasPrefix(gr.name, "nvswitch") && (res.Metrics.Tier != v1alpha1.TierNVSwitch && k > 1 || res.Metrics.MinPairGBps != 900 && k > 1) {
						t.Errorf("%s: %+v; every NVSwitch set is 900 GB/s", name, res.Metrics)
					}
				}
			}
		}
	}
}

// What a PCIe-only large node cannot give is refused with a reason a
// person can act on, and a request beyond the node names both counts.
func TestLargeNodeRefusalsNameTheCause(t *testing.T) {
	g := machine.SyntheticPCIe(72)
	a := New(0)
	_, err := a.Allocate(g, g.All(), topology.Request{Count: 8, Requirement: v1alpha1.Requirement{RequireNVLink: true}})
	var inf *topology.InfeasibleError
	if !errors.As(err, &inf) || !strings.Contains(inf.Reason, "needs NVLink between 8 GPUs; largest free NVLink-connected set has 1") {
		t.Errorf("NVLink on PCIe: %v", err)
	}
	_, err = a.Allocate(g, g.All(), topology.Request{Count: 70, Requirement: v1alpha1.Requirement{RequireNVLink: true}})
	if !errors.As(err, &inf) || !strings.Contains(inf.Reason, "needs 70 GPUs meeting the requirement") {
		t.Errorf("70 NVLinked GPUs on PCIe: %v", err)
	}
	_, err = a.Allocate(g, g.All().Minus(topology.MaskOf(0, 1)), topology.Request{Count: 72})
	if !errors.As(err, &inf) || inf.Reason != "needs 72 GPUs; 70 of 72 are free" {
		t.Errorf("72 of 70 free: %v", err)
	}
	if _, err := a.Allocate(g, g.All(), topology.Request{Count: 73}); err == nil || !strings.Contains(err.Error(), "73 GPUs requested but the node has 72") {
		t.Errorf("73 on a 72-GPU node: %v", err)
	}
	if _, err := BruteForce(g, g.All(), topology.Request{Count: 2}); err == nil || !strings.Contains(err.Error(), "72 free GPUs; the reference search takes at most 64") {
		t.Errorf("brute force over 72 free GPUs: %v", err)
	}
}

func TestLowerIndicesMaskOrdersSets(t *testing.T) {
	m := topology.MaskOf(5, 0, 63, 5, 64, 127, 128, -1)
	// Lower index lists sort first, across the word boundary too.
	if !lowerIndicesMask(topology.MaskOf(1, 70), topology.MaskOf(1, 80)) || lowerIndicesMask(topology.MaskOf(2, 3), topology.MaskOf(1, 90)) || lowerIndicesMask(m, m) {
		t.Error("lowerIndicesMask orders sets wrongly")
	}
}
