package simulator

import (
	"bytes"
	"encoding/csv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

func TestParseTraceRejectsBadInputNamingTheField(t *testing.T) {
	tests := []struct {
		name, csv, want string
	}{
		{"missing header", "a,0,1,1,data\n", "header"},
		{"empty", "# nothing\n", "empty trace"},
		{"no jobs", TraceHeader + "\n", "no jobs"},
		{"too few fields", TraceHeader + "\na,0,1,1\n", "line 2: 4 fields"},
		{"duplicate id", TraceHeader + "\na,0,1,1,data\na,1,1,1,data\n", `line 3: id "a" already used on line 2`},
		{"negative arrival", TraceHeader + "\na,-1,1,1,data\n", "arrival_s"},
		{"zero duration", TraceHeader + "\na,0,0,1,data\n", "duration_s: must be > 0"},
		{"too many gpus", TraceHeader + "\na,0,1,129,data\n", "gpus: \"129\" must be an integer 1..128"},
		{"unknown parallelism", TraceHeader + "\na,0,1,1,pipeline\n", `parallelism: "pipeline" must be model, data or none`},
		{"unterminated quote", TraceHeader + "\n\"a,0,1,1,data\n", "line 2"},
		{"bare quote in a field", TraceHeader + "\na\"b,0,1,1,data\n", "line 2"},
		{"empty quoted id", TraceHeader + "\n\"\",0,1,1,data\n", "line 2: id: empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(tc.csv))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestTraceRoundTripsAndSortsByArrival(t *testing.T) {
	jobs := mustJobs(t, "# comment\n"+TraceHeader+"\nb,10.5,60,4,model\na,3,7200,1,none\nc,10.5,1,2,data\n")
	want := []Job{
		{ID: "a", Arrival: 3 * time.Second, Duration: 2 * time.Hour, GPUs: 1},
		{ID: "b", Arrival: 10500 * time.Millisecond, Duration: time.Minute, GPUs: 4, Parallelism: v1alpha1.ParallelismModel},
		{ID: "c", Arrival: 10500 * time.Millisecond, Duration: time.Second, GPUs: 2, Parallelism: v1alpha1.ParallelismData},
	}
	if diff := cmp.Diff(want, jobs); diff != "" {
		t.Fatalf("parsed (-want +got):\n%s", diff)
	}
	var buf bytes.Buffer
	if err := WriteTrace(&buf, []string{"x"}, jobs); err != nil {
		t.Fatal(err)
	}
	again := mustJobs(t, buf.String())
	if diff := cmp.Diff(jobs, again); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

// IDs with the characters the old hand-written CSV broke on (commas,
// quotes, line breaks, leading spaces) survive a write and a read; an ID
// that would read back as a comment or as nothing is refused by name.
func TestTraceRoundTripsAwkwardIDs(t *testing.T) {
	ids := []string{
		"team-a,job 1",
		`say "hi"`,
		"two\nlines",
		"  leading spaces",
		"trailing space ",
		"a#b",
		"ünïcode/θ",
		"crlf\r\ninside",
		`"quoted"`,
	}
	var jobs []Job
	for i, id := range ids {
		jobs = append(jobs, Job{ID: id, Arrival: time.Duration(i) * time.Second, Duration: time.Minute, GPUs: 1 + i%8, Parallelism: v1alpha1.ParallelismData})
	}
	var buf bytes.Buffer
	if err := WriteTrace(&buf, []string{"awkward ids", "two\nline comment"}, jobs); err != nil {
		t.Fatal(err)
	}
	again, err := ParseTrace(&buf)
	if err != nil {
		t.Fatalf("read back: %v\n%s", err, buf.String())
	}
	// encoding/csv reads a quoted \r\n as \n.
	want := slices.Clone(jobs)
	for i := range want {
		want[i].ID = strings.ReplaceAll(want[i].ID, "\r\n", "\n")
	}
	if diff := cmp.Diff(want, again); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}

	for _, tc := range []struct{ name, id, want string }{
		{"comment-like id", "#1", `id "#1" starts with '#'`},
		{"empty id", "", "id: empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WriteTrace(&bytes.Buffer{}, nil, []Job{{ID: tc.id, Duration: time.Second, GPUs: 1}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestGeneratorMixHasTheDocumentedShape(t *testing.T) {
	tr, err := Generate("gen:mixed:seed=1:jobs=2000")
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[int]int{}
	model := 0
	for _, j := range tr.Jobs {
		sizes[j.GPUs]++
		if j.Parallelism == v1alpha1.ParallelismModel {
			model++
		}
	}
	if len(sizes) != 4 || sizes[1] == 0 || sizes[2] == 0 || sizes[4] == 0 || sizes[8] == 0 {
		t.Errorf("sizes %v, want exactly 1, 2, 4 and 8", sizes)
	}
	if share := float64(model) / 2000; share < 0.36 || share > 0.44 {
		t.Errorf("model-parallel share %.3f, want about 0.40", share)
	}
	frag, err := Generate("gen:fragment:jobs=9")
	if err != nil {
		t.Fatal(err)
	}
	for i, j := range frag.Jobs {
		wantGPUs := 1
		if i%3 == 2 {
			wantGPUs = 4
		}
		if j.GPUs != wantGPUs || (j.GPUs == 4) != j.Model() {
			t.Errorf("job %d: %d GPUs, model %v; want two 1-GPU data jobs per 4-GPU model job", i, j.GPUs, j.Model())
		}
	}
	if frag.Cluster != ClusterDGX1 || tr.Cluster != ClusterMixed {
		t.Errorf("clusters %q, %q", frag.Cluster, tr.Cluster)
	}
}

func TestGeneratorRejectsBadSpecs(t *testing.T) {
	for spec, want := range map[string]string{
		"gen:poisson":             `unknown kind "poisson"`,
		"gen:mixed:seed=x":        `parameter "seed=x"`,
		"gen:mixed:jobs=0":        "must be 1..1000000",
		"gen:mixed:load=0":        "must be in (0, 10]",
		"gen:mixed:depth=3":       "unknown key",
		"gen:mixed:seed":          "want key=value",
		"bundled:nope":            "unknown bundled trace",
		"/no/such/trace/file.csv": "no such file",
	} {
		if _, err := LoadTrace(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadTrace(%q) error %v, want one containing %q", spec, err, want)
		}
	}
}

func TestBundledTracesMatchTheirGenerators(t *testing.T) {
	for bundled, gen := range map[string]string{
		"bundled:mixed":    "gen:mixed:seed=1:jobs=500",
		"bundled:fragment": "gen:fragment:seed=1:jobs=300",
	} {
		b, err := LoadTrace(bundled)
		if err != nil {
			t.Fatal(err)
		}
		g, err := LoadTrace(gen)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(g.Jobs, b.Jobs); diff != "" {
			t.Errorf("%s differs from %s; regenerate it with gputopo simulate --trace %s --out DIR (-gen +bundled):\n%s", bundled, gen, gen, diff)
		}
	}
}

func TestParseClusterErrors(t *testing.T) {
	for spec, want := range map[string]string{
		"":                    "empty",
		"dgx1-v100":           "want fixture=count",
		"dgx1-v100=0":         "count must be",
		"dgx-z=2":             `fixture "dgx-z": unknown`,
		"pcie-8x=1,pcie-8x=2": "listed twice",
	} {
		if _, err := ParseCluster(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCluster(%q) error %v, want one containing %q", spec, err, want)
		}
	}
	nodes := mustCluster(t, "pcie-8x=2,dgx2=1")
	var names []string
	for _, n := range nodes {
		names = append(names, n.Name)
	}
	if diff := cmp.Diff([]string{"pcie-8x-0", "pcie-8x-1", "dgx2-0"}, names); diff != "" {
		t.Errorf("node names (-want +got):\n%s", diff)
	}
}

// placements.csv quotes a job ID with a comma or a quote, so that every
// row reads back with its ten fields.
func TestPlacementsQuoteAwkwardJobIDs(t *testing.T) {
	ids := []string{"team-a,job 1", `say "hi"`}
	res := Result{Policy: "gputopo"}
	for _, id := range ids {
		res.Placed = append(res.Placed, Placed{Job: Job{ID: id, GPUs: 2}, Node: "n,1", Fixture: "dgx-a100", GPUs: []int{0, 1}, Tier: v1alpha1.TierNVSwitch, RingGBps: 600})
	}
	var buf bytes.Buffer
	if err := WritePlacements(&buf, []Result{res}); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatalf("read placements back: %v", err)
	}
	if len(rows) != 1+len(ids) {
		t.Fatalf("%d rows; want a header and %d jobs", len(rows), len(ids))
	}
	for i, id := range ids {
		if got := rows[i+1]; got[1] != id || got[5] != "n,1" || got[7] != "0 1" {
			t.Errorf("row %d = %q; want job %q on node n,1 with GPUs 0 1", i+1, got, id)
		}
	}
}
