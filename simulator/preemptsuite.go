package simulator

import (
	"fmt"
	"io"
	"strings"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// PreemptionSuite are the priority traces the preemption suite replays:
// seeds 101 to 110 of the priority generator (no setting of gputopo's was
// chosen on them), at loads 0.9, 1.1 and 1.3 in turn, 400 jobs each, on
// ClusterMixed.
var PreemptionSuite = func() []string {
	var out []string
	for i := range 10 {
		out = append(out, fmt.Sprintf("gen:priority:seed=%d:jobs=400:load=%.1f", 101+i, []float64{0.9, 1.1, 1.3}[i%3]))
	}
	return out
}()

// PreemptionRun is one policy and preemption mode on one trace.
type PreemptionRun struct {
	Policy, Mode string
	Result       Result
}

// PreemptionRow is one trace of the preemption suite: kube-scheduler
// counting GPUs (first-fit, count-only preemption), gputopo with
// count-only preemption (an extender without the preempt verb) and
// gputopo with its own.
type PreemptionRow struct {
	Trace string
	Runs  []PreemptionRun
}

// preemptionSetups are the suite's policies and preemption modes, in
// report order.
var preemptionSetups = []struct{ policy, mode, label string }{
	{PolicyFirstFit, PreemptCount, "kube-scheduler (count-only)"},
	{PolicyGputopo, PreemptCount, "gputopo, count-only preemption"},
	{PolicyGputopo, PreemptTopology, "gputopo"},
}

// RunPreemptionSuite replays every trace of specs with each setup.
func RunPreemptionSuite(specs []string, ext *configv1alpha1.ExtenderConfiguration) ([]PreemptionRow, error) {
	var rows []PreemptionRow
	for _, spec := range specs {
		tr, err := Generate(spec)
		if err != nil {
			return nil, err
		}
		nodes, err := ParseCluster(tr.Cluster)
		if err != nil {
			return nil, err
		}
		row := PreemptionRow{Trace: strings.TrimPrefix(spec, "gen:priority:")}
		for _, s := range preemptionSetups {
			p, err := newPolicy(s.policy, nodes, ext, nil)
			if err != nil {
				return nil, err
			}
			r, err := RunPolicy(Config{Nodes: nodes, Jobs: tr.Jobs, Preemption: s.mode}, p)
			if err != nil {
				return nil, fmt.Errorf("preemption suite: %s, %s: %w", spec, s.label, err)
			}
			row.Runs = append(row.Runs, PreemptionRun{Policy: s.policy, Mode: s.mode, Result: r})
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// Holds says whether gputopo's preemption meets the suite's bar on the
// row against gputopo with count-only preemption: its high-priority jobs
// wait no longer (effective wait: a job given up counts the full queue
// timeout, so that placing more is not punished), with no more evictions and no more GPU-hours lost, and
// every high-priority model-parallel job it placed is on NVLink.
func (r PreemptionRow) Holds() bool {
	count, topo := r.Runs[1].Result, r.Runs[2].Result
	return topo.HighEffectiveWait <= count.HighEffectiveWait && topo.Evictions <= count.Evictions &&
		topo.LostGPUHours <= count.LostGPUHours+1e-9 && topo.HighModelNVLink == topo.HighModel
}

// WritePreemptionSuite prints the suite's table in Markdown.
func WritePreemptionSuite(w io.Writer, rows []PreemptionRow) error {
	held := 0
	for _, r := range rows {
		if r.Holds() {
			held++
		}
	}
	fmt.Fprintf(w, "preemption suite: %d priority traces (gen:priority, seeds 101-110) on %s; max wait %s; gputopo's preemption holds the bar on %d\n\n", len(rows), ClusterMixed, DefaultMaxWait, held)
	fmt.Fprintln(w, "| trace | setup | high-priority placed | high-priority effective wait | mean wait of those placed | high model-parallel on NVLink | evictions | GPU-hours lost | all jobs placed |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, row := range rows {
		for i, run := range row.Runs {
			r := run.Result
			mark := ""
			if i == 2 && !row.Holds() {
				mark = " ✗"
			}
			fmt.Fprintf(w, "| %s | %s%s | %d/%d | %s | %s | %d/%d | %d | %.1f | %d/%d |\n", row.Trace, preemptionSetups[i].label, mark,
				r.HighAccepted, r.HighJobs, r.HighEffectiveWait.Round(time.Second), r.HighMeanWait.Round(time.Second), r.HighModelNVLink, r.HighModel, r.Evictions, r.LostGPUHours, r.Accepted, r.Jobs)
		}
	}
	_, err := fmt.Fprintln(w, "\nThe bar (✗ where missed): against gputopo with count-only preemption, gputopo's high-priority jobs wait no longer (effective wait: a job given up after the max wait counts it in full), with no more evictions and no more GPU-hours lost, and every high-priority model-parallel job it places is on NVLink.")
	return err
}
