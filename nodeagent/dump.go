package nodeagent

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gputopo/gputopo/topology/machine"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// DumpOptions configure DumpMachine.
type DumpOptions struct {
	// Name is the machine's name in the file (a DNS label).
	Name string
	// SysfsNUMA reads a GPU's NUMA node from sysfs when NVML cannot (real
	// drivers only; never for a simulated node).
	SysfsNUMA bool
}

// nvlinkGen is the NVLink generation of an nvmlNvlinkVersion_t
// (1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0).
var nvlinkGen = map[uint32]int{1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5}

// DumpMachine reads this node's GPUs through NVML, with the same discovery
// code the agent publishes with, and describes them as a machine (written
// with machine.Fixture.MarshalMachine): GPU model and memory, every pair's
// NVLinks and PCIe level, NUMA nodes, PCI bus IDs, the NVLink and PCIe
// generations and the fabric clique. What the file format cannot say
// exactly (P2P support that differs from the PCIe level, NVML answers that
// disagree) is recorded in the machine's notes, so a bug report carries it.
func DumpMachine(lib nvml.Interface, logger klog.Logger, o DumpOptions) (machine.Fixture, error) {
	if err := machine.ValidateName(o.Name); err != nil {
		return machine.Fixture{}, fmt.Errorf("dump: %w", err)
	}
	src := NewNVMLSource(lib, logger, nil)
	if o.SysfsNUMA {
		src.WithSysfsNUMA()
	}
	defer src.Close()
	st, err := src.Topology()
	if err != nil {
		return machine.Fixture{}, fmt.Errorf("dump: %w", err)
	}
	n := len(st.GPUs)
	if n == 0 {
		return machine.Fixture{}, errors.New("dump: NVML reports no GPUs on this node")
	}
	f := machine.Fixture{
		Name:   o.Name,
		Model:  st.GPUs[0].Model,
		GPUs:   n,
		Source: "gputopo nodeagent dump (NVML, driver " + st.DriverVersion + ")",
	}
	var notes []string
	for _, c := range st.Conditions {
		if c.Type == v1alpha1.ConditionTopologyConsistent && c.Status != "True" {
			notes = append(notes, "NVML answers disagreed; the conservative value of each pair is dumped: "+c.Message)
		}
	}
	gpuNotes, err := dumpGPUs(&f, st.GPUs)
	if err != nil {
		return machine.Fixture{}, err
	}
	linkNotes, err := dumpLinks(&f, st.Links)
	if err != nil {
		return machine.Fixture{}, err
	}
	if err := dumpGenerations(&f, lib); err != nil {
		return machine.Fixture{}, err
	}
	f.Description = fmt.Sprintf("%d× %s dumped from NVML", n, f.Model)
	notes = slices.Concat(notes, gpuNotes, linkNotes,
		[]string{"NICs are not visible to NVML; import `nvidia-smi topo -m` (gputopo machine import) to describe them"},
		pairNotes(f, st.Links))
	f.Notes = notes
	if err := f.Validate(); err != nil {
		return machine.Fixture{}, fmt.Errorf("dump: %w", err)
	}
	return f, nil
}

// dumpGPUs fills in what the machine says of its GPUs: memory, fabric
// clique, NUMA nodes and PCI bus IDs. A machine file describes one GPU
// model in one clique; a memory size that differs is noted.
func dumpGPUs(f *machine.Fixture, gpus []v1alpha1.GPU) (notes []string, err error) {
	f.MemoryMiB = gpus[0].MemoryMiB
	f.FabricClique = gpus[0].FabricClique
	f.NUMANodes = make([]int, len(gpus))
	f.PCIBusIDs = make([]string, len(gpus))
	for i, g := range gpus {
		if g.Model != f.Model {
			return nil, fmt.Errorf("dump: GPU %d is %q but GPU 0 is %q; a machine file describes one GPU model", i, g.Model, f.Model)
		}
		if g.MemoryMiB != f.MemoryMiB {
			notes = append(notes, fmt.Sprintf("GPU %d reports %d MiB, GPU 0 %d MiB; the file keeps GPU 0's", i, g.MemoryMiB, f.MemoryMiB))
		}
		if g.FabricClique != f.FabricClique {
			return nil, fmt.Errorf("dump: GPU %d is in NVLink fabric clique %q but GPU 0 in %q; a machine file has one clique", i, g.FabricClique, f.FabricClique)
		}
		f.NUMANodes[i] = g.NUMANode
		f.PCIBusIDs[i] = g.PCIBusID
		if g.PCIBusID == "" {
			return nil, fmt.Errorf("dump: GPU %d reports no PCI bus ID", i)
		}
	}
	return notes, nil
}

// dumpLinks fills in the links: one PCIe matrix, and either one NVSwitch
// fabric or direct pairs, at the slowest NVLink speed read (noted when
// they differ).
func dumpLinks(f *machine.Fixture, links []v1alpha1.Link) (notes []string, err error) {
	f.PCIeLevels = make([][]v1alpha1.PCIeLevel, f.GPUs)
	for i := range f.PCIeLevels {
		f.PCIeLevels[i] = make([]v1alpha1.PCIeLevel, f.GPUs)
	}
	switchLinks, direct, linkGBps := -1, 0, 0
	for _, l := range links {
		f.PCIeLevels[l.A][l.B], f.PCIeLevels[l.B][l.A] = l.PCIe, l.PCIe
		if l.NVLinks == 0 {
			continue
		}
		gbps := l.BandwidthGBps / l.NVLinks
		if linkGBps == 0 || gbps < linkGBps {
			if linkGBps != 0 {
				notes = append(notes, fmt.Sprintf("NVLinks run at different speeds; the slowest, %d GB/s per link (GPU %d-GPU %d), is dumped", gbps, l.A, l.B))
			}
			linkGBps = gbps
		}
		if l.NVSwitch {
			if switchLinks >= 0 && switchLinks != l.NVLinks {
				return nil, fmt.Errorf("dump: GPU %d-GPU %d has %d NVLinks into the NVSwitch, other pairs %d; a machine file has one NVSwitch link count", l.A, l.B, l.NVLinks, switchLinks)
			}
			switchLinks = l.NVLinks
			continue
		}
		direct++
		f.NVLinks = append(f.NVLinks, machine.NVLinkPair{A: l.A, B: l.B, Links: l.NVLinks})
	}
	if switchLinks > 0 {
		if direct > 0 || countNVSwitch(links) != len(links) {
			return nil, errors.New("dump: some pairs go through an NVSwitch and others do not (a GPU off the fabric?); a machine file describes one or the other")
		}
		f.NVSwitchLinks, f.NVLinks = switchLinks, nil
	}
	f.NVLinkGBps = linkGBps
	return notes, nil
}

// dumpGenerations fills in the PCIe and NVLink generations: NVML asked
// directly (the status keeps bandwidths, not generations); the model's
// known generation when NVML will not say.
func dumpGenerations(f *machine.Fixture, lib nvml.Interface) error {
	nvlinked := f.NVLinkGBps > 0
	dev, ret := lib.DeviceGetHandleByIndex(0)
	if ret == nvml.SUCCESS {
		if gen, ret := dev.GetMaxPcieLinkGeneration(); ret == nvml.SUCCESS {
			f.PCIeGen = gen
		}
		if nvlinked {
			if v, ret := dev.GetNvLinkVersion(0); ret == nvml.SUCCESS {
				f.NVLinkGen = nvlinkGen[v]
			}
		}
	}
	if nvlinked && f.NVLinkGen == 0 {
		if k, ok := machine.GPUKindOfName(f.Model); ok {
			f.NVLinkGen = k.NVLinkGen
		}
		if f.NVLinkGen == 0 {
			return fmt.Errorf("dump: NVML does not report the NVLink version and %q is not a GPU the importer knows; the machine file needs the NVLink generation", f.Model)
		}
	}
	if !nvlinked {
		f.NVLinkGen = 0
	}
	return nil
}

// pairNotes names, pair by pair, what the format models differently from
// what NVML said: P2P, the bandwidth of a PCIe pair.
func pairNotes(f machine.Fixture, got []v1alpha1.Link) []string {
	var notes []string
	_, links := f.Parts("dump")
	for i, l := range links {
		g := got[i]
		if l.P2P != g.P2P {
			notes = append(notes, fmt.Sprintf("GPU %d-GPU %d: NVML reports P2P %t; a machine file gives %t to %s pairs", g.A, g.B, g.P2P, l.P2P, l.PCIe))
		}
		if l.BandwidthGBps != g.BandwidthGBps {
			notes = append(notes, fmt.Sprintf("GPU %d-GPU %d: NVML's links give %d GB/s; the machine file models %d GB/s", g.A, g.B, g.BandwidthGBps, l.BandwidthGBps))
		}
	}
	return notes
}

func countNVSwitch(links []v1alpha1.Link) int {
	n := 0
	for _, l := range links {
		if l.NVSwitch {
			n++
		}
	}
	return n
}

// DumpName turns a node name into a machine name (a DNS label): the first
// label, lower case, at most 50 characters.
func DumpName(node string) string {
	name := strings.ToLower(strings.SplitN(node, ".", 2)[0])
	if len(name) > 50 {
		name = strings.TrimRight(name[:50], "-")
	}
	if name == "" {
		return "machine"
	}
	return name
}
