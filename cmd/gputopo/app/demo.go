//go:build !nodemo

package app

import (
	"github.com/spf13/cobra"

	"github.com/gputopo/gputopo/demo"
)

func init() { subcommands = append(subcommands, newDemoCommand) }

func newDemoCommand() *cobra.Command {
	opts := demo.Options{OutDir: "_out/demo"}
	var machines string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole system on a simulated mixed GPU cluster and show where the GPUs landed",
		Long: `demo starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler
from bin/ (make tools), the webhook, the extender and a node agent on
simulated NVML per node of a mixed cluster (2x DGX A100, 2x DGX-1 V100,
2x 8-GPU PCIe), submits model-parallel, data-parallel and single-GPU work,
preemptible batch work on every GPU left, then a high-priority job that
must preempt. Then it places the same workload on the same nodes in a
second control plane through plain kube-scheduler (its default profile),
each pod's GPUs chosen as NVIDIA's device plugin chooses them, and prints
per job where its pods went under each scheduler and the bandwidth that
sets its pace. It draws both placements (<out>/placement.svg and
<out>/placement-plain.svg), prints the kubectl gputopo commands to try
with the cluster's kubeconfig, and tears everything down on exit or
Ctrl-C (with --keep, only on Ctrl-C).

--mode plugin runs gputopo-scheduler (kube-scheduler with gputopo's
framework plugin, make gputopo-scheduler) instead of kube-scheduler and the
HTTP extender: the same decisions, in-process.

--machines runs it on other machines instead: built-in fixtures or machine
files imported from your own servers ('gputopo machine import'); the
workloads shrink to fit them.`,
		Example: `  gputopo demo
  gputopo demo --mode plugin
  gputopo demo --machines mybox.yaml=2,dgx-a100=2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if machines != "" {
				cluster, err := demo.ParseMachines(machines)
				if err != nil {
					return err
				}
				opts.Cluster = cluster
			}
			opts.Out = cmd.OutOrStdout()
			return demo.Run(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.OutDir, "out", opts.OutDir, "directory for placement.svg, placement-plain.svg and component logs")
	cmd.Flags().StringVar(&machines, "machines", "", "nodes as machine=count,... where a machine is a fixture name or a machine file, e.g. mybox.yaml=2,dgx-a100=2 (default: 2x dgx-a100, 2x dgx1-v100, 2x pcie-8x)")
	cmd.Flags().StringVar(&opts.Mode, "mode", demo.ModeExtender, "extender: kube-scheduler calls the HTTP extender; plugin: gputopo-scheduler decides in-process (bin/gputopo-scheduler, make gputopo-scheduler)")
	cmd.Flags().BoolVar(&opts.Keep, "keep", false, "keep the cluster running after the report, for kubectl gputopo, until Ctrl-C")
	return cmd
}
