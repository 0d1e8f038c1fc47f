package machine

import (
	"fmt"
	"strconv"
	"strings"
)

// RenderSMI prints the machine as `nvidia-smi topo -m` would: the GPU and
// NIC matrix with NV# for NVLinked pairs (with pciOnly, the PCIe level
// instead, as `nvidia-smi topo -mp` prints it), the NUMA node of every GPU
// and the legends. ImportSMI reads it back. NIC rows are left out: they
// repeat the GPU rows, and the PCIe level between two NICs is not known.
func RenderSMI(f Fixture, pciOnly bool) string {
	var b strings.Builder
	cell := func(s string) { fmt.Fprintf(&b, "%-8s", s) }
	b.WriteString("        ")
	for i := 0; i < f.GPUs; i++ {
		cell(fmt.Sprintf("GPU%d", i))
	}
	for i := range f.NICs {
		cell(fmt.Sprintf("NIC%d", i))
	}
	b.WriteString("CPU Affinity    NUMA Affinity   GPU NUMA ID\n")
	for a := 0; a < f.GPUs; a++ {
		cell(fmt.Sprintf("GPU%d", a))
		for c := 0; c < f.GPUs; c++ {
			switch l := f.Link(min(a, c), max(a, c)); {
			case a == c:
				cell(" X")
			case l.NVLinks > 0 && !pciOnly:
				cell(fmt.Sprintf("NV%d", l.NVLinks))
			default:
				cell(smiToken(l.PCIe))
			}
		}
		for _, nic := range f.NICs {
			cell(smiToken(nic.PCIe[a]))
		}
		numa := "N/A"
		if v := f.NUMANode(a); v >= 0 {
			numa = strconv.Itoa(v)
		}
		fmt.Fprintf(&b, "%-16s%-16sN/A\n", "N/A", numa)
	}
	b.WriteString(`
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
`)
	if len(f.NICs) > 0 {
		b.WriteString("\nNIC Legend:\n\n")
		for i, nic := range f.NICs {
			fmt.Fprintf(&b, "  NIC%d: %s\n", i, nic.Name)
		}
	}
	return b.String()
}
