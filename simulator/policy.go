package simulator

import (
	"errors"
	"fmt"
	"time"

	"github.com/gputopo/gputopo/topology/allocator"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/gputopo/gputopo/topology"
)

// Placement is where a policy put a job.
type Placement struct {
	Node int // index into the cluster's nodes
	GPUs topology.Mask
}

// Policy decides placements. The simulator owns the free-GPU state and
// passes it in; a policy that keeps its own state (the extender's ledger)
// learns of departures through Release and of given-up jobs through Drop.
type Policy interface {
	// Name is the policy's column in the report.
	Name() string
	// Place picks a node and exactly job.GPUs free GPUs on it; ok is false
	// when the job fits nowhere now. free[i] are node i's free GPUs.
	Place(job Job, free []topology.Mask) (p Placement, ok bool, err error)
	// Release is told that a placed job ended.
	Release(job Job, p Placement) error
	// Drop is told that a waiting job was given up.
	Drop(job Job) error
}

// clocked is a Policy that reads the simulated time: the engine sets it
// before each round of Place calls.
type clocked interface {
	SetTime(t time.Duration)
}

// Policy names, in report order.
const (
	PolicyGputopo   = "gputopo"
	PolicyOptimum   = "optimum"
	PolicyFirstFit  = "first-fit"
	PolicyPairSum   = "pair-sum"
	PolicyPartition = "partition"
	// PolicyGputopoNode is gputopo's node with the node's lowest free
	// GPUs: extender mode for pods that ask for GPUs through DRA claims,
	// whose devices upstream's allocator picks (docs/dra.md). Only with
	// --policy.
	PolicyGputopoNode = "gputopo-node"
)

// PolicyNames lists every policy Run knows.
var PolicyNames = []string{PolicyGputopo, PolicyOptimum, PolicyFirstFit, PolicyPairSum, PolicyPartition}

// PartitionLimit bounds the splits the partition baseline enumerates per
// decision. Splitting m free GPUs into groups of k has m!/((k!)^(m/k)
// (m/k)!) ways (105 for 8 GPUs in pairs, 2,027,025 for 16); past the limit
// the best split found so far is used, as a bounded implementation would.
const PartitionLimit = 100000

// newPolicy builds the named policy over nodes. ext and table configure
// gputopo (the optimum reads the same table); nil means the defaults.
func newPolicy(name string, nodes []Node, ext *configv1alpha1.ExtenderConfiguration, table *configv1alpha1.PolicyTable) (Policy, error) {
	t := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	if table != nil {
		t = *table
	}
	switch name {
	case PolicyGputopo:
		return newGputopoPolicy(nodes, ext, t)
	case PolicyGputopoNode:
		p, err := newGputopoPolicy(nodes, ext, t)
		if err != nil {
			return nil, err
		}
		p.nodeOnly = true
		for _, n := range nodes {
			p.graphs = append(p.graphs, n.Graph)
		}
		return p, nil
	case PolicyOptimum:
		return &optimum{nodes: nodes, table: t}, nil
	case PolicyFirstFit:
		return &firstFit{}, nil
	case PolicyPairSum:
		return &pairSum{nodes: nodes}, nil
	case PolicyPartition:
		return &partition{nodes: nodes}, nil
	}
	return nil, fmt.Errorf("policy %q: unknown; known policies are %v and %s", name, PolicyNames, PolicyGputopoNode)
}

// firstFit is kube-scheduler with a plain device plugin, counting GPUs
// only: the first node (in cluster order) with enough free GPUs, and the
// lowest free indices on it, as kubelet's device manager hands them out
// when the plugin states no preference.
type firstFit struct{ stateless }

var _ Policy = (*firstFit)(nil)

func (*firstFit) Name() string { return PolicyFirstFit }

func (*firstFit) Place(job Job, free []topology.Mask) (Placement, bool, error) {
	for i, f := range free {
		if f.Count() >= job.GPUs {
			return Placement{Node: i, GPUs: lowestK(f, job.GPUs)}, true, nil
		}
	}
	return Placement{}, false, nil
}

// stateless is the Release and Drop of a policy that keeps nothing
// between decisions: the baselines read only the free GPUs.
type stateless struct{}

func (stateless) Release(Job, Placement) error { return nil }
func (stateless) Drop(Job) error               { return nil }

func lowestK(m topology.Mask, k int) topology.Mask {
	var out topology.Mask
	for _, i := range m.Indices()[:k] {
		out = out.Union(topology.MaskOf(i))
	}
	return out
}

// onBestFit places job on the node bestFitNode picks, on the GPUs pick
// chooses among its free ones; ok is false when no node fits.
func onBestFit(nodes []Node, job Job, free []topology.Mask, pick func(g *topology.Graph, free topology.Mask, k int) topology.Mask) (Placement, bool, error) {
	n := bestFitNode(free, job.GPUs)
	if n < 0 {
		return Placement{}, false, nil
	}
	return Placement{Node: n, GPUs: pick(nodes[n].Graph, free[n], job.GPUs)}, true, nil
}

// bestFitNode is the node with the fewest free GPUs that still fit k
// (first in cluster order among equals): a count-only bin-packing node
// choice (kube-scheduler's MostAllocated scoring), -1 when none fits.
func bestFitNode(free []topology.Mask, k int) int {
	best := -1
	for i, f := range free {
		if c := f.Count(); c >= k && (best < 0 || c < free[best].Count()) {
			best = i
		}
	}
	return best
}

// pairSumOf is the sum of pair bandwidths (GB/s) inside set.
func pairSumOf(g *topology.Graph, set topology.Mask) int {
	idx := set.Indices()
	sum := 0
	for i, a := range idx {
		for _, b := range idx[i+1:] {
			sum += g.Bandwidth(a, b)
		}
	}
	return sum
}

// pairSum picks the node by count (best fit), then the k-subset of its free
// GPUs with the highest sum of pair bandwidths, lowest indices among equals.
// It knows links but not requirements: it never refuses a job that fits by
// count.
type pairSum struct {
	stateless
	nodes []Node
}

var _ Policy = (*pairSum)(nil)

func (*pairSum) Name() string { return PolicyPairSum }

func (p *pairSum) Place(job Job, free []topology.Mask) (Placement, bool, error) {
	return onBestFit(p.nodes, job, free, bestPairSum)
}

// bestPairSum is the k-subset of free with the highest pairSumOf, the
// first in lexicographic order among equals.
func bestPairSum(g *topology.Graph, free topology.Mask, k int) topology.Mask {
	best, bestSum := topology.Mask{}, -1
	forEachSubset(free.Indices(), k, func(set topology.Mask) {
		if s := pairSumOf(g, set); s > bestSum {
			best, bestSum = set, s
		}
	})
	return best
}

// forEachSubset calls f with every k-subset of idx in lexicographic order.
func forEachSubset(idx []int, k int, f func(topology.Mask)) {
	topology.Combinations(len(idx), k, func(pos []int) bool {
		var set topology.Mask
		for _, p := range pos {
			set = set.With(idx[p])
		}
		f(set)
		return true
	})
}

// partition is the best-effort policy as described for NVIDIA's
// go-gpuallocator: on the node chosen by count (best fit), split the free
// GPUs into groups of k in every way (the m mod k left over stay
// ungrouped), keep the split with the highest total of group scores (a
// group's score is its pair-bandwidth sum), and return that split's best
// group. At most PartitionLimit splits are scored per decision.
type partition struct {
	stateless
	nodes []Node
	// truncated counts decisions that hit PartitionLimit.
	truncated int
}

var _ Policy = (*partition)(nil)

func (*partition) Name() string { return PolicyPartition }

func (p *partition) Place(job Job, free []topology.Mask) (Placement, bool, error) {
	return onBestFit(p.nodes, job, free, func(g *topology.Graph, free topology.Mask, k int) topology.Mask {
		set, truncated := bestPartitionGroup(g, free, k, PartitionLimit)
		if truncated {
			p.truncated++
		}
		return set
	})
}

// bestPartitionGroup enumerates splits of free into groups of k (up to
// limit splits) and returns the best group of the best split, and whether
// the limit cut the enumeration short. Ties keep the first found, which
// favours lower indices.
func bestPartitionGroup(g *topology.Graph, free topology.Mask, k, limit int) (topology.Mask, bool) {
	idx := free.Indices()
	groups := len(idx) / k
	spare := len(idx) - groups*k
	var cur []topology.Mask
	var bestSplit []topology.Mask
	bestTotal, seen := -1, 0
	var rec func(rest topology.Mask, spare, total int)
	rec = func(rest topology.Mask, spare, total int) {
		if seen >= limit {
			return
		}
		if len(cur) == groups {
			seen++
			if total > bestTotal {
				bestTotal, bestSplit = total, append(bestSplit[:0], cur...)
			}
			return
		}
		lowest := rest.Indices()[0]
		others := rest.Minus(topology.MaskOf(lowest)).Indices()
		// The lowest remaining GPU starts a group with k-1 of the others...
		if k == 1 {
			cur = append(cur, topology.MaskOf(lowest))
			rec(rest.Minus(topology.MaskOf(lowest)), spare, total)
			cur = cur[:len(cur)-1]
		} else {
			forEachSubset(others, k-1, func(s topology.Mask) {
				grp := s.Union(topology.MaskOf(lowest))
				cur = append(cur, grp)
				rec(rest.Minus(grp), spare, total+pairSumOf(g, grp))
				cur = cur[:len(cur)-1]
			})
		}
		// ...or stays out of every group.
		if spare > 0 {
			rec(rest.Minus(topology.MaskOf(lowest)), spare-1, total)
		}
	}
	rec(free, spare, 0)
	best, bestScore := topology.Mask{}, -1
	for _, grp := range bestSplit {
		if s := pairSumOf(g, grp); s > bestScore {
			best, bestScore = grp, s
		}
	}
	return best, seen >= limit
}

// optimum is the exhaustive per-decision optimum under gputopo's own
// objective: every k-subset of every node's free GPUs that meets the
// job's requirement (allocator.BruteForce), the best by allocator.Objective
// across nodes, first node among equals. It is greedy per decision, not a
// clairvoyant schedule of the whole trace.
type optimum struct {
	nodes []Node
	table configv1alpha1.PolicyTable
}

var _ Policy = (*optimum)(nil)

func (*optimum) Name() string { return PolicyOptimum }

func (o *optimum) Place(job Job, free []topology.Mask) (Placement, bool, error) {
	req := topology.Request{Count: job.GPUs, Requirement: o.table.For(job.Parallelism).Requirement(int64(job.GPUs))}
	best := Placement{Node: -1}
	var bestScore allocator.Score
	for i, n := range o.nodes {
		if free[i].Count() < job.GPUs || n.Graph.Len() < job.GPUs {
			continue
		}
		res, err := allocator.BruteForce(n.Graph, free[i], req)
		var inf *topology.InfeasibleError
		switch {
		case errors.As(err, &inf):
			continue
		case err != nil:
			return Placement{}, false, fmt.Errorf("optimum on node %s: %w", n.Name, err)
		}
		set := topology.MaskOf(res.GPUs...)
		if sc := allocator.Objective(n.Graph, set, free[i], req); best.Node < 0 || keysBetter(sc, bestScore) {
			best, bestScore = Placement{Node: i, GPUs: set}, sc
		}
	}
	return best, best.Node >= 0, nil
}

// keysBetter compares two scores' keys only: across nodes, equal keys keep
// the earlier node rather than comparing index sets.
func keysBetter(a, b allocator.Score) bool {
	for i := range a.Keys {
		if a.Keys[i] != b.Keys[i] {
			return a.Keys[i] > b.Keys[i]
		}
	}
	return false
}

func (*optimum) Release(Job, Placement) error { return nil }
func (*optimum) Drop(Job) error               { return nil }
