package machine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Marshal writes the machine as a machine file: YAML, compact rows
// for matrices, with a comment naming the format's documentation.
func (f Fixture) Marshal() ([]byte, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString("# gputopo machine file: the format is described in docs/topology.md (\"Machine files\").\n")
	fmt.Fprintf(&b, "apiVersion: %s\nkind: %s\nname: %s\n", APIVersion, Kind, yamlString(f.Name))
	if f.Description != "" {
		fmt.Fprintf(&b, "description: %s\n", yamlString(f.Description))
	}
	if f.Source != "" {
		fmt.Fprintf(&b, "source: %s\n", yamlString(f.Source))
	}
	if len(f.Notes) > 0 {
		b.WriteString("notes:\n")
		for _, n := range f.Notes {
			fmt.Fprintf(&b, "- %s\n", yamlString(n))
		}
	}
	fmt.Fprintf(&b, "model: %s\ngpus: %d\n", yamlString(f.Model), f.GPUs)
	if f.MemoryMiB != 0 {
		fmt.Fprintf(&b, "memoryMiB: %d\n", f.MemoryMiB)
	}
	f.marshalNVLink(&b)
	f.marshalPCIe(&b)
	f.marshalPlacement(&b)
	if f.FabricClique != "" {
		fmt.Fprintf(&b, "fabricClique: %s\n", yamlString(f.FabricClique))
	}
	return b.Bytes(), nil
}

// yamlString quotes s as a YAML double-quoted scalar (a JSON string is
// one).
func yamlString(s string) string {
	out, _ := json.Marshal(s)
	return string(out)
}

// yamlInts writes v as a YAML flow sequence.
func yamlInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = fmt.Sprint(x)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// marshalNVLink writes the nvlink section, when the machine has NVLink.
func (f Fixture) marshalNVLink(b *bytes.Buffer) {
	if f.NVSwitchLinks <= 0 && len(f.NVLinks) == 0 {
		return
	}
	fmt.Fprintf(b, "nvlink:\n  generation: %d\n", f.NVLinkGen)
	if f.NVLinkGBps != nvlinkGBpsPerLink[f.NVLinkGen] {
		fmt.Fprintf(b, "  gbpsPerLink: %d\n", f.NVLinkGBps)
	}
	if f.NVSwitchLinks > 0 {
		fmt.Fprintf(b, "  nvswitchLinks: %d\n", f.NVSwitchLinks)
		return
	}
	b.WriteString("  pairs:\n")
	for _, p := range f.NVLinks {
		fmt.Fprintf(b, "  - {a: %d, b: %d, links: %d}\n", p.A, p.B, p.Links)
	}
}

// marshalPCIe writes the pcie section: generation, switch and socket
// groups, and the level matrix in nvidia-smi's tokens.
func (f Fixture) marshalPCIe(b *bytes.Buffer) {
	b.WriteString("pcie:\n")
	if f.PCIeGen != 0 {
		fmt.Fprintf(b, "  generation: %d\n", f.PCIeGen)
	}
	for _, g := range []struct {
		key    string
		groups [][]int
	}{{"switches", f.PCIeSwitches}, {"sockets", f.Sockets}} {
		if g.groups == nil {
			continue
		}
		parts := make([]string, len(g.groups))
		for i, m := range g.groups {
			parts[i] = yamlInts(m)
		}
		fmt.Fprintf(b, "  %s: [%s]\n", g.key, strings.Join(parts, ", "))
	}
	if f.PCIeLevels == nil {
		return
	}
	b.WriteString("  levels:\n")
	for i := 0; i < f.GPUs; i++ {
		cells := make([]string, f.GPUs)
		for j := range cells {
			if i == j {
				cells[j] = "X"
			} else {
				cells[j] = smiToken(f.PCIeLevels[i][j])
			}
		}
		fmt.Fprintf(b, "  - %s\n", yamlString(padCells(cells)))
	}
}

// marshalPlacement writes where the GPUs sit: their NUMA nodes, bus IDs
// and the NICs with their level to each GPU.
func (f Fixture) marshalPlacement(b *bytes.Buffer) {
	if f.NUMANodes != nil {
		fmt.Fprintf(b, "numaNodes: %s\n", yamlInts(f.NUMANodes))
	}
	if f.PCIBusIDs != nil {
		ids := make([]string, len(f.PCIBusIDs))
		for i, id := range f.PCIBusIDs {
			ids[i] = yamlString(id)
		}
		fmt.Fprintf(b, "pciBusIDs: [%s]\n", strings.Join(ids, ", "))
	}
	if len(f.NICs) == 0 {
		return
	}
	b.WriteString("nics:\n")
	for _, nic := range f.NICs {
		cells := make([]string, len(nic.PCIe))
		for i, l := range nic.PCIe {
			cells[i] = smiToken(l)
		}
		fmt.Fprintf(b, "- {name: %s, pcie: %s}\n", yamlString(nic.Name), yamlString(padCells(cells)))
	}
}

// padCells joins tokens in columns of five, as nvidia-smi aligns them.
func padCells(cells []string) string {
	var b strings.Builder
	for i, c := range cells {
		if i == len(cells)-1 {
			b.WriteString(c)
			break
		}
		fmt.Fprintf(&b, "%-5s", c)
	}
	return b.String()
}
