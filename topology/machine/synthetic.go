package machine

import (
	"fmt"
	"math/rand/v2"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Synthetic nodes larger than any fixture, for the tests and benchmarks of
// the allocator's bounds: the budget must hold on any graph the builder
// accepts, so these are built to be hard rather than realistic. Every one
// is deterministic (its seed included).

// SyntheticGPUs returns n GPUs with distinct UUIDs and bus IDs, NUMA node
// by half.
func SyntheticGPUs(name string, n int) []v1alpha1.GPU {
	gpus := make([]v1alpha1.GPU, n)
	for i := range gpus {
		gpus[i] = v1alpha1.GPU{
			Index: i, UUID: FixtureUUID(name, i), Model: "synthetic", MemoryMiB: 81920,
			NUMANode: i * 2 / n, PCIBusID: fmt.Sprintf("00000000:%02X:00.0", i+1), Health: v1alpha1.GPUHealthy,
		}
	}
	return gpus
}

// SyntheticPCIeLevel is the PCIe level of GPUs a and b of n placed in a
// tree: pairs share a switch, fours a switch tree, eights a host bridge,
// halves a socket.
func SyntheticPCIeLevel(n, a, b int) v1alpha1.PCIeLevel {
	switch {
	case a/2 == b/2:
		return v1alpha1.PCIeSameSwitch
	case a/4 == b/4:
		return v1alpha1.PCIeMultipleSwitches
	case a/8 == b/8:
		return v1alpha1.PCIeHostBridge
	case a*2/n == b*2/n:
		return v1alpha1.PCIeSameNUMA
	}
	return v1alpha1.PCIeCrossSocket
}

// Synthetic builds a node of n GPUs (SyntheticGPUs) whose pair a<b is
// link(a, b), A and B filled in; it panics on links NewGraph refuses.
func Synthetic(name string, n int, link func(a, b int) v1alpha1.Link) *topology.Graph {
	var links []v1alpha1.Link
	for a := 0; a < n; a++ {
		for b := a + 1; b < n; b++ {
			l := link(a, b)
			l.A, l.B = a, b
			links = append(links, l)
		}
	}
	g, err := topology.NewGraph(SyntheticGPUs(name, n), links)
	if err != nil {
		panic(fmt.Sprintf("synthetic graph %s: %v", name, err))
	}
	return g
}

// SyntheticNVSwitch is n GPUs on one NVSwitch fabric (900 GB/s any pair):
// every set ties on bandwidth.
func SyntheticNVSwitch(n int) *topology.Graph {
	return Synthetic("nvswitch", n, func(a, b int) v1alpha1.Link {
		return v1alpha1.Link{NVLinks: 18, NVSwitch: true, P2P: true, PCIe: SyntheticPCIeLevel(n, a, b), BandwidthGBps: 900}
	})
}

// SyntheticRandomNVLink joins each pair by 1..4 direct NVLinks with
// probability p, with bandwidths that differ by a few GB/s (many near-equal
// levels), and the rest by PCIe.
func SyntheticRandomNVLink(n int, p float64, seed uint64) *topology.Graph {
	rng := rand.New(rand.NewPCG(seed, 7))
	return Synthetic(fmt.Sprintf("random-nvlink-%v-%d", p, seed), n, func(a, b int) v1alpha1.Link {
		lvl := SyntheticPCIeLevel(n, a, b)
		if rng.Float64() < p {
			links := 1 + rng.IntN(4)
			return v1alpha1.Link{NVLinks: links, P2P: true, PCIe: lvl, BandwidthGBps: links*50 + rng.IntN(4)}
		}
		return v1alpha1.Link{PCIe: lvl, P2P: lvl != v1alpha1.PCIeCrossSocket, BandwidthGBps: PCIeBandwidthGBps(4, lvl) - rng.IntN(3)}
	})
}

// SyntheticPCIe is n PCIe GPUs in a tree of many domains (switch pairs,
// switch trees of four, host bridges of eight, two sockets), no NVLink.
func SyntheticPCIe(n int) *topology.Graph {
	return Synthetic("pcie", n, func(a, b int) v1alpha1.Link {
		lvl := SyntheticPCIeLevel(n, a, b)
		return v1alpha1.Link{PCIe: lvl, P2P: lvl != v1alpha1.PCIeCrossSocket, BandwidthGBps: PCIeBandwidthGBps(5, lvl)}
	})
}
