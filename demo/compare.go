package demo

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/internal/picture"
	"github.com/gputopo/gputopo/topology"
)

// The two schedulers the demo compares, as the report names them.
const (
	SchedulerGPUTopo = "gputopo"
	SchedulerPlain   = "plain"
)

// JobRow is one workload as both schedulers placed it.
type JobRow struct {
	Workload       Workload
	GPUTopo, Plain JobPlacement
}

// JobPlacement is where one scheduler put a job's pods, and the pace that
// gives the job.
type JobPlacement struct {
	// Pods are the job's pods in bind order, those preempted later too.
	Pods []Placed
	// Preempted counts the pods of other jobs evicted for this one.
	Preempted int
	// Evicted counts this job's pods preempted by a later job.
	Evicted int
	// Together is the tightest level every pod shares: "node", a fabric
	// level's name (configv1alpha1.DefaultFabricLevels, read from the
	// nodes' labels as the decision core reads them) or "cluster".
	Together string
	// PaceGBps is the bandwidth that sets the job's pace: the slowest of
	// its multi-GPU pods' rings inside their nodes and, when its pods are
	// on several nodes, the bandwidth per GPU of the fabric level they
	// share. 0 when the job's GPUs do not talk to each other (single-GPU
	// pods without a parallelism intent).
	PaceGBps int
}

// Jobs pairs each submitted workload's pods under both schedulers.
func Jobs(ws []Workload, nodes []NodeView, gputopo, plain []Placed) ([]JobRow, error) {
	byName := make(map[string]NodeView, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	rows := make([]JobRow, 0, len(ws))
	for _, w := range ws {
		row := JobRow{Workload: w}
		for _, side := range []struct {
			pods []Placed
			out  *JobPlacement
		}{{gputopo, &row.GPUTopo}, {plain, &row.Plain}} {
			jp, err := jobPlacement(w, byName, side.pods)
			if err != nil {
				return nil, err
			}
			*side.out = jp
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func jobPlacement(w Workload, nodes map[string]NodeView, all []Placed) (JobPlacement, error) {
	var jp JobPlacement
	var names []string
	intra := math.MaxInt
	for _, p := range all {
		if p.EvictedBy == w.Name {
			jp.Preempted++
		}
		if p.Job != w.Name {
			continue
		}
		n, ok := nodes[p.Node]
		if !ok {
			return JobPlacement{}, fmt.Errorf("pod %s is on node %q, which the demo did not create", p.Name, p.Node)
		}
		jp.Pods = append(jp.Pods, p)
		if p.Evicted {
			jp.Evicted++
		}
		if !slices.Contains(names, p.Node) {
			names = append(names, p.Node)
		}
		if len(p.GPUs) > 1 {
			set := topology.MaskOf(p.GPUs...)
			intra = min(intra, n.Graph.Metrics(set, set).RingGBps)
		}
	}
	if len(jp.Pods) == 0 {
		return jp, nil
	}
	together, inter := sharedLevel(names, nodes)
	jp.Together = together
	if w.Intent == "" && w.GPUs < 2 {
		return jp, nil
	}
	jp.PaceGBps = min(intra, inter)
	if jp.PaceGBps == math.MaxInt {
		jp.PaceGBps = 0
	}
	return jp, nil
}

// sharedLevel is the tightest level every node of names shares and the
// bandwidth per GPU across it (math.MaxInt inside one node or NVLink
// domain: the pods' own rings set the pace there).
func sharedLevel(names []string, nodes map[string]NodeView) (string, int) {
	if len(names) == 1 {
		return "node", math.MaxInt
	}
	for _, lv := range configv1alpha1.DefaultFabricLevels() {
		dom := func(n string) string {
			labels := nodeLabels(nodes[n].Fixture)
			for _, k := range lv.Labels {
				if v := labels[k]; v != "" {
					return k + "=" + v
				}
			}
			return ""
		}
		d := dom(names[0])
		if d == "" || slices.ContainsFunc(names[1:], func(n string) bool { return dom(n) != d }) {
			continue
		}
		if lv.BandwidthGBps == 0 {
			return lv.Name, math.MaxInt
		}
		return lv.Name, int(lv.BandwidthGBps)
	}
	return "cluster", configv1alpha1.CrossZoneBandwidthGBps
}

// WriteJobs prints what each job shows, then the table: each job's pods'
// nodes and GPUs under gputopo and under plain kube-scheduler, the level
// they share, the pace, and gputopo's pace over plain's.
func WriteJobs(w io.Writer, rows []JobRow) error {
	fmt.Fprintln(w, "the workload, in the order it is submitted:")
	for _, r := range rows {
		fmt.Fprintf(w, "  %-13s %s\n", r.Workload.Name, r.Workload.Shows)
	}
	fmt.Fprintln(w)
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tPODS x GPUS, KIND\tSCHEDULER\tNODE [GPUS] OF EACH POD\tTOGETHER IN\tPACE\tGPUTOPO/PLAIN")
	for _, r := range rows {
		ratio := "-"
		if g, p := r.GPUTopo.PaceGBps, r.Plain.PaceGBps; g > 0 && p > 0 {
			ratio = fmt.Sprintf("%.1fx", float64(g)/float64(p))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Workload.Name, shape(r.Workload), SchedulerGPUTopo,
			where(r.GPUTopo), orDash(r.GPUTopo.Together), pace(r.GPUTopo.PaceGBps), "")
		fmt.Fprintf(tw, "\t%s\t%s\t%s\t%s\t%s\t%s\n", intentOf(r.Workload), SchedulerPlain,
			where(r.Plain), orDash(r.Plain.Together), pace(r.Plain.PaceGBps), ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// The gputopo line's last cell is empty: no padding after it.
	for _, l := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		if _, err := io.WriteString(w, strings.TrimRight(l, " ")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

// Headline sums up the table in one line: gputopo's pace over plain
// kube-scheduler's for the jobs whose GPUs talk to each other (geometric
// mean), and how often it was faster, equal or slower.
func Headline(rows []JobRow) string {
	var n, faster, slower int
	logSum := 0.0
	for _, r := range rows {
		g, p := r.GPUTopo.PaceGBps, r.Plain.PaceGBps
		if g == 0 || p == 0 {
			continue
		}
		n++
		logSum += math.Log(float64(g) / float64(p))
		switch {
		case g > p:
			faster++
		case g < p:
			slower++
		}
	}
	if n == 0 {
		return "no job's GPUs talk to each other: nothing to compare"
	}
	return fmt.Sprintf("jobs whose GPUs talk run at %.1fx the bandwidth under gputopo (geometric mean of %d jobs; faster %d, equal %d, slower %d)",
		math.Exp(logSum/float64(n)), n, faster, n-faster-slower, slower)
}

func shape(w Workload) string { return fmt.Sprintf("%d x %d", w.Pods, w.GPUs) }

func intentOf(w Workload) string {
	parts := []string{}
	if w.Intent != "" {
		parts = append(parts, string(w.Intent)+"-parallel")
	}
	if w.Priority != "" {
		parts = append(parts, w.Priority)
	}
	return strings.Join(parts, ", ")
}

// where lists each pod's node and GPUs (bind order), or for a job of more
// than four pods how many nodes they are on; then the pods it preempted
// and those of its own preempted later.
func where(jp JobPlacement) string {
	var b strings.Builder
	if len(jp.Pods) > 4 {
		var nodes []string
		for _, p := range jp.Pods {
			if !slices.Contains(nodes, p.Node) {
				nodes = append(nodes, p.Node)
			}
		}
		fmt.Fprintf(&b, "%d pods on %d nodes", len(jp.Pods), len(nodes))
	} else {
		for i, p := range jp.Pods {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s [%s]", p.Node, Ranges(p.GPUs))
		}
	}
	if jp.Preempted > 0 {
		fmt.Fprintf(&b, "; preempted %d pod(s)", jp.Preempted)
	}
	if jp.Evicted > 0 {
		fmt.Fprintf(&b, "; %d preempted later", jp.Evicted)
	}
	return b.String()
}

func pace(gbps int) string {
	if gbps == 0 {
		return "-"
	}
	return fmt.Sprintf("%d GB/s", gbps)
}

// Ranges renders GPU indices sorted, runs collapsed: [4 6 5 7] is "4-7",
// [0 3] is "0,3" (picture.Spans).
func Ranges(idx []int) string { return picture.Spans(idx) }
