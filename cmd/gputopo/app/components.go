package app

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/webhook"
)

func init() {
	subcommands = append(subcommands, newWebhookCommand, newExtenderCommand, newNodeAgentCommand)
}

// kubeconfigFlag adds --kubeconfig and returns a loader: the named file,
// else $KUBECONFIG, in-cluster config or ~/.kube/config.
func kubeconfigFlag(fs *pflag.FlagSet) func() (*rest.Config, error) {
	path := fs.String("kubeconfig", "", "path to a kubeconfig; empty: $KUBECONFIG, in-cluster config, or ~/.kube/config")
	return func() (*rest.Config, error) {
		if *path != "" {
			cfg, err := clientcmd.BuildConfigFromFlags("", *path)
			if err != nil {
				return nil, fmt.Errorf("load kubeconfig %s: %w", *path, err)
			}
			return cfg, nil
		}
		cfg, err := ctrlconfig.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("load kubeconfig: %w", err)
		}
		return cfg, nil
	}
}

func newWebhookCommand() *cobra.Command {
	opts := webhook.DefaultOptions()
	return component("webhook", "Serve the mutating and validating admission webhook",
		opts.AddFlags, func() error { return opts.Validate() },
		func(ctx context.Context, rc *rest.Config) error {
			cfg := webhook.DefaultConfig()
			if opts.ConfigFile != "" {
				var err error
				if cfg, err = webhook.LoadConfig(opts.ConfigFile); err != nil {
					return err
				}
			}
			return webhook.Run(ctx, cfg, rc, opts)
		})
}

// component builds a subcommand that validates its options, loads the
// cluster connection and runs one component.
func component(use, short string, addFlags func(*pflag.FlagSet), validate func() error, run func(context.Context, *rest.Config) error) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs}
	addFlags(cmd.Flags())
	restConfig := kubeconfigFlag(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := validate(); err != nil {
			return err
		}
		rc, err := restConfig()
		if err != nil {
			return err
		}
		return run(cmd.Context(), rc)
	}
	return cmd
}

func newExtenderCommand() *cobra.Command {
	opts := extender.NewOptions()
	return component("extender", "Serve the kube-scheduler extender (filter, prioritize, bind)",
		opts.AddFlags, func() error { return opts.Validate() },
		func(ctx context.Context, rc *rest.Config) error { return extender.Run(ctx, rc, opts) })
}

func newNodeAgentCommand() *cobra.Command {
	var opts nodeagent.Options
	cmd := component("nodeagent", "Discover GPUs with NVML, publish NodeGPUTopology, and serve the kubelet device plugin",
		opts.AddFlags, func() error { return opts.Validate() },
		func(ctx context.Context, rc *rest.Config) error { return nodeagent.Run(ctx, rc, opts) })
	cmd.AddCommand(newNodeAgentDumpCommand())
	return cmd
}
