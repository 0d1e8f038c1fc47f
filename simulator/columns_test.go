package simulator

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

func TestSeedSpecs(t *testing.T) {
	tests := map[string]struct {
		spec    string
		n       int
		want    []string
		wantErr string
	}{
		"seed given":         {spec: "gen:mixed:seed=7:jobs=50", n: 3, want: []string{"gen:mixed:seed=7:jobs=50", "gen:mixed:seed=8:jobs=50", "gen:mixed:seed=9:jobs=50"}},
		"seed defaults to 1": {spec: "gen:fragment:load=0.8", n: 2, want: []string{"gen:fragment:load=0.8:seed=1", "gen:fragment:load=0.8:seed=2"}},
		"bundled trace":      {spec: "bundled:mixed", n: 2, wantErr: "--seeds: needs a generated trace"},
		"too many":           {spec: "gen:mixed", n: 1001, wantErr: "must be 1..1000"},
		"bad seed":           {spec: "gen:mixed:seed=x", n: 2, wantErr: `parameter "seed=x"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := SeedSpecs(tc.spec, tc.n)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummarizeCountsMeanWorstAndWins(t *testing.T) {
	run := func(aAcc, bAcc int, aWait, bWait time.Duration) []Result {
		return []Result{
			{Policy: "a", Jobs: 10, Accepted: aAcc, MeanWait: aWait},
			{Policy: "b", Jobs: 10, Accepted: bAcc, MeanWait: bWait},
		}
	}
	sums := Summarize([][]Result{run(9, 8, time.Minute, 2*time.Minute), run(7, 8, 3*time.Minute, time.Minute)})
	acc, wait := 0, 5
	if Columns[acc].Name != "accepted" || Columns[wait].Name != "mean wait" {
		t.Fatalf("column order changed: %v, %v", Columns[acc].Name, Columns[wait].Name)
	}
	a, b := sums[0], sums[1]
	if a.Mean[acc] != 0.8 || a.Worst[acc] != 0.7 || a.Wins[acc] != 1 || b.Wins[acc] != 1 {
		t.Errorf("accepted: a mean %.2f worst %.2f wins %d, b wins %d; want 0.80, 0.70, 1, 1", a.Mean[acc], a.Worst[acc], a.Wins[acc], b.Wins[acc])
	}
	// Lower wait is better: a's worst is its longest.
	if a.Worst[wait] != float64(3*time.Minute) || b.Worst[wait] != float64(2*time.Minute) {
		t.Errorf("mean wait worst: a %v, b %v; want 3m and 2m", time.Duration(a.Worst[wait]), time.Duration(b.Worst[wait]))
	}
	var out strings.Builder
	if err := WriteSummary(&out, sums); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "best mean per column: accepted: a, b;") || !strings.Contains(out.String(), "mean wait: b") {
		t.Errorf("summary lacks the winners by mean:\n%s", out.String())
	}
}

// TestFallbackAfterInSimulatedTime: on PCIe-only nodes a model-parallel
// job can never get NVLink; without fallbackAfter it is rejected at the
// queue timeout, with it it is placed once it has waited that long (at the
// next cluster event), on a set the record marks degraded.
func TestFallbackAfterInSimulatedTime(t *testing.T) {
	trace := TraceHeader + "\n" +
		"m,0,3600,2,model\n" +
		"d1,60,600,1,data\n" + // events at 60 s, ...
		"d2,1300,600,1,data\n" // ... and 1300 s, after the 20 min fallback
	nodes, jobs := mustCluster(t, "pcie-8x=1"), mustJobs(t, trace)
	strict := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	fallback := strict
	fallback.Model.FallbackAfter = &metav1.Duration{Duration: 20 * time.Minute}

	rs, err := Run(Config{Nodes: nodes, Jobs: jobs, Policies: []string{PolicyGputopo}, PolicyTable: &strict})
	if err != nil {
		t.Fatal(err)
	}
	if r := rs[0]; r.ModelAccepted != 0 || r.Accepted != 2 {
		t.Fatalf("strict: accepted %d, model %d; want the two data jobs only", r.Accepted, r.ModelAccepted)
	}
	rs, err = Run(Config{Nodes: nodes, Jobs: jobs, Policies: []string{PolicyGputopo}, PolicyTable: &fallback})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.ModelAccepted != 1 || r.ModelNVLink != 0 {
		t.Fatalf("fallback: model accepted %d on NVLink %d; want 1 placed off NVLink", r.ModelAccepted, r.ModelNVLink)
	}
	for _, p := range r.Placed {
		if p.Job.ID == "m" {
			if p.Start != 1300*time.Second {
				t.Errorf("model job started at %s, want 1300s: the first cluster event after 20m", p.Start)
			}
			if p.Tier == v1alpha1.TierNVLink || p.Tier == v1alpha1.TierNVSwitch {
				t.Errorf("model job tier %s on a PCIe node", p.Tier)
			}
		}
	}
}

// TestGputopoTieBreakIsSeeded: ties between equal nodes go at random, as
// kube-scheduler breaks them, but two runs of one trace agree.
func TestGputopoTieBreakIsSeeded(t *testing.T) {
	nodes, jobs := mustCluster(t, "pcie-8x=4"), mustJobs(t, TraceHeader+"\na,0,60,8,data\nb,1,60,8,data\nc,2,60,8,data\n")
	var first []string
	for range 2 {
		rs, err := Run(Config{Nodes: nodes, Jobs: jobs, Policies: []string{PolicyGputopo}})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range rs[0].Placed {
			got = append(got, p.Node)
		}
		if first == nil {
			first = got
		} else if diff := cmp.Diff(first, got); diff != "" {
			t.Errorf("two runs placed differently (-first +second):\n%s", diff)
		}
	}
}

// TestRunSuiteJudgesEachCase runs a small suite: gputopo, the optimum and
// the count-only baselines on each case, strict and with fallbackAfter,
// and the verdict columns follow from the numbers.
func TestRunSuiteJudgesEachCase(t *testing.T) {
	rows, err := RunSuite([]SuiteCase{{Trace: "gen:fragment:seed=3:jobs=60:load=1.0", Cluster: ClusterDGX1}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rows[0]
	if r.Gputopo.Policy != PolicyGputopo || r.Optimum.Policy != PolicyOptimum || r.Fallback.Policy != PolicyGputopo ||
		(r.CountOnly.Policy != PolicyFirstFit && r.CountOnly.Policy != PolicyPairSum) {
		t.Fatalf("row policies %s %s %s %s", r.Gputopo.Policy, r.Optimum.Policy, r.Fallback.Policy, r.CountOnly.Policy)
	}
	if r.AcceptOK != (r.Gputopo.Accepted >= r.Optimum.Accepted) || r.WaitOK != (r.Gputopo.MeanWait <= r.Optimum.MeanWait) ||
		r.FallbackAcceptOK != (r.Fallback.Accepted >= r.CountOnly.Accepted) {
		t.Errorf("verdicts do not follow the numbers: %+v", r)
	}
	if !r.NVLinkOK {
		t.Errorf("strict gputopo placed %d of %d model jobs off NVLink", r.Gputopo.ModelAccepted-r.Gputopo.ModelNVLink, r.Gputopo.ModelAccepted)
	}
	var out strings.Builder
	if err := WriteSuite(&out, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "gen:fragment:seed=3:jobs=60:load=1.0") {
		t.Errorf("table lacks the case:\n%s", out.String())
	}
}

func TestSuiteRefusesOptionsItFixes(t *testing.T) {
	err := Simulate(&strings.Builder{}, Options{Suite: true, Cluster: "dgx-a100=1"})
	if err == nil || !strings.Contains(err.Error(), "--suite: runs fixed traces") {
		t.Fatalf("err = %v, want a refusal naming --suite", err)
	}
}
