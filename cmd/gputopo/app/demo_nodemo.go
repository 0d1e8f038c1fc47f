//go:build nodemo

package app

import (
	"errors"

	"github.com/spf13/cobra"
)

// The image's binary is built with -tags nodemo: the demo starts
// kube-apiserver and etcd through envtest, whose package init writes below
// /tmp and fails on the components' read-only root filesystems.
func init() { subcommands = append(subcommands, newDemoCommand) }

func newDemoCommand() *cobra.Command {
	return &cobra.Command{
		Use:    "demo",
		Short:  "Not in this build: run `make demo` from a source checkout",
		Hidden: true,
		Args:   cobra.ArbitraryArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("this gputopo build (the container image's, -tags nodemo) has no demo: it starts kube-apiserver and etcd from bin/; run `make demo` in a source checkout")
		},
	}
}
