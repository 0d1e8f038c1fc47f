// Package nvmllevel maps NVML's PCIe common-ancestor levels to the API's
// names and back: discovery reads them, the simulated NVML answers them.
package nvmllevel

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// levels pairs NVML's common-ancestor levels with the API's names; any
// other level (TOPOLOGY_SYSTEM) is cross-socket.
var levels = [...]struct {
	nvml nvml.GpuTopologyLevel
	api  v1alpha1.PCIeLevel
}{
	{nvml.TOPOLOGY_INTERNAL, v1alpha1.PCIeInternal},
	{nvml.TOPOLOGY_SINGLE, v1alpha1.PCIeSameSwitch},
	{nvml.TOPOLOGY_MULTIPLE, v1alpha1.PCIeMultipleSwitches},
	{nvml.TOPOLOGY_HOSTBRIDGE, v1alpha1.PCIeHostBridge},
	{nvml.TOPOLOGY_NODE, v1alpha1.PCIeSameNUMA},
}

// API maps NVML's common-ancestor level onto the API's name.
func API(l nvml.GpuTopologyLevel) v1alpha1.PCIeLevel {
	for _, p := range levels {
		if p.nvml == l {
			return p.api
		}
	}
	return v1alpha1.PCIeCrossSocket
}

// NVML is API the other way round.
func NVML(l v1alpha1.PCIeLevel) nvml.GpuTopologyLevel {
	for _, p := range levels {
		if p.api == l {
			return p.nvml
		}
	}
	return nvml.TOPOLOGY_SYSTEM
}

// Rank orders the API's levels from nearest (0) to farthest, in the order
// above; cross-socket is farthest.
func Rank(l v1alpha1.PCIeLevel) int {
	for i, p := range levels {
		if p.api == l {
			return i
		}
	}
	return len(levels)
}
