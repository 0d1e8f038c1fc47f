package app

import (
	"github.com/spf13/cobra"

	"github.com/gputopo/gputopo/simulator"
)

func init() { subcommands = append(subcommands, newSimulateCommand) }

func newSimulateCommand() *cobra.Command {
	opts := simulator.Options{Trace: "bundled:mixed", MaxWait: simulator.DefaultMaxWait}
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay a GPU job trace through gputopo's placement code and the common baselines",
		Long: `simulate replays a job trace in simulated time through the extender's own
filter, prioritize and bind code (on a fake API server) and, on the same
trace in the same run, through count-only first fit, pair-score sum,
go-gpuallocator-style best-effort partition and the exhaustive per-decision
optimum. It prints acceptance, NVLink share of model-parallel jobs, ring
bandwidth, fragmentation over time and decision time per policy.

Traces: bundled:mixed, bundled:fragment, gen:<mixed|fragment>[:seed=N][:jobs=N][:load=F],
or a CSV file (` + simulator.TraceHeader + `). See docs/simulator.md.`,
		Example: `  gputopo simulate --trace bundled:fragment --out _out/sim-fragment
  gputopo simulate --cluster dgx-a100=8,pcie-8x=8 --trace gen:mixed:seed=7:jobs=2000`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return simulator.Simulate(cmd.OutOrStdout(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Cluster, "cluster", "", "nodes as fixture=count,... (default: the trace's own cluster)")
	f.StringVar(&opts.Trace, "trace", opts.Trace, "trace: bundled:<name>, gen:<kind>[:key=value...], or a CSV file")
	f.StringVar(&opts.OutDir, "out", "", "directory for report.md, report.svg and trace.csv")
	f.DurationVar(&opts.MaxWait, "max-wait", opts.MaxWait, "queue timeout: a job not placed this long after arrival is rejected")
	f.StringSliceVar(&opts.Policies, "policy", nil, "policies to compare (default all: gputopo, optimum, first-fit, pair-sum, partition)")
	return cmd
}
