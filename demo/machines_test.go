package demo

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var importedV100 = filepath.Join("..", "topology", "testdata", "smi", "dgx1-v100.yaml")
var importedA30 = filepath.Join("..", "topology", "testdata", "smi", "a30-nvlink-pairs.yaml")

func TestParseMachinesNamesNodesAfterTheirMachine(t *testing.T) {
	got, err := ParseMachines(importedA30 + "=2,dgx-a100=1")
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeSpec{{"a30-nvlink-pairs-1", importedA30}, {"a30-nvlink-pairs-2", importedA30}, {"dgx-a100-1", "dgx-a100"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	for spec, wantErr := range map[string]string{
		"":                              "empty",
		"dgx-a100":                      "want machine=count",
		"dgx-a100=0":                    "count must be",
		"dgx-9=1":                       `fixture "dgx-9": unknown`,
		importedV100 + "=1,dgx1-v100=1": `both machine "dgx1-v100"`,
	} {
		if _, err := ParseMachines(spec); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("ParseMachines(%q): %v; want %q", spec, err, wantErr)
		}
	}
}

func TestWorkloadsForTheDefaultClusterAreTheDefaults(t *testing.T) {
	got, err := WorkloadsFor(DefaultCluster)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(DefaultWorkloads, got); diff != "" {
		t.Errorf("(-default +got):\n%s", diff)
	}
}

// On a cluster of two 4-GPU imported boxes and one DGX A100 the workloads
// drop pins to absent machines and never ask for more GPUs than exist.
func TestWorkloadsForFitTheCluster(t *testing.T) {
	cluster, err := ParseMachines(importedA30 + "=2,dgx-a100=1")
	if err != nil {
		t.Fatal(err)
	}
	got, err := WorkloadsFor(cluster)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, w := range got {
		if w.Machine != "" {
			t.Errorf("%s pinned to %s, which the cluster lacks", w.Name, w.Machine)
		}
		if w.GPUs > 8 {
			t.Errorf("%s asks %d GPUs per pod; the largest node has 8", w.Name, w.GPUs)
		}
		total += w.Pods * w.GPUs
	}
	if total > 16 || total < 8 {
		t.Errorf("workloads ask %d GPUs of the cluster's 16; want most, never more", total)
	}
	small, err := WorkloadsFor([]NodeSpec{{"a30-1", importedA30}})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range small {
		if w.GPUs > 4 {
			t.Errorf("%s asks %d GPUs per pod on a 4-GPU machine", w.Name, w.GPUs)
		}
	}
}
