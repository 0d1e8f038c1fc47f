package simulator

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/topology/machine"
)

// importedMachine is a real DGX-1 V100's `nvidia-smi topo -m`, imported by
// the topology package's golden test.
var importedMachine = filepath.Join("..", "topology", "machine", "testdata", "smi", "dgx1-v100.yaml")

func TestParseClusterTakesMachineFiles(t *testing.T) {
	nodes, err := ParseCluster(importedMachine + "=2,dgx-a100=1")
	if err != nil {
		t.Fatal(err)
	}
	var names, machines []string
	for _, n := range nodes {
		names, machines = append(names, n.Name), append(machines, n.Fixture)
	}
	if diff := cmp.Diff([]string{"dgx1-v100-0", "dgx1-v100-1", "dgx-a100-0"}, names); diff != "" {
		t.Errorf("node names (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"dgx1-v100", "dgx1-v100", "dgx-a100"}, machines); diff != "" {
		t.Errorf("machines (-want +got):\n%s", diff)
	}
	f, err := machine.Load(importedMachine)
	if err != nil {
		t.Fatal(err)
	}
	if nodes[0].Graph.Hash() != f.Graph("x").Hash() {
		t.Error("the node's graph is not the machine file's")
	}
	// The imported machine is read as printed: GPU 0 and 1 share a NUMA
	// node, not (as the built-in fixture has it) a PCIe switch.
	if got := nodes[0].Graph.Link(0, 1).PCIe; got != "SameNUMA" {
		t.Errorf("GPU 0-1 PCIe level %s; want the imported SameNUMA", got)
	}
}

func TestParseClusterRefusesClashingOrBrokenMachineFiles(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(importedMachine)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "copy.yaml")
	if err := os.WriteFile(copyPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, append(data, []byte("colour: red\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	for spec, want := range map[string]string{
		importedMachine + "=1," + copyPath + "=1": `are both named "dgx1-v100"`,
		importedMachine + "=1,dgx1-v100=1":        `are both named "dgx1-v100"`,
		broken + "=1":                             `unknown field "colour"`,
		filepath.Join(dir, "none.yaml") + "=1":    "none.yaml",
	} {
		if _, err := ParseCluster(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCluster(%q): %v; want an error containing %q", spec, err, want)
		}
	}
}

// `gputopo simulate --cluster mybox.yaml=N,...` end to end: the replay runs
// every policy on the imported machine beside a built-in one.
func TestSimulateRunsOnAnImportedMachine(t *testing.T) {
	var out strings.Builder
	err := Simulate(&out, Options{Cluster: importedMachine + "=3,dgx-a100=1", Trace: "gen:mixed:seed=3:jobs=60", Policies: []string{PolicyGputopo, "first-fit"}})
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	if !strings.Contains(text, "4 nodes, 32 GPUs") {
		t.Errorf("header does not count the imported nodes:\n%s", text)
	}
	for _, p := range []string{PolicyGputopo, "first-fit"} {
		if !strings.Contains(text, p) {
			t.Errorf("no row for %s:\n%s", p, text)
		}
	}
}
