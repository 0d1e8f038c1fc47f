package simulator

import (
	"bufio"
	"embed"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Job is one entry of a trace: a single pod asking for GPUs, or a group
// of Pods pods placed together (each asking GPUs), all or nothing.
type Job struct {
	// ID is unique within the trace.
	ID string
	// Arrival is when the job is submitted, from the start of the trace.
	Arrival time.Duration
	// Duration is how long it runs once placed.
	Duration time.Duration
	// GPUs is the number of GPUs, 1..64.
	GPUs int
	// Parallelism is the user's intent: model, data, or "" (none).
	Parallelism v1alpha1.Parallelism
	// Pods is how many pods the job runs, each asking GPUs; the job
	// starts when all are placed. 0 or 1 is a single-pod job. Only the
	// gang suite (RunGang) replays jobs of more than one pod.
	Pods int
	// Priority is the job's priority (PriorityTraceHeader; 0 without).
	// With Config.Preemption a job that fits nowhere evicts running jobs
	// of lower priority.
	Priority int32
	// Declared is what its pods declare they run at most
	// (spec.activeDeadlineSeconds; 0: nothing). Traces carry none; the
	// gang suite's --declared-durations sets it (DeclareDurations).
	Declared time.Duration
	// SliceSize cuts a group into slices of that many pods (pods i*size
	// to (i+1)*size-1 are slice i), each to be placed inside one domain
	// of fabric level SliceLevel, the whole group inside one domain of
	// GroupLevel ("": anywhere); 0: no slices. Only the sliced gang
	// generators set them.
	SliceSize              int
	SliceLevel, GroupLevel string
}

// Slices is how many slices the job is cut into (0: none).
func (j Job) Slices() int {
	if j.SliceSize < 1 || !j.Group() {
		return 0
	}
	return j.PodCount() / j.SliceSize
}

// How a trace's jobs declare their durations (DeclareDurations).
const (
	// DeclareNone: no job declares one, as in the traces.
	DeclareNone = "none"
	// DeclareExact: each job declares its duration.
	DeclareExact = "exact"
	// DeclareDouble: each job declares twice its duration.
	DeclareDouble = "double"
	// DeclareHours: each job declares its duration rounded up to whole
	// hours, as a time limit is often set.
	DeclareHours = "hours"
)

// DeclareDurations sets what each job declares it runs at most, by model
// (DeclareNone, DeclareExact, DeclareDouble, DeclareHours; "" is
// DeclareNone).
func DeclareDurations(jobs []Job, model string) error {
	for i := range jobs {
		d := jobs[i].Duration
		switch model {
		case "", DeclareNone:
			d = 0
		case DeclareExact:
		case DeclareDouble:
			d *= 2
		case DeclareHours:
			d = (d + time.Hour - 1) / time.Hour * time.Hour
		default:
			return fmt.Errorf("--declared-durations %q: want %s, %s, %s or %s", model, DeclareNone, DeclareExact, DeclareDouble, DeclareHours)
		}
		jobs[i].Declared = d
	}
	return nil
}

// PodCount is the job's number of pods (at least 1).
func (j Job) PodCount() int { return max(j.Pods, 1) }

// Group reports whether the job is a group: more than one pod.
func (j Job) Group() bool { return j.Pods > 1 }

// Model reports whether the job is model-parallel with more than one GPU,
// the jobs whose placement quality the NVLink share measures.
func (j Job) Model() bool { return j.Parallelism == v1alpha1.ParallelismModel && j.GPUs > 1 }

// TraceHeader is the first line of a trace file.
const TraceHeader = "id,arrival_s,duration_s,gpus,parallelism"

// GangTraceHeader is the first line of a trace file with multi-pod jobs:
// TraceHeader and the pods of each job.
const GangTraceHeader = TraceHeader + ",pods"

// SlicedTraceHeader is the first line of a trace file with sliced
// groups: GangTraceHeader and each job's slice size (0: no slices), its
// slices' level and its group's level (fabric level names; "" for none).
const SlicedTraceHeader = GangTraceHeader + ",slice_size,slice_level,group_level"

// PriorityTraceHeader is the first line of a trace file of single-pod
// jobs with priorities: TraceHeader and each job's priority (an integer,
// as a PriorityClass value; higher preempts lower).
const PriorityTraceHeader = TraceHeader + ",priority"

//go:embed traces/*.csv
var bundled embed.FS

// Trace is a loaded trace and the cluster it is meant for ("" when the
// source does not say).
type Trace struct {
	Name    string
	Cluster string
	Jobs    []Job
}

// LoadTrace resolves a trace source: a bundled trace ("bundled:mixed",
// "bundled:fragment"), a generator ("gen:mixed:seed=1:jobs=500", see
// Generate), or a CSV file path.
func LoadTrace(src string) (Trace, error) {
	switch {
	case strings.HasPrefix(src, "bundled:"):
		name := strings.TrimPrefix(src, "bundled:")
		cluster, ok := bundledClusters[name]
		if !ok {
			return Trace{}, fmt.Errorf("trace %q: unknown bundled trace; known: bundled:mixed, bundled:fragment", src)
		}
		f, err := bundled.Open("traces/" + name + ".csv")
		if err != nil {
			return Trace{}, fmt.Errorf("trace %q: %w", src, err)
		}
		defer f.Close()
		jobs, err := ParseTrace(f)
		if err != nil {
			return Trace{}, fmt.Errorf("trace %q: %w", src, err)
		}
		return Trace{Name: src, Cluster: cluster, Jobs: jobs}, nil
	case strings.HasPrefix(src, "gen:"):
		return Generate(src)
	}
	f, err := os.Open(src)
	if err != nil {
		return Trace{}, fmt.Errorf("trace: %w", err)
	}
	defer f.Close()
	jobs, err := ParseTrace(f)
	if err != nil {
		return Trace{}, fmt.Errorf("trace %s: %w", src, err)
	}
	return Trace{Name: src, Jobs: jobs}, nil
}

var bundledClusters = map[string]string{"mixed": ClusterMixed, "fragment": ClusterDGX1}

// ParseTrace reads the CSV trace format (RFC 4180, through encoding/csv):
// the header line TraceHeader (or GangTraceHeader, whose sixth field is
// the job's pods, 1..v1alpha1.MaxGroupSize), then one job per line; blank lines and lines
// starting with '#' are ignored. A field may be quoted, so a job ID may hold
// commas, quotes or line breaks. Times are seconds (decimals allowed);
// parallelism is model, data or none. Jobs are returned ordered by
// arrival, ties by file order.
func ParseTrace(r io.Reader) ([]Job, error) {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1 // counted here, for an error naming the line
	cr.TrimLeadingSpace = true
	var jobs []Job
	seen := map[string]int{}
	header, fields, priority, sliced := false, 5, false, false
	for {
		f, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read: %w", err)
		}
		line, _ := cr.FieldPos(0)
		if !header {
			switch got := strings.Join(trimAll(f), ","); got {
			case TraceHeader:
			case GangTraceHeader:
				fields = 6
			case SlicedTraceHeader:
				fields, sliced = 9, true
			case PriorityTraceHeader:
				fields, priority = 6, true
			default:
				return nil, fmt.Errorf("line %d: header is %q, want %q (or %q, %q or %q)", line, got, TraceHeader, GangTraceHeader, SlicedTraceHeader, PriorityTraceHeader)
			}
			header = true
			continue
		}
		if len(f) != fields {
			h := TraceHeader
			switch {
			case priority:
				h = PriorityTraceHeader
			case sliced:
				h = SlicedTraceHeader
			case fields == 6:
				h = GangTraceHeader
			}
			return nil, fmt.Errorf("line %d: %d fields, want %d (%s)", line, len(f), fields, h)
		}
		j := Job{ID: f[0]}
		if strings.TrimSpace(j.ID) == "" {
			return nil, fmt.Errorf("line %d: id: empty", line)
		}
		if prev, dup := seen[j.ID]; dup {
			return nil, fmt.Errorf("line %d: id %q already used on line %d", line, j.ID, prev)
		}
		seen[j.ID] = line
		if j.Arrival, err = seconds(f[1]); err != nil {
			return nil, fmt.Errorf("line %d: arrival_s: %w", line, err)
		}
		if j.Duration, err = seconds(f[2]); err != nil {
			return nil, fmt.Errorf("line %d: duration_s: %w", line, err)
		}
		if j.Duration == 0 {
			return nil, fmt.Errorf("line %d: duration_s: must be > 0", line)
		}
		if j.GPUs, err = strconv.Atoi(strings.TrimSpace(f[3])); err != nil || j.GPUs < 1 || j.GPUs > topology.MaxGPUs {
			return nil, fmt.Errorf("line %d: gpus: %q must be an integer 1..%d", line, f[3], topology.MaxGPUs)
		}
		switch p := strings.TrimSpace(f[4]); p {
		case "model", "data":
			j.Parallelism = v1alpha1.Parallelism(p)
		case "none", "":
		default:
			return nil, fmt.Errorf("line %d: parallelism: %q must be model, data or none", line, p)
		}
		if priority {
			v, err := strconv.ParseInt(strings.TrimSpace(f[5]), 10, 32)
			if err != nil || v < -2147483648 || v > 1000000000 {
				return nil, fmt.Errorf("line %d: priority: %q must be an integer up to 1000000000 (a PriorityClass value)", line, f[5])
			}
			j.Priority = int32(v)
		} else if fields >= 6 {
			if j.Pods, err = strconv.Atoi(strings.TrimSpace(f[5])); err != nil || j.Pods < 1 || j.Pods > v1alpha1.MaxGroupSize {
				return nil, fmt.Errorf("line %d: pods: %q must be an integer 1..%d", line, f[5], v1alpha1.MaxGroupSize)
			}
		}
		if sliced {
			if err := parseSlices(&j, f[6], f[7], f[8]); err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
		}
		jobs = append(jobs, j)
	}
	if !header {
		return nil, fmt.Errorf("empty trace: want the header %q and at least one job", TraceHeader)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("trace has no jobs")
	}
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].Arrival < jobs[b].Arrival })
	return jobs, nil
}

// parseSlices reads a sliced trace's slice columns into j: a slice size
// of 0 (no slices; the levels must then be empty) or one that cuts the
// job's pods into at least two slices, with a slice level; the group
// level may be empty (anywhere).
func parseSlices(j *Job, size, sliceLevel, groupLevel string) error {
	n, err := strconv.Atoi(strings.TrimSpace(size))
	if err != nil || n < 0 {
		return fmt.Errorf("slice_size: %q must be an integer, 0 for no slices", size)
	}
	sl, gl := strings.TrimSpace(sliceLevel), strings.TrimSpace(groupLevel)
	if n == 0 {
		if sl != "" {
			return fmt.Errorf("slice_level: %q is set but slice_size is 0; give the slice size or leave the level empty", sl)
		}
		j.GroupLevel = gl
		return nil
	}
	switch {
	case j.PodCount() < 2:
		return fmt.Errorf("slice_size: %d on a job of one pod; slices cut a group, so set pods to 2 or more or slice_size to 0", n)
	case n >= j.PodCount() || j.PodCount()%n != 0:
		return fmt.Errorf("slice_size: %d must divide the job's %d pods into 2 or more slices", n, j.PodCount())
	case sl == "":
		return fmt.Errorf("slice_level: empty with slice_size %d; name the level each slice must lie in (nvlink, leaf, ...)", n)
	}
	j.SliceSize, j.SliceLevel, j.GroupLevel = n, sl, gl
	return nil
}

func trimAll(f []string) []string {
	out := make([]string, len(f))
	for i, s := range f {
		out[i] = strings.TrimSpace(s)
	}
	return out
}

func seconds(s string) (time.Duration, error) {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) || v > 1e9 {
		return 0, fmt.Errorf("%q must be a number of seconds 0..1e9", s)
	}
	return time.Duration(v * float64(time.Second)), nil
}

// WriteTrace writes jobs in the format ParseTrace reads, with comment
// lines first (SlicedTraceHeader when a job has slices or a group level,
// else GangTraceHeader when a job has Pods set, else TraceHeader); encoding/csv quotes what needs quoting. An ID that could
// not be read back is an error naming the job: an empty one, or one that
// starts with '#' (the line would read as a comment).
func WriteTrace(w io.Writer, comments []string, jobs []Job) error {
	bw := bufio.NewWriter(w)
	for _, c := range comments {
		for _, l := range strings.Split(c, "\n") {
			fmt.Fprintf(bw, "# %s\n", strings.TrimRight(l, "\r"))
		}
	}
	cw := csv.NewWriter(bw)
	header := TraceHeader
	for _, j := range jobs {
		if j.Pods != 0 {
			header = GangTraceHeader
			break
		}
		if j.Priority != 0 {
			header = PriorityTraceHeader
		}
	}
	if header == GangTraceHeader && slices.ContainsFunc(jobs, func(j Job) bool { return j.SliceSize > 0 || j.GroupLevel != "" }) {
		header = SlicedTraceHeader
	}
	if header != TraceHeader && header != PriorityTraceHeader && slices.ContainsFunc(jobs, func(j Job) bool { return j.Priority != 0 }) {
		return fmt.Errorf("write trace: a trace has either pods or priorities (%s or %s), not both", GangTraceHeader, PriorityTraceHeader)
	}
	if err := cw.Write(strings.Split(header, ",")); err != nil {
		return fmt.Errorf("write trace: %w", err)
	}
	for i, j := range jobs {
		switch {
		case strings.TrimSpace(j.ID) == "":
			return fmt.Errorf("write trace: job %d: id: empty; give every job an ID", i)
		case strings.HasPrefix(j.ID, "#"):
			return fmt.Errorf("write trace: job %d: id %q starts with '#', which reads as a comment line; rename the job", i, j.ID)
		}
		p := string(j.Parallelism)
		if p == "" {
			p = "none"
		}
		rec := []string{j.ID, strconv.FormatFloat(j.Arrival.Seconds(), 'f', -1, 64),
			strconv.FormatFloat(j.Duration.Seconds(), 'f', -1, 64), strconv.Itoa(j.GPUs), p}
		switch header {
		case GangTraceHeader:
			rec = append(rec, strconv.Itoa(j.PodCount()))
		case SlicedTraceHeader:
			rec = append(rec, strconv.Itoa(j.PodCount()), strconv.Itoa(j.SliceSize), j.SliceLevel, j.GroupLevel)
		case PriorityTraceHeader:
			rec = append(rec, strconv.Itoa(int(j.Priority)))
		}
		if err := cw.Write(rec); err != nil {
			return fmt.Errorf("write trace: job %q: %w", j.ID, err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write trace: %w", err)
	}
	return bw.Flush()
}

// Generate builds a synthetic trace from a spec
// "gen:<kind>[:seed=N][:jobs=N][:load=F]":
//
//   - mixed: sizes 1/2/4/8 GPUs with weights 40/30/20/10, 60% data- and
//     40% model-parallel, Poisson arrivals, exponential durations (mean 1
//     h, clipped to 1 min..8 h); meant for ClusterMixed.
//
//   - priority: jobs with priorities (PriorityTraceHeader) for preemption
//     (Config.Preemption): 70% low-priority data-parallel, 30%
//     high-priority, mostly model-parallel (generatePriority); meant for
//     ClusterMixed.
//
//   - fragment: on ClusterDGX1, two 1-GPU data-parallel jobs of random
//     length (mean 2 h) for every 4-GPU model-parallel job (mean 1 h): the
//     pattern that leaves no NVLink quad free under count-only placement.
//
//   - gang-nvl72, gang-hgx, gang-fleet: half the jobs are groups (Pods 2,
//     4, 8 or 16 with weights 3/3/2/1, every pod asking 4 or 8 GPUs, 8
//     only where the cluster has 8-GPU machines), half single-pod jobs of
//     1/2/4/8 GPUs (weights 2/1/2/1, 8 only where it fits); half of each
//     model-, half data-parallel; durations exponential (mean 1 h,
//     clipped to 5 min..8 h); meant for ClusterNVL72, ClusterHGXFabric
//     and ClusterGangFleet, the gang suite's mixes (GangSuite).
//
// load (default 0.9) is the offered GPU load on the intended cluster;
// seed (default 1) makes the trace reproducible; jobs defaults to 500.
func Generate(spec string) (Trace, error) {
	parts := strings.Split(spec, ":")
	if len(parts) < 2 || parts[0] != "gen" {
		return Trace{}, fmt.Errorf("generator %q: want gen:<mixed|fragment|priority|gang-nvl72|gang-hgx|gang-fleet>[:seed=N][:jobs=N][:load=F]", spec)
	}
	kind := parts[1]
	seed, n, load := uint64(1), 500, 0.9
	for _, kv := range parts[2:] {
		k, v, ok := strings.Cut(kv, "=")
		var err error
		switch {
		case !ok:
			err = fmt.Errorf("want key=value")
		case k == "seed":
			seed, err = strconv.ParseUint(v, 10, 64)
		case k == "jobs":
			n, err = strconv.Atoi(v)
			if err == nil && (n < 1 || n > 1000000) {
				err = fmt.Errorf("must be 1..1000000")
			}
		case k == "load":
			load, err = strconv.ParseFloat(v, 64)
			if err == nil && (load <= 0 || load > 10) {
				err = fmt.Errorf("must be in (0, 10]")
			}
		default:
			err = fmt.Errorf("unknown key; known: seed, jobs, load")
		}
		if err != nil {
			return Trace{}, fmt.Errorf("generator %q: parameter %q: %v", spec, kv, err)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x67707574))
	expo := expoDraw(rng)
	var jobs []Job
	var cluster string
	var t float64
	switch kind {
	case "mixed":
		cluster = ClusterMixed
		const gpus, meanSize, meanDur = 128.0, 0.4*1 + 0.3*2 + 0.2*4 + 0.1*8, 3600.0
		gap := meanSize * meanDur / (load * gpus)
		for i := range n {
			t += rng.ExpFloat64() * gap
			size := []int{1, 1, 1, 1, 2, 2, 2, 4, 4, 8}[rng.IntN(10)]
			par := v1alpha1.ParallelismData
			if rng.Float64() < 0.4 {
				par = v1alpha1.ParallelismModel
			}
			jobs = append(jobs, Job{ID: fmt.Sprintf("m%04d", i), Arrival: time.Duration(math.Round(t)) * time.Second,
				Duration: expo(meanDur, 60, 8*3600), GPUs: size, Parallelism: par})
		}
	case "fragment":
		cluster = ClusterDGX1
		// Per cycle: two 1-GPU jobs (2 h mean) and one 4-GPU job (1 h).
		const gpus, cycleGPUSeconds = 32.0, 2*7200.0 + 4*3600.0
		gap := cycleGPUSeconds / 3 / (load * gpus)
		for i := range n {
			t += rng.ExpFloat64() * gap
			j := Job{ID: fmt.Sprintf("f%04d", i), Arrival: time.Duration(math.Round(t)) * time.Second}
			if i%3 == 2 {
				j.GPUs, j.Parallelism, j.Duration = 4, v1alpha1.ParallelismModel, expo(3600, 60, 8*3600)
			} else {
				j.GPUs, j.Parallelism, j.Duration = 1, v1alpha1.ParallelismData, expo(7200, 60, 16*3600)
			}
			jobs = append(jobs, j)
		}
	case "priority":
		cluster = ClusterMixed
		jobs = generatePriority(rng, n, load, expo)
	case "gang-nvl72", "gang-hgx", "gang-fleet":
		cluster = map[string]string{"gang-nvl72": ClusterNVL72, "gang-hgx": ClusterHGXFabric, "gang-fleet": ClusterGangFleet}[kind]
		nodes, err := ParseCluster(cluster)
		if err != nil {
			return Trace{}, fmt.Errorf("generator %q: cluster: %w", spec, err)
		}
		jobs = generateGang(rng, nodes, n, load, expo)
	case "sliced-nvl72", "sliced-hgx":
		cluster = map[string]string{"sliced-nvl72": ClusterNVL72, "sliced-hgx": ClusterHGXFabric}[kind]
		nodes, err := ParseCluster(cluster)
		if err != nil {
			return Trace{}, fmt.Errorf("generator %q: cluster: %w", spec, err)
		}
		jobs = generateSliced(rng, nodes, n, load, expo, kind == "sliced-nvl72")
	default:
		return Trace{}, fmt.Errorf("generator %q: unknown kind %q; known: mixed, fragment, priority, gang-nvl72, gang-hgx, gang-fleet, sliced-nvl72, sliced-hgx", spec, kind)
	}
	return Trace{Name: spec, Cluster: cluster, Jobs: jobs}, nil
}

// PriorityHigh is the priority of the priority generator's
// high-priority jobs; the others have 0.
const PriorityHigh = 1000

// generatePriority draws the priority generator's jobs on ClusterMixed (see
// Generate): 70% low-priority (0) data-parallel jobs of 1, 1, 2 or 4 GPUs
// (3 h mean), 30% high-priority (PriorityHigh) jobs, model-parallel of 2,
// 4, 4 or 8 GPUs or data-parallel of 2 (1 h mean); durations exponential,
// clipped to 5 min..12 h.
func generatePriority(rng *rand.Rand, n int, load float64, expo func(mean, lo, hi float64) time.Duration) []Job {
	const gpus, lowDur, highDur = 128.0, 10800.0, 3600.0
	const gpuSeconds = 0.7*2*lowDur + 0.3*4*highDur // per job, on average
	gap := gpuSeconds / (load * gpus)
	var jobs []Job
	var t float64
	for i := range n {
		t += rng.ExpFloat64() * gap
		j := Job{ID: fmt.Sprintf("p%04d", i), Arrival: time.Duration(math.Round(t)) * time.Second}
		if rng.Float64() < 0.7 {
			j.GPUs, j.Parallelism, j.Duration = []int{1, 1, 2, 4}[rng.IntN(4)], v1alpha1.ParallelismData, expo(lowDur, 300, 12*3600)
		} else {
			j.Priority, j.Duration = PriorityHigh, expo(highDur, 300, 12*3600)
			j.GPUs, j.Parallelism = []int{2, 4, 4, 8, 2}[rng.IntN(5)], v1alpha1.ParallelismModel
			if j.GPUs == 2 && rng.IntN(2) == 0 {
				j.Parallelism = v1alpha1.ParallelismData
			}
		}
		jobs = append(jobs, j)
	}
	return jobs
}

// generateGang draws the gang generators' jobs for nodes (see Generate).
func generateGang(rng *rand.Rand, nodes []Node, n int, load float64, expo func(mean, lo, hi float64) time.Duration) []Job {
	gpus, widest := 0, 0
	for _, nd := range nodes {
		gpus += nd.Graph.Len()
		widest = max(widest, nd.Graph.Len())
	}
	podGPUs := []int{4, 8}
	single := []int{1, 1, 2, 4, 4, 8}
	if widest < 8 {
		podGPUs, single = []int{4}, []int{1, 1, 2, 4, 4}
	}
	groupPods := []int{2, 2, 2, 4, 4, 4, 8, 8, 16}
	mean := func(v []int) float64 {
		s := 0
		for _, x := range v {
			s += x
		}
		return float64(s) / float64(len(v))
	}
	const meanDur = 3600.0
	meanGPUs := 0.5*mean(single) + 0.5*mean(groupPods)*mean(podGPUs)
	gap := meanGPUs * meanDur / (load * float64(gpus))
	var jobs []Job
	var t float64
	for i := range n {
		t += rng.ExpFloat64() * gap
		j := Job{ID: fmt.Sprintf("g%04d", i), Arrival: time.Duration(math.Round(t)) * time.Second, Pods: 1,
			Parallelism: v1alpha1.ParallelismData}
		if rng.IntN(2) == 0 {
			j.Parallelism = v1alpha1.ParallelismModel
		}
		if rng.IntN(2) == 0 {
			j.Pods, j.GPUs = groupPods[rng.IntN(len(groupPods))], podGPUs[rng.IntN(len(podGPUs))]
		} else {
			j.GPUs = single[rng.IntN(len(single))]
		}
		j.Duration = expo(meanDur, 300, 8*3600)
		jobs = append(jobs, j)
	}
	return jobs
}

// generateSliced draws the sliced generators' jobs for nodes (see
// Generate): half single pods as generateGang's, half model-parallel
// groups cut into 2 to 4 slices required inside one spine. On GB200 NVL72
// (nvl72) each slice is 4, 8 or 16 trays × 4 GPUs inside one rack's NVLink
// domain; on HGX leaves each slice is 2, 4 or 8 servers × 8 GPUs inside
// one leaf, at most 16 servers (a spine) in all.
func generateSliced(rng *rand.Rand, nodes []Node, n int, load float64, expo func(mean, lo, hi float64) time.Duration, nvl72 bool) []Job {
	sh := slicedShape{podGPUs: 8, level: "leaf", groupLevel: "spine", sizes: []int{2, 4, 4, 8}, single: []int{1, 1, 2, 4, 4, 8}, mostPods: 16}
	if nvl72 {
		sh = slicedShape{podGPUs: 4, level: "nvlink", groupLevel: "spine", sizes: []int{4, 8, 8, 16}, single: []int{1, 1, 2, 4, 4}}
	}
	return slicedJobs(rng, clusterGPUs(nodes), n, load, expo, sh)
}

// slicedShape is what a sliced workload draws: pods of podGPUs GPUs, each
// slice required inside one domain at level, the group inside one domain
// at groupLevel ("": anywhere); slice sizes (in pods) and single-pod
// sizes drawn uniformly from their lists (repeats weigh); 2 to 4 slices a
// group, at most mostPods pods (0: no bound).
type slicedShape struct {
	podGPUs           int
	level, groupLevel string
	sizes, single     []int
	mostPods          int
}

// slicesOf draws how many slices a group of slices of size has.
func (sh slicedShape) slicesOf(r *rand.Rand, size int) int {
	most := 4
	if sh.mostPods > 0 {
		most = max(2, min(4, sh.mostPods/size))
	}
	return 2 + r.IntN(most-1)
}

// slicedJobs draws n jobs of shape sh at the offered load on gpus GPUs:
// half single data-parallel pods, half model-parallel sliced groups,
// Poisson arrivals, durations exponential (mean 1 h, 5 min..8 h).
func slicedJobs(rng *rand.Rand, gpus, n int, load float64, expo func(mean, lo, hi float64) time.Duration, sh slicedShape) []Job {
	const meanDur = 3600.0
	// The groups' mean GPUs, by drawing apart from the trace's draws.
	var sum float64
	probe := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		size := sh.sizes[probe.IntN(len(sh.sizes))]
		sum += float64(size * sh.slicesOf(probe, size) * sh.podGPUs)
	}
	meanSingle := 0.0
	for _, x := range sh.single {
		meanSingle += float64(x) / float64(len(sh.single))
	}
	meanGPUs := 0.5*meanSingle + 0.5*sum/1000
	gap := meanGPUs * meanDur / (load * float64(gpus))
	var jobs []Job
	var t float64
	for i := range n {
		t += rng.ExpFloat64() * gap
		j := Job{ID: fmt.Sprintf("s%04d", i), Arrival: time.Duration(math.Round(t)) * time.Second, Pods: 1,
			Parallelism: v1alpha1.ParallelismData}
		if rng.IntN(2) == 0 {
			size := sh.sizes[rng.IntN(len(sh.sizes))]
			j.Pods, j.GPUs, j.Parallelism = size*sh.slicesOf(rng, size), sh.podGPUs, v1alpha1.ParallelismModel
			j.SliceSize, j.SliceLevel, j.GroupLevel = size, sh.level, sh.groupLevel
		} else {
			j.GPUs = sh.single[rng.IntN(len(sh.single))]
		}
		j.Duration = expo(meanDur, 300, 8*3600)
		jobs = append(jobs, j)
	}
	return jobs
}

// clusterGPUs is the GPUs of nodes.
func clusterGPUs(nodes []Node) int {
	gpus := 0
	for _, nd := range nodes {
		gpus += nd.Graph.Len()
	}
	return gpus
}
