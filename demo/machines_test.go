package demo

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
	"github.com/gputopo/gputopo/topology/machine"
)

var importedV100 = filepath.Join("..", "topology", "machine", "testdata", "smi", "dgx1-v100.yaml")
var importedA30 = filepath.Join("..", "topology", "machine", "testdata", "smi", "a30-nvlink-pairs.yaml")

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

// On a cluster of two 4-GPU imported boxes and one DGX A100 the plan pins
// every workload but the batch fill to a machine the cluster has, never
// asks for more GPUs than it has before the priority case, and puts
// model-parallel jobs where an all-NVLink set of their size exists.
func TestWorkloadsForFitTheCluster(t *testing.T) {
	for _, spec := range []string{importedA30 + "=2,dgx-a100=1", importedA30 + "=2," + importedV100 + "=1", importedA30 + "=1"} {
		t.Run(filepath.Base(spec), func(t *testing.T) {
			cluster, err := ParseMachines(spec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := WorkloadsFor(cluster)
			if err != nil {
				t.Fatal(err)
			}
			capacity := map[string]int{}
			graphs := map[string]*topology.Graph{}
			for _, s := range cluster {
				f, err := machine.Load(s.Fixture)
				if err != nil {
					t.Fatal(err)
				}
				capacity[f.Name] += f.GPUs
				graphs[f.Name] = f.Graph(s.Name)
			}
			used := map[string]int{}
			for _, w := range got {
				if w.Fill {
					// It takes whatever is left, anywhere.
					continue
				}
				g, ok := graphs[w.Machine]
				if !ok {
					t.Errorf("%s pinned to %q, which the cluster lacks", w.Name, w.Machine)
					continue
				}
				if w.Priority == "" {
					// The priority case preempts: it is planned on the idle
					// cluster.
					used[w.Machine] += w.Pods * w.GPUs
				}
				if w.Intent == v1alpha1.ParallelismModel && w.GPUs > 1 {
					req := topology.Request{Count: w.GPUs, Requirement: v1alpha1.Requirement{RequireNVLink: true}}
					if _, err := allocator.New(0).Allocate(g, g.All(), req); err != nil {
						t.Errorf("%s: %d all-NVLink GPUs do not exist on %s: %v", w.Name, w.GPUs, w.Machine, err)
					}
				}
			}
			for m, n := range used {
				if n > capacity[m] {
					t.Errorf("workloads ask %d GPUs of %s's %d", n, m, capacity[m])
				}
			}
			if len(got) == 0 {
				t.Error("no workload planned")
			}
		})
	}
}
