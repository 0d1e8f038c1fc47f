//go:build schedbench || integration

package schedbench_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gputopo/gputopo/topology/machine"

	"github.com/gputopo/gputopo/placement/cluster"
	"github.com/gputopo/gputopo/placement/ledger"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

// Environment knobs (defaults keep one run under about five minutes on a
// 2-core machine; make bench-scheduler sets 1000,5000 nodes, 1000 pods, 3
// repetitions).
//
//	SCHEDBENCH_NODES  comma-separated node counts, ascending (500,1000)
//	SCHEDBENCH_PODS   GPU pods per phase (500)
//	SCHEDBENCH_REPS   repetitions of every phase at every size (1)
//	SCHEDBENCH_MODES  comma-separated subset of plain,noop,extender,plugin,events
//	                  (all)
//	SCHEDBENCH_OUT    file to write the Markdown table to, relative to the
//	                  repository root (none)
func envInts(t *testing.T, key, def string) []int {
	t.Helper()
	v := os.Getenv(key)
	if v == "" {
		v = def
	}
	var out []int
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want comma-separated positive integers", key, v)
		}
		out = append(out, n)
	}
	return out
}

// fixtures cycle over the nodes: a mixed fleet of 8-GPU machines.
var fixtures = []string{"dgx-a100", "dgx1-v100", "pcie-8x", "pcie-8x-nvlink-pairs"}

// The four schedulers measured on the same nodes and pods.
const (
	modePlain    = "default scheduler"
	modeNoop     = "no-op HTTP extender"
	modeExtender = "gputopo extender"
	modePlugin   = "gputopo plugin build"
	// modeBaseline is another plugin build, SCHEDBENCH_PLUGIN_BASELINE (a
	// binary in bin/, e.g. main before a change), measured in the same
	// run: the before of a before-and-after.
	modeBaseline = "gputopo plugin build, baseline"
	// modeEvents is the plugin build with the GPUsBound Event on
	// (events.gpusBound; off by default), to measure what it costs.
	modeEvents = "gputopo plugin build, GPUsBound Event on"
)

// allModes are the modes in table order; baseline comes last, and only
// with SCHEDBENCH_PLUGIN_BASELINE.
var allModes = []string{modePlain, modeNoop, modeExtender, modePlugin, modeEvents, modeBaseline}

// modeSlug names each mode's namespaces.
var modeSlug = map[string]string{modePlain: "plain", modeNoop: "noop", modeExtender: "extender", modePlugin: "plugin", modeEvents: "events", modeBaseline: "baseline"}

type phase struct {
	name        string
	rep         int
	nodes, pods int
	wall        time.Duration
	podsPerSec  float64
	p50, p99    time.Duration
	cpuPerPod   time.Duration // this process (clients + in-process extenders)
	// schedCPU and apiCPU are per pod: the scheduler process, and
	// kube-apiserver plus etcd.
	schedCPU, apiCPU time.Duration
	// schedRSS is the scheduler process's peak resident memory (VmHWM)
	// over its life: its start on this node set and the phase.
	schedRSS    int64
	unscheduled int
}

// schedulerBinaries are the binaries whose CPU counts as the scheduler's.
func schedulerBinaries() []string {
	names := []string{"kube-scheduler", "gputopo-scheduler"}
	if b := os.Getenv("SCHEDBENCH_PLUGIN_BASELINE"); b != "" {
		names = append(names, b)
	}
	return names
}

// startMode starts the scheduler of mode for a cluster of n nodes: a
// gputopo extender mode sends kube-scheduler to extenderURL (noopURL for
// the no-op one); a plugin build is started once its ledger has every
// node. It returns how to stop it and the pods' schedulerName.
func startMode(t *testing.T, cp *harness.ControlPlane, mode string, n int, extenderURL, noopURL string) (func(), string) {
	t.Helper()
	ctx := harness.Context(t)
	var stop func()
	schedulerName := v1alpha1.DefaultSchedulerName
	switch mode {
	case modePlain:
		stop = cp.StartScheduler(t, nil).Stop
		schedulerName = corev1.DefaultSchedulerName
	case modeNoop:
		stop = cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModeExtender, ExtenderURL: noopURL}).Stop
	case modeExtender:
		stop = cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModeExtender, ExtenderURL: extenderURL}).Stop
	case modePlugin, modeBaseline, modeEvents:
		o := harness.DeciderOptions{Mode: harness.ModePlugin}
		switch mode {
		case modeBaseline:
			o.Binary, o.Configure = os.Getenv("SCHEDBENCH_PLUGIN_BASELINE"), asBefore
		case modeEvents:
			o.PluginArgs.ConfigFile = eventsConfig(t)
		}
		d := cp.StartDecider(t, o)
		if err := d.WaitCore(ctx, 2*time.Minute, localcluster.AllFree(8*n)); err != nil {
			t.Fatalf("gputopo-scheduler's ledger not settled for %d nodes: %v", n, err)
		}
		stop = d.Stop
	}
	return stop, schedulerName
}

// settle readies the cluster for the next phase once mode's scheduler is
// stopped: no plugin build left holding the decider Lease, and the
// extender's ledger back to every GPU free.
func settle(t *testing.T, cp *harness.ControlPlane, x *harness.Extender, mode string, n int) {
	t.Helper()
	if mode == modePlugin || mode == modeBaseline || mode == modeEvents {
		freeDeciderLease(t, cp, mode)
	}
	waitLedger(t, x.Extender, n)
}

// eventsConfig is an ExtenderConfiguration that turns the GPUsBound
// Event on.
func eventsConfig(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "extender-events.yaml")
	doc := "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nevents:\n  gpusBound: true\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// asBefore shapes the profiles for a baseline build from before the
// plugins it lacks: the pod-group cycle's extension points
// (placementGenerate, placementScore) are left out, and upstream's
// DynamicResources runs in place of GPUTopologyDynamicResources (DRA
// GPUs). With them, such a build would not start.
func asBefore(c *schedconfigv1.KubeSchedulerConfiguration) {
	const dra = "GPUTopologyDynamicResources"
	drop := func(ps *schedconfigv1.PluginSet) {
		ps.Enabled = slices.DeleteFunc(ps.Enabled, func(p schedconfigv1.Plugin) bool { return p.Name == dra })
		ps.Disabled = slices.DeleteFunc(ps.Disabled, func(p schedconfigv1.Plugin) bool { return p.Name == "DynamicResources" })
	}
	for i := range c.Profiles {
		p := c.Profiles[i].Plugins
		if p == nil {
			continue
		}
		p.PlacementGenerate, p.PlacementScore = schedconfigv1.PluginSet{}, schedconfigv1.PluginSet{}
		for _, ps := range []*schedconfigv1.PluginSet{&p.MultiPoint, &p.PreEnqueue, &p.PreFilter, &p.Filter, &p.PostFilter, &p.Score, &p.Reserve, &p.PreBind, &p.PodGroupPostFilter} {
			drop(ps)
		}
	}
}

// selectedModes is SCHEDBENCH_MODES as modes, in the table's order.
func selectedModes(t *testing.T) []string {
	t.Helper()
	v := os.Getenv("SCHEDBENCH_MODES")
	baseline := os.Getenv("SCHEDBENCH_PLUGIN_BASELINE") != ""
	if v == "" {
		if baseline {
			return allModes
		}
		return allModes[:len(allModes)-1]
	}
	want := map[string]bool{}
	for _, s := range strings.Split(v, ",") {
		want[strings.TrimSpace(s)] = true
	}
	var out []string
	for _, m := range allModes {
		if want[modeSlug[m]] {
			out = append(out, m)
			delete(want, modeSlug[m])
		}
	}
	if len(want) > 0 || len(out) == 0 {
		t.Fatalf("SCHEDBENCH_MODES=%q: want a comma-separated subset of plain,noop,extender,plugin,events,baseline", v)
	}
	if slices.Contains(out, modeBaseline) && !baseline {
		t.Fatalf("SCHEDBENCH_MODES=%q names baseline: set SCHEDBENCH_PLUGIN_BASELINE to the baseline build's binary in bin/", v)
	}
	return out
}

// startNoopExtender serves the extender protocol doing nothing: filter
// passes every node, prioritize scores 0, bind writes the Binding. It is
// the floor any HTTP extender pays. It returns its URL.
func startNoopExtender(t *testing.T, cp *harness.ControlPlane) string {
	t.Helper()
	mux := http.NewServeMux()
	decode := func(w http.ResponseWriter, r *http.Request, v any) bool {
		if err := json.NewDecoder(r.Body).Decode(v); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return false
		}
		return true
	}
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /scheduler/filter", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderArgs
		if decode(w, r, &args) {
			reply(w, &extenderv1.ExtenderFilterResult{NodeNames: args.NodeNames})
		}
	})
	mux.HandleFunc("POST /scheduler/prioritize", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderArgs
		if !decode(w, r, &args) {
			return
		}
		list := make(extenderv1.HostPriorityList, 0)
		if args.NodeNames != nil {
			for _, n := range *args.NodeNames {
				list = append(list, extenderv1.HostPriority{Host: n})
			}
		}
		reply(w, &list)
	})
	mux.HandleFunc("POST /scheduler/bind", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderBindingArgs
		if !decode(w, r, &args) {
			return
		}
		res := &extenderv1.ExtenderBindingResult{}
		err := cp.Clientset.CoreV1().Pods(args.PodNamespace).Bind(r.Context(), &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: args.PodName, Namespace: args.PodNamespace, UID: args.PodUID},
			Target:     corev1.ObjectReference{Kind: "Node", Name: args.Node},
		}, metav1.CreateOptions{})
		if err != nil {
			res.Error = err.Error()
		}
		reply(w, res)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// start is the control plane every run of this package uses, with the
// plugin build's identity granted what the extender reads (the chart
// binds the extender's ClusterRole to the scheduler's service account in
// plugin mode), and the in-process gputopo extender the extender mode
// calls; it is stopped at the end of the test.
func start(t *testing.T) (*harness.ControlPlane, *harness.Extender) {
	t.Helper()
	cp := harness.Start(t, harness.Options{})
	if err := localcluster.GrantExtenderRole(harness.Context(t), cp.Client, harness.SchedulerUser); err != nil {
		t.Fatal(err)
	}
	x := startExtender(t, cp)
	t.Cleanup(func() { _ = x.Stop() })
	return cp, x
}

// startExtender is the in-process gputopo extender on cp.
func startExtender(t *testing.T, cp *harness.ControlPlane) *harness.Extender {
	t.Helper()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	o := extender.NewOptions()
	o.BindAddress, o.Port, o.MetricsBindAddress = "127.0.0.1", port, "127.0.0.1:0"
	o.LeaderElect = false
	// Its own decider Lease: it decides only in the extender phases, and
	// must not keep the plugin builds, which take the default Lease, from
	// deciding in theirs (the phases never overlap).
	o.DeciderLeaseName = "gputopo-decider-schedbench-extender"
	// The same client limits as the kube-scheduler under test
	// (localcluster's clientConnection): the extender's bind is not the
	// rate-limited party.
	o.KubeAPIQPS, o.KubeAPIBurst = 0, 0
	return harness.StartExtender(t, klog.NewContext(context.Background(), klog.Background()), cp.Config, o)
}

// freeDeciderLease makes sure no stopped plugin build still holds the
// decider Lease when the next scheduler starts: client-go's election
// counts a Lease held for its whole duration from the moment a new process
// first sees it, whatever its renew time says, so a Lease left held by an
// exited process would hold up the next build's first pods by 15s. A
// build that released it on SIGTERM (schedplugin.AwaitShutdown) leaves
// nothing to do; one that did not (an earlier baseline) has its Lease
// deleted, and the test logs it.
func freeDeciderLease(t *testing.T, cp *harness.ControlPlane, mode string) {
	t.Helper()
	ctx := context.Background()
	name := cluster.DeciderLeaseName(v1alpha1.ResourceGPU)
	leases := cp.Clientset.CoordinationV1().Leases(cluster.DefaultDeciderLeaseNamespace)
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatalf("decider lease %s: %v", name, err)
	}
	if h := ptr.Deref(l.Spec.HolderIdentity, ""); h != "" {
		t.Logf("%s exited still holding the decider lease (%s); deleting it", mode, h)
		if err := leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("delete decider lease %s: %v", name, err)
		}
	}
}

// waitLedger waits until the extender's informers have every node's
// topology and no GPU is held (the previous phase's pods are gone).
func waitLedger(t *testing.T, x *extender.Extender, nodes int) {
	t.Helper()
	var c ledger.Counts
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		c = x.Core().Report().Counts()
		return c.Total == 8*nodes && c.Free == c.Total, nil
	})
	if err != nil {
		t.Fatalf("extender ledger not settled for %d nodes: %s", nodes, c)
	}
}

// createNodes registers nodes [from, to), each a machine of fleet in turn,
// with 8 GPUs each and their
// NodeGPUTopology, 16 at a time.
func createNodes(ctx context.Context, cp *harness.ControlPlane, fleet []string, from, to int) error {
	work := make(chan int)
	errs := make(chan error, to-from)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if err := createNode(ctx, cp, fleet, i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := from; i < to; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

func createNode(ctx context.Context, cp *harness.ControlPlane, fleet []string, i int) error {
	fx := fleet[i%len(fleet)]
	name := fmt.Sprintf("%s-%04d", fx, i)
	cs := cp.Clientset
	n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name}}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	res := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("96"),
		corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods:   resource.MustParse("110"),
		v1alpha1.ResourceGPU:  *resource.NewQuantity(8, resource.DecimalSI),
	}
	n.Status.Capacity, n.Status.Allocatable = res, res
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if n, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update status of node %s: %w", name, err)
	}
	// A bare control plane (no node lifecycle controller) leaves the
	// not-ready taint from admission on the node forever.
	n.Spec.Taints = nil
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("clear taints of node %s: %w", name, err)
	}
	f, err := machine.FixtureByName(fx)
	if err != nil {
		return err
	}
	obj := &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cp.Client.Create(ctx, obj); err != nil {
		return fmt.Errorf("create NodeGPUTopology %s: %w", name, err)
	}
	obj.Status = f.Graph(name).Status()
	obj.Status.ObservedTime = metav1.Now()
	if err := cp.Client.Status().Update(ctx, obj); err != nil {
		return fmt.Errorf("update NodeGPUTopology status %s: %w", name, err)
	}
	return nil
}

// podSpec is one pod of the mix, the same in both phases.
type podSpec struct {
	gpus        int
	requirement string
}

// podMix is the simulator's mixed workload: 1/2/4/8 GPUs weighted
// 40/30/20/10, 60% data- and 40% model-parallel, with the requirement the
// webhook derives (fixed seed).
func podMix(n int) []podSpec {
	rng := rand.New(rand.NewPCG(1, 2))
	table := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	out := make([]podSpec, n)
	for i := range out {
		gpus := []int{1, 1, 1, 1, 2, 2, 2, 4, 4, 8}[rng.IntN(10)]
		intent := v1alpha1.ParallelismData
		if rng.Float64() < 0.4 {
			intent = v1alpha1.ParallelismModel
		}
		raw, _ := json.Marshal(table.For(intent).Requirement(int64(gpus)))
		out[i] = podSpec{gpus: gpus, requirement: string(raw)}
	}
	return out
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runPhase creates every pod at once and waits until all are bound;
// latency is from just before each create call to the
// first watch event that shows the pod bound.
func runPhase(t *testing.T, cp *harness.ControlPlane, name string, nodes int, ns, scheduler string, specs []podSpec) phase {
	t.Helper()
	ctx := harness.Context(t)
	cs := cp.Clientset
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
	// An informer, not a bare watch: it re-lists and re-watches when the
	// API server closes the stream under load.
	var mu sync.Mutex
	created := make(map[string]time.Time, len(specs))
	bound := make(map[string]time.Time, len(specs))
	allBound := make(chan struct{})
	record := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if _, seen := bound[p.Name]; !seen {
			bound[p.Name] = now
			if len(bound) == len(specs) {
				close(allBound)
			}
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	stopInf := make(chan struct{})
	defer factory.Shutdown() // runs after close: waits for the informer goroutines
	defer close(stopInf)
	factory.Start(stopInf)
	if !cache.WaitForCacheSync(stopInf, inf.HasSynced) {
		t.Fatalf("pod informer for %s did not sync", ns)
	}
	runtime.GC()
	cpu0 := cpuTime()
	sched0, api0 := harness.ProcessCPU(schedulerBinaries()...), harness.ProcessCPU("kube-apiserver", "etcd")
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	errs := make(chan error, len(specs))
	for i, s := range specs {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%04d", i), Namespace: ns,
				Annotations: map[string]string{v1alpha1.AnnotationRequirement: s.requirement}},
			Spec: corev1.PodSpec{
				SchedulerName: scheduler,
				Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(int64(s.gpus), resource.DecimalSI)}}}},
				TerminationGracePeriodSeconds: ptr.To[int64](0),
			},
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			mu.Lock()
			created[p.Name] = time.Now()
			mu.Unlock()
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("create pod %s: %w", p.Name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Stop waiting when all are bound, when nothing was bound for 20 s
	// (the rest cannot fit), or after 3 minutes.
	deadline := time.After(3 * time.Minute)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastCount, lastProgress := -1, time.Now()
wait:
	for {
		select {
		case <-allBound:
			break wait
		case <-deadline:
			break wait
		case <-tick.C:
			mu.Lock()
			c := len(bound)
			mu.Unlock()
			if c != lastCount {
				lastCount, lastProgress = c, time.Now()
			} else if time.Since(lastProgress) > 20*time.Second {
				break wait
			}
		}
	}
	cpu := cpuTime() - cpu0
	schedCPU, apiCPU := harness.ProcessCPU(schedulerBinaries()...)-sched0, harness.ProcessCPU("kube-apiserver", "etcd")-api0
	rss := harness.PeakRSS(schedulerBinaries()...)
	mu.Lock()
	var last time.Time
	lat := make([]time.Duration, 0, len(bound))
	for name, b := range bound {
		lat = append(lat, b.Sub(created[name]))
		if b.After(last) {
			last = b
		}
	}
	mu.Unlock()
	slices.Sort(lat)
	per := time.Duration(len(specs))
	r := phase{name: name, nodes: nodes, pods: len(specs), unscheduled: len(specs) - len(lat), cpuPerPod: cpu / per, schedCPU: schedCPU / per, apiCPU: apiCPU / per, schedRSS: rss}
	if len(lat) > 0 {
		r.wall = last.Sub(start)
		r.podsPerSec = float64(len(lat)) / r.wall.Seconds()
		r.p50 = lat[len(lat)/2]
		r.p99 = lat[(len(lat)*99+99)/100-1]
	}
	t.Logf("%s, %d nodes: %d/%d bound in %s (%.1f pods/s), p50 %s, p99 %s", name, nodes, len(lat), len(specs), r.wall.Round(time.Millisecond), r.podsPerSec, r.p50, r.p99)
	// Delete at once (no kubelet to wait for) and let the ledger settle.
	if err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		t.Fatalf("delete pods in %s: %v", ns, err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(l.Items) == 0, nil
	}); err != nil {
		t.Fatalf("pods in %s not deleted: %v", ns, err)
	}
	return r
}

// render writes, per node count, each scheduler's median pods/s over the
// repetitions with its range, latencies and this process's CPU per pod,
// then the two ratios the plugin build is judged by, each the median of
// the per-repetition ratios (both schedulers of a ratio ran in the same
// repetition, minutes apart at most).
func render(rs []phase) string {
	type key struct {
		nodes int
		mode  string
	}
	by := map[key][]phase{}
	var sizes []int
	for _, r := range rs {
		k := key{r.nodes, r.name}
		if len(by[k]) == 0 && r.rep == 0 && !slices.Contains(sizes, r.nodes) {
			sizes = append(sizes, r.nodes)
		}
		by[k] = append(by[k], r)
	}
	median := func(xs []float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		xs = slices.Clone(xs)
		slices.Sort(xs)
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	medianDur := func(ps []phase, f func(phase) time.Duration) time.Duration {
		xs := make([]float64, len(ps))
		for i, p := range ps {
			xs[i] = float64(f(p))
		}
		return time.Duration(median(xs))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| nodes | scheduler | reps | pods bound | pods/s median | pods/s min-max | p50 latency | p99 latency | scheduler CPU/pod | apiserver+etcd CPU/pod | test-process CPU/pod | scheduler peak RSS |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, n := range sizes {
		for _, m := range allModes {
			ps := by[key{n, m}]
			if len(ps) == 0 {
				continue
			}
			var rates []float64
			bound, total := 0, 0
			for _, p := range ps {
				rates = append(rates, p.podsPerSec)
				bound += p.pods - p.unscheduled
				total += p.pods
			}
			fmt.Fprintf(&b, "| %d | %s | %d | %d/%d | %.1f | %.1f-%.1f | %s | %s | %s | %s | %s | %s |\n", n, m, len(ps), bound, total,
				median(rates), slices.Min(rates), slices.Max(rates),
				medianDur(ps, func(p phase) time.Duration { return p.p50 }).Round(time.Millisecond),
				medianDur(ps, func(p phase) time.Duration { return p.p99 }).Round(time.Millisecond),
				medianDur(ps, func(p phase) time.Duration { return p.schedCPU }).Round(time.Microsecond),
				medianDur(ps, func(p phase) time.Duration { return p.apiCPU }).Round(time.Microsecond),
				medianDur(ps, func(p phase) time.Duration { return p.cpuPerPod }).Round(time.Microsecond),
				mib(medianDur(ps, func(p phase) time.Duration { return time.Duration(p.schedRSS) })))
		}
	}
	fmt.Fprintf(&b, "\n| nodes | ratio | per repetition | median | target |\n|---|---|---|---|---|\n")
	pods := func(p phase) float64 { return p.podsPerSec }
	for _, n := range sizes {
		throughput := ">= 0.95"
		if n > 5000 {
			throughput = ">= 0.9"
		}
		rss := "<= 1.2"
		if n < 5000 {
			rss = "-"
		}
		for _, rt := range []struct {
			num, den, what, target string
			of                     func(phase) float64
		}{
			{modePlugin, modePlain, "pods/s", throughput, pods},
			{modePlugin, modePlain, "p99 latency", "<= 1.1", func(p phase) float64 { return float64(p.p99) }},
			{modePlugin, modePlain, "peak RSS", rss, func(p phase) float64 { return float64(p.schedRSS) }},
			{modePlugin, modeEvents, "pods/s", "-", pods},
			{modePlugin, modeBaseline, "pods/s", "-", pods},
			{modeExtender, modeNoop, "pods/s", ">= 0.95", pods},
			{modeExtender, modePlain, "pods/s", "-", pods},
		} {
			num, den := by[key{n, rt.num}], by[key{n, rt.den}]
			if len(num) == 0 || len(den) == 0 {
				continue
			}
			var ratios []float64
			var each []string
			for i := range min(len(num), len(den)) {
				if d := rt.of(den[i]); d > 0 {
					r := rt.of(num[i]) / d
					ratios = append(ratios, r)
					each = append(each, fmt.Sprintf("%.2f", r))
				}
			}
			name := fmt.Sprintf("%s / %s", rt.num, rt.den)
			if rt.what != "pods/s" {
				name += ", " + rt.what
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %.2f | %s |\n", n, name, strings.Join(each, ", "), median(ratios), rt.target)
		}
	}
	return b.String()
}

// mib writes bytes as MiB; "-" for none measured.
func mib(b time.Duration) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}
