package app

import (
	"strconv"

	"github.com/spf13/cobra"

	"github.com/gputopo/gputopo/simulator"
)

func init() { subcommands = append(subcommands, newSimulateCommand) }

// SeedsTrace is the trace --seeds replays when --trace is not given: the
// generator of the default trace, bundled:mixed, which is its seed 1 with
// the generator's defaults (500 jobs, load 0.9).
const SeedsTrace = "gen:mixed"

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
gen:<gang-nvl72|gang-hgx|gang-fleet>[...] (jobs of several pods, replayed through
the gang policies), or a CSV file (` + simulator.TraceHeader + `[,pods] or [,priority]). --seeds N replays N seeds of a
generated trace; without --trace it replays gen:mixed, the generator of the
default trace (bundled:mixed is gen:mixed:seed=1:jobs=500), seeds 1..N.
See docs/simulator.md.`,
		Example: `  gputopo simulate --trace bundled:fragment --out _out/sim-fragment
  gputopo simulate --cluster dgx-a100=8,pcie-8x=8 --trace gen:mixed:seed=7:jobs=2000
  gputopo simulate --trace gen:mixed:load=1.0 --seeds 10 --extender-config my-extender.yaml --webhook-config my-webhook.yaml
  gputopo simulate --extender-config my-extender.yaml --seeds 10
  gputopo simulate --gang-suite --out _out/sim-gang
  gputopo simulate --sliced-suite --out _out/sim-sliced
  gputopo simulate --preemption-suite --out _out/sim-preempt
  gputopo simulate --family test --out _out/sim-family`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Seeds > 1 && !cmd.Flags().Changed("trace") {
				// Seeds of the default trace's own generator: seed 1 is
				// bundled:mixed itself.
				opts.Trace = SeedsTrace
			}
			return simulator.Simulate(cmd.OutOrStdout(), opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Cluster, "cluster", "", "nodes as machine=count,...; a machine is a built-in fixture name or a machine file (default: the trace's own cluster)")
	f.StringVar(&opts.Trace, "trace", opts.Trace, "trace: bundled:<name>, gen:<kind>[:key=value...], or a CSV file")
	f.StringVar(&opts.OutDir, "out", "", "directory for report.md, report.svg and trace.csv")
	f.DurationVar(&opts.MaxWait, "max-wait", opts.MaxWait, "queue timeout: a job not placed this long after arrival is rejected")
	f.StringSliceVar(&opts.Policies, "policy", nil, "policies to compare (default all: gputopo, optimum, first-fit, pair-sum, partition; for a trace with groups: gputopo, gputopo-per-pod, gang-first-fit, tas-like, optimum)")
	f.StringVar(&opts.ExtenderConfig, "extender-config", "", "ExtenderConfiguration file for gputopo's weights and settings (the extender's --config; default: built-in defaults)")
	f.StringVar(&opts.WebhookConfig, "webhook-config", "", "webhook configuration file whose policyTable turns intents into requirements (the webhook's --config; default: built-in table)")
	f.BoolVar(&opts.Suite, "suite", false, "run the placement suite (12 traces on 5 cluster mixes) and print gputopo against the optimum and the count-only baselines, with and without fallbackAfter")
	f.BoolVar(&opts.GangSuite, "gang-suite", false, "run the gang suite (groups of pods on NVL72, HGX/DGX and mixed fleets in a fabric) and print gputopo's group planning against per-pod gputopo, a count-only gang scheduler, a Kueue-TAS-like placer and the greedy optimum")
	f.BoolVar(&opts.SlicedSuite, "sliced-suite", false, "run the sliced suite (groups cut into slices, each required inside one NVLink domain or leaf, on NVL72 and HGX/DGX fabrics) and print gputopo against the same baselines, tas-like placing slices as Kueue's topology-aware scheduling does")
	f.StringVar(&opts.DeclaredDurations, "declared-durations", simulator.DeclareNone, "with --gang-suite: what the jobs' pods declare they run at most (spec.activeDeadlineSeconds), which reservations for waiting groups backfill by: "+simulator.DeclareNone+", "+simulator.DeclareExact+", "+simulator.DeclareDouble+" (twice the duration) or "+simulator.DeclareHours+" (rounded up to whole hours)")
	f.BoolVar(&opts.PreemptionSuite, "preemption-suite", false, "run the preemption suite (priority traces on a mixed cluster) and print gputopo's preemption against count-only preemption (kube-scheduler's victim search without gputopo's filter) and plain kube-scheduler")
	f.StringVar(&opts.Family, "family", "", "run a family of the generalisation benchmark: "+simulator.FamilyTune+" (seeds from "+strconv.Itoa(simulator.FamilyTuneSeed)+", for tuning) or "+simulator.FamilyTest+" (seeds from "+strconv.Itoa(simulator.FamilyTestSeed)+", never tuned on): random cluster mixes and workloads, single pods and groups, every policy, mean, worst and traces won per column, and the acceptance points")
	f.IntVar(&opts.FamilySize, "family-size", 0, "cases of --family (default "+strconv.Itoa(simulator.FamilySize)+")")
	f.IntVar(&opts.FamilyReplicas, "family-replicas", 0, "times --family replays each case (default "+strconv.Itoa(simulator.FamilyReplicas)+"; with --gang-suite, each trace, default 1): its drawn traces, then copies with every arrival moved later by up to "+simulator.FamilyJitter.String()+"; the acceptance points are judged per case on the mean of its replicas, and also on the drawn traces alone, beside how far a policy moves against itself between replicas")
	f.StringSliceVar(&opts.FamilyMachines, "family-machines", nil, "machine files (gputopo machine import) the --family mixes draw from beside the built-in machines")
	f.IntVar(&opts.Seeds, "seeds", 0, "run this many seeds of a gen: trace (its seed, then +1, ...; without --trace, "+SeedsTrace+") and report mean, worst and runs won per column")
	return cmd
}
