package simulator

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
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
}

// Simulate runs o and prints the table to w.
func Simulate(w io.Writer, o Options) error {
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
	cfg := Config{Nodes: nodes, Jobs: tr.Jobs, MaxWait: o.MaxWait, Policies: o.Policies}
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
