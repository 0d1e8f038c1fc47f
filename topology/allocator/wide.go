package allocator

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Graphs of more than WindowGPUs GPUs (up to MaxGPUs) are not searched
// directly: the search's sets are one machine word. Instead a decision
// looks at a window, the graph induced on at most WindowGPUs of the node's
// GPUs, with the same links, domains and health:
//
//   - With at most WindowGPUs free GPUs (a large node in use), the window is
//     the free GPUs. Every set the node could give is inside it and every
//     key of the objective depends only on free GPUs, so the answer is the
//     same as a direct search would give (exact unless the work budget ran
//     out, as on any node).
//   - With more free GPUs, shrink drops free GPUs until WindowGPUs remain
//     (those that cannot be chosen first, then those with the most partners
//     they may not be chosen with, then the least connected, then the
//     highest index), and the window is the rest. A better set may use a
//     dropped GPU, so the answer is marked Heuristic. A request for more
//     than WindowGPUs GPUs takes what shrink leaves of the free GPUs at that
//     count, checked against the requirement.
//
// The metrics of a set on a large graph are the model's (Graph.Metrics).
// docs/topology.md has the figures.

// windowBits is m's GPUs among idx (a window's index map) as the window's
// Bitset.
func windowBits(m topology.Mask, idx []int) topology.Bitset {
	var b topology.Bitset
	for i, gi := range idx {
		if m.Has(gi) {
			b |= 1 << i
		}
	}
	return b
}

// windowRequest is req with its utilization renumbered for the window.
func windowRequest(req topology.Request, idx []int) topology.Request {
	if req.Utilization != nil {
		u := make([]int32, len(idx))
		for i, gi := range idx {
			u[i] = req.Utilization[gi]
		}
		req.Utilization = u
	}
	return req
}

// allocateWide answers a request on a graph of more than WindowGPUs GPUs;
// free is already limited to healthy GPUs.
func (a *Allocator) allocateWide(g *topology.Graph, free topology.Mask, req topology.Request) (topology.Result, error) {
	k, r := req.Count, req.Requirement
	if c := free.Count(); c < k {
		return topology.Result{}, tooFewFree(g, k, c)
	}
	if c := free.Count(); c == k && c > topology.WindowGPUs {
		// Only one set: every free GPU.
		if !meets(g, free, r) {
			return topology.Result{}, &topology.InfeasibleError{Reason: fmt.Sprintf("needs %d GPUs meeting the requirement; the only %d free GPUs do not meet it", k, c)}
		}
		return topology.Result{GPUs: g.RingOrder(free), Metrics: g.Metrics(free, free)}, nil
	}
	if free.Count() <= topology.WindowGPUs {
		w, idx := g.Window(free)
		res, err := a.allocate(w, w.All().Bitset(), windowRequest(req, idx))
		if err != nil {
			return topology.Result{}, err
		}
		for i, l := range res.GPUs {
			res.GPUs[i] = idx[l]
		}
		return res, nil
	}
	if k > topology.WindowGPUs {
		set := shrink(g, free, k, r)
		if !meets(g, set, r) {
			return topology.Result{}, &topology.InfeasibleError{Reason: fmt.Sprintf(
				"needs %d GPUs meeting the requirement; none found among %d free GPUs within the search bound of a node of more than %d GPUs",
				k, free.Count(), topology.WindowGPUs)}
		}
		m := g.Metrics(set, free)
		return topology.Result{GPUs: g.RingOrder(set), Metrics: m, Heuristic: true}, nil
	}
	pool := shrink(g, free, topology.WindowGPUs, r)
	w, idx := g.Window(pool)
	res, err := a.allocate(w, w.All().Bitset(), windowRequest(req, idx))
	if err != nil {
		var inf *topology.InfeasibleError
		if errors.As(err, &inf) {
			inf.Reason += fmt.Sprintf(" (among the %d best-placed of %d free GPUs)", topology.WindowGPUs, free.Count())
		}
		return topology.Result{}, err
	}
	var set topology.Mask
	for i, l := range res.GPUs {
		res.GPUs[i] = idx[l]
		set = set.With(idx[l])
	}
	res.Metrics = g.MetricsWithRing(set, free, res.Metrics.RingGBps)
	res.Heuristic = true
	return res, nil
}

// shrink drops GPUs of free until target remain, worst first: a GPU with
// too little memory, then the one with the most partners it may not be
// chosen with (no NVLink under requireNVLink, a pair below
// minPairBandwidthGBps), then the one with the least bandwidth to the
// others, then the highest index. O(|free|^2).
func shrink(g *topology.Graph, free topology.Mask, target int, r v1alpha1.Requirement) topology.Mask {
	idx := free.Indices()
	n := len(idx)
	conflicts := make([]int, n)
	sum := make([]int64, n)
	alive := make([]bool, n)
	for i, a := range idx {
		alive[i] = true
		if r.GPUMemoryMiB > 0 && g.GPU(a).MemoryMiB < r.GPUMemoryMiB {
			conflicts[i] = n * n // below every GPU that may be chosen
		}
		for _, b := range idx {
			if a == b {
				continue
			}
			sum[i] += int64(g.BW(a, b))
			if !pairAllowed(g, a, b, r) {
				conflicts[i]++
			}
		}
	}
	for left := n; left > target; left-- {
		worst := -1
		for i := n - 1; i >= 0; i-- {
			if !alive[i] {
				continue
			}
			if worst < 0 || conflicts[i] > conflicts[worst] ||
				(conflicts[i] == conflicts[worst] && sum[i] < sum[worst]) {
				worst = i
			}
		}
		alive[worst] = false
		a := idx[worst]
		for i, b := range idx {
			if !alive[i] {
				continue
			}
			sum[i] -= int64(g.BW(a, b))
			if !pairAllowed(g, a, b, r) {
				conflicts[i]--
			}
		}
	}
	var out topology.Mask
	for i, a := range idx {
		if alive[i] {
			out = out.With(a)
		}
	}
	return out
}

// pairAllowed reports whether a and b may be chosen together under r.
func pairAllowed(g *topology.Graph, a, b int, r v1alpha1.Requirement) bool {
	return (!r.RequireNVLink || g.NVLinked(a, b)) && g.BW(a, b) >= r.MinPairBandwidthGBps
}

// lowerIndicesMask is lowerIndices over Masks.
func lowerIndicesMask(a, b topology.Mask) bool {
	for i := range topology.MaxGPUs / 64 {
		if x, y := a.Word(i), b.Word(i); x != y {
			return bits.Reverse64(x) > bits.Reverse64(y)
		}
	}
	return false
}
