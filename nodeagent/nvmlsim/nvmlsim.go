// Package nvmlsim is a simulated NVML: go-nvml's mock interface answering
// as a machine fixture's driver would (devices, NVLinks, PCIe levels, P2P,
// memory, telemetry, XID events), with faults a test can inject. The node
// agent runs the same NVML code path on it as on a real node
// (`gputopo nodeagent --simulate`); nothing in it touches a GPU.
package nvmlsim

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent/internal/nvmllevel"
	"github.com/gputopo/gputopo/topology/machine"
)

// SimulatedDriverVersion is the driver version a simulated node reports.
const SimulatedDriverVersion = "550.54.15"

// Telemetry is one simulated GPU's readings.
type Telemetry struct {
	UtilizationPercent uint32
	MemoryUsedMiB      uint64
	TemperatureC       uint32
	PowerWatts         uint32
	PowerLimitWatts    uint32
	// ThrottleReasons is an NVML clocks-event-reasons bit mask.
	ThrottleReasons uint64
}

// Simulator is a GPU node built from a machine description (a built-in
// topology fixture or a machine file, see machine.Load) behind
// go-nvml's mock.Interface: every NVML answer the discovery code asks for
// (devices, common PCIe ancestors, NVLink state and remote ends, NVSwitches,
// P2P, fabric clique, telemetry, XID events) comes from the machine, its
// explicit per-pair PCIe levels, NUMA nodes and PCI bus IDs included, so the
// simulated agent runs the real NVML code path on the user's machine shape.
// It never loads libnvidia-ml.so.
//
// go-nvml's ready-made machines (mock/dgxa100, ...) are not used: they
// cover four of the fixtures, draw random UUIDs and leave the topology and
// NVLink calls unset, which is exactly what a fixture must answer.
//
// Tests and the demo script it: SetTelemetry, HeatUp, LoseGPU, InjectXID,
// FailInit and Unsupported. Tests of hostile or broken machines also make
// single answers lie: SetNVLinks, SetBusID, SetPCIeLevel, SetP2P and
// SetNVLinkGBps change what one GPU reports without touching the others.
// All methods are safe for concurrent use.
type Simulator struct {
	fixture machine.Fixture
	gpus    []v1alpha1.GPU
	lib     *mock.Interface
	devices []*mock.Device

	mu sync.Mutex
	// links, busIDs and linkGBps are what each GPU reports about its
	// NVLinks, its own bus ID and its per-link speed; levels and p2p hold
	// one-directional overrides of the fixture's answers, keyed by
	// (asking GPU, other GPU).
	links       [][]NVLink
	busIDs      []string
	linkGBps    []int
	levels      map[[2]int]v1alpha1.PCIeLevel
	p2p         map[[2]int]bool
	tel         []Telemetry
	heat        []heatScript
	reads       []uint64
	lost        []bool
	initRet     nvml.Return
	unsupported map[string]bool
	jitter      bool
	events      chan nvml.EventData
}

type heatScript struct {
	perRead, max uint32
}

// New builds the simulated NVML of node nodeName from fixture (any
// machine: machine.Load's answer). UUIDs are derived from the node
// name (machine.FixtureUUID) and PCI bus IDs are the machine's, so the
// extender and tests can name GPUs without asking the node. Idle GPUs read 30 °C, 0%
// and 60 W with a small deterministic jitter, as real idle GPUs do.
func New(fixture machine.Fixture, nodeName string) *Simulator {
	gpus, _ := fixture.Parts(nodeName)
	s := &Simulator{
		fixture: fixture, gpus: gpus,
		tel: make([]Telemetry, len(gpus)), heat: make([]heatScript, len(gpus)),
		reads: make([]uint64, len(gpus)), lost: make([]bool, len(gpus)),
		initRet: nvml.SUCCESS, unsupported: map[string]bool{}, jitter: true,
		events: make(chan nvml.EventData, 64),
	}
	limit := uint32(300)
	if fixture.NVSwitchLinks > 0 {
		limit = 700
	}
	for i := range s.tel {
		s.tel[i] = Telemetry{TemperatureC: 30, PowerWatts: 60, PowerLimitWatts: limit}
	}
	s.levels, s.p2p = map[[2]int]v1alpha1.PCIeLevel{}, map[[2]int]bool{}
	s.links, s.busIDs, s.linkGBps = make([][]NVLink, len(gpus)), make([]string, len(gpus)), make([]int, len(gpus))
	s.devices = make([]*mock.Device, len(gpus))
	for i := range gpus {
		s.devices[i] = &mock.Device{}
		s.links[i] = s.fixtureNVLinks(i)
		s.busIDs[i] = gpus[i].PCIBusID
		s.linkGBps[i] = fixture.NVLinkGBps
	}
	for i := range gpus {
		s.wireDevice(i)
	}
	s.wireInterface()
	return s
}

// NVML returns the simulated library.
func (s *Simulator) NVML() nvml.Interface { return s.lib }

// Fixture returns the machine the simulator was built from.
func (s *Simulator) Fixture() machine.Fixture { return s.fixture }

// UUIDs returns the GPUs' UUIDs in index order.
func (s *Simulator) UUIDs() []string {
	out := make([]string, len(s.gpus))
	for i, g := range s.gpus {
		out[i] = g.UUID
	}
	return out
}

func (s *Simulator) checkIndex(i int) error {
	if i < 0 || i >= len(s.gpus) {
		return fmt.Errorf("gpu index %d: out of range; machine %s has GPUs 0..%d", i, s.fixture.Name, len(s.gpus)-1)
	}
	return nil
}

// SetTelemetry sets GPU i's readings.
func (s *Simulator) SetTelemetry(i int, t Telemetry) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tel[i] = t
	s.heat[i] = heatScript{}
	return nil
}

// HeatUp makes GPU i warm by perReadC degrees at every temperature read
// until it reaches maxC; from 85 °C on it reports thermal slowdown.
func (s *Simulator) HeatUp(i int, perReadC, maxC uint32) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.heat[i] = heatScript{perRead: perReadC, max: maxC}
	return nil
}

// SetJitter turns the idle jitter on or off (on by default).
func (s *Simulator) SetJitter(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.jitter = on
}

// LoseGPU makes every call on GPU i fail with ERROR_GPU_IS_LOST, as when a
// GPU falls off the bus; RecoverGPU undoes it.
func (s *Simulator) LoseGPU(i int) error { return s.setLost(i, true) }

// RecoverGPU makes GPU i answer again.
func (s *Simulator) RecoverGPU(i int) error { return s.setLost(i, false) }

func (s *Simulator) setLost(i int, lost bool) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lost[i] = lost
	return nil
}

// InjectXID delivers an XID critical-error event for GPU i to every
// registered event set.
func (s *Simulator) InjectXID(i int, xid uint64) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	select {
	case s.events <- nvml.EventData{Device: s.devices[i], EventType: nvml.EventTypeXidCriticalError, EventData: xid}:
		return nil
	default:
		return fmt.Errorf("inject xid %d on gpu %d: event queue is full; nobody is waiting for events", xid, i)
	}
}

// FailInit makes nvml.Init return ret (SUCCESS to succeed again).
func (s *Simulator) FailInit(ret nvml.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.initRet = ret
}

// FailDeviceCount makes DeviceGetCount fail with ret from now on, as a
// driver in trouble mid-run does (the session stays open).
func (s *Simulator) FailDeviceCount(ret nvml.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, ret }
}

// Unsupported makes the named device calls (e.g. "GetNvLinkState",
// "GetPowerUsage") return ERROR_NOT_SUPPORTED, as an older driver or a
// GPU without the feature would.
func (s *Simulator) Unsupported(calls ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range calls {
		s.unsupported[c] = true
	}
}

// gate answers for call on GPU i before the real answer: lost beats
// unsupported.
func (s *Simulator) gate(i int, call string) nvml.Return {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lost[i] {
		return nvml.ERROR_GPU_IS_LOST
	}
	if s.unsupported[call] {
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.SUCCESS
}

func (s *Simulator) indexOf(d nvml.Device) int {
	for i, dev := range s.devices {
		if nvml.Device(dev) == d {
			return i
		}
	}
	return -1
}

// NVLink is one active NVLink of a simulated GPU as NVML reports it:
// the remote end's PCI bus ID (GetNvLinkRemotePciInfo) and device type
// (GetNvLinkRemoteDeviceType).
type NVLink struct {
	RemoteBusID string
	RemoteType  nvml.IntNvLinkDeviceType
}

// NVLinks returns what GPU i reports about its active NVLinks (a copy),
// e.g. to change one and hand it to SetNVLinks.
func (s *Simulator) NVLinks(i int) ([]NVLink, error) {
	if err := s.checkIndex(i); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]NVLink(nil), s.links[i]...), nil
}

// SetNVLinks makes GPU i report links as its active NVLinks (link k is
// links[k]); no other GPU changes, so an NVLink one end reports and the
// other does not is made this way. Empty means no NVLink at all.
func (s *Simulator) SetNVLinks(i int, links []NVLink) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.links[i] = append([]NVLink(nil), links...)
	return nil
}

// BusID returns the PCI bus ID GPU i reports.
func (s *Simulator) BusID(i int) (string, error) {
	if err := s.checkIndex(i); err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.busIDs[i], nil
}

// SetBusID makes GPU i report busID from GetPciInfo. The other GPUs'
// NVLinks keep naming the old one unless SetNVLinks changes them.
func (s *Simulator) SetBusID(i int, busID string) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busIDs[i] = busID
	return nil
}

// SetPCIeLevel makes GPU i report level as its closest common PCIe
// ancestor with GPU j (GetTopologyCommonAncestor asked of i); j's answer
// about i is unchanged.
func (s *Simulator) SetPCIeLevel(i, j int, level v1alpha1.PCIeLevel) error {
	if err := s.checkPair(i, j); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.levels[[2]int{i, j}] = level
	return nil
}

// SetP2P makes GPU i report P2P reads to GPU j as supported or not
// (GetP2PStatus asked of i); j's answer about i is unchanged.
func (s *Simulator) SetP2P(i, j int, ok bool) error {
	if err := s.checkPair(i, j); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.p2p[[2]int{i, j}] = ok
	return nil
}

// SetNVLinkGBps makes GPU i report gbps (GB/s bidirectional) as its
// per-link NVLink speed (field FI_DEV_NVLINK_SPEED_MBPS_COMMON).
func (s *Simulator) SetNVLinkGBps(i, gbps int) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.linkGBps[i] = gbps
	return nil
}

func (s *Simulator) checkPair(i, j int) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	if err := s.checkIndex(j); err != nil {
		return err
	}
	if i == j {
		return fmt.Errorf("gpu pair %d-%d: a pair joins two different GPUs", i, j)
	}
	return nil
}

// linksOf is what GPU i reports about its NVLinks now.
func (s *Simulator) linksOf(i int) []NVLink {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.links[i]
}

// fixtureNVLinks are GPU i's NVLinks as the fixture describes them.
func (s *Simulator) fixtureNVLinks(i int) []NVLink {
	f := s.fixture
	var out []NVLink
	if f.NVSwitchLinks > 0 {
		for l := 0; l < f.NVSwitchLinks; l++ {
			// NVSwitches sit on their own buses; which switch a link goes
			// to does not matter to the agent.
			out = append(out, NVLink{RemoteBusID: fmt.Sprintf("00000000:%02X:00.0", 0xC0+l%6), RemoteType: nvml.NVLINK_DEVICE_TYPE_SWITCH})
		}
		return out
	}
	for _, p := range f.NVLinks {
		other := -1
		switch i {
		case p.A:
			other = p.B
		case p.B:
			other = p.A
		}
		for n := 0; other >= 0 && n < p.Links; n++ {
			out = append(out, NVLink{RemoteBusID: s.gpus[other].PCIBusID, RemoteType: nvml.NVLINK_DEVICE_TYPE_GPU})
		}
	}
	return out
}

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

func (s *Simulator) wireDevice(i int) {
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
		if r := s.gate(i, "GetNvLinkRemotePciInfo"); r != nvml.SUCCESS {
			return nvml.PciInfo{}, r
		}
		links := s.linksOf(i)
		if link < 0 || link >= len(links) {
			return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return pciInfo(links[link].RemoteBusID), nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if r := s.gate(i, "GetNvLinkRemoteDeviceType"); r != nvml.SUCCESS {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, r
		}
		links := s.linksOf(i)
		if link < 0 || link >= len(links) {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
		}
		return links[link].RemoteType, nvml.SUCCESS
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
