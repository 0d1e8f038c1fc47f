package simulator

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

func defaultTable() configv1alpha1.PolicyTable {
	return configv1alpha1.DefaultWebhookConfiguration().PolicyTable
}

func mustJobs(t *testing.T, csv string) []Job {
	t.Helper()
	jobs, err := ParseTrace(strings.NewReader(csv))
	if err != nil {
		t.Fatal(err)
	}
	return jobs
}

// outcome is the part of a Result a hand computation can predict.
type outcome struct {
	Accepted, ModelAccepted, ModelNVLink int
}

func outcomes(rs []Result) map[string]outcome {
	out := map[string]outcome{}
	for _, r := range rs {
		out[r.Policy] = outcome{r.Accepted, r.ModelAccepted, r.ModelNVLink}
	}
	return out
}

func TestHandComputedTraces(t *testing.T) {
	tests := []struct {
		name    string
		cluster string
		trace   string
		want    map[string]outcome
	}{{
		// One DGX-1 V100. First fit gives the 1-GPU job GPU 0 and the quad
		// job GPUs 1-4 (1-4 is not NVLinked); the pair job then gets 5,6
		// (NVLinked). Every other policy keeps {4,5,6,7} whole for the quad.
		name:    "count-only first fit breaks the NVLink quad on a DGX-1",
		cluster: "dgx1-v100=1",
		trace: TraceHeader + "\n" +
			"single,0,1000,1,data\n" +
			"quad,0,1000,4,model\n" +
			"pair,0,1000,2,model\n",
		want: map[string]outcome{
			PolicyGputopo:   {3, 2, 2},
			PolicyOptimum:   {3, 2, 2},
			PolicyFirstFit:  {3, 2, 1},
			PolicyPairSum:   {3, 2, 2},
			PolicyPartition: {3, 2, 2},
		},
	}, {
		// No NVLink anywhere: the requirement-aware policies make the
		// model-parallel job wait and reject it at the timeout; the
		// baselines place it on PCIe. The data job fits everywhere.
		name:    "model-parallel job on a PCIe-only cluster waits and times out under gputopo",
		cluster: "pcie-8x=1",
		trace: TraceHeader + "\n" +
			"model,0,100,2,model\n" +
			"data,0,100,2,data\n" +
			"late,5000,100,1,none\n",
		want: map[string]outcome{
			PolicyGputopo:   {2, 0, 0},
			PolicyOptimum:   {2, 0, 0},
			PolicyFirstFit:  {3, 1, 0},
			PolicyPairSum:   {3, 1, 0},
			PolicyPartition: {3, 1, 0},
		},
	}, {
		// Two quads one after the other on one DGX A100 plus a third that
		// must wait for the first to end (at 100 s, within the 1 h wait).
		name:    "a job that does not fit waits in the queue and is placed when GPUs free up",
		cluster: "dgx-a100=1",
		trace: TraceHeader + "\n" +
			"a,0,100,4,model\n" +
			"b,0,200,4,model\n" +
			"c,10,100,4,model\n",
		want: map[string]outcome{
			PolicyGputopo:   {3, 3, 3},
			PolicyOptimum:   {3, 3, 3},
			PolicyFirstFit:  {3, 3, 3},
			PolicyPairSum:   {3, 3, 3},
			PolicyPartition: {3, 3, 3},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Run(Config{Nodes: mustCluster(t, tc.cluster), Jobs: mustJobs(t, tc.trace), MaxWait: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, outcomes(rs)); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestQueuedJobWaitIsMeasured(t *testing.T) {
	rs, err := Run(Config{Nodes: mustCluster(t, "dgx-a100=1"), Policies: []string{PolicyFirstFit}, Jobs: mustJobs(t, TraceHeader+"\n"+
		"a,0,100,8,model\n"+
		"b,40,100,8,model\n")})
	if err != nil {
		t.Fatal(err)
	}
	// b arrives at 40 s and starts when a ends at 100 s: mean wait 30 s.
	if got, want := rs[0].MeanWait, 30*time.Second; got != want {
		t.Errorf("mean wait %s, want %s", got, want)
	}
	if got := rs[0].RingMeanGBps; got != 600 {
		t.Errorf("ring mean %.0f GB/s, want 600 (DGX A100 NVSwitch)", got)
	}
}

func TestSimulationIsDeterministicForASeed(t *testing.T) {
	run := func(spec string) []Result {
		tr, err := Generate(spec)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := Run(Config{Nodes: mustCluster(t, tr.Cluster), Jobs: tr.Jobs})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	ignoreTimes := cmpopts.IgnoreFields(Result{}, "Decisions", "DecisionMean", "DecisionP99")
	a, b := run("gen:mixed:seed=3:jobs=120"), run("gen:mixed:seed=3:jobs=120")
	if diff := cmp.Diff(a, b, ignoreTimes); diff != "" {
		t.Errorf("two runs of one seed differ (-first +second):\n%s", diff)
	}
	if c := run("gen:mixed:seed=4:jobs=120"); cmp.Equal(a, c, ignoreTimes) {
		t.Errorf("seeds 3 and 4 gave identical results; the seed is not used")
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	nodes := mustCluster(t, "dgx-a100=1")
	jobs := mustJobs(t, TraceHeader+"\na,0,1,1,data\n")
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no nodes", Config{Jobs: jobs}, "no nodes"},
		{"no jobs", Config{Nodes: nodes}, "no jobs"},
		{"negative wait", Config{Nodes: nodes, Jobs: jobs, MaxWait: -time.Second}, "max wait"},
		{"unknown policy", Config{Nodes: nodes, Jobs: jobs, Policies: []string{"random"}}, `policy "random": unknown`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Run(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// Effective wait counts a rejected job's full MaxWait; NVLink work is the
// model-parallel GPU-hours run on NVLink per submitted one. One DGX A100:
// an 8-GPU model job runs 2 h from 0; a 4-GPU model job arriving at 0
// waits past the 1 h MaxWait and is rejected.
func TestEffectiveWaitAndNVLinkWork(t *testing.T) {
	nodes, err := ParseCluster("dgx-a100=1")
	if err != nil {
		t.Fatal(err)
	}
	jobs := mustJobs(t, TraceHeader+"\n"+"big,0,7200,8,model\n"+"late,0,3600,4,model\n")
	rs, err := Run(Config{Nodes: nodes, Jobs: jobs, MaxWait: time.Hour, Policies: []string{PolicyFirstFit}})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.Accepted != 1 || r.MeanWait != 0 {
		t.Fatalf("accepted %d, mean wait %s; want 1 and 0", r.Accepted, r.MeanWait)
	}
	if r.EffectiveWait != 30*time.Minute {
		t.Errorf("effective wait %s, want 30m (0 and the rejected job's 1h)", r.EffectiveWait)
	}
	// 16 GPU-hours on NVSwitch of 16 + 4 submitted.
	if want := 0.8; r.NVLinkWork < want-1e-9 || r.NVLinkWork > want+1e-9 {
		t.Errorf("NVLink work %.3f, want %.3f", r.NVLinkWork, want)
	}
}

func TestPercentileIsTheNearestRank(t *testing.T) {
	var d []time.Duration
	for i := 20; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Second)
	}
	for p, want := range map[int]time.Duration{50: 10 * time.Second, 95: 19 * time.Second, 99: 20 * time.Second, 100: 20 * time.Second} {
		if got := percentile(slices.Clone(d), p); got != want {
			t.Errorf("p%d of 1..20 s = %s, want %s", p, got, want)
		}
	}
	if got := percentile(nil, 95); got != 0 {
		t.Errorf("p95 of nothing = %s, want 0", got)
	}
}
