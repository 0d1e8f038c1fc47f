package simulator

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// Node is one simulated GPU node: a machine (a built-in fixture or a
// machine file) under a unique name.
type Node struct {
	Name string
	// Fixture is the machine's name: the fixture's, or the name field of
	// the machine file.
	Fixture string
	Graph   *topology.Graph
	// Labels are the node's labels: the fabric domains a cluster spec
	// gives it (see ParseCluster); nil when it gives none.
	Labels map[string]string
}

// Named clusters the bundled traces are meant for.
const (
	// ClusterMixed is four of each common 8-GPU machine shape.
	ClusterMixed = "dgx-a100=4,dgx1-v100=4,pcie-8x=4,pcie-8x-nvlink-pairs=4"
	// ClusterDGX1 is four DGX-1 V100 (hybrid cube-mesh) nodes.
	ClusterDGX1 = "dgx1-v100=4"
)

// Fabric label keys ParseCluster writes: the GPU Feature Discovery clique
// of a multi-node NVLink domain, and the leaf and spine switches as
// NVIDIA's topograph names them (the first keys of the default
// fabric.levels).
const (
	LabelClique = "nvidia.com/gpu.clique"
	LabelLeaf   = "network.topology.nvidia.com/leaf"
	LabelSpine  = "network.topology.nvidia.com/spine"
)

// ParseCluster reads "machine=count,machine=count,...", where a machine is
// a built-in fixture name or the path of a machine file
// (machine.Load), e.g. "mybox.yaml=8,dgx-a100=4". Nodes are named
// "<machine name>-<i>" (a machine file's name field) and kept in the spec's
// order, which is the order every policy scans them in.
//
// An entry may place its nodes in a fabric: "machine=count/rack=R/leaf=L"
// puts each R consecutive nodes of the entry in one multi-node NVLink
// domain (one LabelClique value, and the same fabric clique on their
// GPUs) and each L consecutive nodes under one leaf switch (LabelLeaf); a
// cluster-wide ";spine=S" after the entries puts each S consecutive leaf
// switches, in the spec's order, under one spine (LabelSpine). Without
// these the nodes carry no labels, e.g.
// "gb200-nvl72-tray=72/rack=18/leaf=36,hgx-h100=16/leaf=8;spine=2".
func ParseCluster(spec string) ([]Node, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, fmt.Errorf("cluster: empty; give machine=count pairs (a fixture name or a machine file), e.g. %q", ClusterMixed)
	}
	entries, global, _ := strings.Cut(spec, ";")
	spine := 0
	for _, kv := range strings.Split(global, ";") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		v, ok := strings.CutPrefix(kv, "spine=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 1 || n > 10000 {
			return nil, fmt.Errorf("cluster: %q after ';': want spine=S, the leaf switches per spine (1..10000)", kv)
		}
		spine = n
	}
	var nodes []Node
	seen := map[string]string{} // machine name -> entry that brought it
	leaves := 0                 // leaf switches so far, across entries
	for _, part := range strings.Split(entries, ",") {
		name, rest, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("cluster: entry %q: want fixture=count or machine-file=count, e.g. dgx1-v100=4 or mybox.yaml=8", part)
		}
		count, attrs, _ := strings.Cut(rest, "/")
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 || n > 10000 {
			return nil, fmt.Errorf("cluster: entry %q: count must be an integer 1..10000", part)
		}
		rack, leaf := 0, 0
		if attrs != "" {
			for _, kv := range strings.Split(attrs, "/") {
				k, v, _ := strings.Cut(kv, "=")
				a, err := strconv.Atoi(v)
				if err != nil || a < 1 || a > 10000 || (k != "rack" && k != "leaf") {
					return nil, fmt.Errorf("cluster: entry %q: %q: want rack=R (nodes per NVLink domain) or leaf=L (nodes per leaf switch), 1..10000", part, kv)
				}
				if k == "rack" {
					rack = a
				} else {
					leaf = a
				}
			}
		}
		if spine > 0 && leaf == 0 {
			return nil, fmt.Errorf("cluster: entry %q: spine=%d needs leaf=L on every entry (a spine joins leaf switches)", part, spine)
		}
		f, err := machine.Load(name)
		if err != nil {
			return nil, fmt.Errorf("cluster: entry %q: %w", part, err)
		}
		if prev, dup := seen[f.Name]; dup {
			if prev == name {
				return nil, fmt.Errorf("cluster: machine %q listed twice; sum the counts into one entry", name)
			}
			return nil, fmt.Errorf("cluster: entries %q and %q are both named %q; node names would clash, so give one machine file another name", prev, name, f.Name)
		}
		seen[f.Name] = name
		first := leaves
		for i := range n {
			nn := fmt.Sprintf("%s-%d", f.Name, i)
			node := Node{Name: nn, Fixture: f.Name}
			fi := f
			if rack > 0 || leaf > 0 {
				node.Labels = map[string]string{}
			}
			if rack > 0 {
				// One NVLink domain per rack: its own clique ID, on the
				// label and on every GPU, as GPU Feature Discovery and
				// NVML report it.
				c := fmt.Sprintf("%s-rack-%d.1", f.Name, i/rack)
				node.Labels[LabelClique] = c
				fi.FabricClique = c
			}
			if leaf > 0 {
				l := first + i/leaf
				leaves = max(leaves, l+1)
				node.Labels[LabelLeaf] = fmt.Sprintf("leaf-%d", l)
				if spine > 0 {
					node.Labels[LabelSpine] = fmt.Sprintf("spine-%d", l/spine)
				}
			}
			node.Graph = fi.Graph(nn)
			nodes = append(nodes, node)
		}
	}
	return nodes, nil
}
