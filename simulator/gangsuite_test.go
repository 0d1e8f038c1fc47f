package simulator

import (
	"fmt"
	"strings"
	"testing"
)

// Acceptance points of the gang suite, as GangRow names them.
const (
	pointPlaced    = "groups placed ≥ best baseline"
	pointHeld      = "no GPU held by an incomplete group"
	pointDomain    = "in one domain ≥ tas-like"
	pointBandwidth = "group GB/s ≥ per-pod"
)

// gangShortfalls are the acceptance points gputopo misses on the gang
// suite today, each with its cause (docs/benchmarks.md, "Gang suite").
// They are listed, not skipped: the test fails when a listed point starts
// to hold (take it off the list and out of the docs) and when any point
// not listed fails.
var gangShortfalls = map[string]map[string]string{
	"gen:gang-nvl72:seed=3:jobs=240:load=1.2": {
		pointPlaced: large,
	},
	"gen:gang-hgx:seed=4:jobs=240:load=0.8": {
		pointPlaced: "per-pod places 8x8, 8x8 and 16x4 groups pod by pod, holding 210.7 GPU-h while they fill",
		pointDomain: scatter,
	},
	"gen:gang-hgx:seed=5:jobs=240:load=1.0": {
		pointPlaced: large,
		pointDomain: scatter,
	},
	"gen:gang-hgx:seed=6:jobs=240:load=1.2": {
		pointDomain: scatter,
	},
	"gen:gang-fleet:seed=7:jobs=240:load=0.8": {
		pointPlaced: pcie + "; the optimum, keeping the intent, places 3 more: " + large,
		pointDomain: scatter,
	},
	"gen:gang-fleet:seed=8:jobs=240:load=1.0": {
		pointPlaced: pcie,
		pointDomain: scatter,
	},
	"gen:gang-fleet:seed=9:jobs=240:load=1.2": {
		pointPlaced: pcie,
	},
}

// The causes of the shortfalls (docs/benchmarks.md).
const (
	scatter = "every group gputopo placed across leaves had no leaf with room for it when tried; the leaves " +
		"were fuller because earlier jobs landed elsewhere: the TAS-like placer puts a single-pod job on the " +
		"fullest node, gputopo's node score weighs bandwidth and capability first and packs by domain only among equals"
	large = "16x4, 16x8 and 8x8 groups need a whole leaf, rack or spine free when tried; " +
		"all or nothing with backfill reserves nothing for them, and where earlier jobs landed decides"
	pcie = "the count-only placers put 12-21 model-parallel groups on PCIe servers, which the strict " +
		"model intent refuses, and the larger groups with them"
)

// TestGangSuiteAcceptance runs the whole gang suite (a few seconds) and
// judges gputopo's group planning on every trace: at least as many
// groups placed as the best other policy, nothing held by an incomplete
// group, at least the TAS-like placer's share of groups in one domain,
// and at least the per-pod policy's group bandwidth.
func TestGangSuiteAcceptance(t *testing.T) {
	if len(GangSuite) < 8 {
		t.Fatalf("the gang suite has %d traces, want at least 8", len(GangSuite))
	}
	rows, err := RunGangSuite(GangSuite, nil, DeclareNone)
	if err != nil {
		t.Fatal(err)
	}
	if m := gangMixes(rows); m < 3 {
		t.Errorf("the gang suite covers %d cluster mixes, want at least 3", m)
	}
	for _, r := range rows {
		g := r.Result(GangGputopo)
		best, tas, pp := r.Result(r.Best), r.Result(GangTAS), r.Result(GangPerPod)
		for _, c := range []struct {
			point string
			ok    bool
			why   string
		}{
			{pointPlaced, r.PlacedOK, fmt.Sprintf("%d against %s's %d", g.GroupsPlaced, r.Best, best.GroupsPlaced)},
			{pointHeld, r.HeldOK, fmt.Sprintf("%.1f GPU-h held", g.HeldGPUHours)},
			{pointDomain, r.DomainOK, fmt.Sprintf("%s against tas-like's %s", pct(g.OneDomainShare()), pct(tas.OneDomainShare()))},
			{pointBandwidth, r.BandwidthOK, fmt.Sprintf("%.1f GB/s against per-pod's %.1f", g.GroupGBpsMean, pp.GroupGBpsMean)},
		} {
			known, listed := gangShortfalls[r.Case.Trace][c.point]
			switch {
			case !c.ok && !listed:
				t.Errorf("%s: %s fails: %s", r.Case.Trace, c.point, c.why)
			case c.ok && listed:
				t.Errorf("%s: %s now holds (%s); take it off gangShortfalls (%q) and out of docs/benchmarks.md", r.Case.Trace, c.point, c.why, known)
			}
		}
		if !r.HeldOK || g.GroupsPartial != 0 {
			t.Errorf("%s: gputopo held %.1f GPU-h in %d incomplete groups; group planning holds all or nothing", r.Case.Trace, g.HeldGPUHours, g.GroupsPartial)
		}
	}
	for trace := range gangShortfalls {
		found := false
		for _, c := range GangSuite {
			found = found || c.Trace == trace
		}
		if !found {
			t.Errorf("gangShortfalls lists %s, which is not in GangSuite", trace)
		}
	}
	var out strings.Builder
	if err := WriteGangSuite(&out, rows); err != nil {
		t.Fatal(err)
	}
	for _, c := range GangSuite {
		if !strings.Contains(out.String(), c.Trace+" on "+c.Mix) {
			t.Errorf("the report has no table for %s", c.Trace)
		}
	}
}

func TestGangSuiteRefusesOptionsItFixes(t *testing.T) {
	for _, o := range []Options{{GangSuite: true, Cluster: "dgx-a100=1"}, {GangSuite: true, Policies: []string{"gputopo"}}} {
		if err := Simulate(&strings.Builder{}, o); err == nil || !strings.Contains(err.Error(), "--gang-suite: runs fixed traces") {
			t.Errorf("Simulate(%+v) = %v, want a refusal naming --gang-suite", o, err)
		}
	}
	if err := Simulate(&strings.Builder{}, Options{GangSuite: true, Suite: true}); err == nil {
		t.Error("--suite with --gang-suite: no error")
	}
	var out strings.Builder
	if err := Simulate(&out, Options{Trace: "gen:gang-hgx:seed=2:jobs=30", Policies: []string{GangGputopo, GangTAS}}); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); !strings.Contains(s, "| gputopo ") || !strings.Contains(s, "| tas-like ") || !strings.Contains(s, "groups placed") {
		t.Errorf("a trace with groups did not print the gang table:\n%s", s)
	}
}
