package app

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
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
		`webhook serves gputopo's admission webhooks over TLS (--port, certificates in
--cert-dir): for GPU pods in namespaces labelled gputopo.io/injection=enabled
it derives the gputopo.io/gpu-topology-requirement annotation from the
workload's intent, routes the pod to the gputopo-scheduler profile and labels
its job; Jobs get their intent copied into the pod template. It refuses GPU
assignments written by anyone but gputopo's own service accounts, and
containers that would choose their own devices through NVIDIA_ variables.
The Helm chart runs it as a Deployment and registers the webhook
configurations. See docs/webhook.md.`,
		opts.AddFlags, func() error { return opts.Validate() },
		func(ctx context.Context, rc *rest.Config) error {
			cfg := configv1alpha1.DefaultWebhookConfiguration()
			if opts.ConfigFile != "" {
				var err error
				if cfg, err = configv1alpha1.LoadWebhook(opts.ConfigFile); err != nil {
					return err
				}
			}
			return webhook.Run(ctx, cfg, rc, opts)
		})
}

// component builds a subcommand that validates its options, loads the
// cluster connection and runs one component; it logs through klog, and
// takes klog's flags.
func component(use, short, long string, addFlags func(*pflag.FlagSet), validate func() error, run func(context.Context, *rest.Config) error) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Long: long, Args: cobra.NoArgs, GroupID: groupComponents}
	addFlags(cmd.Flags())
	addLogFlags(cmd)
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
		`extender serves the scheduler extender verbs that kube-scheduler's
gputopo-scheduler profile calls for every GPU pod: filter keeps the nodes
whose free, healthy GPUs can meet the pod's requirement (with a reason for
every other node), prioritize scores them, and bind writes the pod's Binding
with the exact GPUs (gputopo.io/assigned-gpus, gputopo.io/placement) in the
same write. Its state comes from informers (NodeGPUTopology, Nodes, Pods);
with --leader-elect only the Lease holder serves and is Ready. --config
names an ExtenderConfiguration (weights, staleness limits, timeouts).
See docs/extender.md.`,
		opts.AddFlags, func() error { return opts.Validate() },
		func(ctx context.Context, rc *rest.Config) error { return extender.Run(ctx, rc, opts) })
}

func newNodeAgentCommand() *cobra.Command {
	var opts nodeagent.Options
	cmd := component("nodeagent", "Discover GPUs with NVML, publish NodeGPUTopology, and serve the kubelet device plugin",
		`nodeagent runs on every GPU node (the chart's DaemonSet): it reads the GPUs,
their links and telemetry through NVML, publishes them in the node's
NodeGPUTopology, serves kubelet's device plugin API for the GPU resource so
that a container gets exactly the GPUs kubelet allocated (and the ones the
extender planned, when kubelet follows its preference), and records what
each pod really holds in gputopo.io/allocated-gpus. --simulate runs it on a
simulated machine instead of the NVIDIA driver. See docs/nodeagent.md.`,
		opts.AddFlags, func() error { return opts.Validate() },
		func(ctx context.Context, rc *rest.Config) error { return nodeagent.Run(ctx, rc, opts) })
	cmd.AddCommand(newNodeAgentDumpCommand())
	return cmd
}
