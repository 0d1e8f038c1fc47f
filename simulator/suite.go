package simulator

import (
	"fmt"
	"io"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SuiteCase is one trace on one cluster of the placement suite.
type SuiteCase struct {
	Trace, Cluster string
}

// Cluster mixes of the placement suite besides ClusterMixed and
// ClusterDGX1, 128 GPUs each for the mixed generator (whose load is
// calibrated on 128 GPUs) and 32 for the fragment one.
const (
	// ClusterFleet is old and new NVLink machines beside many PCIe ones.
	ClusterFleet = "dgx-a100=2,hgx-h100=2,dgx1-v100=4,pcie-8x=8"
	// ClusterBridged is NVSwitch machines beside NVLink-bridged and plain
	// PCIe servers.
	ClusterBridged = "dgx-a100=4,pcie-8x-nvlink-pairs=8,pcie-8x=4"
	// ClusterFourGenerations has one of each interconnect generation.
	ClusterFourGenerations = "hgx-h100=4,dgx1-v100=4,pcie-8x-nvlink-pairs=4,pcie-8x=4"
	// ClusterSmallMixed is two DGX-1 V100 and two PCIe servers.
	ClusterSmallMixed = "dgx1-v100=2,pcie-8x=2"
)

// PlacementSuite is the fixed set of traces and cluster mixes the
// extender's defaults are judged on (docs/benchmarks.md): the bundled
// traces and ten generated ones over five cluster mixes, loads 0.7 to
// 1.1. The seeds were fixed before the defaults were chosen.
var PlacementSuite = []SuiteCase{
	{"bundled:mixed", ClusterMixed},
	{"bundled:fragment", ClusterDGX1},
	{"gen:mixed:seed=23:jobs=600", ClusterFleet},
	{"gen:mixed:seed=11:load=0.7", ClusterMixed},
	{"gen:mixed:seed=12:load=1.1", ClusterMixed},
	{"gen:mixed:seed=13:load=0.9", ClusterFleet},
	{"gen:mixed:seed=14:load=1.1", ClusterFleet},
	{"gen:mixed:seed=17:load=1.0", ClusterBridged},
	{"gen:mixed:seed=19:load=0.9:jobs=800", ClusterBridged},
	{"gen:mixed:seed=18:load=0.8", ClusterFourGenerations},
	{"gen:fragment:seed=15:load=0.8", ClusterDGX1},
	{"gen:fragment:seed=16:load=1.1", ClusterSmallMixed},
}

// SuiteFallbackAfter is the fallbackAfter the suite's fallback run gives
// model-parallel jobs: a few cluster events, well inside the queue timeout.
const SuiteFallbackAfter = 5 * time.Minute

// SuiteRow is one case's outcome: gputopo with the strict default policy
// table, gputopo with fallbackAfter on, the per-decision optimum, and the
// best count-only baseline by acceptance (first-fit or pair-sum).
type SuiteRow struct {
	Case                       SuiteCase
	Gputopo, Fallback, Optimum Result
	CountOnly                  Result
	RingOK, WaitOK, AcceptOK   bool
	NVLinkOK, FallbackAcceptOK bool
}

// OK says whether every acceptance point holds on the row.
func (r SuiteRow) OK() bool {
	return r.RingOK && r.WaitOK && r.AcceptOK && r.NVLinkOK && r.FallbackAcceptOK
}

// RunSuite runs every case with ext (nil: defaults) and the default
// policy table, once strict and once with SuiteFallbackAfter on the
// model intent.
func RunSuite(cases []SuiteCase, ext *configv1alpha1.ExtenderConfiguration) ([]SuiteRow, error) {
	strict := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	fallback := strict
	fallback.Model.FallbackAfter = &metav1.Duration{Duration: SuiteFallbackAfter}
	rows := make([]SuiteRow, 0, len(cases))
	for _, c := range cases {
		tr, nodes, err := loadCase(c.Trace, c.Cluster)
		if err != nil {
			return nil, err
		}
		cfg := Config{Nodes: nodes, Jobs: tr.Jobs, MaxWait: DefaultMaxWait, Extender: ext, PolicyTable: &strict,
			Policies: []string{PolicyGputopo, PolicyOptimum, PolicyFirstFit, PolicyPairSum}}
		rs, err := Run(cfg)
		if err != nil {
			return nil, fmt.Errorf("%s on %s: %w", c.Trace, c.Cluster, err)
		}
		cfg.Policies, cfg.PolicyTable = []string{PolicyGputopo}, &fallback
		fb, err := Run(cfg)
		if err != nil {
			return nil, fmt.Errorf("%s on %s with fallbackAfter: %w", c.Trace, c.Cluster, err)
		}
		row := SuiteRow{Case: c, Gputopo: rs[0], Optimum: rs[1], CountOnly: rs[2], Fallback: fb[0]}
		if rs[3].Accepted > row.CountOnly.Accepted {
			row.CountOnly = rs[3]
		}
		g, o := row.Gputopo, row.Optimum
		row.RingOK = g.ModelRingMeanGBps >= o.ModelRingMeanGBps
		row.WaitOK = g.MeanWait <= o.MeanWait
		row.AcceptOK = g.Accepted >= o.Accepted
		row.NVLinkOK = g.ModelNVLink == g.ModelAccepted
		row.FallbackAcceptOK = row.Fallback.Accepted >= row.CountOnly.Accepted
		rows = append(rows, row)
	}
	return rows, nil
}

// WriteSuite prints the suite's table: per case gputopo against the
// optimum on model ring bandwidth, mean wait and acceptance, the NVLink
// share of gputopo's model jobs, and gputopo with fallbackAfter against
// the best count-only baseline.
func WriteSuite(w io.Writer, rows []SuiteRow) error {
	tw := markdownTable(w, "trace", "cluster", "model ring GB/s gputopo / optimum", "mean wait gputopo / optimum", "accepted gputopo / optimum", "model on NVLink", "accepted with fallbackAfter / best count-only", "degraded model jobs", "all hold")
	mark := func(ok bool) string {
		if ok {
			return ""
		}
		return " ✗"
	}
	for _, r := range rows {
		g, o, f, c := r.Gputopo, r.Optimum, r.Fallback, r.CountOnly
		degraded := f.ModelAccepted - f.ModelNVLink
		fmt.Fprintf(tw, "| %s\t| %s\t| %.1f / %.1f%s\t| %s / %s%s\t| %.1f%% / %.1f%%%s\t| %.1f%%%s\t| %.1f%% / %.1f%% (%s)%s\t| %d/%d (%.1f%%)\t| %s\t|\n",
			r.Case.Trace, r.Case.Cluster,
			g.ModelRingMeanGBps, o.ModelRingMeanGBps, mark(r.RingOK),
			g.MeanWait.Round(time.Second), o.MeanWait.Round(time.Second), mark(r.WaitOK),
			100*g.AcceptanceRate(), 100*o.AcceptanceRate(), mark(r.AcceptOK),
			100*g.NVLinkShare(), mark(r.NVLinkOK),
			100*f.AcceptanceRate(), 100*c.AcceptanceRate(), c.Policy, mark(r.FallbackAcceptOK),
			degraded, f.ModelAccepted, 100*ratio(degraded, f.ModelAccepted), yesNo(r.OK()))
	}
	return tw.Flush()
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

// loadCase loads a suite case's trace and cluster.
func loadCase(trace, cluster string) (Trace, []Node, error) {
	tr, err := LoadTrace(trace)
	if err != nil {
		return Trace{}, nil, err
	}
	nodes, err := ParseCluster(cluster)
	if err != nil {
		return Trace{}, nil, err
	}
	return tr, nodes, nil
}
