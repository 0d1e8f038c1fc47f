package simulator

import (
	"math"
	"sort"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// fabric is the cluster's network as the gang suite reads it: each node's
// domain at each of the configuration's fabric levels (from its labels,
// as the decision core's ledger reads them) and each level's bandwidth.
type fabric struct {
	nodes  []Node
	levels []configv1alpha1.FabricLevel
	// dom[i][l] is node i's domain at level l, "" for none.
	dom [][]string
	// leaf is the index of the "leaf" level (1 when no level is named so).
	leaf int
	// island[i] is node i's largest NVLink-connected set when idle.
	island []int
}

// fabricLevels are the levels of ext (the defaults when ext is nil or
// names none).
func fabricLevels(ext *configv1alpha1.ExtenderConfiguration) []configv1alpha1.FabricLevel {
	if ext != nil && ext.Fabric.Levels != nil {
		return ext.Fabric.Levels
	}
	return configv1alpha1.DefaultFabricLevels()
}

func newFabric(nodes []Node, levels []configv1alpha1.FabricLevel) *fabric {
	f := &fabric{nodes: nodes, levels: levels, dom: make([][]string, len(nodes)), leaf: 1, island: make([]int, len(nodes))}
	if i, ok := configv1alpha1.FabricLevelIndex(levels, "leaf"); ok {
		f.leaf = i
	}
	for i, n := range nodes {
		d := make([]string, len(levels))
		for l, lv := range levels {
			for _, k := range lv.Labels {
				if v := n.Labels[k]; v != "" {
					d[l] = k + "=" + v
					break
				}
			}
		}
		// As the ledger: at the first level a node without a label is in
		// its GPUs' fabric clique, if they report one.
		if len(d) > 0 && d[0] == "" && n.Graph.Len() > 0 {
			if c := n.Graph.GPU(0).FabricClique; c != "" {
				d[0] = "clique=" + c
			}
		}
		f.dom[i] = d
		all := n.Graph.All().Intersect(n.Graph.Healthy())
		f.island[i] = n.Graph.Metrics(topology.Mask{}, all).LeftLargestIsland
	}
	return f
}

// sharedLevel is the tightest fabric level at which every node of idx is
// in one domain; len(levels) when they share none.
func (f *fabric) sharedLevel(idx []int) int {
	for l := range f.levels {
		d := f.dom[idx[0]][l]
		if d == "" {
			continue
		}
		all := true
		for _, i := range idx[1:] {
			if f.dom[i][l] != d {
				all = false
				break
			}
		}
		if all {
			return l
		}
	}
	return len(f.levels)
}

// Where a group's pods are, from tight to loose, in the extended levels
// the gang policies walk: one node, then each fabric level, then the
// whole cluster.
func (f *fabric) extLevels() int { return len(f.levels) + 2 }

// extKey is node i's domain at extended level x (0: the node itself,
// 1..len(levels): the fabric levels, len(levels)+1: the cluster). A node
// without a domain at a fabric level is a domain of its own there, as in
// the core's planner.
func (f *fabric) extKey(i, x int) string {
	switch {
	case x == 0:
		return "node=" + f.nodes[i].Name
	case x > len(f.levels):
		return "cluster"
	}
	if d := f.dom[i][x-1]; d != "" {
		return d
	}
	return "node=" + f.nodes[i].Name
}

// extName names extended level x.
func (f *fabric) extName(x int) string {
	switch {
	case x == 0:
		return "node"
	case x > len(f.levels):
		return "cluster"
	}
	return f.levels[x-1].Name
}

// domainsAt groups the nodes of idx (in their order) into their domains
// at extended level x, each domain's nodes in idx order.
func (f *fabric) domainsAt(idx []int, x int) [][]int {
	return topology.PartitionBy(idx, func(i int) string { return f.extKey(i, x) })
}

// nvlinkPods is the most pods of gpus GPUs each that one NVLink domain of
// the idle cluster holds, every pod on an NVLink-connected set: a
// multi-node NVLink domain (one domain at the first fabric level), or a
// node outside any.
func (f *fabric) nvlinkPods(gpus int) int {
	if gpus < 1 {
		return 0
	}
	per := map[string]int{}
	best := 0
	for i := range f.nodes {
		k := "node=" + f.nodes[i].Name
		if len(f.levels) > 0 && f.dom[i][0] != "" {
			k = f.dom[i][0]
		}
		per[k] += f.island[i] / gpus
		best = max(best, per[k])
	}
	return best
}

// groupShape is where a placed group's pods are and what they get.
type groupShape struct {
	// Level is the tightest extended level the pods share (see extName).
	Level string
	// NVLink: every pod talks to every other over NVLink: all on one node
	// whose GPUs they hold together are NVLink-connected, or all in one
	// multi-node NVLink domain on NVLink-connected sets.
	NVLink bool
	// Leaf: all on one node, in one NVLink domain or under one leaf.
	Leaf bool
	// PodsNVLink: every pod of more than one GPU is on an
	// NVLink-connected set inside its node.
	PodsNVLink bool
	// GBps is the group bandwidth (docs/benchmarks.md): the lowest of
	// every pod's in-node ring and, across nodes, the bandwidth of the
	// tightest fabric level the pods share.
	GBps float64
}

func nvlinkTier(t v1alpha1.LinkTier) bool {
	return t == v1alpha1.TierNVLink || t == v1alpha1.TierNVSwitch
}

// shape measures a group placed on pods.
func (f *fabric) shape(pods []Placement) groupShape {
	var idx []int
	seen := map[int]bool{}
	bw := math.Inf(1)
	podsNV := true
	for _, p := range pods {
		if !seen[p.Node] {
			seen[p.Node] = true
			idx = append(idx, p.Node)
		}
		g := f.nodes[p.Node].Graph
		m := g.Metrics(p.GPUs, p.GPUs)
		bw = math.Min(bw, float64(podGBps(g, p.GPUs, m)))
		if p.GPUs.Count() > 1 && !nvlinkTier(m.Tier) {
			podsNV = false
		}
	}
	sort.Ints(idx)
	s := groupShape{PodsNVLink: podsNV}
	if len(idx) == 1 {
		var all topology.Mask
		for _, p := range pods {
			all = all.Union(p.GPUs)
		}
		g := f.nodes[idx[0]].Graph
		s.Level, s.Leaf = "node", true
		s.NVLink = all.Count() < 2 || nvlinkTier(g.Metrics(all, all).Tier)
		s.GBps = bw
		return s
	}
	l := f.sharedLevel(idx)
	s.Level = f.extName(l + 1)
	s.NVLink = l == 0 && podsNV
	s.Leaf = l == 0 || l <= f.leaf
	cap := float64(configv1alpha1.CrossZoneBandwidthGBps)
	if l < len(f.levels) {
		cap = float64(f.levels[l].BandwidthGBps)
		if l == 0 && cap == 0 {
			// The NVLink level: pods talk at their GPUs' own NVLink speed.
			cap = math.Inf(1)
		}
	}
	s.GBps = math.Min(bw, cap)
	return s
}

// podGBps is one pod's in-node bandwidth: its set's ring, or for one GPU
// the GPU's fastest link on the node (its NVLink-domain speed where it
// has NVLink).
func podGBps(g *topology.Graph, set topology.Mask, m topology.SetMetrics) int {
	if set.Count() > 1 {
		return m.RingGBps
	}
	idx := set.Indices()
	best := 0
	for b := range g.Len() {
		if len(idx) == 1 && b != idx[0] {
			best = max(best, g.Bandwidth(idx[0], b))
		}
	}
	return best
}
