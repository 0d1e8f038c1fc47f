package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Output formats.
const (
	OutputTable = ""
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

// validOutput checks -o.
func validOutput(o string) error {
	switch o {
	case OutputTable, "table", OutputJSON, OutputYAML:
		return nil
	}
	return fmt.Errorf("-o %q: must be json or yaml (or empty for a table)", o)
}

// writeData writes v as JSON or YAML.
func writeData(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode output: %w", err)
	}
	if format == OutputYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("encode output as yaml: %w", err)
		}
	} else {
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}

// painter colours text for a terminal; the zero painter writes plain text.
type painter struct{ on bool }

const (
	green  = "32"
	yellow = "33"
	red    = "31"
	cyan   = "36"
	bold   = "1"
	dim    = "2"
)

func (p painter) c(code, s string) string {
	if !p.on || code == "" || s == "" {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

// tierColour: NVSwitch and NVLink green, one PCIe switch yellow, host
// bridge and socket red.
func tierColour(t string) string {
	switch v1alpha1.LinkTier(t) {
	case v1alpha1.TierNVSwitch, v1alpha1.TierNVLink:
		return green
	case v1alpha1.TierPCIeSwitch:
		return yellow
	case v1alpha1.TierPCIeHostBridge, v1alpha1.TierCrossSocket:
		return red
	}
	return ""
}

// age formats seconds as kubectl does ("45s", "3m12s", "2h").
func age(sum NodeSummary) string {
	if sum.ObservedTime == nil {
		return "-"
	}
	return duration.HumanDuration(time.Duration(sum.AgeSeconds) * time.Second)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ints(s []int) string {
	if len(s) == 0 {
		return "-"
	}
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.Itoa(v)
	}
	return strings.Join(parts, ",")
}

// status is the STATUS cell: fresh, or stale with its reason.
func status(p painter, s NodeSummary) string {
	switch s.Status {
	case StatusFresh:
		return p.c(green, s.Status)
	case StatusStale, StatusInvalid:
		return p.c(red, s.Status) + " (" + s.StaleReason + ")"
	}
	return p.c(yellow, s.Status)
}

// writeNodes is the nodes table. AGE comes last: it is the only column
// that changes from one second to the next.
func writeNodes(w io.Writer, p painter, rows []NodeSummary) error {
	t := newTable(w)
	fmt.Fprintln(t, "NODE\tMACHINE\tFREE/TOTAL\tFREE NVLINK ISLAND\tUNHEALTHY\tDRIFT\tSTATUS\tAGE")
	for _, r := range rows {
		unhealthy, drift := strconv.Itoa(r.Unhealthy), strconv.Itoa(r.Drift)
		if r.Unhealthy > 0 {
			unhealthy = p.c(red, unhealthy)
		}
		if r.Drift > 0 {
			drift = p.c(red, drift)
		}
		fmt.Fprintf(t, "%s\t%s\t%d/%d\t%d\t%s\t%s\t%s\t%s\n", r.Name, dash(r.Machine), r.Free, r.GPUs, r.LargestFreeNVLinkIsland, unhealthy, drift, status(p, r), age(r))
	}
	return t.Flush()
}

// cell is one matrix entry: the link kind and its bandwidth, as in
// nvidia-smi topo -m: NV<n> for n NVLinks, NVS through NVSwitch, else the
// PCIe path (PIX one switch, PXB several, PHB host bridge, NODE within a
// NUMA node, SYS across sockets).
func cell(l LinkView) string {
	kind := "?"
	switch {
	case l.NVSwitch:
		kind = "NVS"
	case l.NVLinks > 0:
		kind = "NV" + strconv.Itoa(l.NVLinks)
	default:
		switch v1alpha1.PCIeLevel(l.PCIe) {
		case v1alpha1.PCIeInternal:
			kind = "INT"
		case v1alpha1.PCIeSameSwitch:
			kind = "PIX"
		case v1alpha1.PCIeMultipleSwitches:
			kind = "PXB"
		case v1alpha1.PCIeHostBridge:
			kind = "PHB"
		case v1alpha1.PCIeSameNUMA:
			kind = "NODE"
		case v1alpha1.PCIeCrossSocket:
			kind = "SYS"
		}
	}
	return kind + " " + strconv.Itoa(l.BandwidthGBps)
}

// writeNode draws one node: a header, the GPUs with their NUMA node, PCIe
// group and holder, the link matrix, and the node's pods.
func writeNode(w io.Writer, p painter, d *NodeDetail) error {
	fmt.Fprintf(w, "%s  %s  driver %s\n", p.c(bold, "Node "+d.Name), d.Machine, dash(d.DriverVersion))
	fmt.Fprintf(w, "GPUs free %d/%d, largest free NVLink island %d, unhealthy %d, drift %d, topology %s, observed %s ago\n\n",
		d.Free, d.GPUs, d.LargestFreeNVLinkIsland, d.Unhealthy, d.Drift, status(p, d.NodeSummary), age(d.NodeSummary))
	t := newTable(w)
	fmt.Fprintln(t, "GPU\tNUMA\tPCIE GROUP\tPCI BUS\tHEALTH\tUUID\tHELD BY")
	for _, g := range d.GPUList {
		health := p.c(green, g.Health)
		if g.Health != string(v1alpha1.GPUHealthy) {
			health = p.c(red, g.Health)
			if g.HealthReason != "" {
				health += " (" + g.HealthReason + ")"
			}
		}
		held := p.c(dim, "free")
		if len(g.Holders) > 0 {
			held = strings.Join(g.Holders, ", ")
			if len(g.Holders) > 1 {
				held = p.c(red, held+" (conflict)")
			} else {
				held = p.c(cyan, held)
			}
		}
		fmt.Fprintf(t, "%d\t%d\tsw%d\t%s\t%s\t%s\t%s\n", g.Index, g.NUMANode, g.PCIeGroup, dash(g.PCIBusID), health, g.UUID, held)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	n := len(d.GPUList)
	links := make(map[[2]int]LinkView, len(d.Links))
	for _, l := range d.Links {
		links[[2]int{l.A, l.B}], links[[2]int{l.B, l.A}] = l, l
	}
	fmt.Fprintln(w, "\nLinks (GB/s, bidirectional):")
	t = newTable(w)
	head := []string{""}
	for i := 0; i < n; i++ {
		head = append(head, "GPU"+strconv.Itoa(i))
	}
	fmt.Fprintln(t, strings.Join(head, "\t"))
	for a := 0; a < n; a++ {
		row := []string{"GPU" + strconv.Itoa(a)}
		for b := 0; b < n; b++ {
			if a == b {
				row = append(row, "X")
				continue
			}
			l := links[[2]int{a, b}]
			row = append(row, p.c(tierColour(l.Tier), cell(l)))
		}
		fmt.Fprintln(t, strings.Join(row, "\t"))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "  NVS: through NVSwitch; NV<n>: n direct NVLinks; PIX: one PCIe switch; PXB: several PCIe switches;")
	fmt.Fprintln(w, "  PHB: PCIe host bridge; NODE: across host bridges of one NUMA node; SYS: across CPU sockets")
	if len(d.Pods) > 0 {
		fmt.Fprintln(w)
		return writePods(w, p, d.Pods, false)
	}
	return nil
}

// writePods is the pods table.
func writePods(w io.Writer, p painter, rows []PodRow, withNode bool) error {
	t := newTable(w)
	head := "POD\tPHASE\tINTENT\tGPUS REQ\tREQUIREMENT\tNODE\tGPUS\tTIER\tRING GB/S\tTRUTH"
	if !withNode {
		head = strings.Replace(head, "\tNODE", "", 1)
	}
	fmt.Fprintln(t, head)
	for _, r := range rows {
		truth := "-"
		switch {
		case r.Drift:
			truth = p.c(red, "drift")
		case r.Node != "" && len(r.GPUs) > 0:
			truth = "ok"
		}
		ring := "-"
		if r.RingBandwidthGBps > 0 {
			ring = strconv.Itoa(r.RingBandwidthGBps)
		}
		phase := r.Phase
		if phase == "Pending" && r.Node == "" {
			phase = p.c(yellow, phase)
		}
		cols := []string{r.Namespace + "/" + r.Name, phase, dash(r.Intent), strconv.Itoa(r.Requested), requirementSummary(r.Requirement)}
		if withNode {
			cols = append(cols, dash(r.Node))
		}
		cols = append(cols, ints(r.GPUs), p.c(tierColour(r.Tier), dash(r.Tier)), ring, truth)
		fmt.Fprintln(t, strings.Join(cols, "\t"))
	}
	return t.Flush()
}

// requirementSummary shortens the requirement JSON for a table cell.
func requirementSummary(v string) string {
	if v == "" {
		return "-"
	}
	r, err := v1alpha1.ParseRequirement(v)
	if err != nil {
		return "invalid"
	}
	var parts []string
	if r.RequireNVLink {
		parts = append(parts, "nvlink")
	}
	if r.MinPairBandwidthGBps > 0 {
		parts = append(parts, fmt.Sprintf(">=%dGB/s", r.MinPairBandwidthGBps))
	}
	if r.GPUMemoryMiB > 0 {
		parts = append(parts, fmt.Sprintf(">=%dMiB", r.GPUMemoryMiB))
	}
	parts = append(parts, string(r.EffectiveStrategy()))
	return strings.Join(parts, ",")
}

// writeExplanation prints explain.
func writeExplanation(w io.Writer, p painter, e *Explanation) error {
	fmt.Fprintf(w, "%s  %s, requests %d GPU(s), wants %s, strategy %s\n", p.c(bold, "Pod "+e.Namespace+"/"+e.Name), e.Phase, e.Requested, e.RequestedTier, e.Strategy)
	if e.Requirement != "" {
		fmt.Fprintf(w, "requirement: %s\n", e.Requirement)
	}
	if b := e.Bound; b != nil {
		fmt.Fprintf(w, "bound to node %s\n", b.Node)
		if pl := b.Placement; pl != nil {
			bw := ""
			if len(pl.GPUIndices) > 1 {
				bw = fmt.Sprintf(", ring %d GB/s, min pair %d GB/s", pl.RingBandwidthGBps, pl.MinPairBandwidthGBps)
			}
			fmt.Fprintf(w, "planned:   GPUs %s on node %s, tier %s%s, strategy %s, score %d\n", ints(pl.GPUIndices), pl.Node, p.c(tierColour(string(pl.Tier)), string(pl.Tier)), bw, pl.Strategy, pl.Score)
		}
		if pl := b.Placement; pl != nil && pl.Degraded {
			fmt.Fprintf(w, "fell back: %s\n", p.c(yellow, pl.DegradedReason))
		}
		fmt.Fprintf(w, "assigned:  %s\n", dash(strings.Join(b.Assigned, ",")))
		fmt.Fprintf(w, "allocated: %s\n", dash(strings.Join(b.Allocated, ",")))
		truth := b.Truth
		switch b.Truth {
		case TruthMatches:
			truth = p.c(green, truth) + ": kubelet allocated the GPUs gputopo planned"
		case TruthDrift:
			truth = p.c(red, truth) + ": kubelet allocated other GPUs than gputopo planned (see docs/troubleshooting.md, Drift)"
		case TruthNotRecorded:
			truth = p.c(yellow, truth) + ": the node agent has not recorded allocated-gpus yet (is the container started, is the agent running?)"
		case TruthNoPlan:
			truth = p.c(yellow, truth) + ": the pod has no assigned-gpus; it was not bound by the gputopo extender"
		}
		fmt.Fprintf(w, "truth:     %s\n", truth)
		if b.AchievedTier != "" {
			met := p.c(green, "meets the requirement")
			if !b.Met {
				met = p.c(red, "does not meet the requirement")
			}
			ring := ""
			if b.AchievedRing > 0 {
				ring = fmt.Sprintf(", ring %d GB/s", b.AchievedRing)
			}
			fmt.Fprintf(w, "achieved:  tier %s%s: %s\n", p.c(tierColour(b.AchievedTier), b.AchievedTier), ring, met)
		}
		return nil
	}
	fits := 0
	for _, v := range e.Nodes {
		if v.Verdict == VerdictFits && v.Scheduler == "" {
			fits++
		}
	}
	fmt.Fprintf(w, "gputopo's filter and scores (extender configuration: %s); %d node(s) would take it now\n\n", e.ConfigSource, fits)
	t := newTable(w)
	fmt.Fprintln(t, "NODE\tVERDICT\tSCORE\tGPUS\tTIER\tRING GB/S\tKUBE-SCHEDULER\tREASON")
	for _, v := range e.Nodes {
		verdict, score, ring := v.Verdict, "-", "-"
		switch v.Verdict {
		case VerdictFits:
			verdict = p.c(green, verdict)
			score, ring = strconv.FormatInt(v.Score, 10), strconv.Itoa(v.RingBandwidthGBps)
		case VerdictNever:
			verdict = p.c(red, verdict)
		default:
			verdict = p.c(yellow, verdict)
		}
		sched := "ok"
		if v.Scheduler != "" {
			sched = p.c(yellow, v.Scheduler)
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Node, verdict, score, ints(v.GPUs), p.c(tierColour(v.Tier), dash(v.Tier)), ring, sched, dash(v.Reason))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nfits: the node passes gputopo's filter now; fails: not with its GPUs free now; never: not even with every GPU free and healthy.")
	fmt.Fprintln(w, "KUBE-SCHEDULER: what kube-scheduler's own filters say before gputopo is asked (node selector, taints, GPU count).")
	return nil
}
