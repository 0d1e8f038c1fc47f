// Package nvmlsim is a simulated NVML: go-nvml's mock interface answering
// as a machine fixture's driver would (devices, NVLinks, PCIe levels, P2P,
// memory, telemetry, XID events), with faults a test can inject. The node
// agent runs the same NVML code path on it as on a real node
// (`gputopo nodeagent --simulate`); nothing in it touches a GPU.
package nvmlsim

import (
	"fmt"
	"sync"

	"github.com/gputopo/gputopo/topology/machine"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gputopo/gputopo/api/v1alpha1"
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

// withGPU runs f under the lock once i is known to be a GPU's index.
func (s *Simulator) withGPU(i int, f func()) error {
	if err := s.checkIndex(i); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	f()
	return nil
}

// withPair runs f under the lock once i and j are known to be two GPUs.
func (s *Simulator) withPair(i, j int, f func()) error {
	if err := s.checkPair(i, j); err != nil {
		return err
	}
	return s.withGPU(i, f)
}

// SetTelemetry sets GPU i's readings.
func (s *Simulator) SetTelemetry(i int, t Telemetry) error {
	return s.withGPU(i, func() { s.tel[i], s.heat[i] = t, heatScript{} })
}

// HeatUp makes GPU i warm by perReadC degrees at every temperature read
// until it reaches maxC; from 85 °C on it reports thermal slowdown.
func (s *Simulator) HeatUp(i int, perReadC, maxC uint32) error {
	return s.withGPU(i, func() { s.heat[i] = heatScript{perRead: perReadC, max: maxC} })
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
	return s.withGPU(i, func() { s.lost[i] = lost })
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

// indexOf is the index of d, one of this simulator's handles or a
// wrapper around one (go-nvlib's device.Device embeds the handle and
// passes itself to calls such as GetTopologyCommonAncestor): a wrapper is
// known by the UUID it forwards.
func (s *Simulator) indexOf(d nvml.Device) int {
	for i, dev := range s.devices {
		if nvml.Device(dev) == d {
			return i
		}
	}
	if d == nil {
		return -1
	}
	if u, ret := d.GetUUID(); ret == nvml.SUCCESS {
		for i, g := range s.gpus {
			if g.UUID == u {
				return i
			}
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
func (s *Simulator) NVLinks(i int) (links []NVLink, err error) {
	err = s.withGPU(i, func() { links = append([]NVLink(nil), s.links[i]...) })
	return links, err
}

// SetNVLinks makes GPU i report links as its active NVLinks (link k is
// links[k]); no other GPU changes, so an NVLink one end reports and the
// other does not is made this way. Empty means no NVLink at all.
func (s *Simulator) SetNVLinks(i int, links []NVLink) error {
	return s.withGPU(i, func() { s.links[i] = append([]NVLink(nil), links...) })
}

// BusID returns the PCI bus ID GPU i reports.
func (s *Simulator) BusID(i int) (busID string, err error) {
	err = s.withGPU(i, func() { busID = s.busIDs[i] })
	return busID, err
}

// SetBusID makes GPU i report busID from GetPciInfo. The other GPUs'
// NVLinks keep naming the old one unless SetNVLinks changes them.
func (s *Simulator) SetBusID(i int, busID string) error {
	return s.withGPU(i, func() { s.busIDs[i] = busID })
}

// SetPCIeLevel makes GPU i report level as its closest common PCIe
// ancestor with GPU j (GetTopologyCommonAncestor asked of i); j's answer
// about i is unchanged.
func (s *Simulator) SetPCIeLevel(i, j int, level v1alpha1.PCIeLevel) error {
	return s.withPair(i, j, func() { s.levels[[2]int{i, j}] = level })
}

// SetP2P makes GPU i report P2P reads to GPU j as supported or not
// (GetP2PStatus asked of i); j's answer about i is unchanged.
func (s *Simulator) SetP2P(i, j int, ok bool) error {
	return s.withPair(i, j, func() { s.p2p[[2]int{i, j}] = ok })
}

// SetNVLinkGBps makes GPU i report gbps (GB/s bidirectional) as its
// per-link NVLink speed (field FI_DEV_NVLINK_SPEED_MBPS_COMMON).
func (s *Simulator) SetNVLinkGBps(i, gbps int) error {
	return s.withGPU(i, func() { s.linkGBps[i] = gbps })
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
