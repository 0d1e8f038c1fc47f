package simulator

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// A family case is a function of its seed: drawn twice it is the same;
// its mix has 2 to 4 machine kinds and 8 to 64 nodes (whole racks of
// GB200 trays aside), a load of 0.6 to 1.3, and traces of the documented
// sizes whose jobs fit the widest node. The two families' seeds differ.
func TestFamilyCasesAreDrawnFromTheirSeedWithinTheDocumentedRanges(t *testing.T) {
	a, err := FamilyCases(FamilyTune, 30, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := FamilyCases(FamilyTune, 30, nil)
	if err != nil {
		t.Fatal(err)
	}
	test, err := FamilyCases(FamilyTest, 30, nil)
	if err != nil {
		t.Fatal(err)
	}
	fabric := 0
	for i, c := range a {
		if c.Seed != FamilyTuneSeed+uint64(i) || test[i].Seed != FamilyTestSeed+uint64(i) {
			t.Fatalf("case %d: seeds %d and %d", i, c.Seed, test[i].Seed)
		}
		if c.Cluster != b[i].Cluster || c.Load != b[i].Load || !cmp.Equal(c.Single.Jobs, b[i].Single.Jobs) || !cmp.Equal(c.Gang.Jobs, b[i].Gang.Jobs) {
			t.Fatalf("seed %d drawn twice differs", c.Seed)
		}
		kinds := len(strings.Split(strings.Split(c.Cluster, ";")[0], ","))
		trays := 0
		widest := 0
		for _, n := range c.Nodes {
			if n.Fixture == "gb200-nvl72-tray" {
				trays++
			}
			widest = max(widest, n.Graph.Len())
		}
		if kinds < 1 || kinds > 4 || len(c.Nodes)-trays > 64 || len(c.Nodes) < 8 && trays == 0 {
			t.Errorf("seed %d: %d kinds, %d nodes (%d trays): %s", c.Seed, kinds, len(c.Nodes), trays, c.Cluster)
		}
		if c.Load < 0.6 || c.Load > 1.3 {
			t.Errorf("seed %d: load %.2f", c.Seed, c.Load)
		}
		if len(c.Single.Jobs) != FamilySingleJobs || len(c.Gang.Jobs) != FamilyGangJobs {
			t.Errorf("seed %d: %d and %d jobs", c.Seed, len(c.Single.Jobs), len(c.Gang.Jobs))
		}
		for _, j := range c.Single.Jobs {
			if j.GPUs > widest {
				t.Errorf("seed %d: job %s asks %d GPUs; the widest node has %d", c.Seed, j.ID, j.GPUs, widest)
				break
			}
		}
		if c.Fabric {
			fabric++
			if !strings.HasSuffix(c.Cluster, ";spine=2") {
				t.Errorf("seed %d: fabric case without spines: %s", c.Seed, c.Cluster)
			}
		}
		if c.Cluster == test[i].Cluster && c.Load == test[i].Load {
			t.Errorf("tune seed %d and test seed %d drew the same case", c.Seed, test[i].Seed)
		}
	}
	if fabric == 0 || fabric == len(a) {
		t.Errorf("%d of %d cases with fabric labels; want both kinds", fabric, len(a))
	}
	if _, err := FamilyCases("train", 1, nil); err == nil || !strings.Contains(err.Error(), "want tune") {
		t.Errorf("unknown family: err = %v", err)
	}
	if _, err := FamilyCases(FamilyTest, 0, nil); err == nil || !strings.Contains(err.Error(), "--family-size") {
		t.Errorf("size 0: err = %v", err)
	}
}

// A machine file named like a built-in machine stands in for it.
func TestFamilyMachinesTakeImportedFiles(t *testing.T) {
	pool, err := familyMachines([]string{"../topology/machine/testdata/smi/dgx1-v100.yaml", "../topology/machine/testdata/smi/a30-nvlink-pairs.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{}
	for _, m := range pool {
		sources[m.name] = m.source
	}
	if !strings.HasSuffix(sources["dgx1-v100"], "dgx1-v100.yaml") || !strings.HasSuffix(sources["a30-nvlink-pairs"], ".yaml") || sources["dgx-a100"] != "dgx-a100" {
		t.Errorf("pool sources %v", sources)
	}
	if _, err := familyMachines([]string{"nope.yaml"}); err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("missing machine file: err = %v", err)
	}
}

// The verdict compares gputopo with the optimum per trace and column
// within the tolerance, and with tas-like on groups.
func TestFamilyVerdict(t *testing.T) {
	res := func(policy string, accepted int, wait time.Duration) Result {
		return Result{Policy: policy, Jobs: 100, Accepted: accepted, MeanWait: wait, EffectiveWait: wait, ModelAccepted: 1, ModelNVLink: 1}
	}
	run := FamilyRun{
		Cases: []FamilyCase{{Seed: 1, Mix: "a"}, {Seed: 2, Mix: "b"}},
		Single: [][]Result{
			// Within 3%: 98 of the optimum's 100 accepted, 1 min more wait.
			{res(PolicyGputopo, 98, 10*time.Minute), res(PolicyOptimum, 100, 9*time.Minute+50*time.Second)},
			// Beyond: 90 of 100.
			{res(PolicyGputopo, 90, time.Minute), res(PolicyOptimum, 100, time.Minute)},
		},
	}
	v := run.Verdict()
	if v.WithinTolerance != 1 || len(v.Losses) != 1 || !strings.Contains(v.Losses[0], "seed 2 (b") || !strings.Contains(v.Losses[0], "accepted 90.0% vs 100.0%") {
		t.Errorf("within %d, losses %q", v.WithinTolerance, v.Losses)
	}
	for _, m := range v.MeanVsOptimum {
		if m.Column == "accepted" && m.OK {
			t.Errorf("mean acceptance 94%% against 100%% judged OK")
		}
	}
	if !v.NVLinkAll {
		t.Error("every model job on NVLink, judged not")
	}
}
