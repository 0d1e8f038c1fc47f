package kubectlplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
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
	case StatusStale, StatusInvalid, StatusUntrusted:
		return p.c(red, s.Status) + " (" + s.StaleReason + ")"
	}
	if s.StaleReason != "" {
		return p.c(yellow, s.Status) + " (" + s.StaleReason + ")"
	}
	return p.c(yellow, s.Status)
}

// writeNodes is the nodes table. AGE comes last: it is the only column
// that changes from one second to the next.
func writeNodes(w io.Writer, p painter, rows []NodeSummary) error {
	t := newTable(w)
	fmt.Fprintln(t, "NODE\tMACHINE\tFREE/TOTAL\tFREE NVLINK ISLAND\tUNHEALTHY\tDRIFT\tSTATUS\tAGE\tFOR GROUPS")
	for _, r := range rows {
		unhealthy, drift := strconv.Itoa(r.Unhealthy), strconv.Itoa(r.Drift)
		if r.Unhealthy > 0 {
			unhealthy = p.c(red, unhealthy)
		}
		if r.Drift > 0 {
			drift = p.c(red, drift)
		}
		free, island := fmt.Sprintf("%d/%d", r.Free, r.GPUs), strconv.Itoa(r.LargestFreeNVLinkIsland)
		if r.Status == StatusNoTopology || r.Status == StatusInvalid {
			// Nothing is known of the GPUs but what the Node advertises.
			free, island, unhealthy = "-/"+count(r.Advertised), "-", "-"
		}
		groups := "-"
		if len(r.HeldFor) > 0 {
			groups = p.c(yellow, strings.Join(r.HeldFor, "; "))
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, dash(r.Machine), free, island, unhealthy, drift, status(p, r), age(r), groups)
	}
	return t.Flush()
}

// count is n, or "-" for none.
func count(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
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
		if k, ok := pcieKinds[v1alpha1.PCIeLevel(l.PCIe)]; ok {
			kind = k
		}
	}
	return kind + " " + strconv.Itoa(l.BandwidthGBps)
}

// pcieKinds are nvidia-smi's names of the PCIe paths.
var pcieKinds = map[v1alpha1.PCIeLevel]string{
	v1alpha1.PCIeInternal:         "INT",
	v1alpha1.PCIeSameSwitch:       "PIX",
	v1alpha1.PCIeMultipleSwitches: "PXB",
	v1alpha1.PCIeHostBridge:       "PHB",
	v1alpha1.PCIeSameNUMA:         "NODE",
	v1alpha1.PCIeCrossSocket:      "SYS",
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
		switch {
		case g.PlannedFor != "":
			held = p.c(yellow, "planned for "+g.PlannedFor)
		case g.KeptFor != "":
			held = p.c(yellow, "free, kept for "+g.KeptFor)
		}
		if len(g.Holders) > 0 {
			held = strings.Join(g.Holders, ", ")
			if len(g.Holders) > 1 {
				held = p.c(red, held+" (conflict)")
			} else {
				held = p.c(cyan, held)
			}
			if g.KeptFor != "" {
				held += p.c(yellow, ", kept for "+g.KeptFor)
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

// writePods is the pods table. GROUP and DOMAIN are shown only when a
// pod of the table is in a group, so that a cluster without groups keeps
// its table as it was.
func writePods(w io.Writer, p painter, rows []PodRow, withNode bool) error {
	t := newTable(w)
	grouped := slices.ContainsFunc(rows, func(r PodRow) bool { return r.Group != "" })
	claimed := slices.ContainsFunc(rows, func(r PodRow) bool { return len(r.Claims) > 0 })
	head := "POD\tPHASE\tINTENT\tGPUS REQ\tREQUIREMENT\tGROUP\tDOMAIN\tNODE\tGPUS\tTIER\tRING GB/S\tTRUTH\tCLAIMS"
	if !grouped {
		head = strings.Replace(head, "\tGROUP\tDOMAIN", "", 1)
	}
	if !claimed {
		head = strings.TrimSuffix(head, "\tCLAIMS")
	}
	if !withNode {
		head = strings.Replace(head, "\tNODE", "", 1)
	}
	fmt.Fprintln(t, head)
	for _, r := range rows {
		truth := "-"
		switch {
		case r.Drift:
			truth = p.c(red, "drift")
		case r.Node != "" && len(r.GPUs) > 0 && len(r.Claims) > 0:
			truth = "claim" // the claims' allocation is the truth
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
		if grouped {
			group := dash(r.Group)
			if r.Group == groupInvalid {
				group = p.c(red, group)
			}
			cols = append(cols, group, r.domainCell())
		}
		if withNode {
			cols = append(cols, dash(r.Node))
		}
		cols = append(cols, ints(r.GPUs), p.c(tierColour(r.Tier), dash(r.Tier)), ring, truth)
		if claimed {
			cols = append(cols, dash(strings.Join(r.Claims, ",")))
		}
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
