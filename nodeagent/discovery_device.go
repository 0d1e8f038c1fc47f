package nodeagent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// deviceInfo is what one GPU says about itself and its NVLinks.
type deviceInfo struct {
	gpu    v1alpha1.GPU
	dev    nvml.Device
	busKey string
	// ends are the GPU's active NVLinks as it reports them; resolve sorts
	// them into toGPU and switchLinks once every GPU's bus ID is known.
	ends        []linkEnd
	toGPU       map[int]int // remote GPU index -> active links to it
	switchLinks int         // active links into an NVSwitch
	linkGBps    int         // bandwidth of one NVLink, GB/s bidirectional; 0: unknown
	pcieGen     int
	lost        bool
}

// linkEnd is one active NVLink as the GPU that owns it reports it.
type linkEnd struct {
	link      int
	remoteBus string // as NVML wrote it; "" when the driver would not say
	kind      nvml.IntNvLinkDeviceType
	kindKnown bool // false when GetNvLinkRemoteDeviceType is not supported
}

// readDevice reads one GPU. A GPU lost after it was first read keeps its
// last-known facts and is marked unhealthy; one lost before that makes
// discovery fail, because its identity (UUID) is unknown.
func (s *NVMLSource) readDevice(i int) (*deviceInfo, error) {
	lost := func() (*deviceInfo, error) {
		last, ok := s.lastGPUs[i]
		if !ok {
			return nil, fmt.Errorf("gpu %d: lost before its identity could be read: %w", i, errGPULost)
		}
		s.setHealth(i, ReasonGPULost)
		last.Health, last.HealthReason = v1alpha1.GPUUnhealthy, ReasonGPULost
		return &deviceInfo{gpu: last, busKey: busKey(last.PCIBusID), lost: true}, nil
	}
	dev, ret := s.lib.DeviceGetHandleByIndex(i)
	if ok, err := s.check("DeviceGetHandleByIndex", ret); !ok {
		if errors.Is(err, errGPULost) {
			return lost()
		}
		if err == nil {
			err = fmt.Errorf("nvml DeviceGetHandleByIndex(%d): %w", i, ret)
		}
		return nil, err
	}
	info := &deviceInfo{dev: dev, gpu: v1alpha1.GPU{Index: i, NUMANode: -1, Health: v1alpha1.GPUHealthy}}
	uuid, ret := dev.GetUUID()
	if ok, err := s.check("GetUUID", ret); !ok {
		if errors.Is(err, errGPULost) {
			return lost()
		}
		if err == nil {
			err = fmt.Errorf("nvml GetUUID: %w", ret)
		}
		return nil, fmt.Errorf("gpu %d: %w", i, err)
	}
	info.gpu.UUID = uuid
	// Every further call degrades: a missing fact is published as unknown.
	var lostErr error
	soft := func(call string, ret nvml.Return) bool {
		ok, err := s.check(call, ret)
		if errors.Is(err, errGPULost) {
			lostErr = err
		} else if err != nil {
			s.logger.V(2).Info("NVML call failed; publishing the fact as unknown", "call", call, "gpu", i, "err", err)
		}
		return ok
	}
	if name, ret := dev.GetName(); soft("GetName", ret) {
		info.gpu.Model = name
	}
	if mem, ret := dev.GetMemoryInfo(); soft("GetMemoryInfo", ret) {
		info.gpu.MemoryMiB = int64(mem.Total / (1 << 20))
	}
	if pci, ret := dev.GetPciInfo(); soft("GetPciInfo", ret) {
		info.gpu.PCIBusID = busIDString(pci)
		info.busKey = busKey(info.gpu.PCIBusID)
	}
	if numa, ret := dev.GetNumaNodeId(); soft("GetNumaNodeId", ret) {
		info.gpu.NUMANode = numa
	} else if s.numaFallback != nil && info.gpu.PCIBusID != "" {
		info.gpu.NUMANode = s.numaFallback(info.gpu.PCIBusID)
	}
	if fi, ret := dev.GetGpuFabricInfo(); soft("GetGpuFabricInfo", ret) {
		info.gpu.FabricClique = fabricClique(fi)
	}
	if gen, ret := dev.GetMaxPcieLinkGeneration(); soft("GetMaxPcieLinkGeneration", ret) {
		info.pcieGen = gen
	}
	s.readNVLinks(info, soft)
	if lostErr != nil {
		return lost()
	}
	if _, wasLost := s.health[i]; wasLost && s.health[i] == ReasonGPULost {
		// The GPU answers again (e.g. after a reset): lost no longer holds.
		s.setHealth(i, "")
	}
	return info, nil
}

// readNVLinks records the GPU's active NVLinks with what NVML says is on
// the other end (type and PCI bus ID); resolve sorts them once every GPU's
// bus ID is known. Links are probed from 0 until the driver says the link
// does not exist.
func (s *NVMLSource) readNVLinks(info *deviceInfo, soft func(string, nvml.Return) bool) {
	for link := 0; link < nvml.NVLINK_MAX_LINKS; link++ {
		state, ret := info.dev.GetNvLinkState(link)
		if ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_NOT_FOUND {
			break // past the GPU's last link
		}
		if !soft("GetNvLinkState", ret) {
			break // no NVLink on this GPU, or it is lost
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		e := linkEnd{link: link}
		if remote, ret := info.dev.GetNvLinkRemotePciInfo(link); soft("GetNvLinkRemotePciInfo", ret) {
			e.remoteBus = busIDString(remote)
		}
		if kind, ret := info.dev.GetNvLinkRemoteDeviceType(link); soft("GetNvLinkRemoteDeviceType", ret) {
			e.kind, e.kindKnown = kind, true
		}
		info.ends = append(info.ends, e)
		if info.linkGBps == 0 {
			info.linkGBps = s.nvlinkGBps(info.dev, link, soft)
		}
	}
}

// nvlinkGBpsByVersion is one NVLink's bandwidth, GB/s bidirectional, by
// nvmlNvlinkVersion_t (1: 1.0, 2: 2.0, 3: 2.2, 4: 3.0, 5: 3.1, 6: 4.0,
// 7: 5.0), NVIDIA's published per-link figures.
var nvlinkGBpsByVersion = map[uint32]int{1: 40, 2: 50, 3: 50, 4: 50, 5: 50, 6: 50, 7: 100, 8: 100}

// nvlinkGBps prefers the measured link speed (FI_DEV_NVLINK_SPEED_MBPS_COMMON,
// MB/s per direction) snapped to the published figure when within 10%
// (a reading of 0 or above topology.MaxPairGBps is not believed), then
// the NVLink version, then 50 GB/s, the most common per-link rate.
func (s *NVMLSource) nvlinkGBps(dev nvml.Device, link int, soft func(string, nvml.Return) bool) int {
	fv := []nvml.FieldValue{{FieldId: nvml.FI_DEV_NVLINK_SPEED_MBPS_COMMON}}
	if soft("GetFieldValues", dev.GetFieldValues(fv)) && fv[0].NvmlReturn == uint32(nvml.SUCCESS) {
		// A speed no link can have (above the ceiling on a whole pair, or
		// rounding to 0) is a bad reading, not a fast link.
		if mbps := fieldUint(fv[0]); mbps >= 500 && mbps <= topology.MaxPairGBps*1000/2 {
			bidi := int(2 * mbps / 1000)
			for _, published := range []int{40, 50, 100} {
				if bidi*10 >= published*9 && bidi*10 <= published*11 {
					return published
				}
			}
			return bidi
		}
	}
	if v, ret := dev.GetNvLinkVersion(link); soft("GetNvLinkVersion", ret) {
		if gbps, ok := nvlinkGBpsByVersion[v]; ok {
			return gbps
		}
	}
	return 50
}

// fieldUint reads a field value's unsigned payload, little-endian as NVML
// writes it.
func fieldUint(v nvml.FieldValue) uint64 {
	var out uint64
	for i := 7; i >= 0; i-- {
		out = out<<8 | uint64(v.Value[i])
	}
	switch v.ValueType {
	case uint32(nvml.VALUE_TYPE_UNSIGNED_INT):
		return out & 0xffffffff
	}
	return out
}

func nonZero(gbps int) int {
	if gbps == 0 {
		return 50
	}
	return gbps
}

// nonZeroGen: an unknown PCIe generation counts as Gen4, as in topology.
func nonZeroGen(gen int) int {
	if gen == 0 {
		return 4
	}
	return gen
}

// busIDString reads PciInfo.BusId, a NUL-terminated C string.
func busIDString(p nvml.PciInfo) string {
	var b strings.Builder
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	if b.Len() == 0 {
		return fmt.Sprintf("%08x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
	}
	return b.String()
}

// busKey normalises a bus ID for matching: NVML writes the domain with 8
// digits in some calls and 4 in others, upper or lower case.
func busKey(id string) string {
	id = strings.ToLower(id)
	if i := strings.IndexByte(id, ':'); i > 0 {
		dom := strings.TrimLeft(id[:i], "0")
		id = dom + id[i:]
	}
	return id
}

// fabricClique names the GPU's multi-node NVLink domain as
// "<cluster UUID>.<clique ID>", empty unless fabric registration completed.
func fabricClique(fi nvml.GpuFabricInfo) string {
	if fi.State != nvml.GPU_FABRIC_STATE_COMPLETED || nvml.Return(fi.Status) != nvml.SUCCESS {
		return ""
	}
	zero := true
	for _, b := range fi.ClusterUuid {
		if b != 0 {
			zero = false
		}
	}
	if zero {
		return ""
	}
	u := fi.ClusterUuid
	return fmt.Sprintf("%x-%x-%x-%x-%x.%d", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16], fi.CliqueId)
}

// throttleNames are the clock event reasons worth publishing; idle and
// application clock settings are not throttling.
var throttleNames = []struct {
	bit  uint64
	name string
}{
	{nvml.ClocksEventReasonSwPowerCap, "SwPowerCap"},
	{nvml.ClocksThrottleReasonHwSlowdown, "HwSlowdown"},
	{nvml.ClocksEventReasonSyncBoost, "SyncBoost"},
	{nvml.ClocksEventReasonSwThermalSlowdown, "SwThermalSlowdown"},
	{nvml.ClocksThrottleReasonHwThermalSlowdown, "HwThermalSlowdown"},
	{nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "HwPowerBrakeSlowdown"},
}

// Telemetry implements Source. A GPU that is lost gets zero telemetry and is
// marked unhealthy; an unsupported reading is published as zero.
func (s *NVMLSource) Telemetry() ([]v1alpha1.Telemetry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ensureInit(); err != nil {
		return nil, err
	}
	count, ret := s.lib.DeviceGetCount()
	if ok, err := s.check("DeviceGetCount", ret); !ok {
		if err == nil {
			err = fmt.Errorf("nvml DeviceGetCount: %w", ret)
		}
		return nil, err
	}
	out := make([]v1alpha1.Telemetry, count)
	for i := 0; i < count; i++ {
		out[i].Index = i
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		lost := false
		soft := func(call string, ret nvml.Return) bool {
			ok, err := s.check(call, ret)
			if errors.Is(err, errGPULost) {
				lost = true
			}
			return ok
		}
		if !soft("DeviceGetHandleByIndex", ret) {
			if lost {
				s.setHealth(i, ReasonGPULost)
			}
			continue
		}
		t := &out[i]
		if u, ret := dev.GetUtilizationRates(); soft("GetUtilizationRates", ret) {
			t.UtilizationPercent = int32(u.Gpu)
		}
		if m, ret := dev.GetMemoryInfo(); soft("GetMemoryInfo", ret) {
			t.MemoryUsedMiB = int64(m.Used / (1 << 20))
		}
		if c, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); soft("GetTemperature", ret) {
			t.TemperatureC = int32(c)
		}
		if mw, ret := dev.GetPowerUsage(); soft("GetPowerUsage", ret) {
			t.PowerWatts = int32(mw / 1000)
		}
		if mw, ret := dev.GetEnforcedPowerLimit(); soft("GetEnforcedPowerLimit", ret) {
			t.PowerLimitWatts = int32(mw / 1000)
		}
		if r, ret := dev.GetCurrentClocksEventReasons(); soft("GetCurrentClocksEventReasons", ret) {
			for _, n := range throttleNames {
				if r&n.bit != 0 {
					t.ThrottleReasons = append(t.ThrottleReasons, n.name)
				}
			}
		}
		if lost {
			out[i] = v1alpha1.Telemetry{Index: i}
			s.setHealth(i, ReasonGPULost)
		}
		s.metrics.observeTelemetry(out[i])
	}
	return out, nil
}
