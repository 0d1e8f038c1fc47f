package demo

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
	topomachine "github.com/gputopo/gputopo/topology/machine"
	"github.com/gputopo/gputopo/webhook"
)

// NodeSpec is one simulated node of the demo cluster.
type NodeSpec struct {
	Name string
	// Fixture is the node's machine: a built-in fixture name or the path
	// of a machine file (machine.Load).
	Fixture string
}

// DefaultCluster is the built-in mixed cluster: NVSwitch, hybrid cube-mesh
// and PCIe-only machines side by side.
var DefaultCluster = []NodeSpec{
	{Name: "dgx-a100-1", Fixture: "dgx-a100"},
	{Name: "dgx-a100-2", Fixture: "dgx-a100"},
	{Name: "dgx1-v100-1", Fixture: "dgx1-v100"},
	{Name: "dgx1-v100-2", Fixture: "dgx1-v100"},
	{Name: "pcie-l40s-1", Fixture: "pcie-8x"},
	{Name: "pcie-l40s-2", Fixture: "pcie-8x"},
}

// Workload is one step of the demo: a Job (Pods > 0 pods of GPUs each) or,
// with Bare, that many standalone pods.
type Workload struct {
	Name   string
	Intent v1alpha1.Parallelism // "" for none
	Pods   int
	GPUs   int
	Bare   bool
	// Machine, when set, pins the pods to nodes of that machine (its name),
	// as a team pins work to its own pool of machines.
	Machine string
}

// labelMachine is the node label the demo sets to the node's machine name.
const labelMachine = "demo.gputopo.io/machine"

// ParseMachines reads --machines: "machine=count,..." where a machine is a
// built-in fixture name or a machine file, e.g. "mybox.yaml=2,dgx-a100=2".
// Nodes are named "<machine name>-<i>" from 1, as in DefaultCluster.
func ParseMachines(spec string) ([]NodeSpec, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, fmt.Errorf("--machines: empty; give machine=count pairs, e.g. mybox.yaml=2,dgx-a100=2")
	}
	var out []NodeSpec
	seen := map[string]string{}
	for _, part := range strings.Split(spec, ",") {
		machine, count, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("--machines: entry %q: want machine=count, e.g. mybox.yaml=2 or dgx-a100=2", part)
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 || n > 50 {
			return nil, fmt.Errorf("--machines: entry %q: count must be an integer 1..50 (every node runs its own agent)", part)
		}
		f, err := topomachine.Load(machine)
		if err != nil {
			return nil, fmt.Errorf("--machines: entry %q: %w", part, err)
		}
		if prev, dup := seen[f.Name]; dup {
			return nil, fmt.Errorf("--machines: entries %q and %q are both machine %q; node names would clash (sum the counts, or rename one machine file)", prev, machine, f.Name)
		}
		seen[f.Name] = machine
		for i := 1; i <= n; i++ {
			out = append(out, NodeSpec{Name: fmt.Sprintf("%s-%d", f.Name, i), Fixture: machine})
		}
	}
	return out, nil
}

// WorkloadsFor adapts DefaultWorkloads to a cluster. On DefaultCluster it
// returns them as they are. On any other cluster it plans them the way the
// system will place them, in the order they are then submitted:
// model-parallel jobs first (their NVLink needs are the constraint, and
// every node is still empty when they come), then the rest; each workload
// is pinned to the machine (by name) where the most of its pods fit with
// the webhook's default requirement for their intent and the allocator's
// own choice of GPUs among those still free. A job too large for every
// machine halves its GPUs per pod; a workload with no room left is
// dropped. Pinning keeps the scheduler from spending a machine the plan
// saved for a later job.
func WorkloadsFor(cluster []NodeSpec) ([]Workload, error) {
	if slices.Equal(cluster, DefaultCluster) {
		return DefaultWorkloads, nil
	}
	type planNode struct {
		machine string
		g       *topology.Graph
		free    topology.Mask
	}
	var nodes []*planNode
	var machines []string
	largest := 0
	for _, s := range cluster {
		f, err := topomachine.Load(s.Fixture)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", s.Name, err)
		}
		g := f.Graph(s.Name)
		nodes = append(nodes, &planNode{machine: f.Name, g: g, free: g.All()})
		if !slices.Contains(machines, f.Name) {
			machines = append(machines, f.Name)
		}
		largest = max(largest, f.GPUs)
	}
	policy := webhook.DefaultConfig().PolicyTable
	alloc := allocator.New(0)
	// fit places up to pods pods of gpus GPUs on nodes of machine, first
	// fit, and returns how many fit and the GPUs they took per node.
	fit := func(machine string, intent v1alpha1.Parallelism, pods, gpus int) (int, map[*planNode]topology.Mask) {
		taken := map[*planNode]topology.Mask{}
		req := topology.Request{Count: gpus, Requirement: policy.For(intent).Requirement(int64(gpus))}
		placed := 0
		for placed < pods {
			ok := false
			for _, n := range nodes {
				if n.machine != machine {
					continue
				}
				res, err := alloc.Allocate(n.g, n.free.Minus(taken[n]), req)
				if err != nil {
					continue
				}
				taken[n] = taken[n].Union(topology.MaskOf(res.GPUs...))
				placed, ok = placed+1, true
				break
			}
			if !ok {
				break
			}
		}
		return placed, taken
	}
	planned := make([]*Workload, len(DefaultWorkloads))
	order := make([]int, 0, len(DefaultWorkloads))
	for i, w := range DefaultWorkloads {
		if w.Intent == v1alpha1.ParallelismModel {
			order = append(order, i)
		}
	}
	for i, w := range DefaultWorkloads {
		if w.Intent != v1alpha1.ParallelismModel {
			order = append(order, i)
		}
	}
	for _, i := range order {
		w := DefaultWorkloads[i]
		for gpus := min(w.GPUs, largest); gpus >= 1 && planned[i] == nil; gpus /= 2 {
			best, bestPods := "", 0
			var bestTaken map[*planNode]topology.Mask
			for _, m := range machines {
				if pods, taken := fit(m, w.Intent, w.Pods, gpus); pods > bestPods {
					best, bestPods, bestTaken = m, pods, taken
				}
			}
			if bestPods == 0 {
				continue
			}
			for n, m := range bestTaken {
				n.free = n.free.Minus(m)
			}
			w.Machine, w.Pods, w.GPUs = best, bestPods, gpus
			planned[i] = &w
		}
	}
	var out []Workload
	for _, i := range order {
		if planned[i] != nil {
			out = append(out, *planned[i])
		}
	}
	return out, nil
}

// DefaultWorkloads fill most of the cluster: model-parallel jobs that need
// NVLink, data-parallel jobs, and single-GPU notebooks that must not break
// up NVLink islands.
var DefaultWorkloads = []Workload{
	{Name: "llm-pretrain", Intent: v1alpha1.ParallelismModel, Pods: 1, GPUs: 8},
	{Name: "notebook", Pods: 2, GPUs: 1, Bare: true, Machine: "dgx1-v100"},
	{Name: "resnet", Intent: v1alpha1.ParallelismData, Pods: 2, GPUs: 2, Machine: "pcie-8x"},
	{Name: "llm-finetune", Intent: v1alpha1.ParallelismModel, Pods: 3, GPUs: 4},
}

// Options configure Run.
type Options struct {
	Cluster   []NodeSpec
	Workloads []Workload
	// OutDir receives placement.svg and the component logs.
	OutDir string
	Out    io.Writer
	// Keep leaves the cluster running after the report, until ctx ends
	// (Ctrl-C), for `kubectl gputopo` against it.
	Keep bool
	// AfterPlacement, when set, runs against the still-running cluster
	// after the report, with an admin kubeconfig; its error is Run's.
	AfterPlacement func(ctx context.Context, kubeconfig string) error
	// Mode is ModeExtender (default: kube-scheduler calls the extender)
	// or ModePlugin (gputopo-scheduler decides in-process).
	Mode string
}

// The scheduler modes, as the chart's scheduler.mode.
const (
	ModeExtender = string(localcluster.ModeExtender)
	ModePlugin   = string(localcluster.ModePlugin)
)

const demoNamespace = "ml-team"

// Run starts the local cluster and every gputopo component, submits the
// workloads, waits for placement, prints the table and writes the picture.
// Everything it started is stopped before it returns, also on ctx
// cancellation (Ctrl-C).
func Run(ctx context.Context, o Options) (err error) {
	if len(o.Cluster) == 0 {
		o.Cluster = DefaultCluster
	}
	if len(o.Workloads) == 0 {
		w, err := WorkloadsFor(o.Cluster)
		if err != nil {
			return err
		}
		o.Workloads = w
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	mode, err := localcluster.ParseMode(o.Mode)
	if err != nil {
		return err
	}
	if mode == localcluster.ModePlugin {
		if _, err := localcluster.Binary("gputopo-scheduler"); err != nil {
			return fmt.Errorf("mode plugin needs bin/gputopo-scheduler: run `make gputopo-scheduler` (about 8 minutes cold): %w", err)
		}
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return fmt.Errorf("output dir %s: %w", o.OutDir, err)
	}
	// The control-plane binaries run in working directories of their own.
	outDir, err := filepath.Abs(o.OutDir)
	if err != nil {
		return fmt.Errorf("output dir %s: %w", o.OutDir, err)
	}
	o.OutDir = outDir
	say := func(format string, a ...any) { fmt.Fprintf(o.Out, "==> "+format+"\n", a...) }
	// The components log as they would in a cluster; keep that out of the
	// demo's story, in a file beside the picture.
	logPath := filepath.Join(o.OutDir, "components.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return fmt.Errorf("create %s: %w", logPath, err)
	}
	defer logFile.Close()
	klog.LogToStderr(false)
	klog.SetOutput(logFile)
	defer klog.LogToStderr(true)
	say("component logs: %s", logPath)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stops []func()
	defer func() {
		say("tearing down")
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()

	say("starting etcd and kube-apiserver")
	mut, val, err := webhook.Registration(webhook.RegistrationOptions{ServiceName: "gputopo-webhook", ServiceNamespace: "gputopo-system"})
	if err != nil {
		return err
	}
	cp, err := localcluster.StartControlPlane(localcluster.Options{WebhookInstallOptions: &envtest.WebhookInstallOptions{
		MutatingWebhooks:   []*admissionregistrationv1.MutatingWebhookConfiguration{mut},
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{val},
	}})
	if err != nil {
		return err
	}
	stops = append(stops, func() { _ = cp.Stop() })
	c, err := client.New(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}

	say("starting the webhook")
	if err := startWebhook(ctx, cp, &stops); err != nil {
		return err
	}

	schedKubeconfig, err := cp.Kubeconfig(localcluster.SchedulerUser)
	if err != nil {
		return err
	}
	do := localcluster.DeciderOptions{Mode: mode, Kubeconfig: schedKubeconfig, Dir: o.OutDir}
	if mode == localcluster.ModePlugin {
		say("starting gputopo-scheduler (kube-scheduler with the GPUTopology plugin, profile %s) and kube-controller-manager (job controller)", v1alpha1.DefaultSchedulerName)
		// As the chart binds it in plugin mode: the scheduler's identity
		// gets the extender's ClusterRole.
		if err := localcluster.GrantExtenderRole(ctx, c, localcluster.SchedulerUser); err != nil {
			return err
		}
	} else {
		say("starting the extender")
		x, err := localcluster.StartExtender(ctx, cp.Config, extender.Options{Port: 0, BindAddress: "127.0.0.1", MetricsBindAddress: "0"})
		if err != nil {
			return err
		}
		stops = append(stops, func() { _ = x.Stop() })
		if err := x.WaitReady(ctx, time.Minute); err != nil {
			return err
		}
		say("starting kube-scheduler (profile %s, extender at %s) and kube-controller-manager (job controller)", v1alpha1.DefaultSchedulerName, x.APIAddr())
		do.ExtenderURL = x.URL()
	}
	sched, err := localcluster.StartDecider(do)
	if err != nil {
		return err
	}
	stops = append(stops, sched.Stop)
	// In plugin mode its core decides once its informers synced and its
	// ledger is rebuilt (/readyz on the core's metrics port).
	if err := sched.WaitCore(ctx, time.Minute, nil); err != nil {
		return err
	}
	kcmKubeconfig, err := cp.Kubeconfig("gputopo-demo-controller-manager", "system:masters")
	if err != nil {
		return err
	}
	kcm, err := localcluster.StartControllerManager(kcmKubeconfig, o.OutDir, "job-controller")
	if err != nil {
		return err
	}
	stops = append(stops, kcm.Stop)

	say("creating %d simulated GPU nodes, each with a node agent on simulated NVML", len(o.Cluster))
	nodes, err := startNodes(ctx, c, o.Cluster, &stops)
	if err != nil {
		return err
	}

	say("labelling namespace %s %s=%s", demoNamespace, v1alpha1.LabelInjection, v1alpha1.InjectionEnabled)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace, Labels: map[string]string{v1alpha1.LabelInjection: v1alpha1.InjectionEnabled}}}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	order := 0
	var placed []PodView
	for _, w := range o.Workloads {
		say("submitting %s", describe(w))
		if err := submit(ctx, c, w); err != nil {
			return err
		}
		pods, err := waitPlaced(ctx, c, w, nodes)
		if err != nil {
			return err
		}
		for i := range pods {
			order++
			pods[i].Order = order
		}
		placed = append(placed, pods...)
	}

	rows, err := Rows(nodes, placed)
	if err != nil {
		return err
	}
	fmt.Fprintln(o.Out)
	if err := WriteTable(o.Out, rows); err != nil {
		return err
	}
	fmt.Fprintln(o.Out)
	fmt.Fprintln(o.Out, Summary(rows))
	svgPath := filepath.Join(o.OutDir, "placement.svg")
	f, err := os.Create(svgPath)
	if err != nil {
		return fmt.Errorf("create %s: %w", svgPath, err)
	}
	if err := WriteSVG(f, nodes, placed); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", svgPath, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", svgPath, err)
	}
	fmt.Fprintf(o.Out, "picture of every node's GPUs and links, coloured by pod: %s\n", svgPath)
	kubeconfig, err := cp.Kubeconfig("gputopo-demo-admin", "system:masters")
	if err != nil {
		return err
	}
	printPluginCommands(o.Out, kubeconfig, example(o.Workloads, placed), o.Keep)
	if o.AfterPlacement != nil {
		if err := o.AfterPlacement(ctx, kubeconfig); err != nil {
			return err
		}
	}
	if o.Keep {
		say("the cluster keeps running; press Ctrl-C to tear it down")
		<-ctx.Done()
	}
	return nil
}

// example is the placed pod the printed commands show: the first
// standalone one (its name is known in advance), else the first placed.
func example(ws []Workload, placed []PodView) PodView {
	for _, p := range placed {
		for _, w := range ws {
			if w.Bare && strings.HasPrefix(p.Name, w.Name+"-") {
				return p
			}
		}
	}
	if len(placed) > 0 {
		return placed[0]
	}
	return PodView{}
}

// printPluginCommands shows the kubectl gputopo commands to try against
// the demo's cluster (make kubectl-gputopo builds the plugin into bin/).
func printPluginCommands(w io.Writer, kubeconfig string, ex PodView, kept bool) {
	fmt.Fprintf(w, "\nsee what gputopo sees with the kubectl plugin (make kubectl-gputopo; kubectl finds bin/kubectl-gputopo on PATH):\n\n")
	fmt.Fprintf(w, "  export KUBECONFIG=%s PATH=$PWD/bin:$PATH\n", kubeconfig)
	for _, c := range []string{
		"kubectl gputopo nodes",
		"kubectl gputopo node " + ex.Node,
		"kubectl gputopo node " + ex.Node + " --svg node.svg",
		"kubectl gputopo pods -n " + demoNamespace,
		"kubectl gputopo explain -n " + demoNamespace + " " + ex.Name,
	} {
		fmt.Fprintf(w, "  %s\n", c)
	}
	if !kept {
		fmt.Fprintf(w, "\n(run the demo with --keep to keep the cluster up for these until Ctrl-C)\n")
	}
}

func startWebhook(ctx context.Context, cp *localcluster.ControlPlane, stops *[]func()) error {
	wio := cp.Env.WebhookInstallOptions
	mgr, err := webhook.NewManager(webhook.DefaultConfig(), cp.Config, webhook.Options{
		Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		CertName: "tls.crt", KeyName: "tls.key", MetricsBindAddress: "0", HealthProbeBindAddress: "0",
	})
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	run := localcluster.Go(ctx, mgr.Start)
	*stops = append(*stops, func() { _ = run.Stop() })
	addr := net.JoinHostPort(wio.LocalServingHost, strconv.Itoa(wio.LocalServingPort))
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if exited, err := run.Exited(); exited {
			return false, fmt.Errorf("webhook stopped: %v", err)
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe of a local server
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		return mgr.GetCache().WaitForCacheSync(ctx), nil
	})
}

// startNodes creates a Node per spec and runs a node agent publisher on a
// simulated NVML built from the spec's fixture. There is no kubelet in the
// demo, so the device plugin is not started: pods are placed and bound, not
// run (test/e2e runs the kubelet path).
func startNodes(ctx context.Context, c client.Client, specs []NodeSpec, stops *[]func()) ([]NodeView, error) {
	views := make([]NodeView, 0, len(specs))
	for _, s := range specs {
		f, err := topomachine.Load(s.Fixture)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", s.Name, err)
		}
		if _, err := localcluster.CreateGPUNode(ctx, c, s.Name, f.GPUs, map[string]string{"nvidia.com/gpu.present": "true", labelMachine: f.Name}); err != nil {
			return nil, err
		}
		sim := nvmlsim.New(f, s.Name)
		logger := klog.FromContext(ctx).WithValues("node", s.Name)
		src := nodeagent.NewNVMLSource(sim.NVML(), logger, nil)
		pub := nodeagent.NewPublisher(c, src, nodeagent.PublisherOptions{NodeName: s.Name}, nil, logger)
		run := localcluster.Go(ctx, pub.Run)
		*stops = append(*stops, func() { _ = run.Stop() })
		*stops = append(*stops, src.Close)
		views = append(views, NodeView{Name: s.Name, Fixture: f.Name})
	}
	// The extender places on what the agents published: wait for it, and
	// draw the same graphs.
	for i := range views {
		obj := &v1alpha1.NodeGPUTopology{}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			if err := c.Get(ctx, client.ObjectKey{Name: views[i].Name}, obj); err != nil {
				return false, client.IgnoreNotFound(err)
			}
			return len(obj.Status.GPUs) > 0, nil
		})
		if err != nil {
			return nil, fmt.Errorf("node agent of %s published no topology: %w", views[i].Name, err)
		}
		g, err := topology.FromStatus(&obj.Status)
		if err != nil {
			return nil, fmt.Errorf("topology of %s: %w", views[i].Name, err)
		}
		views[i].Graph = g
	}
	return views, nil
}

func describe(w Workload) string {
	kind := "Job"
	if w.Bare {
		kind = "standalone pods"
	}
	intent := "no parallelism annotation"
	if w.Intent != "" {
		intent = fmt.Sprintf("%s: %s", v1alpha1.AnnotationParallelism, w.Intent)
	}
	where := ""
	if w.Machine != "" {
		where = " on " + w.Machine + " nodes"
	}
	return fmt.Sprintf("%s %s (%s): %d pod(s) x %d GPU(s)%s", kind, w.Name, intent, w.Pods, w.GPUs, where)
}

func submit(ctx context.Context, c client.Client, w Workload) error {
	spec := localcluster.GPUPodSpec(w.GPUs)
	if w.Machine != "" {
		spec.NodeSelector = map[string]string{labelMachine: w.Machine}
	}
	ann := map[string]string{}
	if w.Intent != "" {
		ann[v1alpha1.AnnotationParallelism] = string(w.Intent)
	}
	if w.Bare {
		for i := 0; i < w.Pods; i++ {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: fmt.Sprintf("%s-%d", w.Name, i), Annotations: ann, Labels: map[string]string{"demo": w.Name}},
				Spec:       spec,
			}
			if err := c.Create(ctx, pod); err != nil {
				return fmt.Errorf("create pod %s: %w", pod.Name, err)
			}
		}
		return nil
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: demoNamespace, Name: w.Name, Annotations: ann},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(int32(w.Pods)),
			Completions: ptr.To(int32(w.Pods)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"demo": w.Name}},
				Spec:       spec,
			},
		},
	}
	if err := c.Create(ctx, job); err != nil {
		return fmt.Errorf("create job %s: %w", w.Name, err)
	}
	return nil
}

// waitPlaced waits until the workload's pods are all bound with an
// assignment, and returns them in bind order.
func waitPlaced(ctx context.Context, c client.Client, w Workload, nodes []NodeView) ([]PodView, error) {
	var pods corev1.PodList
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, &pods, client.InNamespace(demoNamespace), client.MatchingLabels{"demo": w.Name}); err != nil {
			return false, err
		}
		if len(pods.Items) < w.Pods {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" || p.Annotations[v1alpha1.AnnotationAssignedGPUs] == "" {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: pods not placed: %w%s", w.Name, err, pending(pods.Items))
	}
	graphs := map[string]*topology.Graph{}
	for _, n := range nodes {
		graphs[n.Name] = n.Graph
	}
	sort.Slice(pods.Items, func(i, j int) bool { return scheduledAt(&pods.Items[i]).Before(scheduledAt(&pods.Items[j])) })
	out := make([]PodView, 0, len(pods.Items))
	for _, p := range pods.Items {
		uuids, err := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", p.Name, err)
		}
		g := graphs[p.Spec.NodeName]
		if g == nil {
			return nil, fmt.Errorf("pod %s bound to unknown node %q", p.Name, p.Spec.NodeName)
		}
		idx := make([]int, 0, len(uuids))
		for _, u := range uuids {
			i, ok := g.IndexOf(u)
			if !ok {
				return nil, fmt.Errorf("pod %s: GPU %s is not on node %s", p.Name, u, p.Spec.NodeName)
			}
			idx = append(idx, i)
		}
		out = append(out, PodView{Name: p.Name, Node: p.Spec.NodeName, Intent: string(w.Intent), GPUs: idx})
	}
	return out, nil
}

func scheduledAt(p *corev1.Pod) time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.LastTransitionTime.Time
		}
	}
	return p.CreationTimestamp.Time
}

func pending(pods []corev1.Pod) string {
	var b strings.Builder
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				fmt.Fprintf(&b, "\n  %s: %s", p.Name, c.Message)
			}
		}
	}
	return b.String()
}
