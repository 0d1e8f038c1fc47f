package simulator

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// Options are the inputs of one `gputopo simulate` run.
type Options struct {
	// Cluster is a ParseCluster spec; empty means the trace's own cluster.
	Cluster string
	// Trace is a LoadTrace source.
	Trace string
	// OutDir, when set, receives report.md, report.svg, placements.csv and
	// trace.csv.
	OutDir string
	// MaxWait is the queue timeout (DefaultMaxWait when zero).
	MaxWait time.Duration
	// Policies to compare; empty means all.
	Policies []string
	// ExtenderConfig is the path of an ExtenderConfiguration file for the
	// gputopo policy (weights, ...); empty means the defaults.
	ExtenderConfig string
	// WebhookConfig is the path of a webhook configuration file whose
	// policyTable turns job intents into requirements (for gputopo and
	// the optimum); empty means the default table.
	WebhookConfig string
	// Seeds, when above 1, runs that many generated traces: Trace must be
	// a gen: spec, and run i uses seed (its seed, default 1) + i. The
	// report gives per column the mean, the worst run and the runs won.
	Seeds int
	// Suite runs the placement suite (PlacementSuite) instead of one
	// trace: the acceptance table of docs/benchmarks.md.
	Suite bool
	// GangSuite runs the gang suite (GangSuite): groups of pods on
	// clusters in a fabric, every gang policy side by side.
	GangSuite bool
	// SlicedSuite runs the sliced suite (SlicedSuite): groups cut into
	// slices, every gang policy side by side.
	SlicedSuite bool
	// DeclaredDurations is how the gang suite's jobs declare their
	// durations (DeclareDurations; "": none).
	DeclaredDurations string
	// PreemptionSuite runs the preemption suite (PreemptionSuite):
	// priority traces, gputopo's preemption against count-only
	// preemption.
	PreemptionSuite bool
	// Family runs the generalisation benchmark's family of that name
	// (FamilyTune or FamilyTest): FamilySize cases (FamilySize when 0) of
	// random cluster mixes, with the built-in machines and
	// FamilyMachines (machine files).
	Family         string
	FamilySize     int
	FamilyMachines []string
	// FamilyReplicas is how many times each case is replayed
	// (FamilyReplicas when 0; Replicate).
	FamilyReplicas int
}

// configs loads the extender and webhook configuration files of o.
func (o Options) configs() (*configv1alpha1.ExtenderConfiguration, *configv1alpha1.PolicyTable, error) {
	var ext *configv1alpha1.ExtenderConfiguration
	var table *configv1alpha1.PolicyTable
	if o.ExtenderConfig != "" {
		c, err := configv1alpha1.LoadExtender(o.ExtenderConfig)
		if err != nil {
			return nil, nil, fmt.Errorf("--extender-config: %w", err)
		}
		ext = c
	}
	if o.WebhookConfig != "" {
		c, err := configv1alpha1.LoadWebhook(o.WebhookConfig)
		if err != nil {
			return nil, nil, fmt.Errorf("--webhook-config: %w", err)
		}
		table = &c.PolicyTable
	}
	return ext, table, nil
}

// SeedSpecs expands a gen: trace spec into n specs with consecutive seeds,
// starting at its own seed (default 1).
func SeedSpecs(spec string, n int) ([]string, error) {
	if !strings.HasPrefix(spec, "gen:") {
		return nil, fmt.Errorf("--seeds: needs a generated trace (gen:<kind>[:key=value...]), not %q", spec)
	}
	if n < 1 || n > 1000 {
		return nil, fmt.Errorf("--seeds: %d: must be 1..1000", n)
	}
	parts := strings.Split(spec, ":")
	base, at := uint64(1), -1
	for i, kv := range parts[2:] {
		if v, ok := strings.CutPrefix(kv, "seed="); ok {
			s, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("--trace %q: parameter %q: %w", spec, kv, err)
			}
			base, at = s, i+2
		}
	}
	out := make([]string, n)
	for i := range out {
		p := append([]string(nil), parts...)
		seed := fmt.Sprintf("seed=%d", base+uint64(i))
		if at >= 0 {
			p[at] = seed
		} else {
			p = append(p, seed)
		}
		out[i] = strings.Join(p, ":")
	}
	return out, nil
}

// Simulate runs o and prints the table to w.
func Simulate(w io.Writer, o Options) error {
	ext, table, err := o.configs()
	if err != nil {
		return err
	}
	if n := btoi(o.Suite) + btoi(o.GangSuite) + btoi(o.SlicedSuite) + btoi(o.PreemptionSuite) + btoi(o.Family != ""); n > 1 {
		return fmt.Errorf("--suite, --gang-suite, --sliced-suite, --preemption-suite and --family: give one")
	}
	if d := o.DeclaredDurations; d != "" && d != DeclareNone && !o.GangSuite {
		return fmt.Errorf("--declared-durations %s: only with --gang-suite (the traces declare no durations)", d)
	}
	if o.Family != "" {
		return simulateFamily(w, o, ext)
	}
	if o.PreemptionSuite {
		return simulatePreemptionSuite(w, o, ext)
	}
	if o.Suite {
		return simulateSuite(w, o, ext)
	}
	if o.GangSuite {
		return simulateGangSuite(w, o, ext)
	}
	if o.SlicedSuite {
		if err := fixedSuite(o, "--sliced-suite"); err != nil {
			return err
		}
		rows, err := RunSlicedSuite(SlicedSuite, ext)
		if err != nil {
			return err
		}
		return writeSuiteReport(w, o, rows, func(held int) string {
			return fmt.Sprintf("sliced suite: %d traces on %d cluster mixes; every slice and hold point holds on %d; max wait %s\n\n", len(rows), len(rows)/3, held, DefaultMaxWait)
		}, WriteSlicedSuite)
	}
	if o.Seeds > 1 {
		return simulateSeeds(w, o, ext, table)
	}
	tr, err := LoadTrace(o.Trace)
	if err != nil {
		return err
	}
	cluster := o.Cluster
	if cluster == "" {
		cluster = tr.Cluster
	}
	if cluster == "" {
		return fmt.Errorf("--cluster: required for trace %s (e.g. %q)", o.Trace, ClusterMixed)
	}
	nodes, err := ParseCluster(cluster)
	if err != nil {
		return fmt.Errorf("--%w", err) // "--cluster: ..."
	}
	if hasGroups(tr.Jobs) {
		return simulateGang(w, o, tr, cluster, nodes, ext, table)
	}
	cfg := Config{Nodes: nodes, Jobs: tr.Jobs, MaxWait: o.MaxWait, Policies: o.Policies, Extender: ext, PolicyTable: table}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	results, err := Run(cfg)
	if err != nil {
		return err
	}
	gpus := 0
	for _, n := range nodes {
		gpus += n.Graph.Len()
	}
	head := fmt.Sprintf("trace %s: %d jobs; cluster %s: %d nodes, %d GPUs; max wait %s", tr.Name, len(tr.Jobs), cluster, len(nodes), gpus, cfg.MaxWait)
	fmt.Fprintln(w, head)
	fmt.Fprintln(w)
	if err := WriteTable(w, results); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := WriteWinners(w, results); err != nil {
		return err
	}
	if o.OutDir == "" {
		return nil
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	var md strings.Builder
	md.WriteString(head + "\n\n")
	if err := WriteTable(&md, results); err != nil {
		return err
	}
	md.WriteString("\n")
	if err := WriteWinners(&md, results); err != nil {
		return err
	}
	files := map[string]func(io.Writer) error{
		"report.md":      func(w io.Writer) error { _, err := io.WriteString(w, md.String()); return err },
		"report.svg":     func(w io.Writer) error { return WriteSVG(w, head, results) },
		"placements.csv": func(w io.Writer) error { return WritePlacements(w, results) },
		"trace.csv": func(w io.Writer) error {
			return WriteTrace(w, []string{"source: " + tr.Name, "cluster: " + cluster}, tr.Jobs)
		},
	}
	for name, write := range files {
		if err := writeFile(filepath.Join(o.OutDir, name), write); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nwrote %s/{report.md,report.svg,placements.csv,trace.csv}\n", o.OutDir)
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// simulateSeeds runs o.Seeds generated traces and prints their summary.
func simulateSeeds(w io.Writer, o Options, ext *configv1alpha1.ExtenderConfiguration, table *configv1alpha1.PolicyTable) error {
	specs, err := SeedSpecs(o.Trace, o.Seeds)
	if err != nil {
		return err
	}
	maxWait := o.MaxWait
	if maxWait == 0 {
		maxWait = DefaultMaxWait
	}
	var runs [][]Result
	cluster := o.Cluster
	for _, spec := range specs {
		tr, err := LoadTrace(spec)
		if err != nil {
			return err
		}
		if o.Cluster == "" {
			cluster = tr.Cluster
		}
		nodes, err := ParseCluster(cluster)
		if err != nil {
			return fmt.Errorf("--%w", err)
		}
		rs, err := Run(Config{Nodes: nodes, Jobs: tr.Jobs, MaxWait: maxWait, Policies: o.Policies, Extender: ext, PolicyTable: table})
		if err != nil {
			return fmt.Errorf("trace %s: %w", spec, err)
		}
		runs = append(runs, rs)
	}
	head := fmt.Sprintf("traces %s .. %s (%d seeds); cluster %s; max wait %s", specs[0], specs[len(specs)-1], len(specs), cluster, maxWait)
	var md strings.Builder
	md.WriteString(head + "\n\n")
	if err := WriteSummary(&md, Summarize(runs)); err != nil {
		return err
	}
	if err := writeReport(w, o.OutDir, md.String()); err != nil || o.OutDir == "" {
		return err
	}
	fmt.Fprintf(w, "\nwrote %s/report.md\n", o.OutDir)
	return nil
}

// simulateSuite runs the placement suite with the extender configuration
// of o and prints (and, with OutDir, writes) its table.
func simulateSuite(w io.Writer, o Options, ext *configv1alpha1.ExtenderConfiguration) error {
	if o.WebhookConfig != "" || o.Seeds > 1 || o.Cluster != "" {
		return fmt.Errorf("--suite: runs fixed traces and clusters with the default policy table; drop --webhook-config, --seeds and --cluster")
	}
	rows, err := RunSuite(PlacementSuite, ext)
	if err != nil {
		return err
	}
	return writeSuiteReport(w, o, rows, func(held int) string {
		return fmt.Sprintf("placement suite: %d traces; every acceptance point holds on %d; fallbackAfter %s in the fallback run; max wait %s\n\n", len(rows), held, SuiteFallbackAfter, DefaultMaxWait)
	}, WriteSuite)
}

// writeSuiteReport prints (and, with OutDir, writes) a suite's report: the
// head line, given how many rows hold every acceptance point, then the
// table.
func writeSuiteReport[R interface{ OK() bool }](w io.Writer, o Options, rows []R, head func(held int) string, table func(io.Writer, []R) error) error {
	held := 0
	for _, r := range rows {
		if r.OK() {
			held++
		}
	}
	return renderReport(w, o.OutDir, func(md io.Writer) error {
		if _, err := io.WriteString(md, head(held)); err != nil {
			return err
		}
		return table(md, rows)
	})
}

// renderReport renders a report's Markdown with write, then prints (and,
// with outDir, writes) it (writeReport).
func renderReport(w io.Writer, outDir string, write func(io.Writer) error) error {
	var md strings.Builder
	if err := write(&md); err != nil {
		return err
	}
	return writeReport(w, outDir, md.String())
}

func hasGroups(jobs []Job) bool {
	for _, j := range jobs {
		if j.Group() {
			return true
		}
	}
	return false
}

// simulateGang replays a trace with groups through the gang policies and
// prints (and, with OutDir, writes) their table.
func simulateGang(w io.Writer, o Options, tr Trace, cluster string, nodes []Node, ext *configv1alpha1.ExtenderConfiguration, table *configv1alpha1.PolicyTable) error {
	maxWait := o.MaxWait
	if maxWait == 0 {
		maxWait = DefaultMaxWait
	}
	results, err := RunGang(GangConfig{Nodes: nodes, Jobs: tr.Jobs, MaxWait: maxWait, Policies: o.Policies, Extender: ext, PolicyTable: table})
	if err != nil {
		return err
	}
	gpus, groups := 0, 0
	for _, n := range nodes {
		gpus += n.Graph.Len()
	}
	for _, j := range tr.Jobs {
		if j.Group() {
			groups++
		}
	}
	var md strings.Builder
	fmt.Fprintf(&md, "trace %s: %d jobs, %d of them groups; cluster %s: %d nodes, %d GPUs; max wait %s\n\n", tr.Name, len(tr.Jobs), groups, cluster, len(nodes), gpus, maxWait)
	if err := WriteGangTable(&md, results); err != nil {
		return err
	}
	if err := writeReport(w, o.OutDir, md.String()); err != nil || o.OutDir == "" {
		return err
	}
	if err := writeFile(filepath.Join(o.OutDir, "trace.csv"), func(w io.Writer) error {
		return WriteTrace(w, []string{"source: " + tr.Name, "cluster: " + cluster}, tr.Jobs)
	}); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nwrote %s/{report.md,trace.csv}\n", o.OutDir)
	return nil
}

// simulateGangSuite runs the gang suite with the extender configuration
// of o and prints (and, with OutDir, writes) its tables.
func simulateGangSuite(w io.Writer, o Options, ext *configv1alpha1.ExtenderConfiguration) error {
	if err := fixedSuite(o, "--gang-suite"); err != nil {
		return err
	}
	reps, err := RunGangSuiteReplicas(GangSuite, ext, o.DeclaredDurations, max(1, o.FamilyReplicas))
	if err != nil {
		return err
	}
	rows := reps[0]
	return writeSuiteReport(w, o, rows, func(held int) string {
		return fmt.Sprintf("gang suite: %d traces on %d cluster mixes; every acceptance point holds on %d; max wait %s\n\n", len(rows), gangMixes(rows), held, DefaultMaxWait)
	}, func(w io.Writer, rows []GangRow) error {
		if err := WriteGangSuite(w, rows); err != nil {
			return err
		}
		return WriteGangReplicas(w, reps)
	})
}

// simulateFamily runs a family of the generalisation benchmark with the
// extender configuration of o and prints (and, with OutDir, writes) its
// report.
func simulateFamily(w io.Writer, o Options, ext *configv1alpha1.ExtenderConfiguration) error {
	if err := fixedSuite(o, "--family"); err != nil {
		return err
	}
	size := o.FamilySize
	if size == 0 {
		size = FamilySize
	}
	cases, err := FamilyCases(o.Family, size, o.FamilyMachines)
	if err != nil {
		return err
	}
	replicas := o.FamilyReplicas
	if replicas == 0 {
		replicas = FamilyReplicas
	}
	if cases, err = Replicate(cases, replicas); err != nil {
		return err
	}
	run, err := RunFamily(o.Family, cases, ext)
	if err != nil {
		return err
	}
	return renderReport(w, o.OutDir, func(md io.Writer) error { return WriteFamily(md, run) })
}

// simulatePreemptionSuite runs the preemption suite with the extender
// configuration of o and prints (and, with OutDir, writes) its table.
func simulatePreemptionSuite(w io.Writer, o Options, ext *configv1alpha1.ExtenderConfiguration) error {
	if err := fixedSuite(o, "--preemption-suite"); err != nil {
		return err
	}
	rows, err := RunPreemptionSuite(PreemptionSuite, ext)
	if err != nil {
		return err
	}
	return renderReport(w, o.OutDir, func(md io.Writer) error { return WritePreemptionSuite(md, rows) })
}

// fixedSuite refuses, for the suite flag, the options a suite with its own
// traces, clusters and policies does not take.
func fixedSuite(o Options, flag string) error {
	if o.WebhookConfig != "" || o.Seeds > 1 || o.Cluster != "" || len(o.Policies) > 0 {
		return fmt.Errorf("%s: runs fixed traces, clusters and policies with the default policy table; drop --webhook-config, --seeds, --cluster and --policy", flag)
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func gangMixes(rows []GangRow) int {
	seen := map[string]bool{}
	for _, r := range rows {
		seen[r.Case.Cluster] = true
	}
	return len(seen)
}

// writeReport writes a suite's report to w and, with outDir, to
// outDir/report.md.
func writeReport(w io.Writer, outDir, md string) error {
	if _, err := io.WriteString(w, md); err != nil {
		return err
	}
	if outDir == "" {
		return nil
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return fmt.Errorf("--out: %w", err)
	}
	return writeFile(filepath.Join(outDir, "report.md"), func(w io.Writer) error { _, err := io.WriteString(w, md); return err })
}
