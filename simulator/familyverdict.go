// The generalisation benchmark's judgement of a family run (family.go
// draws and runs the cases): the acceptance points of docs/benchmarks.md
// (Verdict), how far they move with the exact moments jobs arrive (Noise),
// and the report that prints both (WriteFamily).

package simulator

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FamilyTolerance is how much worse than the optimum a column may be on a
// trace and still count as held: 3%, and for a wait also one minute (an
// optimum that waits 0 s is not beaten by 3% of nothing).
const FamilyTolerance = 0.03

// FamilyVerdict is how gputopo fares on a family against the acceptance
// points of docs/benchmarks.md.
type FamilyVerdict struct {
	// MeanVsOptimum: per single-pod column, gputopo's mean against the
	// optimum's (acceptance, effective wait, model ring, NVLink work).
	MeanVsOptimum []MeanCheck
	// NVLinkAll: every placed model-parallel job on NVLink on every
	// trace; NVLinkWorst is the lowest share.
	NVLinkAll   bool
	NVLinkWorst float64
	// WithinTolerance counts the traces where none of the checked columns
	// (familyMeanColumns: those that do not reward accepting fewer, and
	// model ring bandwidth) is worse than the optimum's by more than
	// FamilyTolerance; Losses names the others.
	WithinTolerance int
	Losses          []string
	// Groups: gputopo's mean share in one domain against tas-like's, the
	// traces where it is at least tas-like's, the traces where it places
	// at least the best baseline keeping the intent, and mean group
	// bandwidth against tas-like's.
	DomainMean, DomainMeanTAS float64
	DomainTraces              int
	PlacedTraces              int
	GBpsMean, GBpsMeanTAS     float64
	// KeptMean is gputopo's mean groups placed keeping the intent (groups
	// placed less model-parallel groups off NVLink) per case, KeptBest the
	// best baseline's (KeptBestPolicy) on the same mean.
	KeptMean, KeptBest float64
	KeptBestPolicy     string
	GangLosses         []string
	Traces             int
}

// MeanCheck is gputopo's mean on one column against the optimum's.
type MeanCheck struct {
	Column           string
	Gputopo, Optimum float64
	OK               bool
	Format           func(float64) string
}

// familyMeanColumns are the single-pod columns gputopo is judged on
// against the optimum, in mean and per trace. Mean wait over accepted jobs
// rewards rejecting (effective wait does not), and the ring bandwidth of
// every multi-GPU job counts data-parallel jobs, which gputopo puts on
// slower links on purpose to keep NVLink sets for model-parallel ones
// (model ring and NVLink work measure that): both stay in the tables.
var familyMeanColumns = []string{"accepted", "effective wait", "model ring GB/s", "model NVLink work"}

// Verdict judges gputopo on the run, case by case: a case's value of a
// column is its mean over the case's replicas (one replica: the drawn
// traces, as the acceptance points state them).
func (run FamilyRun) Verdict() FamilyVerdict {
	v := FamilyVerdict{Traces: len(run.caseRuns()), NVLinkAll: true, NVLinkWorst: 1}
	sums := Summarize(run.Single)
	gi, oi := policyIndex(sums, PolicyGputopo), policyIndex(sums, PolicyOptimum)
	for ci, c := range Columns {
		if !slices.Contains(familyMeanColumns, c.Name) {
			continue
		}
		g, o := sums[gi].Mean[ci], sums[oi].Mean[ci]
		v.MeanVsOptimum = append(v.MeanVsOptimum, MeanCheck{Column: c.Name, Gputopo: g, Optimum: o, OK: !c.better(o, g), Format: c.Format})
	}
	for _, rs := range run.Single {
		if g := rs[gi]; g.ModelAccepted > 0 && g.NVLinkShare() < v.NVLinkWorst {
			v.NVLinkWorst = g.NVLinkShare()
		}
	}
	v.NVLinkAll = v.NVLinkWorst == 1
	var kept map[string]float64 // per baseline, the sum of its case means keeping the intent
	for _, idx := range run.caseRuns() {
		c := run.Cases[idx[0]]
		where := fmt.Sprintf("seed %d (%s, load %.2f)", c.Seed, c.Mix, c.Load)
		var worse []string
		for _, col := range Columns {
			if !slices.Contains(familyMeanColumns, col.Name) {
				continue
			}
			g := meanOver(idx, func(i int) float64 { return col.Value(run.Single[i][gi]) })
			o := meanOver(idx, func(i int) float64 { return col.Value(run.Single[i][oi]) })
			if beyondTolerance(col, g, o) {
				worse = append(worse, fmt.Sprintf("%s %s vs %s", col.Name, col.Format(g), col.Format(o)))
			}
		}
		if len(worse) == 0 {
			v.WithinTolerance++
		} else {
			v.Losses = append(v.Losses, fmt.Sprintf("%s: %s", where, strings.Join(worse, "; ")))
		}
		if len(run.Gang) == 0 {
			continue
		}
		gang := func(policy string, f func(GangResult) float64) float64 {
			return meanOver(idx, func(i int) float64 { return f(run.Gang[i].Result(policy)) })
		}
		domain, domainTAS := gang(GangGputopo, GangResult.OneDomainShare), gang(GangTAS, GangResult.OneDomainShare)
		v.DomainMean += domain
		v.DomainMeanTAS += domainTAS
		v.GBpsMean += gang(GangGputopo, func(r GangResult) float64 { return r.GroupGBpsMean })
		v.GBpsMeanTAS += gang(GangTAS, func(r GangResult) float64 { return r.GroupGBpsMean })
		var lost []string
		if domain >= domainTAS {
			v.DomainTraces++
		} else {
			lost = append(lost, fmt.Sprintf("in one domain %.1f%% vs tas-like %.1f%%", 100*domain, 100*domainTAS))
		}
		// The best baseline keeping the intent: the most groups a
		// baseline placed on the case, on the mean of its replicas, less
		// its model-parallel groups off NVLink.
		placed, best := gang(GangGputopo, func(r GangResult) float64 { return float64(r.GroupsPlaced) }), 0.0
		v.KeptMean += placed
		for _, p := range GangPolicyNames {
			if p != GangGputopo {
				k := gang(p, func(r GangResult) float64 { return float64(r.GroupsPlaced - r.ModelGroupsOffNVLink) })
				best = max(best, k)
				if kept == nil {
					kept = map[string]float64{}
				}
				kept[p] += k
			}
		}
		if placed >= best {
			v.PlacedTraces++
		} else {
			lost = append(lost, fmt.Sprintf("groups placed %s vs %s by the best baseline keeping the intent", groupsFmt(placed), groupsFmt(best)))
		}
		if len(lost) > 0 {
			v.GangLosses = append(v.GangLosses, fmt.Sprintf("%s: %s", where, strings.Join(lost, "; ")))
		}
	}
	if n := float64(v.Traces); n > 0 {
		v.DomainMean, v.DomainMeanTAS, v.GBpsMean, v.GBpsMeanTAS = v.DomainMean/n, v.DomainMeanTAS/n, v.GBpsMean/n, v.GBpsMeanTAS/n
		v.KeptMean /= n
		for _, p := range GangPolicyNames {
			if k, ok := kept[p]; ok && (v.KeptBestPolicy == "" || k/n > v.KeptBest) {
				v.KeptBest, v.KeptBestPolicy = k/n, p
			}
		}
	}
	return v
}

// groupsFmt prints a count of groups, a mean over replicas with one
// decimal.
func groupsFmt(v float64) string {
	if v == math.Trunc(v) {
		return strconv.Itoa(int(v))
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// caseRuns lists, per case in run order, the indices of its replicas'
// runs (run.Cases, run.Single and run.Gang share them).
func (run FamilyRun) caseRuns() [][]int {
	var out [][]int
	at := map[uint64]int{}
	for i, c := range run.Cases {
		k, ok := at[c.Seed]
		if !ok {
			k = len(out)
			at[c.Seed] = k
			out = append(out, nil)
		}
		out[k] = append(out[k], i)
	}
	return out
}

// meanOver is the mean of f over idx.
func meanOver(idx []int, f func(int) float64) float64 {
	s := 0.0
	for _, i := range idx {
		s += f(i)
	}
	return s / float64(len(idx))
}

// Replica is the run restricted to every case's replica r (0: the drawn
// traces).
func (run FamilyRun) Replica(r int) FamilyRun {
	out := FamilyRun{Family: run.Family}
	for i, c := range run.Cases {
		if c.Replica == r {
			out.Cases = append(out.Cases, c)
			out.Single = append(out.Single, run.Single[i])
			out.Gang = append(out.Gang, run.Gang[i])
			if len(run.Sliced) > 0 {
				out.Sliced = append(out.Sliced, run.Sliced[i])
			}
		}
	}
	return out
}

// FamilyNoise is how far the per-trace points move with the exact moments
// jobs arrive: each case's replica 1 against its replica 0, the same
// policy on the same workload and cluster.
type FamilyNoise struct {
	Cases int
	// GputopoWithin and OptimumWithin count the cases where the policy's
	// replica 1 is within FamilyTolerance of its replica 0 on every
	// judged single-pod column (as WithinTolerance judges gputopo against
	// the optimum).
	GputopoWithin, OptimumWithin int
	// PlacedAtLeast and DomainAtLeast count the cases where gputopo's
	// replica 1 places at least the groups of its replica 0, and puts at
	// least its share of them in one domain.
	PlacedAtLeast, DomainAtLeast int
}

// Noise measures the run's FamilyNoise; false without a replica 1.
func (run FamilyRun) Noise() (FamilyNoise, bool) {
	a, b := run.Replica(0), run.Replica(1)
	if len(b.Cases) == 0 || len(b.Cases) != len(a.Cases) {
		return FamilyNoise{}, false
	}
	n := FamilyNoise{Cases: len(a.Cases)}
	sums := Summarize(a.Single)
	gi, oi := policyIndex(sums, PolicyGputopo), policyIndex(sums, PolicyOptimum)
	within := func(x, y Result) bool {
		for _, c := range Columns {
			if slices.Contains(familyMeanColumns, c.Name) && beyondTolerance(c, c.Value(y), c.Value(x)) {
				return false
			}
		}
		return true
	}
	for i := range a.Cases {
		if within(a.Single[i][gi], b.Single[i][gi]) {
			n.GputopoWithin++
		}
		if within(a.Single[i][oi], b.Single[i][oi]) {
			n.OptimumWithin++
		}
		if len(a.Gang) == 0 {
			continue
		}
		x, y := a.Gang[i].Result(GangGputopo), b.Gang[i].Result(GangGputopo)
		if y.GroupsPlaced >= x.GroupsPlaced {
			n.PlacedAtLeast++
		}
		if y.OneDomainShare() >= x.OneDomainShare() {
			n.DomainAtLeast++
		}
	}
	return n, true
}

// beyondTolerance says whether g is worse than o on c by more than
// FamilyTolerance.
func beyondTolerance(c Column, g, o float64) bool {
	if c.Higher {
		return g < o*(1-FamilyTolerance)
	}
	return g > o*(1+FamilyTolerance)+float64(time.Minute)
}

func policyIndex(sums []Summary, name string) int {
	return slices.IndexFunc(sums, func(s Summary) bool { return s.Policy == name })
}

// WriteFamily prints the family's report: what was drawn, the single-pod
// and group summaries (mean, worst trace, traces won per policy and
// column), the acceptance points, and every trace where gputopo loses.
func WriteFamily(w io.Writer, run FamilyRun) error {
	drawn := run.Replica(0)
	fabric, gpus := 0, 0
	minN, maxN := math.MaxInt, 0
	for _, c := range drawn.Cases {
		if c.Fabric {
			fabric++
		}
		gpus += c.GPUs
		minN, maxN = min(minN, len(c.Nodes)), max(maxN, len(c.Nodes))
	}
	n := len(drawn.Cases)
	if n == 0 {
		return fmt.Errorf("family %s: no cases", run.Family)
	}
	replicas := len(run.Cases) / n
	fmt.Fprintf(w, "family %s: %d cases, seeds %d..%d; up to 4 machine kinds, %d to %d nodes (%d GPUs on average), leaf and spine labels on %d; loads 0.6 to 1.3; max wait %s",
		run.Family, n, drawn.Cases[0].Seed, drawn.Cases[n-1].Seed, minN, maxN, gpus/n, fabric, DefaultMaxWait)
	if replicas > 1 {
		fmt.Fprintf(w, "; each case replayed %d times, the drawn traces and %d copies with every arrival moved later by up to %s (%d runs)", replicas, replicas-1, FamilyJitter, len(run.Cases))
	}
	fmt.Fprintf(w, "\n\n### Single-pod jobs (%d per case)\n\n", FamilySingleJobs)
	if err := WriteSummary(w, Summarize(run.Single)); err != nil {
		return err
	}
	fmt.Fprintf(w, "\n### Groups (%d jobs per case, half of them groups)\n\n", FamilyGangJobs)
	gangRuns := make([][]GangResult, len(run.Gang))
	for i, r := range run.Gang {
		gangRuns[i] = r.Results
	}
	if err := writeSummaryBy(w, GangColumns, summarizeBy(gangRuns, GangColumns, func(r GangResult) string { return r.Policy })); err != nil {
		return err
	}
	v := run.Verdict()
	fmt.Fprintf(w, "\n### Acceptance points\n\n")
	if replicas > 1 {
		fmt.Fprintf(w, "Per case on the mean of its %d replicas:\n\n", replicas)
	}
	var means []string
	for _, m := range v.MeanVsOptimum {
		means = append(means, fmt.Sprintf("%s %s / %s%s", m.Column, m.Format(m.Gputopo), m.Format(m.Optimum), mark(m.OK)))
	}
	fmt.Fprintf(w, "- single pods, gputopo's mean / the optimum's: %s\n", strings.Join(means, "; "))
	fmt.Fprintf(w, "- model-parallel jobs on NVLink: worst run %.1f%%%s\n", 100*v.NVLinkWorst, mark(v.NVLinkAll))
	writePoints(w, v)
	if replicas > 1 {
		fmt.Fprintf(w, "\nPer drawn trace (replica 0 alone):\n\n")
		writePoints(w, drawn.Verdict())
		if nf, ok := run.Noise(); ok {
			fmt.Fprintf(w, "\nThe same policy against itself (each case's replica 1 against its drawn traces): gputopo within %.0f%% of itself on %s, the optimum on %s; gputopo places at least its own groups on %s and puts at least its own share in one domain on %s\n",
				100*FamilyTolerance, countPct(nf.GputopoWithin, nf.Cases), countPct(nf.OptimumWithin, nf.Cases), countPct(nf.PlacedAtLeast, nf.Cases), countPct(nf.DomainAtLeast, nf.Cases))
		}
	}
	if len(v.Losses)+len(v.GangLosses) > 0 {
		fmt.Fprintf(w, "\n### Where gputopo loses\n\n")
		if replicas > 1 {
			fmt.Fprintf(w, "Means over each case's %d replicas.\n\n", replicas)
		}
		for _, l := range v.Losses {
			fmt.Fprintf(w, "- single pods, %s\n", l)
		}
		for _, l := range v.GangLosses {
			fmt.Fprintf(w, "- groups, %s\n", l)
		}
	}
	return writeFamilySliced(w, run)
}

// SlicedColumns are the measures of a sliced trace the family summarises.
var SlicedColumns = []ColumnOf[GangResult]{
	{Name: "sliced groups placed", Value: func(r GangResult) float64 { return ratio(r.SlicedPlaced, r.SlicedGroups) }, Higher: true, Format: pct},
	{Name: "keeping the intent", Value: func(r GangResult) float64 { return ratio(slicedKept(r), r.SlicedGroups) }, Higher: true, Format: pct},
	{Name: "slices in one domain", Value: func(r GangResult) float64 { return ratio(r.SlicesOneDomain, r.Slices) }, Higher: true, Format: pct},
	{Name: "slowest slice GB/s", Value: func(r GangResult) float64 { return r.SliceGBpsMean }, Higher: true, Format: gbps},
	{Name: "group wait", Value: func(r GangResult) float64 { return float64(r.GroupMeanWait) }, Higher: false, Format: wait},
	{Name: "single-pod wait", Value: func(r GangResult) float64 { return float64(r.SingleMeanWait) }, Higher: false, Format: wait},
	{Name: "GPU-h held incomplete", Value: func(r GangResult) float64 { return r.HeldGPUHours }, Higher: false, Format: func(v float64) string { return fmt.Sprintf("%.1f", v) }},
}

// slicedKept is r's sliced groups placed less its model-parallel groups
// off NVLink (on a sliced trace every group is sliced and model-parallel).
func slicedKept(r GangResult) int { return r.SlicedPlaced - r.ModelGroupsOffNVLink }

// writeFamilySliced prints the family's groups of slices: the cases whose
// mix has a level to slice at (drawSliced), every policy summarised, and
// the sliced suite's acceptance points over all their runs.
func writeFamilySliced(w io.Writer, run FamilyRun) error {
	var runs [][]GangResult
	var rows []SlicedRow
	cases := map[uint64]bool{}
	for i, r := range run.Sliced {
		if r.Results == nil {
			continue
		}
		runs = append(runs, r.Results)
		g := r.Result(GangGputopo)
		rows = append(rows, SlicedRow{GangRow: r, SlicesOK: g.SlicesOneDomain == g.Slices})
		cases[run.Cases[i].Seed] = true
	}
	if len(rows) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\n### Groups of slices (%d jobs per case, half of them sliced groups; the %d cases with GB200 racks or leaf labels, %d runs)\n\n", FamilySlicedJobs, len(cases), len(rows))
	if err := writeSummaryBy(w, SlicedColumns, summarizeBy(runs, SlicedColumns, func(r GangResult) string { return r.Policy })); err != nil {
		return err
	}
	v := Verdict(rows)
	held, kept, keptTAS := 0.0, 0.0, 0.0
	for _, r := range rows {
		held = max(held, r.Result(GangGputopo).HeldGPUHours)
		kept += float64(slicedKept(r.Result(GangGputopo))) / float64(len(rows))
		keptTAS += float64(slicedKept(r.Result(GangTAS))) / float64(len(rows))
	}
	fmt.Fprintf(w, "\n- placed slices inside one domain of their level, gputopo / tas-like: %.1f%% / %.1f%%%s\n", 100*v.InDomain, 100*v.InTAS, mark(v.AllInDomain))
	fmt.Fprintf(w, "- sliced groups placed keeping the intent (less model-parallel groups with a pod off NVLink), mean per run gputopo / tas-like: %.1f / %.1f%s; as placed: %.1f / %.1f\n", kept, keptTAS, mark(kept >= keptTAS), v.Placed, v.PlacedTAS)
	fmt.Fprintf(w, "- slowest slice's GB/s, mean gputopo / tas-like: %.1f / %.1f\n", v.GBps, v.GBpsTAS)
	fmt.Fprintf(w, "- GPU-h held by gputopo's incomplete groups, worst run: %.1f%s\n", held, mark(held == 0))
	return nil
}

// writePoints prints the per-case acceptance points of v.
func writePoints(w io.Writer, v FamilyVerdict) {
	n := v.Traces
	fmt.Fprintf(w, "- traces where none of those columns is more than %.0f%% worse than the optimum's: %s (want ≥ 90%%)%s\n", 100*FamilyTolerance, countPct(v.WithinTolerance, n), mark(10*v.WithinTolerance >= 9*n))
	fmt.Fprintf(w, "- groups in one domain, mean gputopo / tas-like: %.1f%% / %.1f%%%s; traces at least tas-like's: %s (want ≥ 80%%)%s\n",
		100*v.DomainMean, 100*v.DomainMeanTAS, mark(v.DomainMean >= v.DomainMeanTAS), countPct(v.DomainTraces, n), mark(10*v.DomainTraces >= 8*n))
	fmt.Fprintf(w, "- traces where gputopo places at least the groups of the best baseline keeping the intent: %s (want ≥ 90%%)%s\n", countPct(v.PlacedTraces, n), mark(10*v.PlacedTraces >= 9*n))
	fmt.Fprintf(w, "- group GB/s, mean gputopo / tas-like: %.1f / %.1f%s\n", v.GBpsMean, v.GBpsMeanTAS, mark(v.GBpsMean >= v.GBpsMeanTAS))
	if v.KeptBestPolicy != "" {
		fmt.Fprintf(w, "- groups placed keeping the intent, mean per case gputopo / the best baseline (%s): %.1f / %.1f%s\n", v.KeptBestPolicy, v.KeptMean, v.KeptBest, mark(v.KeptMean >= v.KeptBest))
	}
}
