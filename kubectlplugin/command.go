package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gputopo/gputopo/internal/picture"
)

// DefaultConfigMap is where the chart (release gputopo in gputopo-system)
// keeps the extender's configuration.
const DefaultConfigMap = "gputopo-system/gputopo-extender"

// Options are the flags every subcommand shares.
type Options struct {
	Out, ErrOut io.Writer
	// Kubeconfig, Context and Namespace are kubectl's flags of the same
	// names (KUBECONFIG applies as in kubectl).
	Kubeconfig, Context, Namespace string
	AllNamespaces                  bool
	// Output is "" (table), json or yaml.
	Output string
	// Color is auto (colour only on a terminal), always or never.
	Color string
	// ExtenderConfig and ExtenderConfigMap say where explain reads the
	// extender's configuration.
	ExtenderConfig, ExtenderConfigMap string
	// load reads the cluster; tests replace it.
	load func(ctx context.Context, o *Options) (*Snapshot, error)
}

// NewCommand is `kubectl gputopo` (binary kubectl-gputopo).
func NewCommand(out, errOut io.Writer) *cobra.Command {
	return newCommand(&Options{Out: out, ErrOut: errOut})
}

func newCommand(o *Options) *cobra.Command {
	o.Color, o.ExtenderConfigMap = "auto", DefaultConfigMap
	root := &cobra.Command{
		Use:   "kubectl-gputopo",
		Short: "Show GPU topology as gputopo sees it, and why GPU pods are Pending",
		Long: `kubectl gputopo reads the cluster with your kubeconfig (Nodes, NodeGPUTopology
objects, Pods) and shows what gputopo's scheduler extender sees:

  kubectl gputopo nodes                every GPU node: machine, free GPUs, largest free NVLink island, staleness
  kubectl gputopo node NAME [--svg F]  one node's GPUs, who holds them, and its link matrix
  kubectl gputopo pods [-A]            GPU pods: intent, requirement, node, GPUs, tier, ring bandwidth
  kubectl gputopo explain POD          why a pod is Pending (every node's verdict, by the extender's own
                                       code) or, for a bound pod, requested against achieved placement

Bandwidths are GB/s bidirectional, as NVIDIA quotes them. -o json|yaml for scripts.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(o.Out)
	root.SetErr(o.ErrOut)
	f := root.PersistentFlags()
	f.StringVar(&o.Kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
	f.StringVar(&o.Context, "context", "", "kubeconfig context to use")
	f.StringVarP(&o.Namespace, "namespace", "n", "", "namespace (default: the context's)")
	f.StringVarP(&o.Output, "output", "o", "", "output format: json or yaml (default: a table)")
	f.StringVar(&o.Color, "color", o.Color, "colour: auto (only on a terminal, not with NO_COLOR), always or never")
	f.StringVar(&o.ExtenderConfig, "extender-config", "", "file with the extender's ExtenderConfiguration (explain); overrides --extender-configmap")
	f.StringVar(&o.ExtenderConfigMap, "extender-configmap", o.ExtenderConfigMap, "NAMESPACE/NAME of the ConfigMap with the extender's config.yaml (explain); the defaults when unreadable")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if err := validOutput(o.Output); err != nil {
			return err
		}
		switch o.Color {
		case "auto", "always", "never":
			return nil
		}
		return fmt.Errorf("--color %q: must be auto, always or never", o.Color)
	}

	var svgFile string
	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "Every GPU node: machine, free/total GPUs, largest free NVLink island, unhealthy GPUs, drift, topology staleness and age",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := o.snapshot(cmd.Context())
			if err != nil {
				return err
			}
			rows := s.NodeSummaries()
			if svgFile != "" {
				if err := writeSVGFile(svgFile, s, s.gpuNodeNames()); err != nil {
					return err
				}
			}
			if o.data() {
				return writeData(o.Out, o.Output, rows)
			}
			return writeNodes(o.Out, o.painter(), rows)
		},
	}
	nodes.Flags().StringVar(&svgFile, "svg", "", "also draw every node's GPUs and links, coloured by pod, into this SVG file")
	node := &cobra.Command{
		Use:   "node NAME",
		Short: "One node: its GPUs (NUMA node, PCIe group, health, holder) and the link matrix with tiers and bandwidths",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := o.snapshot(cmd.Context())
			if err != nil {
				return err
			}
			d, err := s.NodeDetail(args[0])
			if err != nil {
				return err
			}
			if svgFile != "" {
				if err := writeSVGFile(svgFile, s, []string{args[0]}); err != nil {
					return err
				}
			}
			if o.data() {
				return writeData(o.Out, o.Output, d)
			}
			return writeNode(o.Out, o.painter(), d)
		},
	}
	node.Flags().StringVar(&svgFile, "svg", "", "also draw the node's GPUs and links, coloured by pod (the demo's picture), into this SVG file")
	pods := &cobra.Command{
		Use:   "pods",
		Short: "GPU pods: intent, requirement, node, GPUs, tier, ring bandwidth, plan against truth",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := o.snapshot(cmd.Context())
			if err != nil {
				return err
			}
			var rows []PodRow
			for _, r := range s.PodRows() {
				if o.AllNamespaces || r.Namespace == o.Namespace {
					rows = append(rows, r)
				}
			}
			if o.data() {
				if rows == nil {
					rows = []PodRow{}
				}
				return writeData(o.Out, o.Output, rows)
			}
			return writePods(o.Out, o.painter(), rows, true)
		},
	}
	pods.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "GPU pods of every namespace")
	explain := &cobra.Command{
		Use:   "explain POD",
		Short: "Why a pod is Pending: every node's verdict and reason from the extender's decision code, and the GPUs it would choose; for a bound pod, requested against achieved",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := o.snapshot(cmd.Context())
			if err != nil {
				return err
			}
			ns, name := o.Namespace, args[0]
			if a, b, ok := strings.Cut(args[0], "/"); ok {
				ns, name = a, b
			}
			e, err := s.Explain(ns, name)
			if err != nil {
				return err
			}
			if o.data() {
				return writeData(o.Out, o.Output, e)
			}
			return writeExplanation(o.Out, o.painter(), e)
		},
	}
	root.AddCommand(nodes, node, pods, explain)
	return root
}

func (o *Options) data() bool { return o.Output == OutputJSON || o.Output == OutputYAML }

// painter colours only on a terminal (auto), unless NO_COLOR is set.
func (o *Options) painter() painter {
	switch o.Color {
	case "always":
		return painter{on: true}
	case "never":
		return painter{}
	}
	if os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
		return painter{}
	}
	f, ok := o.Out.(*os.File)
	if !ok {
		return painter{}
	}
	st, err := f.Stat()
	return painter{on: err == nil && st.Mode()&os.ModeCharDevice != 0}
}

// snapshot reads the cluster and settles the namespace.
func (o *Options) snapshot(ctx context.Context) (*Snapshot, error) {
	if o.load != nil {
		return o.load(ctx, o)
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.Kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.Context})
	if o.Namespace == "" {
		ns, _, err := cc.Namespace()
		if err != nil {
			return nil, fmt.Errorf("kubeconfig namespace: %w", err)
		}
		o.Namespace = ns
	}
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "kubectl-gputopo"
	return Load(ctx, cfg, ConfigFrom{File: o.ExtenderConfig, ConfigMap: o.ExtenderConfigMap})
}

// writeSVGFile draws the nodes with the demo's picture.
func writeSVGFile(path string, s *Snapshot, names []string) error {
	var nodes []picture.NodeView
	var pods []picture.PodView
	for _, name := range names {
		n := s.nodeState(name)
		if n.graph == nil {
			continue
		}
		nodes = append(nodes, picture.NodeView{Name: name, Fixture: machine(n.graph), Graph: n.graph})
		for _, h := range n.holders {
			if len(h.gpus) > 0 {
				pods = append(pods, picture.PodView{Name: h.pod.Namespace + "/" + h.pod.Name, Node: name, GPUs: h.gpus})
			}
		}
	}
	if len(nodes) == 0 {
		return fmt.Errorf("--svg %s: no node with a valid NodeGPUTopology to draw", path)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--svg: %w", err)
	}
	if err := picture.WriteSVG(f, nodes, pods); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
