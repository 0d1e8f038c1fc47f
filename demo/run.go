package demo

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	topomachine "github.com/gputopo/gputopo/topology/machine"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
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
	// OutDir receives placement.svg, placement-plain.svg and the
	// component logs.
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
