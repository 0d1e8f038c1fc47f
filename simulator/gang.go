package simulator

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// GangPolicy places jobs of one or more pods. The simulator owns the
// free-GPU state and passes it in. A job starts when all its pods are
// placed; the pods a policy places before that hold their GPUs while the
// job waits for the rest (a partial hold, which all-or-nothing policies
// never make).
type GangPolicy interface {
	// Name is the policy's row in the report.
	Name() string
	// Place places pods of job that are not placed yet: have are the
	// job's pods placed so far, free[i] node i's free GPUs. It returns the
	// pods it places now, each on job.GPUs free GPUs, at most
	// job.PodCount()-len(have) of them; none when it places none now.
	Place(job Job, have []Placement, free []topology.Mask) ([]Placement, error)
	// Release is told that a job ended, with its pods.
	Release(job Job, pods []Placement) error
	// Drop is told that a waiting job was given up, with the pods it held
	// (the simulator frees them).
	Drop(job Job, pods []Placement) error
}

// Gang policy names, in report order.
const (
	// GangGputopo is the decision core planning each group whole.
	GangGputopo = "gputopo"
	// GangPerPod is the same core given the pods without their group,
	// one by one.
	GangPerPod = "gputopo-per-pod"
	// GangFirstFit is a count-only gang scheduler: all or nothing, first
	// fit, any GPUs of a node.
	GangFirstFit = "gang-first-fit"
	// GangTAS is a Kueue-TAS-like placer: all or nothing, the best-fit
	// domain by free GPUs at the tightest level that holds the group.
	GangTAS = "tas-like"
	// GangOptimum is the greedy per-decision optimum of group bandwidth.
	GangOptimum = "optimum"
)

// GangPolicyNames lists every gang policy RunGang knows.
var GangPolicyNames = []string{GangGputopo, GangPerPod, GangFirstFit, GangTAS, GangOptimum}

// GangConfig is one gang simulation: a Config whose jobs may have
// several pods. A job not wholly placed within MaxWait is given up with
// the pods it held; nil Policies means GangPolicyNames; it takes no
// Preemption.
type GangConfig = Config

// GangResult is one policy's outcome on a trace with groups.
type GangResult struct {
	Policy string
	// Jobs and Accepted count every job; Accepted were wholly placed
	// within MaxWait.
	Jobs, Accepted int
	// Groups counts the jobs of more than one pod; GroupsPlaced those
	// wholly placed. Of the placed: GroupsNVLink inside one NVLink
	// domain, GroupsLeaf inside one leaf (or tighter), GroupsOneDomain
	// inside one NVLink domain or, for a group no NVLink domain of the
	// idle cluster holds, inside one leaf.
	Groups, GroupsPlaced             int
	GroupsNVLink, GroupsLeaf         int
	GroupsOneDomain, GroupsFitNVLink int
	// ModelGroupsOffNVLink counts the placed model-parallel groups with a
	// pod on GPUs not NVLink-connected to each other (PCIe), which the
	// default policy table's strict model intent never allows.
	ModelGroupsOffNVLink int
	// GroupsPartial counts the groups that held GPUs while incomplete;
	// HeldGPUHours is what they held: the GPUs of each pod placed while
	// its group was incomplete, times the time until the group was
	// complete or given up.
	GroupsPartial int
	HeldGPUHours  float64
	// MeanWait is over every job, one not placed counting MaxWait;
	// GroupMeanWait, GroupWaitP95 and GroupWaitMax the same over the
	// groups (p95: nearest rank), SingleMeanWait over the single-pod jobs:
	// what a group placed sooner costs the others.
	MeanWait, GroupMeanWait    time.Duration
	GroupWaitP95, GroupWaitMax time.Duration
	SingleMeanWait             time.Duration
	// GroupGBpsMean and GroupGBpsWorst are over the placed groups' group
	// bandwidths (see groupShape).
	GroupGBpsMean, GroupGBpsWorst float64
	// Sliced groups (Job.SliceSize): SlicedGroups counts them,
	// SlicedPlaced the placed ones; Slices counts those groups' slices,
	// SlicesOneDomain the ones inside one domain of their slice level (on
	// one node counts); SliceGBpsMean is the mean over the placed sliced
	// groups of their slowest slice's group bandwidth (groupShape).
	SlicedGroups, SlicedPlaced, Slices, SlicesOneDomain int
	SliceGBpsMean                                       float64
	// Decisions counts Place calls; DecisionMean and DecisionP99 are their
	// wall-clock times.
	Decisions                 int
	DecisionMean, DecisionP99 time.Duration
	// Placed lists the placed groups in the order they started.
	Placed []GangPlaced
}

// GangPlaced is a placed group: when it started, its pods and its shape.
type GangPlaced struct {
	Job   Job
	Start time.Duration
	Pods  []Placement
	Shape groupShape
}

// GroupsPlacedShare is GroupsPlaced/Groups.
func (r GangResult) GroupsPlacedShare() float64 { return ratio(r.GroupsPlaced, r.Groups) }

// IntentKeptShare is the share of the trace's groups placed keeping the
// model intent: groups placed less model-parallel groups off NVLink, as
// the acceptance points compare groups placed.
func (r GangResult) IntentKeptShare() float64 {
	return ratio(r.GroupsPlaced-r.ModelGroupsOffNVLink, r.Groups)
}

// OneDomainShare is the share of placed groups inside one domain (see
// GroupsOneDomain).
func (r GangResult) OneDomainShare() float64 { return ratio(r.GroupsOneDomain, r.GroupsPlaced) }

// RunGang replays the trace through every gang policy, each on its own
// copy of the cluster, with Run's queue: one FIFO queue with backfill,
// every waiting job tried whenever the cluster changes, and a job still
// incomplete MaxWait after its arrival given up at that moment (a timeout
// is an event of its own, so a partial hold ends on time).
func RunGang(cfg GangConfig) ([]GangResult, error) {
	names, err := cfg.check(GangPolicyNames)
	if err != nil {
		return nil, err
	}
	if cfg.Preemption != "" {
		return nil, fmt.Errorf("simulate: preemption %q: the gang policies do not preempt; leave it empty", cfg.Preemption)
	}
	for _, j := range cfg.Jobs {
		if j.GPUs < 1 {
			return nil, fmt.Errorf("simulate: job %s asks %d GPUs", j.ID, j.GPUs)
		}
	}
	fab := newFabric(cfg.Nodes, fabricLevels(cfg.Extender))
	out := make([]GangResult, 0, len(names))
	for _, name := range names {
		p, err := newGangPolicy(name, cfg, fab)
		if err != nil {
			return nil, fmt.Errorf("simulate: %w", err)
		}
		r, err := runGang(cfg, fab, p)
		if err != nil {
			return nil, fmt.Errorf("simulate: policy %s: %w", name, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// gangJob is one job in the queue or running: its pods so far and when
// each was placed.
type gangJob struct {
	job  Job
	pods []Placement
	at   []time.Duration
	end  time.Duration
	seq  int
	// partial: it held GPUs while incomplete.
	partial bool
}

func (g *gangJob) endSeq() (time.Duration, int) { return g.end, g.seq }

type gangHeap = endHeap[*gangJob]

type gangEngine struct {
	cfg  GangConfig
	fab  *fabric
	p    GangPolicy
	free []topology.Mask
	res  GangResult

	queue     []*gangJob
	run       gangHeap
	next, seq int
	decisions []time.Duration
	fitNV     map[int]int // pod GPUs -> pods one NVLink domain holds
	waitSum   time.Duration
	groupWait time.Duration
	// groupWaits are each group's wait; singleWait sums the single-pod
	// jobs' waits.
	groupWaits []time.Duration
	singleWait time.Duration
	bwSum      float64
	sliceBwSum float64
	heldGPUs   float64 // GPU-seconds
}

func runGang(cfg GangConfig, fab *fabric, p GangPolicy) (GangResult, error) {
	e := &gangEngine{cfg: cfg, fab: fab, p: p, free: make([]topology.Mask, len(cfg.Nodes)), fitNV: map[int]int{},
		res: GangResult{Policy: p.Name(), Jobs: len(cfg.Jobs), GroupGBpsWorst: -1}}
	for i, n := range cfg.Nodes {
		e.free[i] = n.Graph.All().Intersect(n.Graph.Healthy())
	}
	for _, j := range cfg.Jobs {
		if j.Group() {
			e.res.Groups++
			if j.Slices() > 0 {
				e.res.SlicedGroups++
			}
		}
	}
	for e.next < len(cfg.Jobs) || e.run.Len() > 0 || len(e.queue) > 0 {
		t := time.Duration(-1)
		if e.next < len(cfg.Jobs) {
			t = cfg.Jobs[e.next].Arrival
		}
		if e.run.Len() > 0 && (t < 0 || e.run[0].end < t) {
			t = e.run[0].end
		}
		for _, gj := range e.queue {
			if d := gj.job.Arrival + cfg.MaxWait; t < 0 || d < t {
				t = d
			}
		}
		if err := e.step(t); err != nil {
			return e.res, err
		}
	}
	e.finish()
	return e.res, nil
}

func (e *gangEngine) step(t time.Duration) error {
	for e.run.Len() > 0 && e.run[0].end <= t {
		gj := heap.Pop(&e.run).(*gangJob)
		if err := e.p.Release(gj.job, gj.pods); err != nil {
			return err
		}
		e.freePods(gj.pods)
	}
	for e.next < len(e.cfg.Jobs) && e.cfg.Jobs[e.next].Arrival <= t {
		e.queue = append(e.queue, &gangJob{job: e.cfg.Jobs[e.next]})
		e.next++
	}
	if c, ok := e.p.(clocked); ok {
		c.SetTime(t)
	}
	waiting := e.queue[:0]
	for _, gj := range e.queue {
		j := gj.job
		if t-j.Arrival > e.cfg.MaxWait {
			if err := e.drop(t, gj); err != nil {
				return err
			}
			continue
		}
		start := time.Now()
		pls, err := e.p.Place(j, slices.Clone(gj.pods), e.free)
		e.decisions = append(e.decisions, time.Since(start))
		if err != nil {
			return err
		}
		if len(gj.pods)+len(pls) > j.PodCount() {
			return fmt.Errorf("job %s: %d pods placed; it has %d", j.ID, len(gj.pods)+len(pls), j.PodCount())
		}
		for _, pl := range pls {
			if err := check(e.cfg.Nodes, e.free, j, pl); err != nil {
				return fmt.Errorf("job %s: %w", j.ID, err)
			}
			e.free[pl.Node] = e.free[pl.Node].Minus(pl.GPUs)
			gj.pods = append(gj.pods, pl)
			gj.at = append(gj.at, t)
		}
		switch {
		case len(gj.pods) == j.PodCount():
			e.start(t, gj)
		case t-j.Arrival >= e.cfg.MaxWait:
			if err := e.drop(t, gj); err != nil {
				return err
			}
		default:
			if len(gj.pods) > 0 {
				gj.partial = true
			}
			waiting = append(waiting, gj)
		}
	}
	e.queue = waiting
	return nil
}

func (e *gangEngine) freePods(pods []Placement) {
	for _, pl := range pods {
		e.free[pl.Node] = e.free[pl.Node].Union(pl.GPUs)
	}
}

// hold adds what gj's pods held while it was incomplete, until t.
func (e *gangEngine) hold(t time.Duration, gj *gangJob) {
	for i, pl := range gj.pods {
		e.heldGPUs += float64(pl.GPUs.Count()) * (t - gj.at[i]).Seconds()
	}
	if gj.partial {
		e.res.GroupsPartial++
	}
}

func (e *gangEngine) drop(t time.Duration, gj *gangJob) error {
	e.hold(t, gj)
	if err := e.p.Drop(gj.job, gj.pods); err != nil {
		return err
	}
	e.freePods(gj.pods)
	e.waited(gj.job, e.cfg.MaxWait)
	return nil
}

func (e *gangEngine) start(t time.Duration, gj *gangJob) {
	j := gj.job
	e.hold(t, gj)
	e.res.Accepted++
	e.waited(j, t-j.Arrival)
	if j.Group() {
		r := &e.res
		s := e.fab.shape(gj.pods)
		r.GroupsPlaced++
		fits, ok := e.fitNV[j.GPUs]
		if !ok {
			fits = e.fab.nvlinkPods(j.GPUs)
			e.fitNV[j.GPUs] = fits
		}
		fitsNV := j.PodCount() <= fits
		if fitsNV {
			r.GroupsFitNVLink++
		}
		if s.NVLink {
			r.GroupsNVLink++
		}
		if s.Leaf {
			r.GroupsLeaf++
		}
		if s.NVLink || !fitsNV && s.Leaf {
			r.GroupsOneDomain++
		}
		if j.Parallelism == v1alpha1.ParallelismModel && !s.PodsNVLink {
			r.ModelGroupsOffNVLink++
		}
		e.bwSum += s.GBps
		if r.GroupGBpsWorst < 0 || s.GBps < r.GroupGBpsWorst {
			r.GroupGBpsWorst = s.GBps
		}
		if j.Slices() > 0 {
			e.slices(j, gj.pods)
		}
		r.Placed = append(r.Placed, GangPlaced{Job: j, Start: t, Pods: slices.Clone(gj.pods), Shape: s})
	}
	e.seq++
	gj.end, gj.seq = t+j.Duration, e.seq
	heap.Push(&e.run, gj)
}

// waited counts job j's wait: from its arrival to its start, or MaxWait
// when it was given up.
func (e *gangEngine) waited(j Job, w time.Duration) {
	e.waitSum += w
	if j.Group() {
		e.groupWait += w
		e.groupWaits = append(e.groupWaits, w)
	} else {
		e.singleWait += w
	}
}

func (e *gangEngine) finish() {
	r := &e.res
	r.GroupWaitMax = slices.Max(append([]time.Duration{0}, e.groupWaits...))
	r.GroupWaitP95 = percentile(e.groupWaits, 95)
	r.SingleMeanWait = meanOf(e.singleWait, r.Jobs-r.Groups)
	if r.GroupsPlaced == 0 {
		r.GroupGBpsWorst = 0
	}
	r.GroupGBpsMean = meanOf(e.bwSum, r.GroupsPlaced)
	r.SliceGBpsMean = meanOf(e.sliceBwSum, r.SlicedPlaced)
	r.MeanWait = meanOf(e.waitSum, r.Jobs)
	r.GroupMeanWait = meanOf(e.groupWait, r.Groups)
	r.HeldGPUHours = e.heldGPUs / 3600
	r.Decisions, r.DecisionMean, r.DecisionP99 = decisionStats(e.decisions)
}

// slices measures the slices of sliced job j placed on pods (pod i in
// slice i / SliceSize): how many lie inside one domain of their level, and
// the slowest one's bandwidth.
func (e *gangEngine) slices(j Job, pods []Placement) {
	r := &e.res
	r.SlicedPlaced++
	lvl := e.fab.extLevelOf(j.SliceLevel) - 1 // its fabric level
	slowest := math.Inf(1)
	for i := range j.Slices() {
		part := pods[i*j.SliceSize : min((i+1)*j.SliceSize, len(pods))]
		r.Slices++
		seen := map[int]bool{}
		var idx []int
		for _, p := range part {
			if !seen[p.Node] {
				seen[p.Node] = true
				idx = append(idx, p.Node)
			}
		}
		if len(idx) == 1 || e.fab.sharedLevel(idx) <= lvl {
			r.SlicesOneDomain++
		}
		slowest = math.Min(slowest, e.fab.shape(part).GBps)
	}
	e.sliceBwSum += slowest
}
