package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
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
	// SchedulerNames are the scheduler profiles that run gputopo (explain):
	// a pod naming another is never decided by gputopo.
	SchedulerNames []string
	// Job, for explain, names a Job to explain instead of a pod.
	Job string
	// connect returns the client the plugin reads the cluster with; tests
	// replace it (default: the kubeconfig's).
	connect func(ctx context.Context, o *Options) (client.Reader, error)
	// now is the clock ages are measured with (default time.Now).
	now func() time.Time
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
  kubectl gputopo explain POD          what will happen to a pod: the scheduler it asked for, its
                                       PodScheduled condition and events, then every node's verdict by the
                                       extender's own code or, for a bound pod, requested against achieved
  kubectl gputopo explain --job NAME   a Job's refused pods (FailedCreate events) and its pods

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
	nodes, node := o.nodeCommands()
	root.AddCommand(nodes, node, o.podsCommand(), o.explainCommand())
	return root
}

// withSnapshot runs show on a snapshot of the cluster.
func (o *Options) withSnapshot(show func(s *Snapshot, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		s, err := o.snapshot(cmd.Context())
		if err != nil {
			return err
		}
		return show(s, args)
	}
}

// nodeCommands are nodes and node; with --svg they also draw the nodes
// they show.
func (o *Options) nodeCommands() (nodes, node *cobra.Command) {
	var nodesSVG, nodeSVG string
	nodes = &cobra.Command{
		Use:   "nodes",
		Short: "Every GPU node: machine, free/total GPUs, largest free NVLink island, unhealthy GPUs, drift, topology staleness and age",
		Args:  cobra.NoArgs,
		RunE: o.withSnapshot(func(s *Snapshot, _ []string) error {
			rows := s.NodeSummaries()
			for _, unread := range []string{s.PlansUnread, s.ClaimsUnread} {
				if unread != "" {
					fmt.Fprintln(o.ErrOut, unread)
				}
			}
			if err := writeSVGFile(nodesSVG, s, s.gpuNodeNames()); err != nil {
				return err
			}
			return write(o, rows, writeNodes)
		}),
	}
	node = &cobra.Command{
		Use:   "node NAME",
		Short: "One node: its GPUs (NUMA node, PCIe group, health, holder) and the link matrix with tiers and bandwidths",
		Args:  cobra.ExactArgs(1),
		RunE: o.withSnapshot(func(s *Snapshot, args []string) error {
			d, err := s.NodeDetail(args[0])
			if err != nil {
				return err
			}
			if err := writeSVGFile(nodeSVG, s, args[:1]); err != nil {
				return err
			}
			return write(o, d, writeNode)
		}),
	}
	nodes.Flags().StringVar(&nodesSVG, "svg", "", "also draw every node's GPUs and links, coloured by pod, into this SVG file")
	node.Flags().StringVar(&nodeSVG, "svg", "", "also draw the node's GPUs and links, coloured by pod (the demo's picture), into this SVG file")
	return nodes, node
}

func (o *Options) podsCommand() *cobra.Command {
	pods := &cobra.Command{
		Use:   "pods",
		Short: "GPU pods: intent, requirement, group and its domain, node, GPUs, tier, ring bandwidth, plan against truth",
		Args:  cobra.NoArgs,
		RunE: o.withSnapshot(func(s *Snapshot, _ []string) error {
			if s.ClaimsUnread != "" {
				fmt.Fprintln(o.ErrOut, s.ClaimsUnread)
			}
			rows := []PodRow{}
			for _, r := range s.PodRows() {
				if o.AllNamespaces || r.Namespace == o.Namespace {
					rows = append(rows, r)
				}
			}
			return write(o, rows, func(w io.Writer, p painter, rows []PodRow) error {
				return writePods(w, p, rows, true)
			})
		}),
	}
	pods.Flags().BoolVarP(&o.AllNamespaces, "all-namespaces", "A", false, "GPU pods of every namespace")
	return pods
}

func (o *Options) explainCommand() *cobra.Command {
	explain := &cobra.Command{
		Use:   "explain POD",
		Short: "What will happen to a pod: its scheduler, PodScheduled condition and events, then every node's verdict from the extender's decision code; for a bound pod, requested against achieved",
		Long: `explain POD says what will happen to a pod, before the per-node verdicts:

  - the scheduler it asked for (spec.schedulerName), and whether that is a
    gputopo profile (--scheduler-name, default gputopo-scheduler); if not,
    gputopo never decides the pod and the verdicts are what it would do;
  - its PodScheduled condition (status, reason, message, age), e.g.
    SchedulerError when the scheduler cannot reach gputopo's extender;
  - its recent events (FailedScheduling, GPUsBound, ...);
  - for a pod of a group (gputopo.io/group, docs/groups.md): the group's
    size and levels, its pods bound and pending, and the fabric domain it
    is placed in or would be placed in now, or why it waits, by the core's
    own group planning.

Then, for a Pending pod, every GPU node's verdict by the extender's own
filter and scores, fed with what the plugin lists; for a bound pod, its node
and GPUs (placement annotation), plan against truth.

A pod the webhook refuses never exists: its controller records the refusal
as a FailedCreate event. explain --job NAME shows a Job's events and its
pods; explain NAME, when no pod has that name, shows the events of the
workload of that name (a Job, ReplicaSet, StatefulSet, or a Deployment with
its ReplicaSets').`,
		Example: `  kubectl gputopo explain -n ml-team train-0
  kubectl gputopo explain ml-team/train-0 -o yaml
  kubectl gputopo explain -n ml-team --job llm-finetune
  kubectl gputopo explain -n ml-team notebook --scheduler-name gputopo-scheduler,gputopo-batch`,
		Args: cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 0 && o.Job == "":
				return fmt.Errorf("explain: name a pod (explain POD) or a Job (explain --job NAME)")
			case len(args) == 1 && o.Job != "":
				return fmt.Errorf("explain: name a pod or a Job (--job), not both")
			}
			name := o.Job
			if len(args) == 1 {
				name = args[0]
			}
			return o.explain(cmd.Context(), name)
		},
	}
	explain.Flags().StringSliceVar(&o.SchedulerNames, "scheduler-name", []string{v1alpha1.DefaultSchedulerName},
		"scheduler profiles that run gputopo (repeat or comma-separate); a pod that names another is never decided by gputopo")
	explain.Flags().StringVar(&o.Job, "job", "", "explain this Job instead of a pod: its FailedCreate events (pods the webhook refused) and its pods")
	return explain
}

// explain prints explain for name ([NAMESPACE/]NAME): the Job of that name
// with --job, else the pod, else the workload of that name.
func (o *Options) explain(ctx context.Context, name string) error {
	c, err := o.client(ctx)
	if err != nil {
		return err
	}
	s, err := o.snapshotWith(ctx, c)
	if err != nil {
		return err
	}
	ns := o.Namespace
	if a, b, ok := strings.Cut(name, "/"); ok {
		ns, name = a, b
	}
	if o.Job != "" {
		owner, err := explainJob(ctx, c, s, ns, name)
		if err != nil {
			return err
		}
		return write(o, owner, writeOwnerExplanation)
	}
	p := s.pod(ns, name)
	if p == nil {
		owner, err := explainOwner(ctx, c, s, ns, name)
		if err != nil {
			return err
		}
		if owner == nil {
			return fmt.Errorf("pod %s/%s not found (or finished), and no Job or other workload named %s has events in namespace %s", ns, name, name, ns)
		}
		return write(o, owner, writeOwnerExplanation)
	}
	e, err := s.Explain(ns, name, o.SchedulerNames...)
	if err != nil {
		return err
	}
	e.Events = podEvents(ctx, c, s.Now, p)
	return write(o, e, writeExplanation)
}

// write prints v: as data with -o json or yaml, else with table.
func write[T any](o *Options, v T, table func(io.Writer, painter, T) error) error {
	if o.data() {
		return writeData(o.Out, o.Output, v)
	}
	return table(o.Out, o.painter(), v)
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
	c, err := o.client(ctx)
	if err != nil {
		return nil, err
	}
	return o.snapshotWith(ctx, c)
}

func (o *Options) snapshotWith(ctx context.Context, c client.Reader) (*Snapshot, error) {
	s, err := LoadWith(ctx, c, ConfigFrom{File: o.ExtenderConfig, ConfigMap: o.ExtenderConfigMap})
	if err != nil {
		return nil, err
	}
	if o.now != nil {
		s.Now = o.now()
	}
	return s, nil
}

// client connects with the kubeconfig and settles the namespace.
func (o *Options) client(ctx context.Context) (client.Reader, error) {
	if o.connect != nil {
		return o.connect(ctx, o)
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
	c, err := client.New(cfg, client.Options{Scheme: scheme()})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}

// writeSVGFile draws the nodes with the demo's picture into path; it does
// nothing when path is empty (no --svg).
func writeSVGFile(path string, s *Snapshot, names []string) error {
	if path == "" {
		return nil
	}
	var nodes []picture.NodeView
	var pods []picture.PodView
	for _, name := range names {
		n := s.nodeState(name)
		if n.graph == nil {
			continue
		}
		nodes = append(nodes, picture.NodeView{Name: name, Fixture: machine(n.graph), Domain: s.fabricDomain(name), Graph: n.graph})
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
