// The generalisation benchmark's families: their cases, drawn from seeds
// (FamilyCases, Replicate), and the run that replays them through the
// policies (RunFamily). familyverdict.go judges a run and prints its report.

package simulator

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// The generalisation benchmark's families (docs/benchmarks.md): random
// cluster mixes and workloads drawn from a seed each. Weights and defaults
// may be tuned on the tuning family; the test family is only ever
// measured. Seeds of a family of n cases are its first seed .. +n-1.
const (
	FamilyTune = "tune"
	FamilyTest = "test"
	// FamilyTuneSeed and FamilyTestSeed are the families' first seeds.
	FamilyTuneSeed = 1000
	FamilyTestSeed = 5000
	// FamilySize is the cases a family run draws unless told otherwise.
	FamilySize = 100
	// FamilySingleJobs and FamilyGangJobs are the jobs of a case's
	// single-pod and group traces.
	FamilySingleJobs = 300
	FamilyGangJobs   = 200
	FamilySlicedJobs = 200
	// FamilyReplicas is how many times a family run replays each case
	// unless told otherwise: its drawn traces, then copies of them whose
	// arrivals are each moved later by up to FamilyJitter (Replicate).
	FamilyReplicas = 3
	// FamilyJitter bounds how far a replica moves an arrival.
	FamilyJitter = time.Minute
)

// FamilyCase is one case of a family: a cluster mix, a load, and two
// traces drawn for them.
type FamilyCase struct {
	Seed uint64
	// Cluster is the ParseCluster spec of the mix, Mix the same with
	// machine names for machine files; Fabric says whether its nodes
	// carry leaf and spine labels.
	Cluster, Mix string
	Fabric       bool
	Nodes        []Node
	GPUs         int
	Load         float64
	// Single are single-pod jobs; Gang half groups, half single pods
	// (generateGang); Sliced half groups of slices, half single pods
	// (drawSliced), with no jobs on a mix without a level to slice at.
	Single, Gang, Sliced Trace
	// Replica is 0 for the drawn traces and r > 0 for their r-th copy
	// with arrivals moved (Replicate).
	Replica int
}

// Replicate returns every case k times, in case order: the case as drawn,
// then k-1 copies whose jobs each arrive later by a whole number of
// seconds below FamilyJitter, drawn from the case's seed and the copy's
// number. A copy is the same workload on the same cluster, so what
// differs between a case's replicas is what a policy's outcome owes to
// the exact moments jobs arrive, not to the policy.
func Replicate(cases []FamilyCase, k int) ([]FamilyCase, error) {
	if k < 1 || k > 10 {
		return nil, fmt.Errorf("--family-replicas %d: must be 1..10", k)
	}
	out := make([]FamilyCase, 0, k*len(cases))
	for _, c := range cases {
		for r := range k {
			rc := c
			rc.Replica = r
			if r > 0 {
				rng := rand.New(rand.NewPCG(c.Seed, uint64(r)))
				rc.Single.Jobs, rc.Gang.Jobs = jitterArrivals(rng, c.Single.Jobs), jitterArrivals(rng, c.Gang.Jobs)
				if len(c.Sliced.Jobs) > 0 {
					rc.Sliced.Jobs = jitterArrivals(rng, c.Sliced.Jobs)
				}
			}
			out = append(out, rc)
		}
	}
	return out, nil
}

// jitterArrivals copies jobs with each arrival moved later by up to
// FamilyJitter, in arrival order.
func jitterArrivals(rng *rand.Rand, jobs []Job) []Job {
	out := slices.Clone(jobs)
	for i := range out {
		out[i].Arrival += time.Duration(rng.IntN(int(FamilyJitter/time.Second))) * time.Second
	}
	slices.SortStableFunc(out, func(a, b Job) int { return cmp.Compare(a.Arrival, b.Arrival) })
	return out
}

// FamilySeeds resolves a family name to its first seed.
func FamilySeeds(family string) (uint64, error) {
	switch family {
	case FamilyTune:
		return FamilyTuneSeed, nil
	case FamilyTest:
		return FamilyTestSeed, nil
	}
	return 0, fmt.Errorf("--family %q: want %s (seeds from %d, for tuning) or %s (seeds from %d, never tuned on)", family, FamilyTune, FamilyTuneSeed, FamilyTest, FamilyTestSeed)
}

// FamilyCases draws n cases of the family. The machines are every
// built-in fixture and each of machineFiles (machine files imported from
// real servers; one named like a fixture stands in for it).
func FamilyCases(family string, n int, machineFiles []string) ([]FamilyCase, error) {
	first, err := FamilySeeds(family)
	if err != nil {
		return nil, err
	}
	if n < 1 || n > 1000 {
		return nil, fmt.Errorf("--family-size %d: must be 1..1000", n)
	}
	pool, err := familyMachines(machineFiles)
	if err != nil {
		return nil, err
	}
	out := make([]FamilyCase, 0, n)
	for i := range n {
		c, err := drawCase(first+uint64(i), pool)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// familyMachine is a machine the family draws from: its source (fixture
// name or file) and size.
type familyMachine struct {
	source, name string
	gpus         int
	// tray: a multi-node NVLink domain's compute tray, drawn as whole
	// racks of rackTrays.
	tray bool
}

const rackTrays = 18

func familyMachines(files []string) ([]familyMachine, error) {
	var pool []familyMachine
	for _, f := range machine.Fixtures() {
		pool = append(pool, familyMachine{source: f.Name, name: f.Name, gpus: f.GPUs, tray: f.FabricClique != ""})
	}
	for _, path := range files {
		f, err := machine.Load(path)
		if err != nil {
			return nil, fmt.Errorf("family machine %s: %w", path, err)
		}
		m := familyMachine{source: path, name: f.Name, gpus: f.GPUs}
		if i := slices.IndexFunc(pool, func(p familyMachine) bool { return p.name == f.Name }); i >= 0 {
			pool[i] = m
			continue
		}
		pool = append(pool, m)
	}
	return pool, nil
}

// drawCase draws one case from seed: 2 to 4 machine kinds, 8 to 64 nodes
// (racks of GB200 trays count 18 nodes each), leaf switches of 4 or 8
// nodes (a rack's 18 trays) under spines of 2 leaves on half the cases,
// a load of 0.6 to 1.3, and the two traces.
func drawCase(seed uint64, pool []familyMachine) (FamilyCase, error) {
	rng := rand.New(rand.NewPCG(seed, 0x66616d696c79))
	c := FamilyCase{Seed: seed, Fabric: rng.IntN(2) == 0}
	total := 8 + rng.IntN(57)
	kinds := 2 + rng.IntN(3)
	order := rng.Perm(len(pool))
	var entries, mix []string
	left := total
	for _, pi := range order {
		if len(entries) == kinds || left <= 0 {
			break
		}
		m := pool[pi]
		var count int
		switch {
		case m.tray && left < rackTrays:
			continue
		case m.tray:
			count = rackTrays * (1 + rng.IntN(left/rackTrays))
		case len(entries) == kinds-1:
			count = left
		default:
			count = 1 + rng.IntN(max(1, left-(kinds-1-len(entries))))
		}
		left -= count
		attrs := ""
		if m.tray {
			attrs += fmt.Sprintf("/rack=%d", rackTrays)
		}
		if c.Fabric {
			leaf := []int{4, 8}[rng.IntN(2)]
			if m.tray {
				leaf = rackTrays
			}
			attrs += fmt.Sprintf("/leaf=%d", leaf)
		}
		entries = append(entries, fmt.Sprintf("%s=%d%s", m.source, count, attrs))
		mix = append(mix, fmt.Sprintf("%s=%d%s", m.name, count, attrs))
	}
	c.Cluster, c.Mix = strings.Join(entries, ","), strings.Join(mix, ",")
	if c.Fabric {
		c.Cluster += ";spine=2"
		c.Mix += ";spine=2"
	}
	nodes, err := ParseCluster(c.Cluster)
	if err != nil {
		return FamilyCase{}, fmt.Errorf("family seed %d: %w", seed, err)
	}
	c.Nodes = nodes
	widest := 0
	for _, n := range nodes {
		c.GPUs += n.Graph.Len()
		widest = max(widest, n.Graph.Len())
	}
	c.Load = math.Round((0.6+0.7*rng.Float64())*20) / 20
	expo := expoDraw(rng)
	c.Single = Trace{Name: fmt.Sprintf("family:%d:single", seed), Cluster: c.Cluster, Jobs: drawSingle(rng, c.GPUs, widest, c.Load, expo)}
	c.Gang = Trace{Name: fmt.Sprintf("family:%d:gang", seed), Cluster: c.Cluster, Jobs: generateGang(rng, nodes, FamilyGangJobs, c.Load, expo)}
	// The sliced trace draws from a source of its own, so that the
	// single-pod and group traces are what they were before it existed.
	srng := rand.New(rand.NewPCG(seed, 0x736c69636564))
	if jobs := drawSliced(srng, nodes, FamilySlicedJobs, c.Load, expoDraw(srng)); len(jobs) > 0 {
		c.Sliced = Trace{Name: fmt.Sprintf("family:%d:sliced", seed), Cluster: c.Cluster, Jobs: jobs}
	}
	return c, nil
}

// drawSliced draws a sliced workload for nodes (slicedJobs): slices inside
// one multi-node NVLink domain where the mix has GB200 racks, else inside
// one leaf where its nodes carry leaf labels; the group inside one spine
// where there are spines. Pods are model-parallel, so each takes an
// NVLink-connected set: pods of 8, 4 or 2 GPUs, whichever size the
// level's nodes give the most GPUs in such sets; slices of 2 to 8 pods (4
// to 16 trays on racks) as far as the roomiest domain holds them. Nil for
// a mix with neither level, or whose domains hold no slice of two.
func drawSliced(rng *rand.Rand, nodes []Node, n int, load float64, expo func(mean, lo, hi float64) time.Duration) []Job {
	sh := slicedShape{level: "nvlink", sizes: []int{4, 8, 8, 16}}
	key := LabelClique
	if !slices.ContainsFunc(nodes, func(nd Node) bool { return nd.Labels[LabelClique] != "" }) {
		sh = slicedShape{level: "leaf", sizes: []int{2, 4, 4, 8}}
		key = LabelLeaf
	}
	island := make([]int, len(nodes))
	for i, nd := range nodes {
		all := nd.Graph.All().Intersect(nd.Graph.Healthy())
		island[i] = nd.Graph.Metrics(topology.Mask{}, all).LeftLargestIsland
	}
	// pods is how many pods of g GPUs the roomiest domain by label holds
	// ("": the cluster), each on an NVLink-connected set, and in all.
	pods := func(g int, label string) (most, all int) {
		in := map[string]int{}
		for i, nd := range nodes {
			d := nd.Labels[label]
			if label != "" && (d == "" || nd.Labels[key] == "") {
				continue
			}
			in[d] += island[i] / g
			all += island[i] / g
			most = max(most, in[d])
		}
		return most, all
	}
	// The group's level: the spine where there are spines, else the
	// cluster.
	groupLabel := ""
	if slices.ContainsFunc(nodes, func(nd Node) bool { return nd.Labels[LabelSpine] != "" }) {
		sh.groupLevel, groupLabel = "spine", LabelSpine
	}
	// Of the pod sizes that give a group of two slices of two pods a
	// place, the one with the most GPUs on NVLink-connected sets.
	perDomain, gpus := 0, 0
	for _, g := range []int{8, 4, 2} {
		most, all := pods(g, key)
		inGroup, _ := pods(g, groupLabel)
		if most >= 2 && inGroup >= 4 && all*g > gpus {
			sh.podGPUs, perDomain, sh.mostPods, gpus = g, most, inGroup, all*g
		}
	}
	if sh.podGPUs == 0 {
		return nil
	}
	sh.sizes = slices.DeleteFunc(sh.sizes, func(s int) bool { return s > perDomain || 2*s > sh.mostPods })
	if len(sh.sizes) == 0 {
		sh.sizes = []int{min(perDomain, sh.mostPods/2)}
	}
	for _, x := range []int{1, 1, 2, 4, 4, 8} {
		if x <= sh.podGPUs {
			sh.single = append(sh.single, x)
		}
	}
	return slicedJobs(rng, clusterGPUs(nodes), n, load, expo, sh)
}

// expoDraw returns a draw of exponential durations from rng with the given
// mean, clipped to lo..hi seconds.
func expoDraw(rng *rand.Rand) func(mean, lo, hi float64) time.Duration {
	return func(mean, lo, hi float64) time.Duration {
		v := min(max(rng.ExpFloat64()*mean, lo), hi)
		return time.Duration(math.Round(v)) * time.Second
	}
}

// drawSingle draws a single-pod workload for a cluster of gpus GPUs whose
// largest node has widest: sizes 1, 2, 4 and 8 (as far as the widest node
// holds them) with random weights 1 to 4, a model-parallel share of 20 to
// 70%, Poisson arrivals at the offered load, durations exponential (mean
// 1 h, clipped to 1 min..8 h).
func drawSingle(rng *rand.Rand, gpus, widest int, load float64, expo func(mean, lo, hi float64) time.Duration) []Job {
	var sizes []int
	for _, s := range []int{1, 2, 4, 8, 16} {
		if s <= widest {
			for range 1 + rng.IntN(4) {
				sizes = append(sizes, s)
			}
		}
	}
	model := 0.2 + 0.5*rng.Float64()
	const meanDur = 3600.0
	meanSize := 0.0
	for _, s := range sizes {
		meanSize += float64(s)
	}
	meanSize /= float64(len(sizes))
	gap := meanSize * meanDur / (load * float64(gpus))
	jobs := make([]Job, 0, FamilySingleJobs)
	var t float64
	for i := range FamilySingleJobs {
		t += rng.ExpFloat64() * gap
		j := Job{ID: fmt.Sprintf("s%04d", i), Arrival: time.Duration(math.Round(t)) * time.Second,
			Duration: expo(meanDur, 60, 8*3600), GPUs: sizes[rng.IntN(len(sizes))], Parallelism: v1alpha1.ParallelismData}
		if rng.Float64() < model {
			j.Parallelism = v1alpha1.ParallelismModel
		}
		jobs = append(jobs, j)
	}
	return jobs
}

// FamilyPolicies are the single-pod policies a family compares.
var FamilyPolicies = []string{PolicyGputopo, PolicyOptimum, PolicyFirstFit, PolicyPairSum, PolicyPartition}

// GangColumns are the measures of a group trace the family summarises.
var GangColumns = []ColumnOf[GangResult]{
	{Name: "groups placed", Value: GangResult.GroupsPlacedShare, Higher: true, Format: pct},
	{Name: "keeping the intent", Value: GangResult.IntentKeptShare, Higher: true, Format: pct},
	{Name: "in one domain", Value: GangResult.OneDomainShare, Higher: true, Format: pct},
	{Name: "group GB/s", Value: func(r GangResult) float64 { return r.GroupGBpsMean }, Higher: true, Format: gbps},
	{Name: "group wait", Value: func(r GangResult) float64 { return float64(r.GroupMeanWait) }, Higher: false, Format: wait},
	{Name: "group wait p95", Value: func(r GangResult) float64 { return float64(r.GroupWaitP95) }, Higher: false, Format: wait},
	{Name: "single-pod wait", Value: func(r GangResult) float64 { return float64(r.SingleMeanWait) }, Higher: false, Format: wait},
	{Name: "job wait", Value: func(r GangResult) float64 { return float64(r.MeanWait) }, Higher: false, Format: wait},
	{Name: "GPU-h held incomplete", Value: func(r GangResult) float64 { return r.HeldGPUHours }, Higher: false, Format: func(v float64) string { return fmt.Sprintf("%.1f", v) }},
}

// FamilyRun is a family's outcome: per case the single-pod policies'
// results (FamilyPolicies order) and the group trace's row.
type FamilyRun struct {
	Family string
	Cases  []FamilyCase
	Single [][]Result
	Gang   []GangRow
	// Sliced is each case's sliced trace's row; Results is nil where the
	// case has none.
	Sliced []GangRow
}

// RunFamily replays every case's two traces through the policies, with
// ext (nil: defaults) and the default policy table; cases run in parallel,
// one per CPU.
func RunFamily(family string, cases []FamilyCase, ext *configv1alpha1.ExtenderConfiguration) (FamilyRun, error) {
	run := FamilyRun{Family: family, Cases: cases, Single: make([][]Result, len(cases)), Gang: make([]GangRow, len(cases)), Sliced: make([]GangRow, len(cases))}
	table := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for i, c := range cases {
		g.Go(func() error {
			rs, err := Run(Config{Nodes: c.Nodes, Jobs: c.Single.Jobs, MaxWait: DefaultMaxWait, Extender: ext, PolicyTable: &table, Policies: FamilyPolicies})
			if err != nil {
				return fmt.Errorf("%s on %s: %w", c.Single.Name, c.Cluster, err)
			}
			run.Single[i] = rs
			row, err := runGangCase(GangCase{Trace: c.Gang.Name, Cluster: c.Cluster, Mix: fmt.Sprintf("seed %d", c.Seed)}, c.Gang.Jobs, c.Nodes, ext)
			if err != nil {
				return err
			}
			run.Gang[i] = row
			if len(c.Sliced.Jobs) == 0 {
				return nil
			}
			row, err = runGangCase(GangCase{Trace: c.Sliced.Name, Cluster: c.Cluster, Mix: fmt.Sprintf("seed %d", c.Seed)}, c.Sliced.Jobs, c.Nodes, ext)
			if err != nil {
				return err
			}
			run.Sliced[i] = row
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return FamilyRun{}, err
	}
	return run, nil
}
