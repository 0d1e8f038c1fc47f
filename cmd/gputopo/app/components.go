package app

import (
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
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Serve the mutating and validating admission webhook",
		Args:  cobra.NoArgs,
	}
	opts.AddFlags(cmd.Flags())
	restConfig := kubeconfigFlag(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := opts.Validate(); err != nil {
			return err
		}
		cfg := webhook.DefaultConfig()
		if opts.ConfigFile != "" {
			var err error
			if cfg, err = webhook.LoadConfig(opts.ConfigFile); err != nil {
				return err
			}
		}
		rc, err := restConfig()
		if err != nil {
			return err
		}
		return webhook.Run(cmd.Context(), cfg, rc, opts)
	}
	return cmd
}

func newExtenderCommand() *cobra.Command {
	opts := extender.NewOptions()
	cmd := &cobra.Command{
		Use:   "extender",
		Short: "Serve the kube-scheduler extender (filter, prioritize, bind)",
		Args:  cobra.NoArgs,
	}
	opts.AddFlags(cmd.Flags())
	restConfig := kubeconfigFlag(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := opts.Validate(); err != nil {
			return err
		}
		rc, err := restConfig()
		if err != nil {
			return err
		}
		return extender.Run(cmd.Context(), rc, opts)
	}
	return cmd
}

func newNodeAgentCommand() *cobra.Command {
	var opts nodeagent.Options
	cmd := &cobra.Command{
		Use:   "nodeagent",
		Short: "Discover GPUs with NVML, publish NodeGPUTopology, and serve the kubelet device plugin",
		Args:  cobra.NoArgs,
	}
	opts.AddFlags(cmd.Flags())
	restConfig := kubeconfigFlag(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := opts.Validate(); err != nil {
			return err
		}
		rc, err := restConfig()
		if err != nil {
			return err
		}
		return nodeagent.Run(cmd.Context(), rc, opts)
	}
	return cmd
}
