package app

import (
	"context"
	"flag"
	"fmt"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Version is stamped at build time with
// -ldflags "-X github.com/gputopo/gputopo/cmd/gputopo/app.Version=v0.1.0".
var Version = "v0.0.0-dev"

// NewCommand returns the root command. ctx is cancelled on SIGINT/SIGTERM.
func NewCommand(ctx context.Context) *cobra.Command {
	root := &cobra.Command{
		Use:           "gputopo",
		Short:         "GPU-topology-aware scheduling for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	root.PersistentFlags().AddGoFlagSet(klogFlags)
	root.SetContext(ctx)
	// controller-runtime logs through klog like the rest of the binary.
	ctrllog.SetLogger(klog.NewKlogr())
	root.AddCommand(newVersionCommand())
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	return root
}

// subcommands are registered by the files of this package, one per
// component.
var subcommands []func() *cobra.Command

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), Version)
			return err
		},
	}
}
