package machine

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// pcieX16GBps is a PCIe x16 link's bandwidth, GB/s bidirectional, by PCIe
// generation.
var pcieX16GBps = map[int]int{3: 32, 4: 64, 5: 128}

// PCIeBandwidthGBps is the model's peer-to-peer bandwidth, GB/s
// bidirectional, between two GPUs whose closest common PCIe ancestor is
// level, on PCIe generation gen with x16 links. Under one switch a pair gets
// the full x16 rate; each farther level loses an eighth (switch trees, then
// the root complex, then root ports of one socket); crossing the socket
// interconnect is modelled at 5/16 of the x16 rate (20 GB/s on Gen4,
// the busbw measured on pair-bridged boxes once a third GPU crosses PCIe).
// The absolute numbers are a model; what the allocator relies on is their
// order. An unknown generation counts as Gen4.
func PCIeBandwidthGBps(gen int, level v1alpha1.PCIeLevel) int {
	x16, ok := pcieX16GBps[gen]
	if !ok {
		x16 = pcieX16GBps[4]
	}
	switch level {
	case v1alpha1.PCIeInternal, v1alpha1.PCIeSameSwitch:
		return x16
	case v1alpha1.PCIeMultipleSwitches:
		return x16 * 7 / 8
	case v1alpha1.PCIeHostBridge:
		return x16 * 6 / 8
	case v1alpha1.PCIeSameNUMA:
		return x16 * 5 / 8
	}
	return x16 * 5 / 16
}

// NVLinkPair is a direct NVLink connection between two GPUs of a fixture.
type NVLinkPair struct {
	A, B  int
	Links int
}

// Fixture describes one real machine's GPU topology (DESIGN §4) once, for
// tests, the simulator, the demo and the node agent's simulated NVML.
type Fixture struct {
	Name        string
	Description string
	// Model is the GPU product name as NVML reports it.
	Model string
	// GPUs is the number of GPUs on the node.
	GPUs int
	// MemoryMiB is each GPU's framebuffer memory.
	MemoryMiB int64
	// NVLinkGen is the NVLink generation (0: none); NVLinkGBps the
	// bandwidth of one link, GB/s bidirectional.
	NVLinkGen, NVLinkGBps int
	// NVSwitchLinks is the number of NVLinks each GPU has into an NVSwitch
	// fabric joining every pair (0: no NVSwitch).
	NVSwitchLinks int
	// NVLinks lists direct NVLink pairs (machines without NVSwitch).
	NVLinks []NVLinkPair
	// PCIeGen is the PCIe generation of the GPUs' x16 links.
	PCIeGen int
	// PCIeSwitches groups the GPUs that share a PCIe switch.
	PCIeSwitches [][]int
	// Sockets groups the GPUs by CPU socket; a GPU's NUMA node is its
	// socket's position.
	Sockets [][]int
	// FabricClique, when set, is the multi-node NVLink domain of every GPU.
	FabricClique string

	// The fields below are what imported machines (Load, ImportSMI,
	// a node agent dump) carry beyond the hand-written fixtures; each is
	// optional and, when empty, the fixture behaves as before.

	// PCIeLevels, when set, is the closest common PCIe ancestor of every
	// pair (n×n, symmetric; the diagonal is not read). It overrides the
	// level PCIeSwitches and Sockets would give.
	PCIeLevels [][]v1alpha1.PCIeLevel
	// NUMANodes, when set, is each GPU's NUMA node (-1: unknown); otherwise
	// a GPU's NUMA node is its socket's position in Sockets.
	NUMANodes []int
	// PCIBusIDs, when set, is each GPU's PCI bus ID as NVML writes it;
	// otherwise the IDs are generated from the index.
	PCIBusIDs []string
	// NICs are the machine's network adapters with their PCIe distance to
	// every GPU (GPU↔NIC affinity, as nvidia-smi topo -m prints it).
	NICs []NIC
	// Source says where the description came from (a built-in fixture
	// leaves it empty).
	Source string
	// Notes record what an importer inferred rather than read, so that a
	// reader of the machine file can check it.
	Notes []string
}

// NIC is a network adapter of a machine and its PCIe distance to each GPU.
type NIC struct {
	Name string
	// PCIe[i] is the closest common PCIe ancestor of the NIC and GPU i.
	PCIe []v1alpha1.PCIeLevel
}

// Fixtures returns every machine in a stable order.
func Fixtures() []Fixture {
	quads := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	pairs := [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}
	p100 := []NVLinkPair{}
	for _, q := range quads {
		for i, a := range q {
			for _, b := range q[i+1:] {
				p100 = append(p100, NVLinkPair{a, b, 1})
			}
		}
	}
	for i := 0; i < 4; i++ {
		p100 = append(p100, NVLinkPair{i, i + 4, 1})
	}
	v100 := []NVLinkPair{
		{0, 3, 2}, {0, 4, 2}, {1, 2, 2}, {1, 5, 2}, {2, 3, 2}, {4, 7, 2}, {5, 6, 2}, {6, 7, 2},
		{0, 1, 1}, {0, 2, 1}, {1, 3, 1}, {2, 6, 1}, {3, 7, 1}, {4, 5, 1}, {4, 6, 1}, {5, 7, 1},
	}
	single := func(n int) [][]int {
		out := make([][]int, n)
		for i := range out {
			out[i] = []int{i}
		}
		return out
	}
	seq := func(from, to int) []int {
		out := []int{}
		for i := from; i < to; i++ {
			out = append(out, i)
		}
		return out
	}
	dgx2Switches := [][]int{}
	for i := 0; i < 16; i += 2 {
		dgx2Switches = append(dgx2Switches, []int{i, i + 1})
	}
	return []Fixture{
		{
			Name: "dgx1-p100", Description: "DGX-1 (P100): two fully NVLinked quads joined GPU i to i+4, 4 NVLink1 per GPU",
			Model: "Tesla P100-SXM2-16GB", GPUs: 8, MemoryMiB: 16384, NVLinkGen: 1, NVLinkGBps: 40,
			NVLinks: p100, PCIeGen: 3, PCIeSwitches: pairs, Sockets: quads,
		},
		{
			Name: "dgx1-v100", Description: "DGX-1 (V100): hybrid cube-mesh, 6 NVLink2 per GPU; only {0,1,2,3} and {4,5,6,7} are fully NVLinked quads",
			Model: "Tesla V100-SXM2-16GB", GPUs: 8, MemoryMiB: 16384, NVLinkGen: 2, NVLinkGBps: 50,
			NVLinks: v100, PCIeGen: 3, PCIeSwitches: pairs, Sockets: quads,
		},
		{
			Name: "dgx-a100", Description: "DGX A100: 8 GPUs on NVSwitch, 12 NVLink3 each (600 GB/s any pair)",
			Model: "NVIDIA A100-SXM4-40GB", GPUs: 8, MemoryMiB: 40960, NVLinkGen: 3, NVLinkGBps: 50, NVSwitchLinks: 12,
			PCIeGen: 4, PCIeSwitches: pairs, Sockets: quads,
		},
		{
			Name: "hgx-h100", Description: "HGX H100: 8 GPUs on NVSwitch, 18 NVLink4 each (900 GB/s any pair)",
			Model: "NVIDIA H100 80GB HBM3", GPUs: 8, MemoryMiB: 81559, NVLinkGen: 4, NVLinkGBps: 50, NVSwitchLinks: 18,
			PCIeGen: 5, PCIeSwitches: single(8), Sockets: quads,
		},
		{
			Name: "hgx-h200", Description: "HGX H200: 8 GPUs on NVSwitch, 18 NVLink4 each (900 GB/s any pair)",
			Model: "NVIDIA H200", GPUs: 8, MemoryMiB: 143771, NVLinkGen: 4, NVLinkGBps: 50, NVSwitchLinks: 18,
			PCIeGen: 5, PCIeSwitches: single(8), Sockets: quads,
		},
		{
			Name: "pcie-8x", Description: "8 PCIe L40S, no NVLink; two PCIe switches per socket",
			Model: "NVIDIA L40S", GPUs: 8, MemoryMiB: 46068,
			PCIeGen: 4, PCIeSwitches: pairs, Sockets: quads,
		},
		{
			Name: "pcie-8x-nvlink-pairs", Description: "8 PCIe A100 with NVLink bridges joining {0,1},{2,3},{4,5},{6,7} (12 NVLink3 per pair); one PCIe switch per socket",
			Model: "NVIDIA A100 80GB PCIe", GPUs: 8, MemoryMiB: 81920, NVLinkGen: 3, NVLinkGBps: 50,
			NVLinks: []NVLinkPair{{0, 1, 12}, {2, 3, 12}, {4, 5, 12}, {6, 7, 12}},
			PCIeGen: 4, PCIeSwitches: quads, Sockets: quads,
		},
		{
			Name: "dgx2", Description: "DGX-2: 16 V100 on NVSwitch, 6 NVLink2 each (300 GB/s any pair)",
			Model: "Tesla V100-SXM3-32GB", GPUs: 16, MemoryMiB: 32768, NVLinkGen: 2, NVLinkGBps: 50, NVSwitchLinks: 6,
			PCIeGen: 3, PCIeSwitches: dgx2Switches, Sockets: [][]int{seq(0, 8), seq(8, 16)},
		},
		{
			Name: "gb200-nvl72-tray", Description: "GB200 NVL72 compute tray: 4 GPUs, 18 NVLink5 each into the rack's NVSwitch fabric (1,800 GB/s any pair); the NVLink domain spans 18 trays",
			Model: "NVIDIA GB200", GPUs: 4, MemoryMiB: 189471, NVLinkGen: 5, NVLinkGBps: 100, NVSwitchLinks: 18,
			PCIeGen: 5, PCIeSwitches: single(4), Sockets: [][]int{{0, 1}, {2, 3}},
			FabricClique: "6e7f2a31-9a0c-4c1b-8f43-72d1a0b9c072.1",
		},
	}
}

// FixtureByName finds a fixture; an unknown name is an error listing the
// known ones.
func FixtureByName(name string) (Fixture, error) {
	var names []string
	for _, f := range Fixtures() {
		if f.Name == name {
			return f, nil
		}
		names = append(names, f.Name)
	}
	return Fixture{}, fmt.Errorf("fixture %q: unknown; known fixtures are %s", name, strings.Join(names, ", "))
}

// PCIeLevel is the closest common PCIe ancestor of GPUs a and b in the
// fixture: same switch, else same socket (different root ports of one
// NUMA node), else across sockets.
func (f Fixture) PCIeLevel(a, b int) v1alpha1.PCIeLevel {
	if a >= 0 && a < len(f.PCIeLevels) && b >= 0 && b < len(f.PCIeLevels[a]) {
		return f.PCIeLevels[a][b]
	}
	if groupOf(f.PCIeSwitches, a) == groupOf(f.PCIeSwitches, b) && groupOf(f.PCIeSwitches, a) >= 0 {
		return v1alpha1.PCIeSameSwitch
	}
	if groupOf(f.Sockets, a) == groupOf(f.Sockets, b) && groupOf(f.Sockets, a) >= 0 {
		return v1alpha1.PCIeSameNUMA
	}
	return v1alpha1.PCIeCrossSocket
}

func groupOf(groups [][]int, i int) int {
	for g, members := range groups {
		for _, m := range members {
			if m == i {
				return g
			}
		}
	}
	return -1
}

// NUMANode is GPU i's NUMA node: NUMANodes when given, else its socket's
// position in Sockets, else -1 (unknown).
func (f Fixture) NUMANode(i int) int {
	if i >= 0 && i < len(f.NUMANodes) {
		return f.NUMANodes[i]
	}
	return max(groupOf(f.Sockets, i), -1)
}

// BusID is GPU i's PCI bus ID: PCIBusIDs when given, else one generated
// from the index (07, 17, 27, ... as on many 8-GPU boards).
func (f Fixture) BusID(i int) string {
	if i >= 0 && i < len(f.PCIBusIDs) && f.PCIBusIDs[i] != "" {
		return f.PCIBusIDs[i]
	}
	return fmt.Sprintf("00000000:%02X:00.0", 0x07+i*0x10)
}

// Link is the fixture's link between a and b (a != b), bandwidth included.
func (f Fixture) Link(a, b int) v1alpha1.Link {
	if a > b {
		a, b = b, a
	}
	l := v1alpha1.Link{A: a, B: b, PCIe: f.PCIeLevel(a, b)}
	switch {
	case f.NVSwitchLinks > 0:
		l.NVLinks, l.NVSwitch = f.NVSwitchLinks, true
	default:
		for _, p := range f.NVLinks {
			if (p.A == a && p.B == b) || (p.A == b && p.B == a) {
				l.NVLinks = p.Links
			}
		}
	}
	if l.NVLinks > 0 {
		l.BandwidthGBps = l.NVLinks * f.NVLinkGBps
		l.P2P = true
	} else {
		l.BandwidthGBps = PCIeBandwidthGBps(f.PCIeGen, l.PCIe)
		l.P2P = l.PCIe != v1alpha1.PCIeCrossSocket
	}
	return l
}

// Graph builds the fixture for a node. UUIDs derive from nodeName and the
// index, so every node differs and every run agrees; PCI bus IDs and NUMA
// nodes are the same on every node, and so is the hash.
func (f Fixture) Graph(nodeName string) *topology.Graph {
	gpus, links := f.Parts(nodeName)
	g, err := topology.NewGraph(gpus, links)
	if err != nil {
		// Fixtures are fixed data checked by the package's tests.
		panic(fmt.Sprintf("fixture %s is invalid: %v", f.Name, err))
	}
	return g
}

// Parts returns the fixture's GPUs and links for a node, before validation.
func (f Fixture) Parts(nodeName string) ([]v1alpha1.GPU, []v1alpha1.Link) {
	gpus := make([]v1alpha1.GPU, f.GPUs)
	for i := range gpus {
		gpus[i] = v1alpha1.GPU{
			Index:        i,
			UUID:         FixtureUUID(nodeName, i),
			Model:        f.Model,
			MemoryMiB:    f.MemoryMiB,
			NUMANode:     f.NUMANode(i),
			PCIBusID:     f.BusID(i),
			Health:       v1alpha1.GPUHealthy,
			FabricClique: f.FabricClique,
		}
	}
	var links []v1alpha1.Link
	for a := 0; a < f.GPUs; a++ {
		for b := a + 1; b < f.GPUs; b++ {
			links = append(links, f.Link(a, b))
		}
	}
	return gpus, links
}

// FixtureUUID is the deterministic UUID of GPU index on node nodeName, in
// NVML's "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" form.
func FixtureUUID(nodeName string, index int) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", nodeName, index))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}
