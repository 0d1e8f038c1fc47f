package simulator

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

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

// TestSlicedTraceRoundTripsThroughCSV: a sliced generator's trace is
// written with the slice columns (SlicedTraceHeader) and read back
// unchanged, so a sliced trace can be kept, edited and replayed as a
// file; bad slice columns are refused naming the column and the fix.
func TestSlicedTraceRoundTripsThroughCSV(t *testing.T) {
	tr, err := LoadTrace("gen:sliced-hgx:seed=5:jobs=60")
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	if err := WriteTrace(&buf, []string{"sliced"}, tr.Jobs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "\n"+SlicedTraceHeader+"\n") {
		t.Fatalf("sliced trace written without the slice columns:\n%.300s", buf.String())
	}
	back, err := ParseTrace(strings.NewReader(buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(tr.Jobs, back); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	for _, c := range []struct{ row, want string }{
		{"a,0,60,8,model,4,3,leaf,spine", "slice_size: 3 must divide the job's 4 pods into 2 or more slices"},
		{"a,0,60,8,model,4,4,leaf,spine", "slice_size: 4 must divide the job's 4 pods into 2 or more slices"},
		{"a,0,60,8,model,1,1,leaf,", "slice_size: 1 on a job of one pod"},
		{"a,0,60,8,model,4,2,,spine", "slice_level: empty with slice_size 2"},
		{"a,0,60,8,model,4,0,leaf,", "slice_level: \"leaf\" is set but slice_size is 0"},
		{"a,0,60,8,model,4,x,leaf,", "slice_size: \"x\" must be an integer"},
		{"a,0,60,8,model,4,2,leaf", "8 fields, want 9"},
	} {
		_, err := ParseTrace(strings.NewReader(SlicedTraceHeader + "\n" + c.row + "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: error %v, want one on line 2 with %q", c.row, err, c.want)
		}
	}
	jobs, err := ParseTrace(strings.NewReader(SlicedTraceHeader + "\na,0,60,8,model,4,2,leaf,spine\nb,1,60,8,data,2,0,,\n"))
	if err != nil {
		t.Fatal(err)
	}
	if j := jobs[0]; j.Slices() != 2 || j.SliceLevel != "leaf" || j.GroupLevel != "spine" || jobs[1].Slices() != 0 {
		t.Errorf("parsed %+v, want a of 2 slices at leaf in one spine and b unsliced", jobs)
	}
}
