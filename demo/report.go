package demo

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/picture"
	"github.com/gputopo/gputopo/topology"
)

// NodeView is one node as the report shows it.
type NodeView = picture.NodeView

// PodView is one placed pod.
type PodView = picture.PodView

// Placed is a placed pod and the group its placement record names.
type Placed struct {
	PodView
	// Group is the pod's group (namespace/name) and Domain the fabric
	// domain the whole group was placed in, from the pod's placement
	// record; both empty for a pod placed alone.
	Group, Domain string
}

// Row is one line of the placement table.
type Row struct {
	Pod, Node, Intent string
	// Group and Domain are the pod's group and the domain it was placed
	// in ("" for a pod placed alone).
	Group, Domain string
	GPUs          []int
	Got           topology.SetMetrics
	// CountOnly is what a count-only device plugin (lowest free indices
	// first, in the same bind order, on the same node) would have given.
	CountOnlyGPUs []int
	CountOnly     topology.SetMetrics
}

// Rows computes the table: gputopo's placements and, for each, the
// count-only alternative replayed in bind order on the same node.
func Rows(nodes []NodeView, pods []Placed) ([]Row, error) {
	byName := make(map[string]NodeView, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	sorted := append([]Placed(nil), pods...)
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
		row := Row{Pod: p.Name, Node: n.Name, Intent: p.Intent, Group: p.Group, Domain: p.Domain, GPUs: p.GPUs, Got: n.Graph.Metrics(set, gotFree[n.Name])}
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

// WriteTable prints the placement table. GROUP and DOMAIN (the group's
// fabric domain, from the placement record) are shown when a row is in a
// group.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	grouped := slices.ContainsFunc(rows, func(r Row) bool { return r.Group != "" })
	head := "POD\tINTENT\tGROUP\tDOMAIN\tNODE\tGPUS\tTIER\tMIN PAIR\tRING\t|\tCOUNT-ONLY GPUS\tTIER\tMIN PAIR\tRING"
	if !grouped {
		head = strings.Replace(head, "\tGROUP\tDOMAIN", "", 1)
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		cols := []string{r.Pod, orDash(r.Intent)}
		if grouped {
			cols = append(cols, orDash(r.Group), orDash(r.Domain))
		}
		cols = append(cols, r.Node, ints(r.GPUs), string(r.Got.Tier), gbps(r.Got.MinPairGBps, len(r.GPUs)), gbps(r.Got.RingGBps, len(r.GPUs)), "|",
			ints(r.CountOnlyGPUs), string(r.CountOnly.Tier), gbps(r.CountOnly.MinPairGBps, len(r.GPUs)), gbps(r.CountOnly.RingGBps, len(r.GPUs)))
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
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
