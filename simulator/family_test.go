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

// A case whose mix has GB200 racks or leaf labels draws a sliced trace:
// model-parallel groups of 2 to 4 slices, each slice at most what the
// roomiest domain of its level holds on NVLink-connected sets of the
// pod's GPUs, and the group inside one spine where there are spines; a
// mix with neither draws none. The sliced trace does not change the
// other two (its own random source).
func TestFamilySlicedTracesFitTheirMix(t *testing.T) {
	cases, err := FamilyCases(FamilyTest, 40, nil)
	if err != nil {
		t.Fatal(err)
	}
	racks, leaves := 0, 0
	for _, c := range cases {
		var clique, leaf, spine bool
		for _, n := range c.Nodes {
			clique = clique || n.Labels[LabelClique] != ""
			leaf = leaf || n.Labels[LabelLeaf] != ""
			spine = spine || n.Labels[LabelSpine] != ""
		}
		if !clique && !leaf {
			if len(c.Sliced.Jobs) != 0 {
				t.Errorf("seed %d (%s): %d sliced jobs on a mix with no level to slice at", c.Seed, c.Mix, len(c.Sliced.Jobs))
			}
			continue
		}
		if len(c.Sliced.Jobs) != FamilySlicedJobs {
			t.Errorf("seed %d (%s): %d sliced jobs, want %d", c.Seed, c.Mix, len(c.Sliced.Jobs), FamilySlicedJobs)
			continue
		}
		level, key := "leaf", LabelLeaf
		if clique {
			level, key = "nvlink", LabelClique
			racks++
		} else {
			leaves++
		}
		f := newFabric(c.Nodes, nil)
		groups := 0
		for _, j := range c.Sliced.Jobs {
			if j.SliceSize == 0 {
				if j.Pods != 1 || j.Parallelism != "data" {
					t.Errorf("seed %d: single job %s: %d pods, %s", c.Seed, j.ID, j.Pods, j.Parallelism)
				}
				continue
			}
			groups++
			room := map[string]int{}
			most := 0
			for i, n := range c.Nodes {
				if d := n.Labels[key]; d != "" {
					room[d] += f.island[i] / j.GPUs
					most = max(most, room[d])
				}
			}
			if n := j.Slices(); n < 2 || n > 4 || j.SliceLevel != level || j.Parallelism != "model" || j.SliceSize > most ||
				(spine != (j.GroupLevel == "spine")) || j.GPUs != 2 && j.GPUs != 4 && j.GPUs != 8 {
				t.Errorf("seed %d (%s): job %s: %d pods × %d GPUs in slices of %d at %q (group %q); the roomiest %s holds %d such pods",
					c.Seed, c.Mix, j.ID, j.Pods, j.GPUs, j.SliceSize, j.SliceLevel, j.GroupLevel, level, most)
			}
		}
		if groups < FamilySlicedJobs/4 {
			t.Errorf("seed %d: %d sliced groups of %d jobs", c.Seed, groups, FamilySlicedJobs)
		}
	}
	if racks == 0 || leaves == 0 {
		t.Errorf("%d cases sliced on racks, %d on leaves; want both", racks, leaves)
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

// Replicas: the first of a case's replicas is the case as drawn; the
// others hold the same jobs, each arriving later by less than
// FamilyJitter, in arrival order, and are the same when replicated again.
func TestReplicateMovesArrivalsWithinTheJitter(t *testing.T) {
	cases, err := FamilyCases(FamilyTune, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Replicate(cases, 3)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Replicate(cases, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 6 {
		t.Fatalf("%d replicas of 2 cases × 3", len(a))
	}
	for i, rc := range a {
		c := cases[i/3]
		if rc.Seed != c.Seed || rc.Replica != i%3 || rc.Cluster != c.Cluster {
			t.Fatalf("replica %d: seed %d replica %d", i, rc.Seed, rc.Replica)
		}
		if !cmp.Equal(rc.Gang.Jobs, b[i].Gang.Jobs) {
			t.Errorf("seed %d replica %d differs when replicated again", rc.Seed, rc.Replica)
		}
		for _, pair := range [][2][]Job{{c.Single.Jobs, rc.Single.Jobs}, {c.Gang.Jobs, rc.Gang.Jobs}} {
			drawn, moved := pair[0], pair[1]
			if rc.Replica == 0 {
				if !cmp.Equal(drawn, moved) {
					t.Errorf("seed %d: replica 0 is not the drawn trace", c.Seed)
				}
				continue
			}
			at := map[string]Job{}
			for _, j := range drawn {
				at[j.ID] = j
			}
			changed := 0
			for k, j := range moved {
				d := at[j.ID]
				shift := j.Arrival - d.Arrival
				if shift < 0 || shift >= FamilyJitter || j.Duration != d.Duration || j.GPUs != d.GPUs || j.Pods != d.Pods {
					t.Fatalf("seed %d replica %d: job %s moved by %s (or changed)", c.Seed, rc.Replica, j.ID, shift)
				}
				if shift > 0 {
					changed++
				}
				if k > 0 && moved[k-1].Arrival > j.Arrival {
					t.Fatalf("seed %d replica %d: not in arrival order at %d", c.Seed, rc.Replica, k)
				}
			}
			if len(moved) != len(drawn) || changed == 0 {
				t.Errorf("seed %d replica %d: %d jobs of %d, %d moved", c.Seed, rc.Replica, len(moved), len(drawn), changed)
			}
		}
	}
	if cmp.Equal(a[1].Single.Jobs, a[2].Single.Jobs) {
		t.Error("replicas 1 and 2 are the same")
	}
	for _, k := range []int{0, 11} {
		if _, err := Replicate(cases, k); err == nil || !strings.Contains(err.Error(), "--family-replicas") {
			t.Errorf("%d replicas: err = %v", k, err)
		}
	}
}

// With replicas, the verdict judges a case on the means of its replicas,
// the drawn traces alone (Replica(0)) may judge otherwise, and Noise
// compares each policy's replica 1 with its replica 0.
func TestFamilyVerdictOnReplicaMeans(t *testing.T) {
	res := func(policy string, accepted int) Result {
		return Result{Policy: policy, Jobs: 100, Accepted: accepted, ModelAccepted: 1, ModelNVLink: 1}
	}
	gang := func(placed, tasPlaced, tasOff, optPlaced int) GangRow {
		return GangRow{Results: []GangResult{
			{Policy: GangGputopo, Groups: 100, GroupsPlaced: placed},
			{Policy: GangTAS, Groups: 100, GroupsPlaced: tasPlaced, ModelGroupsOffNVLink: tasOff},
			{Policy: GangOptimum, Groups: 100, GroupsPlaced: optPlaced},
		}}
	}
	run := FamilyRun{
		Cases: []FamilyCase{{Seed: 1, Mix: "a"}, {Seed: 1, Mix: "a", Replica: 1}},
		Single: [][]Result{
			// The drawn trace: 90 of the optimum's 100 accepted, beyond
			// the tolerance; replica 1: 100 of 90. Means 95 / 95.
			{res(PolicyGputopo, 90), res(PolicyOptimum, 100)},
			{res(PolicyGputopo, 100), res(PolicyOptimum, 90)},
		},
		// Groups: 80 against the optimum's 81 as drawn, 84 against 81 in
		// replica 1 (tas-like keeps 70 - 10 of its intent): means 82 / 81.
		Gang: []GangRow{gang(80, 70, 10, 81), gang(84, 90, 30, 81)},
	}
	v := run.Verdict()
	if v.Traces != 1 || v.WithinTolerance != 1 || v.PlacedTraces != 1 || len(v.Losses) != 0 {
		t.Errorf("replica means: %d traces, within %d, placed %d, losses %q", v.Traces, v.WithinTolerance, v.PlacedTraces, v.Losses)
	}
	d := run.Replica(0).Verdict()
	if d.Traces != 1 || d.WithinTolerance != 0 || d.PlacedTraces != 0 || len(d.GangLosses) != 1 || !strings.Contains(d.GangLosses[0], "groups placed 80 vs 81") {
		t.Errorf("drawn traces: %d traces, within %d, placed %d, gang losses %q", d.Traces, d.WithinTolerance, d.PlacedTraces, d.GangLosses)
	}
	nf, ok := run.Noise()
	if !ok || nf.Cases != 1 || nf.GputopoWithin != 1 || nf.OptimumWithin != 0 || nf.PlacedAtLeast != 1 {
		t.Errorf("noise %+v, %v", nf, ok)
	}
	if _, ok := run.Replica(0).Noise(); ok {
		t.Error("noise measured without a replica 1")
	}
}
