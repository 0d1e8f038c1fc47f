package simulator

import "testing"

// TestSlicedTracesKeepTheirShape: the sliced generators draw groups of 2
// to 4 slices that fit one spine, model-parallel, each slice required at
// the mix's level.
func TestSlicedTracesKeepTheirShape(t *testing.T) {
	for kind, level := range map[string]string{"sliced-nvl72": "nvlink", "sliced-hgx": "leaf"} {
		tr, err := LoadTrace("gen:" + kind + ":seed=5:jobs=200")
		if err != nil {
			t.Fatal(err)
		}
		sliced := 0
		for _, j := range tr.Jobs {
			if !j.Group() {
				continue
			}
			sliced++
			if k := j.Slices(); k < 2 || k > 4 || k*j.SliceSize != j.Pods || j.SliceLevel != level || j.GroupLevel != "spine" {
				t.Fatalf("%s: job %+v: want 2 to 4 slices at %s in one spine", kind, j, level)
			}
			if kind == "sliced-hgx" && j.Pods > 16 {
				t.Fatalf("%s: job %+v has more servers than a spine", kind, j)
			}
		}
		if sliced < 60 || sliced > 140 {
			t.Errorf("%s: %d sliced groups of 200 jobs, want about half", kind, sliced)
		}
	}
}

// TestSlicedSuiteCase: on one sliced case gputopo and the tas-like slice
// baseline put every placed slice inside one domain of its level and hold
// nothing while incomplete, where the count-only gang scheduler, which
// knows no slices, splits some slices across domains.
func TestSlicedSuiteCase(t *testing.T) {
	rows, err := RunSlicedSuite(SlicedSuite[1:2], nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rows[0]
	for _, p := range []string{GangGputopo, GangTAS} {
		res := r.Result(p)
		if res.SlicedPlaced == 0 || res.SlicesOneDomain != res.Slices || res.HeldGPUHours != 0 {
			t.Errorf("%s: %d sliced groups placed, %d of %d slices in one domain, %.1f GPU-h held incomplete", p, res.SlicedPlaced, res.SlicesOneDomain, res.Slices, res.HeldGPUHours)
		}
	}
	if ff := r.Result(GangFirstFit); ff.SlicesOneDomain >= ff.Slices {
		t.Errorf("gang-first-fit keeps all %d slices in one domain: the case shows nothing", ff.Slices)
	}
	if !r.OK() {
		t.Errorf("row %+v does not hold", r.GangRow.Case)
	}
}
