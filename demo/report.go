package demo

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/picture"
	"github.com/gputopo/gputopo/topology"
)

// NodeView is one node as the report shows it.
type NodeView = picture.NodeView

// PodView is one placed pod.
type PodView = picture.PodView

// Row is one line of the placement table.
type Row struct {
	Pod, Node, Intent string
	GPUs              []int
	Got               topology.SetMetrics
	// CountOnly is what a count-only device plugin (lowest free indices
	// first, in the same bind order, on the same node) would have given.
	CountOnlyGPUs []int
	CountOnly     topology.SetMetrics
}

// Rows computes the table: gputopo's placements and, for each, the
// count-only alternative replayed in bind order on the same node.
func Rows(nodes []NodeView, pods []PodView) ([]Row, error) {
	byName := make(map[string]NodeView, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	sorted := append([]PodView(nil), pods...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Order < sorted[j].Order })
	gotFree := map[string]topology.Mask{}
	baseFree := map[string]topology.Mask{}
	rows := make([]Row, 0, len(sorted))
	for _, p := range sorted {
		n, ok := byName[p.Node]
		if !ok {
			return nil, fmt.Errorf("pod %s is on node %q, which the demo did not create", p.Name, p.Node)
		}
		if _, ok := gotFree[n.Name]; !ok {
			gotFree[n.Name], baseFree[n.Name] = n.Graph.All(), n.Graph.All()
		}
		set := topology.MaskOf(p.GPUs...)
		if set.Count() != len(p.GPUs) || !set.Minus(gotFree[n.Name]).Empty() {
			return nil, fmt.Errorf("pod %s holds GPUs %v on %s that were not free", p.Name, p.GPUs, n.Name)
		}
		row := Row{Pod: p.Name, Node: n.Name, Intent: p.Intent, GPUs: p.GPUs, Got: n.Graph.Metrics(set, gotFree[n.Name])}
		gotFree[n.Name] = gotFree[n.Name].Minus(set)
		base := firstFit(baseFree[n.Name], len(p.GPUs))
		row.CountOnlyGPUs = base.Indices()
		row.CountOnly = n.Graph.Metrics(base, baseFree[n.Name])
		baseFree[n.Name] = baseFree[n.Name].Minus(base)
		rows = append(rows, row)
	}
	return rows, nil
}

// firstFit takes the k lowest free indices, as a count-only device plugin
// does; if fewer are free (count-only would have placed the pod elsewhere)
// it takes what there is.
func firstFit(free topology.Mask, k int) topology.Mask {
	var m topology.Mask
	for _, i := range free.Indices() {
		if m.Count() == k {
			break
		}
		m = m.Union(topology.MaskOf(i))
	}
	return m
}

// WriteTable prints the placement table.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tINTENT\tNODE\tGPUS\tTIER\tMIN PAIR\tRING\t|\tCOUNT-ONLY GPUS\tTIER\tMIN PAIR\tRING")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t|\t%s\t%s\t%s\t%s\n",
			r.Pod, orDash(r.Intent), r.Node, ints(r.GPUs), r.Got.Tier, gbps(r.Got.MinPairGBps, len(r.GPUs)), gbps(r.Got.RingGBps, len(r.GPUs)),
			ints(r.CountOnlyGPUs), r.CountOnly.Tier, gbps(r.CountOnly.MinPairGBps, len(r.GPUs)), gbps(r.CountOnly.RingGBps, len(r.GPUs)))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ints(v []int) string { return picture.Indices(v) }

func gbps(v, k int) string {
	if k < 2 {
		return "-"
	}
	return fmt.Sprintf("%d GB/s", v)
}

// Summary sums up the multi-GPU rows: how many got an all-NVLink set, and
// the mean ring bandwidth, for gputopo and for count-only.
func Summary(rows []Row) string {
	var multi, nvGot, nvBase, ringGot, ringBase int
	for _, r := range rows {
		if len(r.GPUs) < 2 {
			continue
		}
		multi++
		if nvlinkTier(r.Got.Tier) {
			nvGot++
		}
		if nvlinkTier(r.CountOnly.Tier) {
			nvBase++
		}
		ringGot += r.Got.RingGBps
		ringBase += r.CountOnly.RingGBps
	}
	if multi == 0 {
		return "no multi-GPU pods placed"
	}
	return fmt.Sprintf("multi-GPU pods: %d; all-NVLink sets: gputopo %d, count-only %d; mean ring bandwidth: gputopo %d GB/s, count-only %d GB/s",
		multi, nvGot, nvBase, ringGot/multi, ringBase/multi)
}

func nvlinkTier(t v1alpha1.LinkTier) bool {
	return t == v1alpha1.TierNVLink || t == v1alpha1.TierNVSwitch
}
