package machine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Every built-in fixture written as a machine file reads back to exactly the
// same machine: same GPUs, links, NUMA nodes and bus IDs, so the same graph.
func TestMachineFileRoundTripsEveryFixture(t *testing.T) {
	for _, fx := range Fixtures() {
		t.Run(fx.Name, func(t *testing.T) {
			data, err := fx.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(data)
			if err != nil {
				t.Fatalf("parse:\n%s\n%v", data, err)
			}
			wantG, wantL := fx.Parts("node")
			gotG, gotL := back.Parts("node")
			if diff := cmp.Diff(wantG, gotG); diff != "" {
				t.Errorf("GPUs (-fixture +file):\n%s", diff)
			}
			if diff := cmp.Diff(wantL, gotL); diff != "" {
				t.Errorf("links (-fixture +file):\n%s", diff)
			}
			if fx.Graph("node").Hash() != back.Graph("node").Hash() {
				t.Error("graph hash differs")
			}
		})
	}
}

const minimalMachine = `apiVersion: gputopo.io/v1alpha1
kind: Machine
name: mybox
model: NVIDIA A100-SXM4-80GB
gpus: 4
memoryMiB: 81920
nvlink:
  generation: 3
  pairs:
  - {a: 0, b: 1, links: 12}
  - {a: 2, b: 3, links: 12}
pcie:
  generation: 4
  levels:
  - "X    PIX  SYS  SYS"
  - "PIX  X    SYS  SYS"
  - "SYS  SYS  X    PXB"
  - "SYS  SYS  PXB  X"
numaNodes: [0, 0, 1, 1]
nics:
- {name: mlx5_0, pcie: "PIX PIX SYS SYS"}
`

func TestParseMachineReadsExplicitLevelsNUMAAndNICs(t *testing.T) {
	f, err := Parse([]byte(minimalMachine))
	if err != nil {
		t.Fatal(err)
	}
	g := f.Graph("n")
	if l := g.Link(0, 1); l.NVLinks != 12 || l.BandwidthGBps != 600 || l.PCIe != "SameSwitch" {
		t.Errorf("GPU 0-1: %+v; want 12 NVLinks, 600 GB/s, SameSwitch", l)
	}
	if l := g.Link(2, 3); l.PCIe != "MultipleSwitches" {
		t.Errorf("GPU 2-3: %+v; want MultipleSwitches", l)
	}
	if l := g.Link(1, 2); l.NVLinks != 0 || l.PCIe != "CrossSocket" || l.BandwidthGBps != PCIeBandwidthGBps(4, "CrossSocket") {
		t.Errorf("GPU 1-2: %+v; want a PCIe cross-socket pair", l)
	}
	if got := []int{g.GPUs()[0].NUMANode, g.GPUs()[3].NUMANode}; got[0] != 0 || got[1] != 1 {
		t.Errorf("NUMA nodes %v; want 0 and 1", got)
	}
	if len(f.NICs) != 1 || f.NICs[0].Name != "mlx5_0" || f.NICs[0].PCIe[1] != "SameSwitch" {
		t.Errorf("NICs %+v", f.NICs)
	}
}

func TestParseMachineRefusesBadFilesNamingTheField(t *testing.T) {
	edit := func(old, new string) string {
		if !strings.Contains(minimalMachine, old) {
			t.Fatalf("base has no %q", old)
		}
		return strings.Replace(minimalMachine, old, new, 1)
	}
	for _, c := range []struct {
		name string
		file string
		want []string
	}{
		{"unknown top-level field", minimalMachine + "color: red\n", []string{`unknown field "color"`}},
		{"unknown nested field with its path", edit("  generation: 3\n", "  generation: 3\n  speed: 50\n"), []string{`unknown field "nvlink.speed"`}},
		{"unknown field in a list item", edit("{name: mlx5_0,", "{name: mlx5_0, port: 1,"), []string{`unknown field "nics[0].port"`}},
		{"duplicate key", minimalMachine + "gpus: 8\n", []string{"gpus", "already set"}},
		{"asymmetric levels", edit(`"SYS  SYS  PXB  X"`, `"SYS  SYS  PIX  X"`), []string{"pcie.levels[2][3]", "pcie.levels[3][2] says PIX", "symmetric"}},
		{"unknown level token", edit(`"PIX  X    SYS  SYS"`, `"PIX  X    QPI  SYS"`), []string{"pcie.levels[1][2]", `"QPI"`}},
		{"short level row", edit(`"PIX  X    SYS  SYS"`, `"PIX  X    SYS"`), []string{"pcie.levels[1]", "3 cells for 4 GPUs"}},
		{"diagonal not X", edit(`"X    PIX  SYS  SYS"`, `"PIX  PIX  SYS  SYS"`), []string{"pcie.levels[0][0]", "must be X"}},
		{"missing NVLink generation", edit("  generation: 3\n", ""), []string{"nvlink.generation", "NVLink generation is needed"}},
		{"pair out of range", edit("{a: 2, b: 3, links: 12}", "{a: 2, b: 4, links: 12}"), []string{"nvlink.pairs[1]", "0..3"}},
		{"pair listed twice", edit("{a: 2, b: 3, links: 12}", "{a: 1, b: 0, links: 12}"), []string{"nvlink.pairs[1]", "also pairs[0]"}},
		{"NUMA nodes not one per GPU", edit("[0, 0, 1, 1]", "[0, 0, 1]"), []string{"numaNodes", "3 NUMA nodes for 4 GPUs"}},
		{"NIC row too short", edit(`"PIX PIX SYS SYS"`, `"PIX PIX"`), []string{"nics[0].pcie", "2 cells for 4 GPUs"}},
		{"bad name", edit("name: mybox", "name: My_Box"), []string{"name", "My_Box"}},
		{"wrong kind", edit("kind: Machine", "kind: Node"), []string{"kind", "want Machine"}},
		{"too many GPUs", edit("gpus: 4", "gpus: 129"), []string{"gpus", "1..128"}},
		{"bandwidth beyond a pair's", edit("  pairs:\n", "  gbpsPerLink: 500\n  pairs:\n"), []string{"bandwidthGBps", "at most 2000"}},
		{"empty file", "", []string{"empty"}},
		{"not YAML", "{{{", []string{"parse"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.file))
			if err == nil {
				t.Fatalf("parsed; want an error containing %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadMachineTakesFixtureNamesAndFiles(t *testing.T) {
	f, err := Load("dgx-a100")
	if err != nil || f.Name != "dgx-a100" || f.NVSwitchLinks != 12 {
		t.Fatalf("Load(dgx-a100) = %s, %v; want the built-in fixture", f.Name, err)
	}
	path := filepath.Join(t.TempDir(), "mybox.yaml")
	if err := os.WriteFile(path, []byte(minimalMachine), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err = Load(path)
	if err != nil || f.Name != "mybox" || f.GPUs != 4 {
		t.Fatalf("Load(%s) = %+v, %v", path, f, err)
	}
	if !IsFile(path) || IsFile("dgx-a100") {
		t.Error("IsFile tells files from fixture names wrongly")
	}
	for spec, want := range map[string]string{
		"dgx-9":                  `fixture "dgx-9": unknown; known fixtures are dgx1-p100`,
		"missing.yaml":           "machine file missing.yaml",
		filepath.Dir(path) + "/": "machine file",
	} {
		if _, err := Load(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load(%q): %v; want an error containing %q", spec, err, want)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte(minimalMachine+"extra: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), `unknown field "extra"`) {
		t.Errorf("Load(bad file): %v; want the path and the unknown field", err)
	}
}
