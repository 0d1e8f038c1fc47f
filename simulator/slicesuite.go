package simulator

import (
	"fmt"
	"io"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// SlicedSuite is the fixed set of traces the sliced suite judges groups of
// slices on (docs/benchmarks.md): half single pods, half model-parallel
// groups of 2 to 4 slices, each slice required inside one NVLink domain
// (GB200 NVL72 racks) or one leaf (HGX and DGX leaves), the group inside
// one spine; three seeds per mix at loads 0.8, 1.0 and 1.2. The seeds
// were fixed before the suite was first run.
var SlicedSuite = []GangCase{
	{"gen:sliced-nvl72:seed=21:jobs=200:load=0.8", ClusterNVL72, "nvl72"},
	{"gen:sliced-nvl72:seed=22:jobs=200:load=1.0", ClusterNVL72, "nvl72"},
	{"gen:sliced-nvl72:seed=23:jobs=200:load=1.2", ClusterNVL72, "nvl72"},
	{"gen:sliced-hgx:seed=24:jobs=200:load=0.8", ClusterHGXFabric, "hgx"},
	{"gen:sliced-hgx:seed=25:jobs=200:load=1.0", ClusterHGXFabric, "hgx"},
	{"gen:sliced-hgx:seed=26:jobs=200:load=1.2", ClusterHGXFabric, "hgx"},
}

// SlicedRow is one sliced case's outcome with its acceptance points for
// gputopo: every placed slice inside one domain of its level (SlicesOK),
// no GPU held by an incomplete group (HeldOK).
type SlicedRow struct {
	GangRow
	SlicesOK bool
}

// OK says whether the row's acceptance points hold (groups placed are
// judged on the suite's mean, SlicedVerdict).
func (r SlicedRow) OK() bool { return r.SlicesOK && r.HeldOK }

// RunSlicedSuite runs the sliced cases through every gang policy with ext
// (nil: defaults).
func RunSlicedSuite(cases []GangCase, ext *configv1alpha1.ExtenderConfiguration) ([]SlicedRow, error) {
	rows, err := RunGangSuite(cases, ext, DeclareNone)
	if err != nil {
		return nil, err
	}
	out := make([]SlicedRow, len(rows))
	for i, r := range rows {
		g := r.Result(GangGputopo)
		out[i] = SlicedRow{GangRow: r, SlicesOK: g.SlicesOneDomain == g.Slices}
	}
	return out, nil
}

// SlicedVerdict is the suite's means: sliced groups placed by gputopo and
// by the tas-like slice baseline, the shares of all their placed slices
// inside one domain, and their slowest slices' bandwidth.
type SlicedVerdict struct {
	Placed, PlacedTAS float64
	InDomain, InTAS   float64
	GBps, GBpsTAS     float64
	// AllInDomain: every slice gputopo placed is inside one domain.
	AllInDomain bool
}

// Verdict averages rows.
func Verdict(rows []SlicedRow) SlicedVerdict {
	var v SlicedVerdict
	if len(rows) == 0 {
		return v
	}
	n := float64(len(rows))
	var in, of, inT, ofT int
	for _, r := range rows {
		g, t := r.Result(GangGputopo), r.Result(GangTAS)
		v.Placed += float64(g.SlicedPlaced) / n
		v.PlacedTAS += float64(t.SlicedPlaced) / n
		in, of = in+g.SlicesOneDomain, of+g.Slices
		inT, ofT = inT+t.SlicesOneDomain, ofT+t.Slices
		v.GBps += g.SliceGBpsMean / n
		v.GBpsTAS += t.SliceGBpsMean / n
	}
	v.InDomain, v.InTAS = ratio(in, of), ratio(inT, ofT)
	v.AllInDomain = in == of
	return v
}

// WriteSlicedSuite prints the suite: the means, a summary line per case,
// then per case one table of every policy.
func WriteSlicedSuite(w io.Writer, rows []SlicedRow) error {
	v := Verdict(rows)
	fmt.Fprintf(w, "- sliced groups placed, mean gputopo / tas-like: %.1f / %.1f%s\n", v.Placed, v.PlacedTAS, mark(v.Placed >= v.PlacedTAS))
	fmt.Fprintf(w, "- placed slices inside one domain of their level, gputopo / tas-like: %.1f%% / %.1f%%%s\n", 100*v.InDomain, 100*v.InTAS, mark(v.AllInDomain))
	fmt.Fprintf(w, "- slowest slice's GB/s, mean gputopo / tas-like: %.1f / %.1f\n\n", v.GBps, v.GBpsTAS)
	tw := markdownTable(w, "trace", "mix", "sliced groups placed gputopo / tas-like", "slices in one domain gputopo / tas-like", "slowest slice GB/s gputopo / tas-like", "GPU-h held incomplete gputopo", "all hold")
	for _, r := range rows {
		g, t := r.Result(GangGputopo), r.Result(GangTAS)
		fmt.Fprintf(tw, "| %s\t| %s\t| %d / %d of %d\t| %s / %s%s\t| %.1f / %.1f\t| %.1f%s\t| %s\t|\n",
			r.Case.Trace, r.Case.Mix, g.SlicedPlaced, t.SlicedPlaced, g.SlicedGroups,
			countPct(g.SlicesOneDomain, g.Slices), countPct(t.SlicesOneDomain, t.Slices), mark(r.SlicesOK),
			g.SliceGBpsMean, t.SliceGBpsMean, g.HeldGPUHours, mark(r.HeldOK), yesNo(r.OK()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		fmt.Fprintf(w, "\n%s on %s (%s: %d nodes, %d GPUs): %d jobs, %d of them sliced groups\n\n",
			r.Case.Trace, r.Case.Mix, r.Case.Cluster, r.Nodes, r.GPUs, r.Results[0].Jobs, r.Results[0].SlicedGroups)
		tw := markdownTable(w, "policy", "sliced groups placed", "slices in one domain", "slowest slice GB/s mean", "GPU-h held incomplete", "jobs placed", "group wait", "single-pod wait")
		for _, res := range r.Results {
			fmt.Fprintf(tw, "| %s\t| %s\t| %s\t| %.1f\t| %.1f\t| %s\t| %s\t| %s\t|\n",
				res.Policy, countPct(res.SlicedPlaced, res.SlicedGroups), countPct(res.SlicesOneDomain, res.Slices), res.SliceGBpsMean,
				res.HeldGPUHours, countPct(res.Accepted, res.Jobs), res.GroupMeanWait.Round(time.Second), res.SingleMeanWait.Round(time.Second))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
