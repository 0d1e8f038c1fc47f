package simulator

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// A trace with priorities reads back as written; a bad priority names
// the line and the field.
func TestPriorityTraceRoundTrip(t *testing.T) {
	tr, err := Generate("gen:priority:seed=3:jobs=50")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTrace(&buf, nil, tr.Jobs); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), PriorityTraceHeader+"\n") {
		t.Fatalf("header %q, want %q", strings.SplitN(buf.String(), "\n", 2)[0], PriorityTraceHeader)
	}
	back, err := ParseTrace(&buf)
	if err != nil {
		t.Fatal(err)
	}
	high := 0
	for i, j := range back {
		if j != tr.Jobs[i] {
			t.Fatalf("job %d: %+v, want %+v", i, j, tr.Jobs[i])
		}
		if j.Priority > 0 {
			high++
		}
	}
	if high == 0 || high == len(back) {
		t.Errorf("%d of %d jobs have a priority; want a mix", high, len(back))
	}
	_, err = ParseTrace(strings.NewReader(PriorityTraceHeader + "\na,0,60,1,data,high\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2: priority") {
		t.Errorf("bad priority: %v, want an error naming line 2 and the priority field", err)
	}
}

// fullDGX1 is a DGX-1 V100 full of eight low-priority 1-GPU jobs and a
// high-priority 4-GPU model-parallel job arriving later.
func fullDGX1() []Job {
	var jobs []Job
	for i := range 8 {
		jobs = append(jobs, Job{ID: fmt.Sprintf("low-%d", i), Arrival: time.Duration(i) * time.Second, Duration: 10 * time.Hour, GPUs: 1, Parallelism: v1alpha1.ParallelismData})
	}
	return append(jobs, Job{ID: "high", Arrival: time.Minute, Duration: time.Hour, GPUs: 4, Parallelism: v1alpha1.ParallelismModel, Priority: PriorityHigh})
}

// Preemption in the engine: gputopo's evicts the 4 jobs of one NVLink
// quad at once and places the job there; count-only preemption evicts by
// count, and evicts again while the freed GPUs are no NVLink quad; with
// none, the job waits until it is given up.
func TestEnginePreemption(t *testing.T) {
	nodes, err := ParseCluster("dgx1-v100=1")
	if err != nil {
		t.Fatal(err)
	}
	run := func(mode string) Result {
		p, err := newPolicy(PolicyGputopo, nodes, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := RunPolicy(Config{Nodes: nodes, Jobs: fullDGX1(), Preemption: mode}, p)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	topo := run(PreemptTopology)
	if topo.Evictions != 4 || topo.HighAccepted != 1 || topo.HighModelNVLink != 1 || topo.HighMeanWait != 0 {
		t.Errorf("topology preemption: %d evictions, high placed %d (NVLink %d) after %s; want 4 evictions and the job on NVLink at once",
			topo.Evictions, topo.HighAccepted, topo.HighModelNVLink, topo.HighMeanWait)
	}
	if want := 4 * 59.0 / 3600; topo.LostGPUHours < want-0.01 || topo.LostGPUHours > 4*60.0/3600+0.01 {
		t.Errorf("GPU-hours lost %.3f, want about 4 jobs × 1 minute", topo.LostGPUHours)
	}
	count := run(PreemptCount)
	if count.Evictions < topo.Evictions || count.LostGPUHours < topo.LostGPUHours {
		t.Errorf("count-only preemption: %d evictions, %.3f GPU-hours lost; gputopo's: %d, %.3f: want count-only no better", count.Evictions, count.LostGPUHours, topo.Evictions, topo.LostGPUHours)
	}
	none := run("")
	if none.Evictions != 0 || none.HighAccepted != 0 {
		t.Errorf("no preemption: %d evictions, %d high placed; want none", none.Evictions, none.HighAccepted)
	}
}

// The preemption suite's bar holds on its first traces (the whole suite
// runs in make bench; docs/benchmarks.md has its table).
func TestPreemptionSuiteHolds(t *testing.T) {
	rows, err := RunPreemptionSuite(PreemptionSuite[:3], nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WritePreemptionSuite(&buf, rows); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if !r.Holds() {
			t.Errorf("%s: gputopo's preemption misses the bar:\n%s", r.Trace, buf.String())
		}
	}
}
