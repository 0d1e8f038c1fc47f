package simulator

import (
	"container/heap"
	"fmt"
	"slices"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Config is one simulation: a cluster, a trace, the queueing rule and the
// policies to compare.
type Config struct {
	Nodes []Node
	Jobs  []Job
	// MaxWait is how long a job may wait in the queue; a job not placed
	// within MaxWait of its arrival is rejected. Zero means DefaultMaxWait.
	MaxWait time.Duration
	// Policies to run, by name; nil means PolicyNames.
	Policies []string
	// Extender configures the gputopo policy's extender (weights, ...);
	// nil means configv1alpha1.DefaultExtenderConfiguration. PolicyTable is the
	// webhook's policy table the pods' requirements come from; nil means
	// the webhook's default.
	Extender    *configv1alpha1.ExtenderConfiguration
	PolicyTable *configv1alpha1.PolicyTable
	// Preemption is how a job that fits nowhere evicts running jobs of
	// lower priority (PreemptTopology, PreemptCount); "" never evicts.
	Preemption string
}

// check refuses a configuration without nodes or jobs or with a negative
// MaxWait, sets MaxWait's default, and returns the policies to run
// (defaults when Policies is nil).
func (cfg *Config) check(defaults []string) ([]string, error) {
	if len(cfg.Nodes) == 0 {
		return nil, fmt.Errorf("simulate: no nodes; give a cluster")
	}
	if len(cfg.Jobs) == 0 {
		return nil, fmt.Errorf("simulate: no jobs; give a trace")
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.MaxWait < 0 {
		return nil, fmt.Errorf("simulate: max wait %s: must be >= 0", cfg.MaxWait)
	}
	if cfg.Policies == nil {
		return defaults, nil
	}
	return cfg.Policies, nil
}

// DefaultMaxWait is the default queue timeout.
const DefaultMaxWait = time.Hour

// Result is one policy's outcome on the trace.
type Result struct {
	Policy string
	Jobs   int
	// Accepted jobs were placed within MaxWait; the others were rejected.
	Accepted int
	// ModelJobs counts model-parallel multi-GPU jobs; ModelAccepted those
	// placed, ModelNVLink those placed on a fully NVLink- or
	// NVSwitch-connected set.
	ModelJobs, ModelAccepted, ModelNVLink int
	// MultiGPU counts placed jobs with more than one GPU; RingMeanGBps and
	// RingWorstGBps are over their ring bandwidths.
	MultiGPU                    int
	RingMeanGBps, RingWorstGBps float64
	// ModelRingMeanGBps is the mean ring bandwidth of the placed
	// model-parallel multi-GPU jobs, the ones bound by it.
	ModelRingMeanGBps float64
	// IslandShare is the time-weighted mean of the fragmentation measure
	// (see Sample); 1 means no NVLink island was ever broken needlessly.
	IslandShare float64
	// MeanWait is over accepted jobs. EffectiveWait is over every job, a
	// rejected one counting the full MaxWait: it does not reward
	// accepting fewer.
	MeanWait, EffectiveWait time.Duration
	// NVLinkWork is the model-parallel multi-GPU work that ran on a fully
	// NVLink- or NVSwitch-connected set, in GPU-hours, per GPU-hour of
	// such work submitted: 1 when every model-parallel job ran at NVLink
	// speed, lower for each one rejected or placed on PCIe.
	NVLinkWork float64
	// Decisions counts Place calls (one per job per scheduling attempt);
	// DecisionMean and DecisionP99 are their wall-clock times.
	Decisions                 int
	DecisionMean, DecisionP99 time.Duration
	// Series is the cluster state after every event.
	Series []Sample
	// Placed lists the accepted jobs in placement order.
	Placed []Placed
	// Preemption's columns (Config.Preemption): jobs of priority above 0
	// (High*), their mean wait until placed, their model-parallel
	// multi-GPU jobs placed and those on NVLink; evicted jobs, and the
	// GPU-hours they had run (lost: an evicted job starts over).
	HighJobs, HighAccepted, HighModel, HighModelNVLink int
	HighMeanWait                                       time.Duration
	// HighEffectiveWait is over every high-priority job, a rejected one
	// counting the full MaxWait: it does not reward placing fewer.
	HighEffectiveWait time.Duration
	Evictions         int
	LostGPUHours      float64
}

// Placed is one accepted job and where it ran.
type Placed struct {
	Job     Job
	Start   time.Duration
	Node    string
	Fixture string
	GPUs    []int
	Tier    v1alpha1.LinkTier
	// RingGBps is the set's bottleneck ring bandwidth (0 for one GPU).
	RingGBps int
}

// AcceptanceRate is Accepted/Jobs.
func (r Result) AcceptanceRate() float64 { return ratio(r.Accepted, r.Jobs) }

// NVLinkShare is the share of placed model-parallel multi-GPU jobs on a
// fully NVLink-connected set.
func (r Result) NVLinkShare() float64 { return ratio(r.ModelNVLink, r.ModelAccepted) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Sample is the cluster after the events at time T.
type Sample struct {
	T time.Duration
	// UsedGPUs held by running jobs.
	UsedGPUs int
	// IslandShare is Σ largest free NVLink island per node divided by
	// Σ min(free GPUs, largest island the node has when empty): the share
	// of the NVLink-connected capacity that the free GPUs could still
	// offer one job per node. 1 when nothing is free.
	IslandShare float64
}

// Run replays the trace through every policy, each on its own copy of the
// cluster. Jobs wait in one FIFO queue; whenever an event changes the
// cluster every waiting job is tried in arrival order (a job that does not
// fit does not block the jobs behind it: backfill), and a job still
// waiting MaxWait after its arrival is rejected.
func Run(cfg Config) ([]Result, error) {
	names, err := cfg.check(PolicyNames)
	if err != nil {
		return nil, err
	}
	if err := singlePods(cfg.Jobs); err != nil {
		return nil, err
	}
	out := make([]Result, 0, len(names))
	for _, name := range names {
		p, err := newPolicy(name, cfg.Nodes, cfg.Extender, cfg.PolicyTable)
		if err != nil {
			return nil, fmt.Errorf("simulate: %w", err)
		}
		r, err := runPolicy(cfg, p)
		if err != nil {
			return nil, fmt.Errorf("simulate: policy %s: %w", name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// RunPolicy replays the trace of cfg through one policy the caller built
// (cfg.Policies is ignored): a policy outside the simulator, such as the
// real kube-scheduler and extender on a control plane, is measured with
// the same queue and the same columns.
func RunPolicy(cfg Config, p Policy) (Result, error) {
	if len(cfg.Nodes) == 0 || len(cfg.Jobs) == 0 {
		return Result{}, fmt.Errorf("simulate: need nodes and jobs")
	}
	if err := singlePods(cfg.Jobs); err != nil {
		return Result{}, err
	}
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	return runPolicy(cfg, p)
}

// singlePods refuses jobs of more than one pod, which only RunGang
// replays.
func singlePods(jobs []Job) error {
	for _, j := range jobs {
		if j.Group() {
			return fmt.Errorf("simulate: job %s has %d pods; jobs of several pods are replayed by the gang policies (RunGang, gputopo simulate --gang-suite)", j.ID, j.Pods)
		}
	}
	return nil
}

type running struct {
	end, start time.Duration
	seq        int
	job        Job
	pl         Placement
}

func (r running) endSeq() (time.Duration, int) { return r.end, r.seq }

type runHeap = endHeap[running]

// endHeap is a container/heap of running jobs, the first to end on top
// (then the first started).
type endHeap[T interface{ endSeq() (time.Duration, int) }] []T

func (h endHeap[T]) Len() int { return len(h) }
func (h endHeap[T]) Less(i, j int) bool {
	ei, si := h[i].endSeq()
	ej, sj := h[j].endSeq()
	return ei < ej || ei == ej && si < sj
}
func (h endHeap[T]) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *endHeap[T]) Push(x any)   { *h = append(*h, x.(T)) }
func (h *endHeap[T]) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// engine is one policy's run: the cluster's free GPUs, the jobs waiting
// and running, and what the run has measured so far.
type engine struct {
	cfg       Config
	p         Policy
	free      []topology.Mask
	maxIsland []int // each node's largest free NVLink island when idle
	island    []int // each node's largest free NVLink island now
	res       Result

	queue     []Job
	run       runHeap
	seq       int
	next      int // the next job to arrive
	used      int
	decisions []time.Duration
	ringSum   float64
	modelRing float64
	waitSum   time.Duration
	// modelWork and nvlinkWork are the submitted model-parallel GPU-hours
	// and those run on NVLink.
	modelWork, nvlinkWork float64
	// started are the jobs started at least once (an evicted job starts
	// again); highWait sums the high-priority jobs' first waits.
	started  map[string]bool
	highWait time.Duration
	// requeue are the jobs preemption evicted during a step.
	requeue []Job
}

func runPolicy(cfg Config, p Policy) (Result, error) {
	e := newEngine(cfg, p)
	e.sample(0)
	for e.next < len(cfg.Jobs) || e.run.Len() > 0 || len(e.queue) > 0 {
		var t time.Duration
		switch {
		case e.next < len(cfg.Jobs) && (e.run.Len() == 0 || cfg.Jobs[e.next].Arrival <= e.run[0].end):
			t = cfg.Jobs[e.next].Arrival
		case e.run.Len() > 0:
			t = e.run[0].end
		default:
			// Nothing runs and nothing arrives: the cluster is empty and
			// the waiting jobs did not fit it; they never will.
			for _, j := range e.queue {
				if err := p.Drop(j); err != nil {
					return e.res, err
				}
			}
			e.queue = nil
			continue
		}
		if err := e.step(t); err != nil {
			return e.res, err
		}
	}
	e.finish()
	return e.res, nil
}

func newEngine(cfg Config, p Policy) *engine {
	nodes := cfg.Nodes
	e := &engine{cfg: cfg, p: p, free: make([]topology.Mask, len(nodes)), maxIsland: make([]int, len(nodes)),
		res: Result{Policy: p.Name(), Jobs: len(cfg.Jobs), RingWorstGBps: -1}}
	for i, n := range nodes {
		e.free[i] = n.Graph.All().Intersect(n.Graph.Healthy())
		e.maxIsland[i] = n.Graph.Metrics(topology.Mask{}, e.free[i]).LeftLargestIsland
	}
	e.island = slices.Clone(e.maxIsland)
	for _, j := range cfg.Jobs {
		if j.Model() {
			e.res.ModelJobs++
			e.modelWork += gpuHours(j)
		}
		if j.Priority > 0 {
			e.res.HighJobs++
		}
	}
	e.started = make(map[string]bool, len(cfg.Jobs))
	return e
}

// sample records the cluster at t in the series (replacing a sample
// already taken at t).
func (e *engine) sample(t time.Duration) {
	num, den := 0, 0
	for i := range e.cfg.Nodes {
		num += e.island[i]
		den += min(e.free[i].Count(), e.maxIsland[i])
	}
	s := Sample{T: t, UsedGPUs: e.used, IslandShare: 1}
	if den > 0 {
		s.IslandShare = float64(num) / float64(den)
	}
	if k := len(e.res.Series); k > 0 && e.res.Series[k-1].T == t {
		e.res.Series[k-1] = s
	} else {
		e.res.Series = append(e.res.Series, s)
	}
}

// step advances the run to t: the jobs that end by t release their GPUs,
// those that arrive by t join the queue, and the queue is offered to the
// policy in order.
func (e *engine) step(t time.Duration) error {
	nodes := e.cfg.Nodes
	for e.run.Len() > 0 && e.run[0].end <= t {
		r := heap.Pop(&e.run).(running)
		if err := e.p.Release(r.job, r.pl); err != nil {
			return err
		}
		e.free[r.pl.Node] = e.free[r.pl.Node].Union(r.pl.GPUs)
		e.used -= r.job.GPUs
		e.island[r.pl.Node] = nodes[r.pl.Node].Graph.Metrics(topology.Mask{}, e.free[r.pl.Node]).LeftLargestIsland
	}
	for e.next < len(e.cfg.Jobs) && e.cfg.Jobs[e.next].Arrival <= t {
		e.queue = append(e.queue, e.cfg.Jobs[e.next])
		e.next++
	}
	if c, ok := e.p.(clocked); ok {
		c.SetTime(t)
	}
	waiting := e.queue[:0]
	for _, j := range e.queue {
		if t-j.Arrival > e.cfg.MaxWait {
			if err := e.p.Drop(j); err != nil {
				return err
			}
			continue
		}
		start := time.Now()
		pl, ok, err := e.p.Place(j, e.free)
		e.decisions = append(e.decisions, time.Since(start))
		if err != nil {
			return err
		}
		if !ok && e.cfg.Preemption != "" && j.Priority > 0 {
			evicted, err := e.preempt(t, j)
			if err != nil {
				return err
			}
			if evicted {
				if pl, ok, err = e.p.Place(j, e.free); err != nil {
					return err
				}
			}
		}
		if !ok {
			waiting = append(waiting, j)
			continue
		}
		if err := check(nodes, e.free, j, pl); err != nil {
			return fmt.Errorf("job %s: %w", j.ID, err)
		}
		e.start(t, j, pl)
	}
	e.queue = append(waiting, e.requeue...)
	e.requeue = e.requeue[:0]
	e.sample(t)
	return nil
}

// start runs job j at t on pl and measures what it got.
func (e *engine) start(t time.Duration, j Job, pl Placement) {
	n := e.cfg.Nodes[pl.Node]
	m := n.Graph.Metrics(pl.GPUs, e.free[pl.Node])
	e.free[pl.Node] = e.free[pl.Node].Minus(pl.GPUs)
	e.island[pl.Node] = m.LeftLargestIsland
	e.used += j.GPUs
	res := &e.res
	e.seq++
	heap.Push(&e.run, running{end: t + j.Duration, seq: e.seq, job: j, pl: pl, start: t})
	if e.started[j.ID] {
		return // an evicted job started again: counted at its first start
	}
	e.started[j.ID] = true
	res.Accepted++
	e.waitSum += t - j.Arrival
	if j.Priority > 0 {
		res.HighAccepted++
		e.highWait += t - j.Arrival
		if j.Model() {
			res.HighModel++
			if m.Tier == v1alpha1.TierNVLink || m.Tier == v1alpha1.TierNVSwitch {
				res.HighModelNVLink++
			}
		}
	}
	if j.GPUs > 1 {
		res.MultiGPU++
		e.ringSum += float64(m.RingGBps)
		if res.RingWorstGBps < 0 || float64(m.RingGBps) < res.RingWorstGBps {
			res.RingWorstGBps = float64(m.RingGBps)
		}
	}
	if j.Model() {
		res.ModelAccepted++
		e.modelRing += float64(m.RingGBps)
		if m.Tier == v1alpha1.TierNVLink || m.Tier == v1alpha1.TierNVSwitch {
			res.ModelNVLink++
			e.nvlinkWork += gpuHours(j)
		}
	}
	res.Placed = append(res.Placed, Placed{Job: j, Start: t, Node: n.Name, Fixture: n.Fixture,
		GPUs: pl.GPUs.Indices(), Tier: m.Tier, RingGBps: m.RingGBps})
}

// finish turns the run's sums into the result's means and percentiles.
func (e *engine) finish() {
	res := &e.res
	if res.MultiGPU == 0 {
		res.RingWorstGBps = 0
	}
	res.RingMeanGBps = meanOf(e.ringSum, res.MultiGPU)
	res.ModelRingMeanGBps = meanOf(e.modelRing, res.ModelAccepted)
	res.MeanWait = meanOf(e.waitSum, res.Accepted)
	res.EffectiveWait = meanOf(e.waitSum+time.Duration(res.Jobs-res.Accepted)*e.cfg.MaxWait, res.Jobs)
	if e.modelWork > 0 {
		res.NVLinkWork = e.nvlinkWork / e.modelWork
	}
	res.HighMeanWait = meanOf(e.highWait, res.HighAccepted)
	res.HighEffectiveWait = meanOf(e.highWait+time.Duration(res.HighJobs-res.HighAccepted)*e.cfg.MaxWait, res.HighJobs)
	res.IslandShare = timeWeighted(res.Series)
	res.Decisions, res.DecisionMean, res.DecisionP99 = decisionStats(e.decisions)
}

// gpuHours is the GPU-hours job j runs for.
func gpuHours(j Job) float64 { return float64(j.GPUs) * j.Duration.Hours() }

// check enforces what every policy owes: the right number of GPUs, all
// of them free, on a node that exists.
func check(nodes []Node, free []topology.Mask, j Job, pl Placement) error {
	switch {
	case pl.Node < 0 || pl.Node >= len(nodes):
		return fmt.Errorf("placed on node index %d; the cluster has %d nodes", pl.Node, len(nodes))
	case pl.GPUs.Count() != j.GPUs:
		return fmt.Errorf("placed on %d GPUs (%s); it asked for %d", pl.GPUs.Count(), pl.GPUs, j.GPUs)
	case !pl.GPUs.Minus(free[pl.Node]).Empty():
		return fmt.Errorf("placed on GPUs %s of node %s, which are not free (free: %s)", pl.GPUs, nodes[pl.Node].Name, free[pl.Node])
	}
	return nil
}

// timeWeighted is the mean of IslandShare over the span of the series,
// each sample holding until the next.
func timeWeighted(s []Sample) float64 {
	if len(s) == 0 {
		return 0
	}
	if len(s) == 1 || s[len(s)-1].T == s[0].T {
		return s[0].IslandShare
	}
	var sum float64
	for i := 0; i+1 < len(s); i++ {
		sum += s[i].IslandShare * float64(s[i+1].T-s[i].T)
	}
	return sum / float64(s[len(s)-1].T-s[0].T)
}

// decisionStats are the count, mean and p99 of decision times (d is
// sorted).
func decisionStats(d []time.Duration) (n int, mean, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	var sum time.Duration
	for _, x := range d {
		sum += x
	}
	return len(d), sum / time.Duration(len(d)), percentile(d, 99)
}

// percentile is the p-th percentile of d (nearest rank), 0 when d is
// empty; it sorts d.
func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[(len(d)*p+99)/100-1]
}

// meanOf is sum over n, 0 when n is 0.
func meanOf[T ~float64 | ~int64](sum T, n int) T {
	if n == 0 {
		return 0
	}
	return sum / T(n)
}
