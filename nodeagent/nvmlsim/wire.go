package nvmlsim

import (
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gputopo/gputopo/nodeagent/internal/nvmllevel"
)

// nvlinkVersion is nvmlNvlinkVersion_t for an NVLink generation.
func nvlinkVersion(gen int) uint32 {
	return map[int]uint32{1: 1, 2: 2, 3: 4, 4: 6, 5: 7}[gen]
}

func pciInfo(busID string) nvml.PciInfo {
	var p nvml.PciInfo
	for k := 0; k < len(busID) && k < len(p.BusId)-1; k++ {
		p.BusId[k] = int8(busID[k])
	}
	parts := strings.Split(busID, ":")
	if len(parts) == 3 {
		d, _ := strconv.ParseUint(parts[0], 16, 32)
		b, _ := strconv.ParseUint(parts[1], 16, 32)
		p.Domain, p.Bus = uint32(d), uint32(b)
	}
	return p
}

// fabricInfo parses a fixture clique "<cluster UUID>.<clique ID>".
func fabricInfo(clique string) (nvml.GpuFabricInfo, bool) {
	dot := strings.LastIndexByte(clique, '.')
	if dot < 0 {
		return nvml.GpuFabricInfo{}, false
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(clique[:dot], "-", ""))
	id, err2 := strconv.ParseUint(clique[dot+1:], 10, 32)
	if err != nil || err2 != nil || len(raw) != 16 {
		return nvml.GpuFabricInfo{}, false
	}
	fi := nvml.GpuFabricInfo{CliqueId: uint32(id), State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS)}
	copy(fi.ClusterUuid[:], raw)
	return fi, true
}

// wireDevice makes GPU i's mock device answer from the machine and the
// simulator's state.
func (s *Simulator) wireDevice(i int) {
	s.wireIdentity(i)
	s.wireNVLinks(i)
	s.wirePairs(i)
	s.wireReadings(i)
}

// wireIdentity answers what GPU i is: index, UUID, model, memory, PCI bus
// ID, NUMA node, PCIe generation and fabric clique.
func (s *Simulator) wireIdentity(i int) {
	d, gpu, f := s.devices[i], s.gpus[i], s.fixture
	d.GetIndexFunc = func() (int, nvml.Return) { return i, s.gate(i, "GetIndex") }
	d.GetUUIDFunc = func() (string, nvml.Return) {
		if r := s.gate(i, "GetUUID"); r != nvml.SUCCESS {
			return "", r
		}
		return gpu.UUID, nvml.SUCCESS
	}
	d.GetNameFunc = func() (string, nvml.Return) { return gpu.Model, s.gate(i, "GetName") }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if r := s.gate(i, "GetMemoryInfo"); r != nvml.SUCCESS {
			return nvml.Memory{}, r
		}
		s.mu.Lock()
		used := s.tel[i].MemoryUsedMiB << 20
		s.mu.Unlock()
		total := uint64(gpu.MemoryMiB) << 20
		return nvml.Memory{Total: total, Used: used, Free: total - min(used, total)}, nvml.SUCCESS
	}
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		if r := s.gate(i, "GetPciInfo"); r != nvml.SUCCESS {
			return nvml.PciInfo{}, r
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		return pciInfo(s.busIDs[i]), nvml.SUCCESS
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return gpu.NUMANode, s.gate(i, "GetNumaNodeId") }
	d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return f.PCIeGen, s.gate(i, "GetMaxPcieLinkGeneration") }
	d.GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		if r := s.gate(i, "GetGpuFabricInfo"); r != nvml.SUCCESS {
			return nvml.GpuFabricInfo{}, r
		}
		fi, ok := fabricInfo(gpu.FabricClique)
		if !ok {
			return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return fi, nvml.SUCCESS
	}
}

// wireNVLinks answers GPU i's NVLinks: their state, remote ends, version
// and speed.
func (s *Simulator) wireNVLinks(i int) {
	d, f := s.devices[i], s.fixture
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if r := s.gate(i, "GetNvLinkState"); r != nvml.SUCCESS {
			return nvml.FEATURE_DISABLED, r
		}
		links := s.linksOf(i)
		if len(links) == 0 {
			return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
		}
		if link < 0 || link >= len(links) {
			return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		l, r := s.nvlink(i, "GetNvLinkRemotePciInfo", link)
		if r != nvml.SUCCESS {
			return nvml.PciInfo{}, r
		}
		return pciInfo(l.RemoteBusID), nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		l, r := s.nvlink(i, "GetNvLinkRemoteDeviceType", link)
		if r != nvml.SUCCESS {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, r
		}
		return l.RemoteType, nvml.SUCCESS
	}
	d.GetNvLinkVersionFunc = func(link int) (uint32, nvml.Return) {
		if r := s.gate(i, "GetNvLinkVersion"); r != nvml.SUCCESS {
			return 0, r
		}
		return nvlinkVersion(f.NVLinkGen), nvml.SUCCESS
	}
	d.GetFieldValuesFunc = func(values []nvml.FieldValue) nvml.Return {
		if r := s.gate(i, "GetFieldValues"); r != nvml.SUCCESS {
			return r
		}
		links := s.linksOf(i)
		s.mu.Lock()
		gbps := s.linkGBps[i]
		s.mu.Unlock()
		for k := range values {
			v := &values[k]
			if v.FieldId != nvml.FI_DEV_NVLINK_SPEED_MBPS_COMMON || len(links) == 0 {
				v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
				continue
			}
			// MB/s per direction: half the bidirectional GB/s.
			mbps := uint32(gbps * 1000 / 2)
			v.ValueType, v.NvmlReturn = uint32(nvml.VALUE_TYPE_UNSIGNED_INT), uint32(nvml.SUCCESS)
			v.Value = [8]byte{byte(mbps), byte(mbps >> 8), byte(mbps >> 16), byte(mbps >> 24)}
		}
		return nvml.SUCCESS
	}
}

// nvlink is GPU i's NVLink link as call reports it: what gate says, else
// ERROR_INVALID_ARGUMENT past the GPU's last link.
func (s *Simulator) nvlink(i int, call string, link int) (NVLink, nvml.Return) {
	if r := s.gate(i, call); r != nvml.SUCCESS {
		return NVLink{}, r
	}
	links := s.linksOf(i)
	if link < 0 || link >= len(links) {
		return NVLink{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return links[link], nvml.SUCCESS
}

// wirePairs answers what GPU i says of another GPU: their common PCIe
// ancestor and P2P support.
func (s *Simulator) wirePairs(i int) {
	d, f := s.devices[i], s.fixture
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		j := s.indexOf(other)
		if r := s.gate(i, "GetTopologyCommonAncestor"); r != nvml.SUCCESS {
			return 0, r
		}
		if j < 0 {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if r := s.gate(j, "GetTopologyCommonAncestor"); r != nvml.SUCCESS {
			return 0, r
		}
		s.mu.Lock()
		level, ok := s.levels[[2]int{i, j}]
		s.mu.Unlock()
		if !ok {
			level = f.PCIeLevel(i, j)
		}
		return nvmllevel.NVML(level), nvml.SUCCESS
	}
	d.GetP2PStatusFunc = func(other nvml.Device, _ nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
		j := s.indexOf(other)
		if r := s.gate(i, "GetP2PStatus"); r != nvml.SUCCESS {
			return nvml.P2P_STATUS_UNKNOWN, r
		}
		if j < 0 || j == i {
			return nvml.P2P_STATUS_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
		}
		s.mu.Lock()
		ok, set := s.p2p[[2]int{i, j}]
		s.mu.Unlock()
		if !set {
			ok = f.Link(i, j).P2P
		}
		if ok {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		return nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED, nvml.SUCCESS
	}
}

// wireReadings answers GPU i's telemetry and its XID events.
func (s *Simulator) wireReadings(i int) {
	d := s.devices[i]
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		if r := s.gate(i, "GetUtilizationRates"); r != nvml.SUCCESS {
			return nvml.Utilization{}, r
		}
		t, n := s.read(i)
		u := t.UtilizationPercent
		if t.UtilizationPercent == 0 && n%4 == 1 {
			u = 1
		}
		return nvml.Utilization{Gpu: u}, nvml.SUCCESS
	}
	d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) {
		if r := s.gate(i, "GetTemperature"); r != nvml.SUCCESS {
			return 0, r
		}
		s.mu.Lock()
		if h := s.heat[i]; h.perRead > 0 && s.tel[i].TemperatureC < h.max {
			s.tel[i].TemperatureC = min(s.tel[i].TemperatureC+h.perRead, h.max)
		}
		s.mu.Unlock()
		t, n := s.read(i)
		return t.TemperatureC + uint32(n%2), nvml.SUCCESS
	}
	d.GetPowerUsageFunc = func() (uint32, nvml.Return) {
		if r := s.gate(i, "GetPowerUsage"); r != nvml.SUCCESS {
			return 0, r
		}
		t, n := s.read(i)
		return (t.PowerWatts + uint32(n%3)) * 1000, nvml.SUCCESS
	}
	d.GetEnforcedPowerLimitFunc = func() (uint32, nvml.Return) {
		if r := s.gate(i, "GetEnforcedPowerLimit"); r != nvml.SUCCESS {
			return 0, r
		}
		t, _ := s.read(i)
		return t.PowerLimitWatts * 1000, nvml.SUCCESS
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
		if r := s.gate(i, "GetCurrentClocksEventReasons"); r != nvml.SUCCESS {
			return 0, r
		}
		t, _ := s.read(i)
		r := t.ThrottleReasons
		if t.TemperatureC >= 85 {
			r |= nvml.ClocksEventReasonSwThermalSlowdown
		}
		return r, nvml.SUCCESS
	}
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return s.gate(i, "RegisterEvents") }
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError, s.gate(i, "GetSupportedEventTypes")
	}
}

// read returns GPU i's readings and a read counter for the jitter (always
// 0 with jitter off). The counter advances once per utilization read, that
// is once per telemetry round.
func (s *Simulator) read(i int) (Telemetry, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.jitter {
		return s.tel[i], 0
	}
	return s.tel[i], s.reads[i]
}

func (s *Simulator) wireInterface() {
	s.lib = &mock.Interface{
		InitFunc: func() nvml.Return {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.initRet
		},
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return SimulatedDriverVersion, nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return len(s.devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(s.devices) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			if r := s.gate(i, "DeviceGetHandleByIndex"); r != nvml.SUCCESS {
				return nil, r
			}
			s.mu.Lock()
			s.reads[i]++
			s.mu.Unlock()
			return s.devices[i], nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) {
			return &mock.EventSet{
				WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
					select {
					case ev := <-s.events:
						return ev, nvml.SUCCESS
					case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
						return nvml.EventData{}, nvml.ERROR_TIMEOUT
					}
				},
				FreeFunc: func() nvml.Return { return nvml.SUCCESS },
			}, nvml.SUCCESS
		},
	}
}
