package kubectlplugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// A node's domain in the picture is its tightest fabric level whose label
// it carries, else its topology's fabric clique at the NVLink level.
func TestFabricDomainIsTheTightestLabelledLevel(t *testing.T) {
	s := &Snapshot{Now: now, Config: configv1alpha1.DefaultExtenderConfiguration()}
	s.Topologies = []v1alpha1.NodeGPUTopology{
		topo(t, "pcie-8x", "leaf", now), topo(t, "pcie-8x", "both", now), topo(t, "pcie-8x", "none", now),
		topo(t, "gb200-nvl72-tray", "tray", now), topo(t, "gb200-nvl72-tray", "tray-labelled", now),
	}
	s.Nodes = []corev1.Node{
		node("leaf", 8, map[string]string{"network.topology.nvidia.com/leaf": "rack-1"}),
		node("both", 8, map[string]string{"network.topology.nvidia.com/spine": "s1", "fabric.topograph.run/tier-0": "rack-2"}),
		node("none", 8, map[string]string{"pool": "pcie"}),
		node("tray", 4, map[string]string{"network.topology.nvidia.com/leaf": "rack-3"}),
		node("tray-labelled", 4, map[string]string{"nvidia.com/gpu.clique": "c-9"}),
	}
	clique := s.Topologies[3].Status.GPUs[0].FabricClique
	for name, want := range map[string]string{
		"leaf": "leaf=rack-1", "both": "leaf=rack-2", "none": "", "tray": "nvlink=" + clique,
		"tray-labelled": "nvlink=c-9", "missing": "",
	} {
		if got := s.fabricDomain(name); got != want {
			t.Errorf("%s: domain %q, want %q", name, got, want)
		}
	}
	s.Config.Fabric.Levels = []configv1alpha1.FabricLevel{{Name: "pool", Labels: []string{"pool"}}}
	if got := s.fabricDomain("none"); got != "pool=pcie" {
		t.Errorf("configured levels: domain %q, want pool=pcie", got)
	}
}

// --svg draws the nodes grouped under their domains.
func TestSVGGroupsNodesByDomain(t *testing.T) {
	s := cluster(t)
	s.Nodes[0].Labels = map[string]string{"network.topology.nvidia.com/leaf": "rack-1"}
	path := filepath.Join(t.TempDir(), "nodes.svg")
	if err := writeSVGFile(path, s, s.gpuNodeNames()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	svg := string(b)
	for _, want := range []string{`data-node="a100" data-domain="leaf=rack-1"`, `data-node="pcie" data-domain=""`, ">leaf=rack-1<", ">no fabric domain<", ">PCIe switch 0<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the SVG has no %s", want)
		}
	}
}
