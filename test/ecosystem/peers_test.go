//go:build integration && peers

package ecosystem

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/demo"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/simulator"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// The peers on the same cluster (make bench-peers, docs/benchmarks.md):
// one node set and one burst of Jobs, the gang suite's mix, through each
// scheduler in turn on a fresh real control plane, each given the
// topology in its own form. GPUs inside a node, where a peer leaves them
// to the device plugin, are NVIDIA's device plugin's choice on the
// node's simulated NVML (demo.DevicePlugin), in bind order.
//
// PEERS_MODE=quick (default: 16 nodes, 4 leaves), full (64 nodes, 8
// leaves) or nvl72 (two GB200 NVL72 racks); PEERS selects schedulers (comma-separated, default all);
// PEERS_OUT is the report (default _out/peers.md).

const nsPeers = "peers" // not opted in to gputopo's webhook

// Schedulers of the bench.
const (
	peerPlain           = "kube-scheduler"
	peerGputopoPlugin   = "gputopo (plugin)"
	peerGputopoExtender = "gputopo (extender)"
	peerKueueTAS        = "Kueue TAS + kube-scheduler"
	peerKoord           = "koord-scheduler"
	peerKAI             = "KAI-Scheduler"
	peerVolcano         = "Volcano"
)

var peerNames = []string{peerPlain, peerKueueTAS, peerKoord, peerKAI, peerVolcano, peerGputopoExtender, peerGputopoPlugin}

// peerMachines are the suites' machine mix, in leaf-sized runs.
var peerMachines = []string{"dgx-a100", "dgx1-v100", "pcie-8x", "pcie-8x-nvlink-pairs"}

// peerJob is one Job of the burst.
type peerJob struct {
	name    string
	pods    int
	gpus    int // per pod
	intent  v1alpha1.Parallelism
	grouped bool
}

// peerWorkload draws the gang suite's mix from trace (the simulator's
// gang-fleet or gang-nvl72 generator: half groups of 2-16 pods × 4 or 8
// GPUs, 8 only where machines have 8, half single pods of 1-8 GPUs, half
// model-, half data-parallel), skipping a job that would take the burst
// over 85% of capacity GPUs.
func peerWorkload(t *testing.T, trace string, capacity int) []peerJob {
	t.Helper()
	tr, err := simulator.Generate(trace)
	if err != nil {
		t.Fatal(err)
	}
	var out []peerJob
	used := 0
	for _, j := range tr.Jobs {
		pods := j.PodCount()
		if used+pods*j.GPUs > capacity*85/100 {
			continue
		}
		used += pods * j.GPUs
		out = append(out, peerJob{name: fmt.Sprintf("j%02d-%s", len(out), j.Parallelism), pods: pods, gpus: j.GPUs, intent: j.Parallelism, grouped: pods > 1})
	}
	return out
}

// peerRow is one scheduler's line of the report.
type peerRow struct {
	name                       string
	pods, bound                int
	groups, groupsPlaced       int
	groupsOneLeaf              int
	modelPods, modelPodsNVLink int
	slowestRings               []int // per model job placed whole: its slowest pod's ring GB/s
	wall                       time.Duration
	cpu                        time.Duration
	rss                        int64
	note                       string
	// waiting names, per Job with pods not bound, why (the first such
	// pod's PodScheduled message).
	waiting []string
}

// peerCluster is the node set of a bench mode: its nodes, the fabric
// domain that groups should stay inside (label and word) and each node's
// domain, and the generator its burst is drawn from.
type peerCluster struct {
	specs    []demo.NodeSpec
	domainOf map[string]string
	label    string
	word     string
	domains  int
	machines string
	gpus     int
	trace    string
}

// peerClusterFor is the node set of mode: quick (16 nodes, 4 leaves),
// full (64 nodes, 8 leaves) or nvl72 (two GB200 NVL72 racks of 18 trays,
// each rack one NVLink clique).
func peerClusterFor(t *testing.T, mode string) peerCluster {
	t.Helper()
	c := peerCluster{domainOf: map[string]string{}, label: leafLabel, word: "leaf", trace: "gen:gang-fleet:seed=11:jobs=400"}
	switch mode {
	case "", "quick", "full":
		perMachine, leafSize := 4, 4
		if mode == "full" {
			perMachine, leafSize = 16, 8
		}
		for _, m := range peerMachines {
			for i := range perMachine {
				c.specs = append(c.specs, demo.NodeSpec{Name: fmt.Sprintf("%s-%02d", m, i), Fixture: m})
			}
		}
		for i, s := range c.specs {
			c.domainOf[s.Name] = fmt.Sprintf("leaf-%d", i/leafSize)
		}
		c.domains = len(c.specs) / leafSize
		c.machines = strings.Join(peerMachines, ", ") + ", equally many of each"
	case "nvl72":
		for i := range 36 {
			name := fmt.Sprintf("rack-%d-%02d", i/18, i%18)
			c.specs = append(c.specs, demo.NodeSpec{Name: name, Fixture: "gb200-nvl72-tray"})
			c.domainOf[name] = fmt.Sprintf("clique-%d", i/18)
		}
		c.label, c.word, c.domains, c.machines = cliqueLabel, "NVLink clique", 2, "GB200 NVL72 trays of 4 GPUs"
		c.trace = "gen:gang-nvl72:seed=11:jobs=400"
	default:
		t.Fatalf("PEERS_MODE=%q: want quick, full or nvl72", mode)
	}
	for _, s := range c.specs {
		f, err := machine.FixtureByName(s.Fixture)
		if err != nil {
			t.Fatal(err)
		}
		c.gpus += f.GPUs
	}
	return c
}

func TestPeers(t *testing.T) {
	c := peerClusterFor(t, os.Getenv("PEERS_MODE"))
	jobs := peerWorkload(t, c.trace, c.gpus)
	want := peerNames
	if v := os.Getenv("PEERS"); v != "" {
		want = strings.Split(v, ",")
	}
	var rows []peerRow
	var notRun []string
	for _, name := range peerNames {
		if !slices.Contains(want, name) {
			continue
		}
		// KAI-Scheduler and Volcano are built from sources fetched from
		// GitHub (hack/tools/kai.sh, volcano.sh). Where that failed, a run
		// that did not name them leaves them out and says so; one that
		// named them fails.
		if missing := missingPeerBinaries(name); missing != "" {
			if os.Getenv("PEERS") != "" {
				t.Fatalf("%s: %s", name, missing)
			}
			notRun = append(notRun, fmt.Sprintf("%s: not run, %s.", name, missing))
			continue
		}
		t.Run(strings.NewReplacer(" ", "-", "(", "", ")", "", "+", "").Replace(name), func(t *testing.T) {
			rows = append(rows, runPeer(t, name, c, jobs))
		})
	}
	report := writePeers(c, jobs, rows)
	for _, n := range notRun {
		report += "\n" + n + "\n"
	}
	t.Log("\n" + report)
	out := cmp.Or(os.Getenv("PEERS_OUT"), filepath.Join(harness.RepoRoot(), "_out", "peers.md"))
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
}

// missingPeerBinaries says which binaries of peer name, one built from a
// fetched source, are not in bin/ and how to build them; "" when none is
// missing or the peer needs no such build.
func missingPeerBinaries(name string) string {
	bins, script, env := map[string][]string{peerKAI: {kaiScheduler, kaiBinder, kaiGrouper}, peerVolcano: {vcScheduler, vcControllers}}[name], "", ""
	switch name {
	case peerKAI:
		script, env = "hack/tools/kai.sh", "KAI_SRC"
	case peerVolcano:
		script, env = "hack/tools/volcano.sh", "VOLCANO_SRC"
	}
	var missing []string
	for _, b := range bins {
		if _, err := localcluster.Binary(b); err != nil {
			missing = append(missing, "bin/"+b)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("%s missing (%s builds it from a clone of its pinned commit, or from %s=<a checkout of it>)", strings.Join(missing, ", "), script, env)
}

// peerSource is the source tree of a peer built from a fetched source
// (KAI-Scheduler, Volcano): the directory in variable env, else
// _out/src/name, where its build script clones it; marker is a path
// inside it the bench reads (its CRDs).
func peerSource(t *testing.T, env, name, script string, marker ...string) string {
	t.Helper()
	dir := os.Getenv(env)
	if dir == "" {
		dir = filepath.Join(harness.RepoRoot(), "_out", "src", name)
	}
	if _, err := os.Stat(filepath.Join(append([]string{dir}, marker...)...)); err != nil {
		t.Fatalf("%s's source (%s, else _out/src/%s; %s fetches it): %v", name, env, name, script, err)
	}
	return dir
}

// startPeerProcess starts bin/name (built by script) with env added to
// its environment and args, and waits until its log says ready.
func startPeerProcess(t *testing.T, name, ready, script string, env []string, args ...string) *localcluster.Process {
	t.Helper()
	bin, err := localcluster.Binary(name)
	if err != nil {
		t.Fatalf("%v (%s builds it; make bench-peers runs it)", err, script)
	}
	p := harness.StartProcess(t, name, "/usr/bin/env", append(append(slices.Clone(env), bin), args...)...)
	harness.Poll(t, 2*time.Minute, name+" to start", func() (bool, string) {
		if exited, err := p.Exited(); exited {
			t.Fatalf("%s exited: %v\n%s", name, err, p.Tail(40))
		}
		return p.LogContains(ready), p.Tail(3)
	})
	return p
}

// runPeer places jobs on a fresh cluster of specs through scheduler name
// and measures the result.
func runPeer(t *testing.T, name string, c peerCluster, jobs []peerJob) peerRow {
	specs, leafOf := c.specs, c.domainOf
	mode := localcluster.ModePlugin
	if name == peerGputopoExtender {
		mode = localcluster.ModeExtender
	}
	gputopo := name == peerGputopoPlugin || name == peerGputopoExtender
	ns := nsPeers
	if gputopo {
		ns = nsTeam // opted in: the webhook derives requirements and groups
	}
	graphs := map[string]*topology.Graph{}
	e := newEnv(t, mode, envOptions{
		noDecider: !gputopo,
		nodes: func(t *testing.T, e *env) {
			for _, s := range specs {
				f, err := machine.FixtureByName(s.Fixture)
				if err != nil {
					t.Fatal(err)
				}
				graphs[s.Name] = f.Graph(s.Name)
				e.addNode(t, s.Name, f, map[string]string{c.label: leafOf[s.Name], spineLabel: "s"})
			}
		},
		start: func(e *env, t *testing.T) {
			if name == peerKueueTAS {
				e.startKueue(t)
			}
		},
	})
	ctx := harness.Context(t)
	if !gputopo {
		for _, obj := range []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: nsPeers}}} {
			if err := e.cp.Client.Create(ctx, obj); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.cp.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: nsPeers, Name: "default"}}); err != nil {
			t.Fatal(err)
		}
	}
	if name == peerPlain || name == peerKueueTAS {
		e.cp.StartScheduler(t, nil)
	}
	if name == peerKueueTAS {
		e.kueueQueue(t, nsPeers, "gpus", c.gpus, "fabric", spineLabel, c.label)
	}
	var koord *localcluster.Process
	if name == peerKoord {
		koord = startKoord(t, e, specs, graphs)
	}
	var kai *kaiRun
	if name == peerKAI {
		kai = startKAI(t, e, specs, graphs, spineLabel, c.label)
	}
	var volcano *volcanoRun
	if name == peerVolcano {
		volcano = startVolcano(t, e, leafOf)
	}
	procs := map[string][]string{
		peerPlain: {"kube-scheduler"}, peerKueueTAS: {"kube-scheduler", "kueue"},
		peerGputopoExtender: {"kube-scheduler"}, peerGputopoPlugin: {"gputopo-scheduler"}, peerKoord: {"koord-scheduler"},
		peerKAI: {kaiScheduler, kaiBinder, kaiGrouper}, peerVolcano: {vcScheduler, vcControllers},
	}[name]

	// Bind order, as kubelet's device plugin would see pods arrive.
	var mu sync.Mutex
	var order []corev1.Pod
	seen := map[string]bool{}
	w, err := e.cp.Clientset.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var lastBind time.Time
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || p.Spec.NodeName == "" {
				continue
			}
			mu.Lock()
			if !seen[p.Name] {
				seen[p.Name] = true
				order = append(order, *p)
				lastBind = time.Now()
			}
			mu.Unlock()
		}
	}()

	total := 0
	for _, j := range jobs {
		total += j.pods
	}
	cpu0 := harness.ProcessCPU(procs...)
	start := time.Now()
	for _, j := range jobs {
		ann := map[string]string{}
		if j.grouped && name == peerKueueTAS {
			ann[kueuePreferredTopology] = c.label
		}
		job := indexedJob(j.name, j.pods, j.gpus, ann)
		job.SetNamespace(ns)
		if gputopo {
			job.SetAnnotations(map[string]string{v1alpha1.AnnotationParallelism: string(j.intent)})
		}
		if name == peerKueueTAS {
			job = queued(job, "gpus")
		}
		if name == peerKoord {
			koordJob(job, j)
		}
		if name == peerKAI {
			kaiJob(t, e, job, j, c.label)
		}
		if name == peerVolcano {
			volcanoJob(t, e, job, j)
		}
		if err := e.cp.Client.Create(ctx, job); err != nil {
			t.Fatalf("create Job %s: %v", j.name, err)
		}
	}
	// Until every pod is bound, or nothing binds for 45 s (more than the
	// 30 s period of kube-scheduler's flush of unschedulable pods).
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		mu.Lock()
		n, last := len(order), lastBind
		mu.Unlock()
		if n == total || n > 0 && time.Since(last) > 45*time.Second || n == 0 && time.Since(start) > time.Minute {
			break
		}
	}
	mu.Lock()
	bound := slices.Clone(order)
	if len(bound) == 0 {
		// A scheduler, or a queue in front of it, that places nothing is a
		// broken setup, not a slow peer.
		t.Errorf("%s bound none of the %d pods within a minute: is it running and configured?", name, total)
	}
	wall := lastBind.Sub(start)
	mu.Unlock()
	row := peerRow{name: name, pods: total, bound: len(bound), wall: wall, cpu: harness.ProcessCPU(procs...) - cpu0, rss: harness.PeakRSS(procs...)}
	switch name {
	case peerGputopoExtender:
		row.note = "scheduler CPU and RSS are kube-scheduler's; the extender runs in the test process"
	case peerKAI:
		row.note = "its scheduler (the operator's default SchedulingShard configuration), binder and pod grouper, a Topology of spine, " + c.word + " and host labels, KAI's default queues; a Job of several pods is a PodGroup of its own (minMember = its pods, preferred in one " + c.word + "), a single pod the pod grouper's; KAI places whole GPUs on a node, not which ones, so its pods' GPUs are the device plugin's; scheduler CPU/pod is its scheduler's, binder's and pod grouper's together, peak RSS the largest of them"
	case peerVolcano:
		row.note = "vc-scheduler with its installer's configuration (actions enqueue, allocate, backfill; plugins priority, gang, conformance, overcommit, drf, predicates, proportion, nodeorder, binpack) plus its network-topology-aware plugin as its user guide enables it, and vc-controller-manager (PodGroup and queue controllers among its defaults), both at -v=2 (the installer's 3 and 4 log more), no admission webhooks, its default queue, HyperNodes of tier 1 per " + c.word + " (its label's nodes) and tier 2 for the spine; a Job of several pods is a PodGroup of its own (minMember = its pods, network topology hard up to tier 2: one " + c.word + " tried before the spine), a single pod the PodGroup controller's; Volcano counts whole GPUs per node (nvidia.com/gpu), not which ones, so its pods' GPUs are the device plugin's; scheduler CPU/pod is vc-scheduler's and vc-controller-manager's together, peak RSS the larger"
	case peerKoord:
		row.note = "run with --pod-max-in-unschedulable-pods-duration=15s (default 5m), so that gang pods its Coscheduling turned away before their gang was complete are retried within the bench's 45 s wait (the flush runs every 30 s)"
	}

	// Why the pods not bound wait.
	all, err := e.cp.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	said := map[string]bool{}
	for _, p := range all.Items {
		job := p.Labels["batch.kubernetes.io/job-name"]
		if p.Spec.NodeName != "" || said[job] {
			continue
		}
		said[job] = true
		msg := "no PodScheduled condition"
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				msg = c.Message
			}
		}
		if len(p.Spec.SchedulingGates) > 0 {
			msg = fmt.Sprintf("scheduling gate %s", p.Spec.SchedulingGates[0].Name)
		}
		if len(msg) > 240 {
			msg = msg[:240] + "..."
		}
		row.waiting = append(row.waiting, job+": "+msg)
	}
	slices.Sort(row.waiting)
	if koord != nil && len(row.waiting) > 0 && os.Getenv("PEERS_DEBUG") != "" {
		t.Log(koord.Tail(300))
	}
	if kai != nil && len(row.waiting) > 0 && os.Getenv("PEERS_DEBUG") != "" {
		t.Log(kai.scheduler.Tail(300))
	}
	if volcano != nil && len(row.waiting) > 0 && os.Getenv("PEERS_DEBUG") != "" {
		t.Log(volcano.scheduler.Tail(300))
	}

	// Each bound pod's GPUs: gputopo's assigned-gpus, else the device
	// plugin's choice in bind order.
	dp, err := demo.NewDevicePlugin(specs)
	if err != nil {
		t.Fatal(err)
	}
	podGPUs := map[string][]int{}
	jobOf := map[string]string{}
	for _, p := range bound {
		jobOf[p.Name] = p.Labels["batch.kubernetes.io/job-name"]
		var uuids []string
		switch {
		case name == peerKoord:
			fresh, err := e.cp.Clientset.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if fresh.Spec.SchedulerName != koordScheduler {
				t.Errorf("pod %s has schedulerName %q; want %s", p.Name, fresh.Spec.SchedulerName, koordScheduler)
			}
			// koord-scheduler chooses the GPUs itself (DeviceShare).
			minors, err := koordMinors(fresh)
			if err != nil {
				t.Errorf("pod %s bound without Koordinator's device allocation: %v", p.Name, err)
			}
			podGPUs[p.Name] = minors
			continue
		case gputopo:
			fresh, err := e.cp.Clientset.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if fresh.Annotations[v1alpha1.AnnotationPlacement] == "" {
				t.Errorf("pod %s bound without gputopo's placement record: gputopo did not decide it", p.Name)
			}
			uuids = harness.PodGPUs(t, fresh, v1alpha1.AnnotationAssignedGPUs)
		default:
			if kai != nil {
				// KAI decided: its scheduler asked for this binding.
				if err := kai.decided(&p); err != nil {
					t.Errorf("pod %s: %v: KAI-Scheduler did not decide it", p.Name, err)
				}
			} else if volcano != nil {
				if err := volcano.decided(&p); err != nil {
					t.Errorf("pod %s: %v: Volcano did not decide it", p.Name, err)
				}
			} else if p.Spec.SchedulerName != corev1.DefaultSchedulerName {
				t.Errorf("pod %s has schedulerName %q; want kube-scheduler's", p.Name, p.Spec.SchedulerName)
			}
			n, err := v1alpha1.PodGPUDemand(&p.Spec, v1alpha1.ResourceGPU)
			if err != nil {
				t.Fatal(err)
			}
			if uuids, err = dp.Allocate(p.Spec.NodeName, int(n)); err != nil {
				t.Fatalf("device plugin on %s for pod %s: %v", p.Spec.NodeName, p.Name, err)
			}
		}
		for _, u := range uuids {
			if i, ok := graphs[p.Spec.NodeName].IndexOf(u); ok {
				podGPUs[p.Name] = append(podGPUs[p.Name], i)
			}
		}
	}
	if name == peerKueueTAS {
		// Kueue decided: every Job placed was admitted by it.
		for _, j := range jobs {
			if c := e.workloadConditionIn(t, ns, j.name, "Admitted"); !strings.HasPrefix(c, "Admitted=True") && slices.ContainsFunc(bound, func(p corev1.Pod) bool { return jobOf[p.Name] == j.name }) {
				t.Errorf("Job %s has pods bound but its Workload is not Admitted (%s): Kueue did not decide it", j.name, c)
			}
		}
	}
	nodeOf := map[string]string{}
	for _, p := range bound {
		nodeOf[p.Name] = p.Spec.NodeName
	}
	for _, j := range jobs {
		var pods []string
		for _, p := range bound {
			if jobOf[p.Name] == j.name {
				pods = append(pods, p.Name)
			}
		}
		if j.grouped {
			row.groups++
		}
		whole := len(pods) == j.pods
		if j.grouped && whole {
			row.groupsPlaced++
			leaves := map[string]bool{}
			for _, p := range pods {
				leaves[leafOf[nodeOf[p]]] = true
			}
			if len(leaves) == 1 {
				row.groupsOneLeaf++
			}
		}
		if j.intent != v1alpha1.ParallelismModel || j.gpus < 2 {
			continue
		}
		slowest := -1
		for _, p := range pods {
			g := graphs[nodeOf[p]]
			m := g.Metrics(topology.MaskOf(podGPUs[p]...), topology.Mask{})
			row.modelPods++
			if m.Tier == v1alpha1.TierNVLink || m.Tier == v1alpha1.TierNVSwitch {
				row.modelPodsNVLink++
			}
			if slowest < 0 || m.RingGBps < slowest {
				slowest = m.RingGBps
			}
		}
		if whole && slowest >= 0 {
			row.slowestRings = append(row.slowestRings, slowest)
		}
	}
	return row
}

// writePeers is the report: the cluster, the workload and one line per
// scheduler.
func writePeers(c peerCluster, jobs []peerJob, rows []peerRow) string {
	var b strings.Builder
	groups, pods, gpus := 0, 0, 0
	for _, j := range jobs {
		if j.grouped {
			groups++
		}
		pods += j.pods
		gpus += j.pods * j.gpus
	}
	fmt.Fprintf(&b, "%d nodes (%s) in %d %ss under one spine; %d Jobs at once (%d groups), %d pods, %d GPUs of %d.\n\n",
		len(c.specs), c.machines, c.domains, strings.TrimPrefix(c.word, "NVLink "), len(jobs), groups, pods, gpus, c.gpus)
	fmt.Fprintf(&b, "| scheduler | pods bound | groups placed | groups in one %s |", c.word)
	b.WriteString(" model pods on NVLink | slowest pod's ring per model job, mean GB/s | time to place | pods/s | scheduler CPU/pod | peak RSS |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		ring := "-"
		if len(r.slowestRings) > 0 {
			sum := 0
			for _, g := range r.slowestRings {
				sum += g
			}
			ring = fmt.Sprintf("%.1f (%d jobs)", float64(sum)/float64(len(r.slowestRings)), len(r.slowestRings))
		}
		rate, cpu := "-", "-"
		if r.wall > 0 && r.bound > 0 {
			rate = fmt.Sprintf("%.1f", float64(r.bound)/r.wall.Seconds())
			cpu = (r.cpu / time.Duration(r.bound)).Round(10 * time.Microsecond).String()
		}
		fmt.Fprintf(&b, "| %s | %d/%d | %d/%d | %d | %s | %s | %s | %s | %s | %d MiB |\n", r.name, r.bound, r.pods, r.groupsPlaced, r.groups, r.groupsOneLeaf,
			pct(r.modelPodsNVLink, r.modelPods), ring, r.wall.Round(100*time.Millisecond), rate, cpu, r.rss>>20)
	}
	for _, r := range rows {
		if r.note != "" {
			fmt.Fprintf(&b, "\n%s: %s.\n", r.name, r.note)
		}
	}
	for _, r := range rows {
		if len(r.waiting) > 0 {
			fmt.Fprintf(&b, "\nNot placed by %s, per Job (the scheduler's words):\n\n", r.name)
			for _, w := range r.waiting {
				fmt.Fprintf(&b, "- %s\n", strings.ReplaceAll(w, "\n", " "))
			}
		}
	}
	return b.String()
}

func pct(a, b int) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d (%.0f%%)", a, b, 100*float64(a)/float64(b))
}
