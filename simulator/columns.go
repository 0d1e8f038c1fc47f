package simulator

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// ColumnOf is one quality measure of a result R (Result, GangResult)
// that policies are compared on, with the direction that is better.
type ColumnOf[R any] struct {
	Name string
	// Value reads the measure; Higher says a larger value is better.
	Value  func(R) float64
	Higher bool
	// Format prints a value.
	Format func(float64) string
}

// Column is a measure of a single-pod run's Result.
type Column = ColumnOf[Result]

func pct(v float64) string  { return fmt.Sprintf("%.1f%%", 100*v) }
func gbps(v float64) string { return fmt.Sprintf("%.1f", v) }
func wait(v float64) string { return time.Duration(v).Round(time.Second).String() }
func share(v float64) string {
	return fmt.Sprintf("%.3f", v)
}

// Columns are the measures the winner lines and the multi-seed summary
// report, in table order.
var Columns = []Column{
	{Name: "accepted", Value: Result.AcceptanceRate, Higher: true, Format: pct},
	{Name: "model on NVLink", Value: Result.NVLinkShare, Higher: true, Format: pct},
	{Name: "model ring GB/s", Value: func(r Result) float64 { return r.ModelRingMeanGBps }, Higher: true, Format: gbps},
	{Name: "ring GB/s mean", Value: func(r Result) float64 { return r.RingMeanGBps }, Higher: true, Format: gbps},
	{Name: "island share", Value: func(r Result) float64 { return r.IslandShare }, Higher: true, Format: share},
	{Name: "mean wait", Value: func(r Result) float64 { return float64(r.MeanWait) }, Higher: false, Format: wait},
	{Name: "effective wait", Value: func(r Result) float64 { return float64(r.EffectiveWait) }, Higher: false, Format: wait},
	{Name: "model NVLink work", Value: func(r Result) float64 { return r.NVLinkWork }, Higher: true, Format: pct},
}

// better says whether a beats b on c.
func (c ColumnOf[R]) better(a, b float64) bool {
	if c.Higher {
		return a > b
	}
	return a < b
}

// Winners names, per column, the policies with the best value (several
// on a tie), over values[policy].
func winners[R any](c ColumnOf[R], names []string, values []float64) []string {
	best := -1
	for i := range values {
		if best < 0 || c.better(values[i], values[best]) {
			best = i
		}
	}
	var out []string
	for i, v := range values {
		if best >= 0 && !c.better(values[best], v) {
			out = append(out, names[i])
		}
	}
	return out
}

// WriteWinners prints which policy won each column of one run.
func WriteWinners(w io.Writer, results []Result) error {
	names := make([]string, len(results))
	for i, r := range results {
		names[i] = r.Policy
	}
	return writeWinnerLine(w, Columns, "best per column", names, func(ci, i int) float64 { return Columns[ci].Value(results[i]) })
}

// writeWinnerLine prints "<label>: column: winners; ..." where value(ci, i)
// is policy i's value in column ci of cols.
func writeWinnerLine[R any](w io.Writer, cols []ColumnOf[R], label string, names []string, value func(ci, i int) float64) error {
	var parts []string
	for ci, c := range cols {
		vals := make([]float64, len(names))
		for i := range names {
			vals[i] = value(ci, i)
		}
		parts = append(parts, fmt.Sprintf("%s: %s", c.Name, strings.Join(winners(c, names, vals), ", ")))
	}
	_, err := fmt.Fprintf(w, "%s: %s\n", label, strings.Join(parts, "; "))
	return err
}

// Summary is one policy over several runs (seeds): per column the mean and
// the worst value, and on how many runs it was (one of) the best.
type Summary struct {
	Policy string
	Runs   int
	Mean   []float64 // by Columns index
	Worst  []float64
	Wins   []int
}

// Summarize folds runs (each one Run's results, same policies in the same
// order) into one Summary per policy, over Columns.
func Summarize(runs [][]Result) []Summary {
	return summarizeBy(runs, Columns, func(r Result) string { return r.Policy })
}

// summarizeBy folds runs of results R into one Summary per policy (named
// by policy) over cols.
func summarizeBy[R any](runs [][]R, cols []ColumnOf[R], policy func(R) string) []Summary {
	if len(runs) == 0 {
		return nil
	}
	out := make([]Summary, len(runs[0]))
	for p, r := range runs[0] {
		out[p] = Summary{Policy: policy(r), Mean: make([]float64, len(cols)), Worst: make([]float64, len(cols)), Wins: make([]int, len(cols))}
	}
	names := make([]string, len(out))
	for p := range out {
		names[p] = out[p].Policy
	}
	for ri, results := range runs {
		for ci, c := range cols {
			vals := make([]float64, len(results))
			for p, r := range results {
				v := c.Value(r)
				vals[p] = v
				s := &out[p]
				s.Mean[ci] += v
				if ri == 0 || c.better(s.Worst[ci], v) {
					s.Worst[ci] = v
				}
			}
			for _, name := range winners(c, names, vals) {
				for p := range out {
					if out[p].Policy == name {
						out[p].Wins[ci]++
					}
				}
			}
		}
		for p := range out {
			out[p].Runs++
		}
	}
	for p := range out {
		for ci := range cols {
			out[p].Mean[ci] /= float64(out[p].Runs)
		}
	}
	return out
}

// WriteSummary prints the multi-seed table: per policy and column the mean,
// the worst run and the number of runs won, then the winner of each
// column by mean.
func WriteSummary(w io.Writer, sums []Summary) error {
	return writeSummaryBy(w, Columns, sums)
}

// writeSummaryBy is WriteSummary over cols.
func writeSummaryBy[R any](w io.Writer, cols []ColumnOf[R], sums []Summary) error {
	head := []string{"policy"}
	for _, c := range cols {
		head = append(head, c.Name+" (mean / worst / runs won)")
	}
	tw := markdownTable(w, head...)
	for _, s := range sums {
		row := "| " + s.Policy + "\t"
		for ci, c := range cols {
			row += fmt.Sprintf("| %s / %s / %d\t", c.Format(s.Mean[ci]), c.Format(s.Worst[ci]), s.Wins[ci])
		}
		fmt.Fprintln(tw, row+"|")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	names := make([]string, len(sums))
	for i, s := range sums {
		names[i] = s.Policy
	}
	fmt.Fprintln(w)
	return writeWinnerLine(w, cols, "best mean per column", names, func(ci, i int) float64 { return sums[i].Mean[ci] })
}
