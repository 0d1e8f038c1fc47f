package demo

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	topomachine "github.com/gputopo/gputopo/topology/machine"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
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
	"github.com/gputopo/gputopo/webhook"
)

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
	// AfterPlacement, when set, runs against the still-running clusters
	// after the report; its error is Run's.
	AfterPlacement func(ctx context.Context, r Result) error
	// Mode is ModeExtender (default: kube-scheduler calls the extender)
	// or ModePlugin (gputopo-scheduler decides in-process).
	Mode string
}

// Result is what Run placed, for AfterPlacement.
type Result struct {
	// Kubeconfig is an admin kubeconfig of the gputopo cluster,
	// PlainKubeconfig of the plain kube-scheduler one.
	Kubeconfig, PlainKubeconfig string
	// Jobs are the workloads as submitted, under both schedulers.
	Jobs []JobRow
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
	mode, err := o.complete()
	if err != nil {
		return err
	}
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

	cp, c, err := startControlPlane(ctx, say, &stops)
	if err != nil {
		return err
	}
	if err := startScheduling(ctx, cp, c, mode, o.OutDir, say, &stops); err != nil {
		return err
	}
	say("creating %d simulated GPU nodes, each with a node agent on simulated NVML", len(o.Cluster))
	nodes, err := startNodes(ctx, c, o.Cluster, &stops)
	if err != nil {
		return err
	}
	submitted, placed, err := place(ctx, c, o.Workloads, nodes, gputopoGPUs{}, true, say)
	if err != nil {
		return err
	}
	plainSay := func(format string, a ...any) { say("[plain kube-scheduler] "+format, a...) }
	plainKubeconfig, plain, err := runPlain(ctx, o, nodes, plainSay, &stops)
	if err != nil {
		return err
	}
	rows, err := report(o.Out, o.OutDir, nodes, submitted, placed, plain)
	if err != nil {
		return err
	}
	kubeconfig, err := cp.Kubeconfig("gputopo-demo-admin", "system:masters")
	if err != nil {
		return err
	}
	printPluginCommands(o.Out, kubeconfig, plainKubeconfig, example(o.Workloads, placed), o.Keep)
	if o.AfterPlacement != nil {
		if err := o.AfterPlacement(ctx, Result{Kubeconfig: kubeconfig, PlainKubeconfig: plainKubeconfig, Jobs: rows}); err != nil {
			return err
		}
	}
	if o.Keep {
		say("the cluster keeps running; press Ctrl-C to tear it down")
		<-ctx.Done()
	}
	return nil
}

// complete fills in o's defaults, checks the mode and makes OutDir an
// absolute path that exists.
func (o *Options) complete() (localcluster.Mode, error) {
	if len(o.Cluster) == 0 {
		o.Cluster = DefaultCluster
	}
	if len(o.Workloads) == 0 {
		w, err := WorkloadsFor(o.Cluster)
		if err != nil {
			return "", err
		}
		o.Workloads = w
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	mode, err := localcluster.ParseMode(o.Mode)
	if err != nil {
		return "", err
	}
	if mode == localcluster.ModePlugin {
		if _, err := localcluster.Binary("gputopo-scheduler"); err != nil {
			return "", fmt.Errorf("mode plugin needs bin/gputopo-scheduler: run `make gputopo-scheduler` (about 8 minutes cold): %w", err)
		}
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return "", fmt.Errorf("output dir %s: %w", o.OutDir, err)
	}
	// The control-plane binaries run in working directories of their own.
	outDir, err := filepath.Abs(o.OutDir)
	if err != nil {
		return "", fmt.Errorf("output dir %s: %w", o.OutDir, err)
	}
	o.OutDir = outDir
	return mode, nil
}

// startControlPlane starts etcd and kube-apiserver with the webhook
// registered, and the webhook.
func startControlPlane(ctx context.Context, say func(string, ...any), stops *[]func()) (*localcluster.ControlPlane, client.Client, error) {
	say("starting etcd and kube-apiserver")
	mut, val, err := webhook.Registration(webhook.RegistrationOptions{ServiceName: "gputopo-webhook", ServiceNamespace: "gputopo-system"})
	if err != nil {
		return nil, nil, err
	}
	cp, err := localcluster.StartControlPlane(localcluster.Options{WebhookInstallOptions: &envtest.WebhookInstallOptions{
		MutatingWebhooks:   []*admissionregistrationv1.MutatingWebhookConfiguration{mut},
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{val},
	}})
	if err != nil {
		return nil, nil, err
	}
	*stops = append(*stops, func() { _ = cp.Stop() })
	c, err := client.New(cp.Config, client.Options{Scheme: cp.Scheme})
	if err != nil {
		return nil, nil, fmt.Errorf("client: %w", err)
	}

	say("starting the webhook")
	if err := startWebhook(ctx, cp, stops); err != nil {
		return nil, nil, err
	}
	return cp, c, nil
}

// startScheduling starts what decides and creates the pods: in extender
// mode the extender and kube-scheduler, in plugin mode gputopo-scheduler;
// then kube-controller-manager's job controller.
func startScheduling(ctx context.Context, cp *localcluster.ControlPlane, c client.Client, mode localcluster.Mode, dir string, say func(string, ...any), stops *[]func()) error {
	schedKubeconfig, err := cp.Kubeconfig(localcluster.SchedulerUser)
	if err != nil {
		return err
	}
	do := localcluster.DeciderOptions{Mode: mode, Kubeconfig: schedKubeconfig, Dir: dir}
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
		*stops = append(*stops, func() { _ = x.Stop() })
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
	*stops = append(*stops, sched.Stop)
	// In plugin mode its core decides once its informers synced and its
	// ledger is rebuilt (/readyz on the core's metrics port).
	if err := sched.WaitCore(ctx, time.Minute, nil); err != nil {
		return err
	}
	kcmKubeconfig, err := cp.Kubeconfig("gputopo-demo-controller-manager", "system:masters")
	if err != nil {
		return err
	}
	kcm, err := localcluster.StartControllerManager(kcmKubeconfig, dir, "job-controller")
	if err != nil {
		return err
	}
	*stops = append(*stops, kcm.Stop)
	return nil
}

// gpuSource is how a scheduler's bound pod gets its GPUs: gputopo's bind
// writes them on the pod; under plain kube-scheduler the device plugin
// chooses them when kubelet admits the pod.
type gpuSource interface {
	// known says whether p's GPUs can be read yet.
	known(p *corev1.Pod) bool
	// gpus returns the UUIDs of p's GPUs.
	gpus(ctx context.Context, c client.Client, p *corev1.Pod) ([]string, error)
	// gone says a pod that held uuids on node was deleted (preempted).
	gone(node string, uuids []string)
}

// gputopoGPUs reads the GPUs gputopo's bind wrote.
type gputopoGPUs struct{}

func (gputopoGPUs) known(p *corev1.Pod) bool {
	return p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationAssignedGPUs] != ""
}

func (gputopoGPUs) gpus(_ context.Context, _ client.Client, p *corev1.Pod) ([]string, error) {
	return v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
}

func (gputopoGPUs) gone(string, []string) {}

// place creates the namespace (labelled for gputopo's webhook when inject),
// then submits each workload and waits for its pods to be placed,
// numbering them in placement order. It returns the workloads as submitted
// (a Fill workload with its pod count) and every pod placed, those
// preempted later marked so.
func place(ctx context.Context, c client.Client, ws []Workload, nodes []NodeView, src gpuSource, inject bool, say func(string, ...any)) ([]Workload, []Placed, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}
	if inject {
		say("labelling namespace %s %s=%s", demoNamespace, v1alpha1.LabelInjection, v1alpha1.InjectionEnabled)
		ns.Labels = map[string]string{v1alpha1.LabelInjection: v1alpha1.InjectionEnabled}
	}
	if err := c.Create(ctx, ns); err != nil {
		return nil, nil, fmt.Errorf("create namespace: %w", err)
	}
	if err := createPriorityClasses(ctx, c, ws); err != nil {
		return nil, nil, err
	}
	graphs := map[string]*topology.Graph{}
	total := 0
	for _, n := range nodes {
		graphs[n.Name] = n.Graph
		total += n.Graph.Len()
	}
	order := 0
	var placed []Placed
	var submitted []Workload
	for _, w := range ws {
		if w.Fill {
			held := 0
			for _, p := range placed {
				if !p.Evicted {
					held += len(p.GPUs)
				}
			}
			if w.Pods = (total - held) / max(w.GPUs, 1); w.Pods == 0 {
				say("skipping %s: no GPU is left for it", w.Name)
				continue
			}
		}
		say("submitting %s", describe(w))
		if err := submit(ctx, c, w); err != nil {
			return nil, nil, err
		}
		submitted = append(submitted, w)
		pods, err := waitPlaced(ctx, c, w, src)
		if err != nil {
			return nil, nil, err
		}
		// Pods this workload preempted are gone by the time it is bound:
		// their GPUs are free again before its own are taken.
		var live corev1.PodList
		if err := c.List(ctx, &live, client.InNamespace(demoNamespace)); err != nil {
			return nil, nil, fmt.Errorf("list pods: %w", err)
		}
		alive := map[string]bool{}
		for _, p := range live.Items {
			if p.DeletionTimestamp == nil {
				alive[p.Name] = true
			}
		}
		for i := range placed {
			if p := &placed[i]; !p.Evicted && !alive[p.Name] {
				p.Evicted, p.EvictedBy = true, w.Name
				src.gone(p.Node, p.UUIDs)
			}
		}
		for _, p := range pods {
			pv, err := placedPod(ctx, c, src, graphs, w, &p)
			if err != nil {
				return nil, nil, err
			}
			order++
			pv.Order = order
			placed = append(placed, pv)
		}
	}
	return submitted, placed, nil
}

// placedPod reads (or has chosen) p's GPUs and its group record.
func placedPod(ctx context.Context, c client.Client, src gpuSource, graphs map[string]*topology.Graph, w Workload, p *corev1.Pod) (Placed, error) {
	uuids, err := src.gpus(ctx, c, p)
	if err != nil {
		return Placed{}, fmt.Errorf("pod %s: %w", p.Name, err)
	}
	g := graphs[p.Spec.NodeName]
	if g == nil {
		return Placed{}, fmt.Errorf("pod %s bound to unknown node %q", p.Name, p.Spec.NodeName)
	}
	idx := make([]int, 0, len(uuids))
	for _, u := range uuids {
		i, ok := g.IndexOf(u)
		if !ok {
			return Placed{}, fmt.Errorf("pod %s: GPU %s is not on node %s", p.Name, u, p.Spec.NodeName)
		}
		idx = append(idx, i)
	}
	pv := Placed{PodView: PodView{Name: p.Name, Node: p.Spec.NodeName, Intent: string(w.Intent), GPUs: idx}, Job: w.Name, UUIDs: uuids}
	// The group and its domain, as gputopo's bind recorded them.
	if pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement]); err == nil {
		pv.Group, pv.Domain = pl.Group, pl.Domain
	}
	return pv, nil
}

// createPriorityClasses creates the demo's PriorityClasses that ws use.
func createPriorityClasses(ctx context.Context, c client.Client, ws []Workload) error {
	done := map[string]bool{}
	for _, w := range ws {
		if w.Priority == "" || done[w.Priority] {
			continue
		}
		v, ok := priorityValues[w.Priority]
		if !ok {
			return fmt.Errorf("workload %s: priority %q is not one of the demo's (%s, %s)", w.Name, w.Priority, PriorityBatch, PriorityServing)
		}
		done[w.Priority] = true
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: w.Priority}, Value: v}
		if err := c.Create(ctx, pc); err != nil {
			return fmt.Errorf("create PriorityClass %s: %w", w.Priority, err)
		}
	}
	return nil
}

// report prints what each job shows, the per-job table and its headline
// to out, and draws both placements into dir.
func report(out io.Writer, dir string, nodes []NodeView, ws []Workload, gputopo, plain []Placed) ([]JobRow, error) {
	rows, err := Jobs(ws, nodes, gputopo, plain)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(out)
	if err := WriteJobs(out, rows); err != nil {
		return nil, err
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, Headline(rows))
	for _, side := range []struct {
		file, who string
		pods      []Placed
	}{{"placement.svg", "gputopo", gputopo}, {"placement-plain.svg", "plain kube-scheduler", plain}} {
		path := filepath.Join(dir, side.file)
		if err := writeSVGFile(path, nodes, live(side.pods)); err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "picture of every node's GPUs and links, coloured by pod, under %s: %s\n", side.who, path)
	}
	return rows, nil
}

func writeSVGFile(path string, nodes []NodeView, pods []PodView) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := WriteSVG(f, nodes, pods); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// example is the placed pod the printed commands show: the first
// standalone one (its name is known in advance), else the first placed.
func example(ws []Workload, placed []Placed) PodView {
	for _, p := range placed {
		for _, w := range ws {
			if w.Bare && strings.HasPrefix(p.Name, w.Name+"-") {
				return p.PodView
			}
		}
	}
	if len(placed) > 0 {
		return placed[0].PodView
	}
	return PodView{}
}

// printPluginCommands shows the kubectl gputopo commands to try against
// the demo's cluster (make kubectl-gputopo builds the plugin into bin/).
func printPluginCommands(w io.Writer, kubeconfig, plainKubeconfig string, ex PodView, kept bool) {
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
	fmt.Fprintf(w, "\nthe plain kube-scheduler cluster (its pods' GPUs in annotation %s):\n\n  KUBECONFIG=%s kubectl get pods -n %s -o wide\n", AnnotationDevicePluginGPUs, plainKubeconfig, demoNamespace)
	if !kept {
		fmt.Fprintf(w, "\n(run the demo with --keep to keep the cluster up for these until Ctrl-C)\n")
	}
}

func startWebhook(ctx context.Context, cp *localcluster.ControlPlane, stops *[]func()) error {
	wio := cp.Env.WebhookInstallOptions
	mgr, err := webhook.NewManager(configv1alpha1.DefaultWebhookConfiguration(), cp.Config, webhook.Options{
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
		if _, err := localcluster.CreateGPUNode(ctx, c, s.Name, f.GPUs, nodeLabels(f.Name)); err != nil {
			return nil, err
		}
		sim := nvmlsim.New(f, s.Name)
		logger := klog.FromContext(ctx).WithValues("node", s.Name)
		src := nodeagent.NewNVMLSource(sim.NVML(), logger, nil)
		pub := nodeagent.NewPublisher(c, src, nodeagent.PublisherOptions{NodeName: s.Name}, nil, logger)
		run := localcluster.Go(ctx, pub.Run)
		*stops = append(*stops, func() { _ = run.Stop() })
		*stops = append(*stops, src.Close)
		// Drawn by leaf, as kubectl gputopo node --svg names a domain.
		views = append(views, NodeView{Name: s.Name, Fixture: f.Name, Domain: "leaf=" + nodeLabels(f.Name)[labelLeaf]})
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
	// No kubelet runs to confirm a graceful deletion: a preempted pod
	// is gone at once.
	spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	spec.PriorityClassName = w.Priority
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

// waitPlaced waits until the workload's pods are all bound and their GPUs
// known, and returns them in bind order.
func waitPlaced(ctx context.Context, c client.Client, w Workload, src gpuSource) ([]corev1.Pod, error) {
	var pods corev1.PodList
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.List(ctx, &pods, client.InNamespace(demoNamespace), client.MatchingLabels{"demo": w.Name}); err != nil {
			return false, err
		}
		if len(pods.Items) < w.Pods {
			return false, nil
		}
		for i := range pods.Items {
			if !src.known(&pods.Items[i]) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: pods not placed: %w%s", w.Name, err, pending(pods.Items))
	}
	sort.SliceStable(pods.Items, func(i, j int) bool { return scheduledAt(&pods.Items[i]).Before(scheduledAt(&pods.Items[j])) })
	return pods.Items, nil
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
