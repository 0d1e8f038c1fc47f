//go:build schedbench

package schedbench_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/webhook"
)

// Environment knobs (defaults keep one run under about five minutes on a
// 2-core machine).
//
//	SCHEDBENCH_NODES  comma-separated node counts, ascending (500,1000)
//	SCHEDBENCH_PODS   GPU pods per phase (500)
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

type phase struct {
	name        string
	nodes, pods int
	wall        time.Duration
	podsPerSec  float64
	p50, p99    time.Duration
	cpuPerPod   time.Duration // this process (clients + extender when in use)
	unscheduled int
	extenderCPU time.Duration // per pod; gputopo phase minus plain phase
}

func TestSchedulerThroughput(t *testing.T) {
	sizes := envInts(t, "SCHEDBENCH_NODES", "500,1000")
	podCount := envInts(t, "SCHEDBENCH_PODS", "500")[0]
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)

	x, stopExtender := startExtender(t, cp)
	defer stopExtender()
	port := x.port

	pods := podMix(podCount)
	var results []phase
	made := 0
	for _, n := range sizes {
		if n < made {
			t.Fatalf("SCHEDBENCH_NODES must ascend; got %v", sizes)
		}
		start := time.Now()
		if err := createNodes(ctx, cp, made, n); err != nil {
			t.Fatal(err)
		}
		made = n
		t.Logf("nodes=%d created in %s", n, time.Since(start).Round(time.Millisecond))
		waitLedger(t, x.Extender, n)

		plainSched := cp.StartScheduler(t, nil)
		plain := runPhase(t, cp, "default scheduler", n, "plain-"+strconv.Itoa(n), corev1.DefaultSchedulerName, pods)
		plainSched.Stop()

		gSched := startGputopoScheduler(t, cp, port)
		g := runPhase(t, cp, "with gputopo extender", n, "gputopo-"+strconv.Itoa(n), v1alpha1.DefaultSchedulerName, pods)
		gSched.Stop()
		waitLedger(t, x.Extender, n)
		g.extenderCPU = g.cpuPerPod - plain.cpuPerPod
		results = append(results, plain, g)
	}
	table := render(results)
	fmt.Println(table)
	if out := os.Getenv("SCHEDBENCH_OUT"); out != "" {
		// go test runs in the package directory; a relative path means
		// the repository root, where make runs.
		if !filepath.IsAbs(out) {
			out = filepath.Join(harness.RepoRoot(), out)
		}
		if err := os.WriteFile(out, []byte(table), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range results {
		if r.unscheduled > 0 {
			t.Errorf("%s on %d nodes: %d of %d pods not bound; the figures above are not comparable", r.name, r.nodes, r.unscheduled, r.pods)
		}
	}
}

type runningExtender struct {
	*extender.Extender
	port int
}

func startExtender(t *testing.T, cp *harness.ControlPlane) (*runningExtender, func()) {
	t.Helper()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	o := extender.NewOptions()
	o.BindAddress, o.Port, o.MetricsBindAddress = "127.0.0.1", port, "127.0.0.1:0"
	o.LeaderElect = false
	x, err := extender.New(cp.Config, o)
	if err != nil {
		t.Fatalf("new extender: %v", err)
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	done := make(chan error, 1)
	go func() { done <- x.Start(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("extender: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return x.Ready(), nil
	}); err != nil {
		t.Fatalf("extender not ready: %v", err)
	}
	return &runningExtender{Extender: x, port: port}, stop
}

// waitLedger waits until the extender's informers have every node's
// topology and no GPU is held (the previous phase's pods are gone).
func waitLedger(t *testing.T, x *extender.Extender, nodes int) {
	t.Helper()
	var c extender.Counts
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		c = x.Ledger().Counts()
		return c.Total == 8*nodes && c.Free == c.Total, nil
	})
	if err != nil {
		t.Fatalf("extender ledger not settled for %d nodes: %s", nodes, c)
	}
}

// startGputopoScheduler runs kube-scheduler with the chart's profile,
// pointed at the in-process extender.
func startGputopoScheduler(t *testing.T, cp *harness.ControlPlane, port int) *harness.Process {
	t.Helper()
	return cp.StartScheduler(t, harness.ChartSchedulerConfig(t, "http://127.0.0.1:"+strconv.Itoa(port)))
}

// createNodes registers nodes [from, to) with 8 GPUs each and their
// NodeGPUTopology, 16 at a time.
func createNodes(ctx context.Context, cp *harness.ControlPlane, from, to int) error {
	work := make(chan int)
	errs := make(chan error, to-from)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := range work {
				if err := createNode(ctx, cp, i); err != nil {
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

func createNode(ctx context.Context, cp *harness.ControlPlane, i int) error {
	fx := fixtures[i%len(fixtures)]
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
	f, err := topology.FixtureByName(fx)
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
	table := webhook.DefaultConfig().PolicyTable
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
	r := phase{name: name, nodes: nodes, pods: len(specs), unscheduled: len(specs) - len(lat), cpuPerPod: cpu / time.Duration(len(specs))}
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

func render(rs []phase) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| nodes | scheduler | pods bound | wall | pods/s | ratio to plain | p50 latency | p99 latency | test-process CPU/pod | extender CPU/pod |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|\n")
	var plain phase
	for _, r := range rs {
		ratio, ext := "1.00 (baseline)", "-"
		if r.name == "default scheduler" {
			plain = r
		} else {
			if plain.podsPerSec > 0 {
				ratio = fmt.Sprintf("%.2f", r.podsPerSec/plain.podsPerSec)
			}
			ext = r.extenderCPU.Round(time.Microsecond).String()
		}
		fmt.Fprintf(&b, "| %d | %s | %d/%d | %s | %.1f | %s | %s | %s | %s | %s |\n", r.nodes, r.name, r.pods-r.unscheduled, r.pods,
			r.wall.Round(time.Millisecond), r.podsPerSec, ratio, r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond),
			r.cpuPerPod.Round(time.Microsecond), ext)
	}
	return b.String()
}
