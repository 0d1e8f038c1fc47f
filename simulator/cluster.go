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
}

// Named clusters the bundled traces are meant for.
const (
	// ClusterMixed is four of each common 8-GPU machine shape.
	ClusterMixed = "dgx-a100=4,dgx1-v100=4,pcie-8x=4,pcie-8x-nvlink-pairs=4"
	// ClusterDGX1 is four DGX-1 V100 (hybrid cube-mesh) nodes.
	ClusterDGX1 = "dgx1-v100=4"
)

// ParseCluster reads "machine=count,machine=count,...", where a machine is
// a built-in fixture name or the path of a machine file
// (machine.Load), e.g. "mybox.yaml=8,dgx-a100=4". Nodes are named
// "<machine name>-<i>" (a machine file's name field) and kept in the spec's
// order, which is the order every policy scans them in.
func ParseCluster(spec string) ([]Node, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, fmt.Errorf("cluster: empty; give machine=count pairs (a fixture name or a machine file), e.g. %q", ClusterMixed)
	}
	var nodes []Node
	seen := map[string]string{} // machine name -> entry that brought it
	for _, part := range strings.Split(spec, ",") {
		name, count, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("cluster: entry %q: want fixture=count or machine-file=count, e.g. dgx1-v100=4 or mybox.yaml=8", part)
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 || n > 10000 {
			return nil, fmt.Errorf("cluster: entry %q: count must be an integer 1..10000", part)
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
		for i := range n {
			nn := fmt.Sprintf("%s-%d", f.Name, i)
			nodes = append(nodes, Node{Name: nn, Fixture: f.Name, Graph: f.Graph(nn)})
		}
	}
	return nodes, nil
}
