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
	// nil means DefaultExtenderConfiguration. PolicyTable is the webhook's
	// policy table the pods' requirements come from; nil means the
	// webhook's default.
	Extender    *configv1alpha1.ExtenderConfiguration
	PolicyTable *configv1alpha1.PolicyTable
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
	// MeanWait is over accepted jobs.
	MeanWait time.Duration
	// Decisions counts Place calls (one per job per scheduling attempt);
	// DecisionMean and DecisionP99 are their wall-clock times.
	Decisions                 int
	DecisionMean, DecisionP99 time.Duration
	// Series is the cluster state after every event.
	Series []Sample
	// Placed lists the accepted jobs in placement order.
	Placed []Placed
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
	names := cfg.Policies
	if names == nil {
		names = PolicyNames
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
	if cfg.MaxWait == 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	return runPolicy(cfg, p)
}

type running struct {
	end time.Duration
	seq int
	job Job
	pl  Placement
}

type runHeap []running

func (h runHeap) Len() int { return len(h) }
func (h runHeap) Less(i, j int) bool {
	return h[i].end < h[j].end || h[i].end == h[j].end && h[i].seq < h[j].seq
}
func (h runHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *runHeap) Push(x any)   { *h = append(*h, x.(running)) }
func (h *runHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func runPolicy(cfg Config, p Policy) (Result, error) {
	nodes := cfg.Nodes
	free := make([]topology.Mask, len(nodes))
	maxIsland := make([]int, len(nodes))
	for i, n := range nodes {
		free[i] = n.Graph.All().Intersect(n.Graph.Healthy())
		maxIsland[i] = n.Graph.Metrics(topology.Mask{}, free[i]).LeftLargestIsland
	}
	island := make([]int, len(nodes))
	for i := range nodes {
		island[i] = maxIsland[i]
	}
	res := Result{Policy: p.Name(), Jobs: len(cfg.Jobs), RingWorstGBps: -1}
	var (
		queue     []Job
		run       runHeap
		seq       int
		next      int
		used      int
		decisions []time.Duration
		ringSum   float64
		modelRing float64
		waitSum   time.Duration
	)
	for _, j := range cfg.Jobs {
		if j.Model() {
			res.ModelJobs++
		}
	}
	sample := func(t time.Duration) {
		num, den := 0, 0
		for i := range nodes {
			num += island[i]
			den += min(free[i].Count(), maxIsland[i])
		}
		s := Sample{T: t, UsedGPUs: used, IslandShare: 1}
		if den > 0 {
			s.IslandShare = float64(num) / float64(den)
		}
		if k := len(res.Series); k > 0 && res.Series[k-1].T == t {
			res.Series[k-1] = s
		} else {
			res.Series = append(res.Series, s)
		}
	}
	sample(0)
	for next < len(cfg.Jobs) || run.Len() > 0 || len(queue) > 0 {
		var t time.Duration
		switch {
		case next < len(cfg.Jobs) && (run.Len() == 0 || cfg.Jobs[next].Arrival <= run[0].end):
			t = cfg.Jobs[next].Arrival
		case run.Len() > 0:
			t = run[0].end
		default:
			// Nothing runs and nothing arrives: the cluster is empty and
			// the waiting jobs did not fit it; they never will.
			for _, j := range queue {
				if err := p.Drop(j); err != nil {
					return res, err
				}
			}
			queue = nil
			continue
		}
		for run.Len() > 0 && run[0].end <= t {
			r := heap.Pop(&run).(running)
			if err := p.Release(r.job, r.pl); err != nil {
				return res, err
			}
			free[r.pl.Node] = free[r.pl.Node].Union(r.pl.GPUs)
			used -= r.job.GPUs
			island[r.pl.Node] = nodes[r.pl.Node].Graph.Metrics(topology.Mask{}, free[r.pl.Node]).LeftLargestIsland
		}
		for next < len(cfg.Jobs) && cfg.Jobs[next].Arrival <= t {
			queue = append(queue, cfg.Jobs[next])
			next++
		}
		if c, ok := p.(clocked); ok {
			c.SetTime(t)
		}
		waiting := queue[:0]
		for _, j := range queue {
			if t-j.Arrival > cfg.MaxWait {
				if err := p.Drop(j); err != nil {
					return res, err
				}
				continue
			}
			start := time.Now()
			pl, ok, err := p.Place(j, free)
			decisions = append(decisions, time.Since(start))
			if err != nil {
				return res, err
			}
			if !ok {
				waiting = append(waiting, j)
				continue
			}
			if err := check(nodes, free, j, pl); err != nil {
				return res, fmt.Errorf("job %s: %w", j.ID, err)
			}
			g := nodes[pl.Node].Graph
			m := g.Metrics(pl.GPUs, free[pl.Node])
			free[pl.Node] = free[pl.Node].Minus(pl.GPUs)
			island[pl.Node] = m.LeftLargestIsland
			used += j.GPUs
			res.Accepted++
			waitSum += t - j.Arrival
			if j.GPUs > 1 {
				res.MultiGPU++
				ringSum += float64(m.RingGBps)
				if res.RingWorstGBps < 0 || float64(m.RingGBps) < res.RingWorstGBps {
					res.RingWorstGBps = float64(m.RingGBps)
				}
			}
			if j.Model() {
				res.ModelAccepted++
				modelRing += float64(m.RingGBps)
				if m.Tier == v1alpha1.TierNVLink || m.Tier == v1alpha1.TierNVSwitch {
					res.ModelNVLink++
				}
			}
			res.Placed = append(res.Placed, Placed{Job: j, Start: t, Node: nodes[pl.Node].Name, Fixture: nodes[pl.Node].Fixture,
				GPUs: pl.GPUs.Indices(), Tier: m.Tier, RingGBps: m.RingGBps})
			seq++
			heap.Push(&run, running{end: t + j.Duration, seq: seq, job: j, pl: pl})
		}
		queue = waiting
		sample(t)
	}
	if res.MultiGPU > 0 {
		res.RingMeanGBps = ringSum / float64(res.MultiGPU)
	} else {
		res.RingWorstGBps = 0
	}
	if res.ModelAccepted > 0 {
		res.ModelRingMeanGBps = modelRing / float64(res.ModelAccepted)
	}
	if res.Accepted > 0 {
		res.MeanWait = waitSum / time.Duration(res.Accepted)
	}
	res.IslandShare = timeWeighted(res.Series)
	res.Decisions = len(decisions)
	if len(decisions) > 0 {
		var sum time.Duration
		for _, d := range decisions {
			sum += d
		}
		res.DecisionMean = sum / time.Duration(len(decisions))
		slices.Sort(decisions)
		res.DecisionP99 = decisions[(len(decisions)*99+99)/100-1]
	}
	return res, nil
}

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
