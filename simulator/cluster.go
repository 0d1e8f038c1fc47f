package simulator

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/topology"
)

// Node is one simulated GPU node: a fixture machine under a unique name.
type Node struct {
	Name    string
	Fixture string
	Graph   *topology.Graph
}

// Named clusters the bundled traces are meant for.
const (
	// ClusterMixed is four of each common 8-GPU machine shape.
	ClusterMixed = "dgx-a100=4,dgx1-v100=4,pcie-8x=4,pcie-8x-nvlink-pairs=4"
	// ClusterDGX1 is four DGX-1 V100 (hybrid cube-mesh) nodes.
	ClusterDGX1 = "dgx1-v100=4"
)

// ParseCluster reads "fixture=count,fixture=count,...". Nodes are named
// "<fixture>-<i>" and kept in the spec's order, which is the order every
// policy scans them in.
func ParseCluster(spec string) ([]Node, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, fmt.Errorf("cluster: empty; give fixture=count pairs, e.g. %q", ClusterMixed)
	}
	var nodes []Node
	seen := map[string]bool{}
	for _, part := range strings.Split(spec, ",") {
		name, count, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("cluster: entry %q: want fixture=count, e.g. dgx1-v100=4", part)
		}
		if seen[name] {
			return nil, fmt.Errorf("cluster: fixture %q listed twice; sum the counts into one entry", name)
		}
		seen[name] = true
		f, err := topology.FixtureByName(name)
		if err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 || n > 10000 {
			return nil, fmt.Errorf("cluster: entry %q: count must be an integer 1..10000", part)
		}
		for i := range n {
			nn := fmt.Sprintf("%s-%d", name, i)
			nodes = append(nodes, Node{Name: nn, Fixture: name, Graph: f.Graph(nn)})
		}
	}
	return nodes, nil
}
