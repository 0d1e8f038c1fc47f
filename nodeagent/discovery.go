package nodeagent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent/internal/nvmllevel"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// Source is the GPU driver as the agent needs it. NVMLSource is the one
// implementation; it is an interface so that the publisher and the device
// plugin can be tested without NVML at all.
type Source interface {
	// Topology reads the GPUs, their links, health and the driver version.
	// TopologyHash is set; telemetry and times are not.
	Topology() (v1alpha1.NodeGPUTopologyStatus, error)
	// Telemetry reads every GPU's load and thermals in index order.
	Telemetry() ([]v1alpha1.Telemetry, error)
	// WaitHealth blocks up to timeout for driver health events and returns
	// the ones that arrived (none on timeout).
	WaitHealth(timeout time.Duration) ([]HealthEvent, error)
	// HealthChanged is signalled whenever a GPU's health changes, from any
	// call; the publisher refreshes topology on it.
	HealthChanged() <-chan struct{}
	// Close releases the driver.
	Close()
}

// HealthEvent is one health-relevant thing the driver reported.
type HealthEvent struct {
	Index  int
	UUID   string
	XID    uint64 // 0 when the event is not an XID (GPU lost)
	Class  XIDClass
	Reason string
}

// ReasonGPULost is the health reason of a GPU the driver reports as lost.
const ReasonGPULost = "GPU lost: the driver reports ERROR_GPU_IS_LOST"

// errGPULost marks a call that failed because its GPU is gone.
var errGPULost = errors.New("gpu is lost")

// NVMLSource discovers GPUs with NVML. Calls the driver does not support
// (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND) degrade to a documented
// default and are logged once per call name; other failures count in the
// nvml errors metric.
type NVMLSource struct {
	lib     nvml.Interface
	logger  klog.Logger
	metrics *Metrics
	// numaFallback reads a GPU's NUMA node when NVML cannot (older drivers
	// lack nvmlDeviceGetNumaNodeId); nil in simulated mode so that the
	// simulated node never reads the host.
	numaFallback func(busID string) int

	mu         sync.Mutex
	inited     bool
	events     nvml.EventSet
	logged     map[string]bool
	health     map[int]string // index -> reason, for unhealthy GPUs
	lastGPUs   map[int]v1alpha1.GPU
	lastLinks  map[[2]int]v1alpha1.Link
	uuidIndex  map[string]int
	changed    chan struct{}
	lastDriver string
	// lastIssues is the last inconsistency message logged, so that a
	// lasting one is logged once, not at every refresh.
	lastIssues string
}

var _ Source = (*NVMLSource)(nil)

// NewNVMLSource wraps lib. Use nvml.New() for the real driver and
// Simulator.NVML() for a simulated node; metrics may be nil.
func NewNVMLSource(lib nvml.Interface, logger klog.Logger, metrics *Metrics) *NVMLSource {
	return &NVMLSource{
		lib: lib, logger: logger, metrics: metrics,
		logged: map[string]bool{}, health: map[int]string{},
		lastGPUs: map[int]v1alpha1.GPU{}, lastLinks: map[[2]int]v1alpha1.Link{},
		uuidIndex: map[string]int{}, changed: make(chan struct{}, 1),
	}
}

// WithSysfsNUMA makes the source read /sys/bus/pci/devices/<bus>/numa_node
// when NVML cannot report a GPU's NUMA node. Only for the real driver.
func (s *NVMLSource) WithSysfsNUMA() *NVMLSource {
	s.numaFallback = sysfsNUMA
	return s
}

func sysfsNUMA(busID string) int {
	// NVML's bus IDs carry an 8-digit domain; sysfs uses 4.
	id := strings.ToLower(busID)
	if len(id) == 16 && strings.HasPrefix(id, "0000") {
		id = id[4:]
	}
	b, err := os.ReadFile(filepath.Join("/sys/bus/pci/devices", id, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// HealthChanged implements Source.
func (s *NVMLSource) HealthChanged() <-chan struct{} { return s.changed }

// check sorts one NVML return into: usable (true, nil); unsupported, use the
// default (false, nil, logged once); GPU lost (false, errGPULost); failed
// (false, error naming the call).
func (s *NVMLSource) check(call string, ret nvml.Return) (bool, error) {
	switch ret {
	case nvml.SUCCESS:
		return true, nil
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		if !s.logged[call] {
			s.logged[call] = true
			s.logger.Info("NVML call not supported by this driver; using the documented default", "call", call, "return", ret.Error())
		}
		s.metrics.nvmlError(call, ret)
		return false, nil
	case nvml.ERROR_GPU_IS_LOST:
		s.metrics.nvmlError(call, ret)
		return false, errGPULost
	}
	s.metrics.nvmlError(call, ret)
	return false, fmt.Errorf("nvml %s: %w", call, ret)
}

// ensureInit initialises NVML once; a failure is retried on the next call,
// so an agent that started before the driver recovers on its own.
func (s *NVMLSource) ensureInit() error {
	if s.inited {
		return nil
	}
	if ret := s.lib.Init(); ret != nvml.SUCCESS {
		s.metrics.nvmlError("Init", ret)
		return fmt.Errorf("nvml init: %w", ret)
	}
	s.inited = true
	s.registerEvents()
	return nil
}

// Close implements Source.
func (s *NVMLSource) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.inited {
		return
	}
	if s.events != nil {
		_ = s.events.Free()
		s.events = nil
	}
	_ = s.lib.Shutdown()
	s.inited = false
}

func (s *NVMLSource) setHealth(index int, reason string) {
	if s.health[index] == reason {
		return
	}
	if reason == "" {
		delete(s.health, index)
	} else {
		s.health[index] = reason
	}
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

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

// issue is one inconsistency in NVML's answers: a Reason* of
// ConditionTopologyConsistent and what exactly disagreed.
type issue struct {
	reason string
	msg    string
}

// issueOrder ranks the reasons of ConditionTopologyConsistent: the first
// found in this order names the condition.
var issueOrder = []string{v1alpha1.ReasonDuplicateBusID, v1alpha1.ReasonUnknownRemoteBusID, v1alpha1.ReasonAsymmetricLink}

// maxIssuesInMessage bounds the condition's message: a 64-GPU node could
// list thousands of pairs.
const maxIssuesInMessage = 16

// RefusedError is a topology read that was refused because NVML's answers
// contradict each other in a way no conservative value resolves (two GPUs
// with one PCI bus ID). The publisher publishes the node as stale with
// Condition set.
type RefusedError struct {
	Condition metav1.Condition
}

func (e *RefusedError) Error() string {
	return "nvml topology refused: " + e.Condition.Message
}

// consistentCondition is TopologyConsistent when NVML's answers agree.
func consistentCondition() metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionTopologyConsistent, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonConsistent,
		Message: "both ends of every link agree and every NVLink leads to a GPU or an NVSwitch of this node"}
}

// consistency turns the issues of one read into the TopologyConsistent
// condition (without lastTransitionTime; the publisher sets it) and counts
// them in the inconsistencies metric.
func (s *NVMLSource) consistency(issues []issue) metav1.Condition {
	if len(issues) == 0 {
		s.lastIssues = ""
		return consistentCondition()
	}
	rank := func(reason string) int { return slices.Index(issueOrder, reason) }
	sort.SliceStable(issues, func(i, j int) bool { return rank(issues[i].reason) < rank(issues[j].reason) })
	var b strings.Builder
	for i, is := range issues {
		s.metrics.inconsistency(is.reason)
		if i == maxIssuesInMessage {
			fmt.Fprintf(&b, "; and %d more", len(issues)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(is.reason + ": " + is.msg)
	}
	c := metav1.Condition{Type: v1alpha1.ConditionTopologyConsistent, Status: metav1.ConditionFalse, Reason: issues[0].reason, Message: b.String()}
	if c.Message != s.lastIssues {
		s.lastIssues = c.Message
		s.logger.Info("NVML answers disagree; publishing the conservative topology", "reason", c.Reason, "issues", len(issues), "detail", c.Message)
	}
	return c
}

// Topology implements Source. Every link is read from both of its GPUs;
// where they disagree the conservative value is published and the
// disagreement recorded in the TopologyConsistent condition. Two GPUs with
// one bus ID make the read fail with a *RefusedError.
func (s *NVMLSource) Topology() (v1alpha1.NodeGPUTopologyStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ensureInit(); err != nil {
		return v1alpha1.NodeGPUTopologyStatus{}, err
	}
	driver, ret := s.lib.SystemGetDriverVersion()
	if ok, err := s.check("SystemGetDriverVersion", ret); ok {
		s.lastDriver = driver
	} else if err != nil {
		return v1alpha1.NodeGPUTopologyStatus{}, err
	}
	count, ret := s.lib.DeviceGetCount()
	if ok, err := s.check("DeviceGetCount", ret); !ok {
		if err == nil {
			err = fmt.Errorf("nvml DeviceGetCount: %w", ret)
		}
		return v1alpha1.NodeGPUTopologyStatus{}, err
	}
	if count > topology.MaxGPUs {
		return v1alpha1.NodeGPUTopologyStatus{}, fmt.Errorf("nvml reports %d GPUs; at most %d are supported per node", count, topology.MaxGPUs)
	}
	if count < 0 {
		return v1alpha1.NodeGPUTopologyStatus{}, fmt.Errorf("nvml reports %d GPUs", count)
	}
	infos := make([]*deviceInfo, count)
	for i := 0; i < count; i++ {
		info, err := s.readDevice(i)
		if err != nil {
			return v1alpha1.NodeGPUTopologyStatus{}, err
		}
		infos[i] = info
	}
	byBus, dups := indexByBus(infos)
	if len(dups) > 0 {
		c := s.consistency(dups)
		return v1alpha1.NodeGPUTopologyStatus{}, &RefusedError{Condition: c}
	}
	var issues []issue
	for _, info := range infos {
		issues = append(issues, resolve(info, byBus)...)
	}
	gpus := make([]v1alpha1.GPU, count)
	for i, info := range infos {
		gpus[i] = info.gpu
		if reason, bad := s.health[i]; bad {
			gpus[i].Health, gpus[i].HealthReason = v1alpha1.GPUUnhealthy, reason
		}
	}
	var links []v1alpha1.Link
	for a := 0; a < count; a++ {
		for b := a + 1; b < count; b++ {
			l, pairIssues, err := s.readLink(infos[a], infos[b])
			if err != nil {
				return v1alpha1.NodeGPUTopologyStatus{}, err
			}
			links = append(links, l)
			issues = append(issues, pairIssues...)
		}
	}
	g, err := topology.NewGraph(gpus, links)
	if err != nil {
		return v1alpha1.NodeGPUTopologyStatus{}, fmt.Errorf("nvml topology is inconsistent: %w", err)
	}
	st := g.Status()
	st.DriverVersion = s.lastDriver
	st.Conditions = []metav1.Condition{s.consistency(issues)}
	for _, gpu := range st.GPUs {
		s.lastGPUs[gpu.Index] = gpu
		s.uuidIndex[gpu.UUID] = gpu.Index
	}
	for _, l := range st.Links {
		s.lastLinks[[2]int{l.A, l.B}] = l
	}
	return st, nil
}

// indexByBus maps each GPU's bus key to its index. Two GPUs with one bus
// ID are an issue each: NVLinks name their remote end by bus ID, so such a
// node's links cannot be told apart. GPUs whose bus ID is unknown are left
// out (no NVLink can name them).
func indexByBus(infos []*deviceInfo) (map[string]int, []issue) {
	byBus := make(map[string]int, len(infos))
	var dups []issue
	for i, info := range infos {
		if info.busKey == "" {
			continue
		}
		if j, dup := byBus[info.busKey]; dup {
			dups = append(dups, issue{v1alpha1.ReasonDuplicateBusID, fmt.Sprintf("GPU %d and GPU %d both report PCI bus ID %s; NVLinks cannot be told apart, so the topology is not published",
				j, i, info.gpu.PCIBusID)})
			continue
		}
		byBus[info.busKey] = i
	}
	return byBus, dups
}

// remoteTypeName names an NVLink remote device type for messages.
func remoteTypeName(e linkEnd) string {
	if !e.kindKnown {
		return "not reported by the driver"
	}
	switch e.kind {
	case nvml.NVLINK_DEVICE_TYPE_GPU:
		return "GPU"
	case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
		return "IBM NPU"
	case nvml.NVLINK_DEVICE_TYPE_SWITCH:
		return "NVSwitch"
	}
	return fmt.Sprintf("unknown (%#x)", uint32(e.kind))
}

// resolve sorts one GPU's NVLinks by what NVML says is on the other end:
//
//   - NVSwitch (NVLINK_DEVICE_TYPE_SWITCH): a link into the fabric. Only
//     this answer makes an NVSwitch path; the bus ID is not consulted.
//   - IBM NPU (NVLINK_DEVICE_TYPE_IBMNPU): a link to an IBM POWER CPU, not
//     between GPUs; not counted, and not an inconsistency.
//   - GPU, unknown (0xFF) or not reported: a direct link to the GPU whose
//     bus ID the link names. A bus ID that is no other GPU of this node is
//     an issue and the link is not counted: nothing says what is there.
func resolve(info *deviceInfo, byBus map[string]int) []issue {
	info.toGPU = map[int]int{}
	type unknownRemote struct {
		bus, kind string
	}
	unknown := map[unknownRemote][]int{}
	var order []unknownRemote
	for _, e := range info.ends {
		if e.kindKnown {
			switch e.kind {
			case nvml.NVLINK_DEVICE_TYPE_SWITCH:
				info.switchLinks++
				continue
			case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
				continue
			}
		}
		if j, ok := byBus[busKey(e.remoteBus)]; ok && e.remoteBus != "" && j != info.gpu.Index {
			info.toGPU[j]++
			continue
		}
		k := unknownRemote{e.remoteBus, remoteTypeName(e)}
		if _, seen := unknown[k]; !seen {
			order = append(order, k)
		}
		unknown[k] = append(unknown[k], e.link)
	}
	var issues []issue
	for _, k := range order {
		bus := k.bus
		if bus == "" {
			bus = "unknown"
		}
		issues = append(issues, issue{v1alpha1.ReasonUnknownRemoteBusID, fmt.Sprintf(
			"GPU %d NVLinks %v lead to bus ID %s (remote type %s), which is no other GPU of this node; not counted (an NVSwitch is believed only when NVML reports the remote type NVSwitch)",
			info.gpu.Index, unknown[k], bus, k.kind)})
	}
	return issues
}

// pairEnd is what one GPU of a pair says about the other.
type pairEnd struct {
	level      v1alpha1.PCIeLevel // CrossSocket when the driver would not say
	levelKnown bool
	p2p        nvml.GpuP2PStatus
	p2pKnown   bool
}

// readEnd asks GPU a about GPU b. Only a lost GPU is an error.
func (s *NVMLSource) readEnd(a, b *deviceInfo) (pairEnd, error) {
	e := pairEnd{level: v1alpha1.PCIeCrossSocket}
	level, ret := a.dev.GetTopologyCommonAncestor(b.dev)
	if ok, err := s.check("GetTopologyCommonAncestor", ret); ok {
		e.level, e.levelKnown = nvmllevel.API(level), true
	} else if errors.Is(err, errGPULost) {
		return e, err
	}
	p2p, ret := a.dev.GetP2PStatus(b.dev, nvml.P2P_CAPS_INDEX_READ)
	if ok, err := s.check("GetP2PStatus", ret); ok {
		e.p2p, e.p2pKnown = p2p, true
	} else if errors.Is(err, errGPULost) {
		return e, err
	}
	return e, nil
}

// readLink describes the pair a<b from both ends: NVLink count and whether
// it goes through an NVSwitch, the PCIe common ancestor, P2P support and
// the bandwidth. Where the ends disagree it takes the conservative value:
// fewer NVLinks, the slower per-link speed, the farther PCIe level, P2P
// unsupported; each disagreement is an issue. An end the driver cannot
// answer for counts as the documented default (CrossSocket; P2P from the
// other end) without being an issue. For a lost GPU the last-known link is
// kept.
func (s *NVMLSource) readLink(a, b *deviceInfo) (v1alpha1.Link, []issue, error) {
	ia, ib := a.gpu.Index, b.gpu.Index
	if a.lost || b.lost {
		if l, ok := s.lastLinks[[2]int{ia, ib}]; ok {
			return l, nil, nil
		}
		return v1alpha1.Link{}, nil, fmt.Errorf("gpu %d-gpu %d: no last-known link for a lost GPU: %w", ia, ib, errGPULost)
	}
	var issues []issue
	asym := func(format string, args ...any) {
		issues = append(issues, issue{v1alpha1.ReasonAsymmetricLink, fmt.Sprintf(format, args...)})
	}
	ab, err := s.readEnd(a, b)
	if err != nil {
		return v1alpha1.Link{}, nil, fmt.Errorf("gpu %d-gpu %d: %w", ia, ib, err)
	}
	ba, err := s.readEnd(b, a)
	if err != nil {
		return v1alpha1.Link{}, nil, fmt.Errorf("gpu %d-gpu %d: %w", ib, ia, err)
	}
	l := v1alpha1.Link{A: ia, B: ib, PCIe: ab.level}
	if pcieRank(ba.level) > pcieRank(ab.level) {
		l.PCIe = ba.level
	}
	if ab.levelKnown && ba.levelKnown && ab.level != ba.level {
		asym("GPU %d sees GPU %d at PCIe level %s, GPU %d sees GPU %d at %s; publishing %s", ia, ib, ab.level, ib, ia, ba.level, l.PCIe)
	}

	nab, nba := a.toGPU[ib], b.toGPU[ia]
	l.NVLinks = min(nab, nba)
	if nab != nba {
		asym("GPU %d reports %d NVLinks to GPU %d, GPU %d reports %d to GPU %d; publishing %d", ia, nab, ib, ib, nba, ia, l.NVLinks)
	}
	if l.NVLinks == 0 && a.switchLinks > 0 && b.switchLinks > 0 {
		l.NVLinks, l.NVSwitch = min(a.switchLinks, b.switchLinks), true
	}

	okA := ab.p2pKnown && ab.p2p == nvml.P2P_STATUS_OK
	okB := ba.p2pKnown && ba.p2p == nvml.P2P_STATUS_OK
	switch {
	case ab.p2pKnown && ba.p2pKnown:
		l.P2P = okA && okB
		if okA != okB {
			asym("GPU %d reports P2P reads to GPU %d as %s, GPU %d to GPU %d as %s; publishing P2P unsupported", ia, ib, p2pName(ab.p2p), ib, ia, p2pName(ba.p2p))
		}
	case ab.p2pKnown || ba.p2pKnown:
		l.P2P = okA || okB
	default:
		// Neither end answers: NVLinked pairs do P2P over NVLink.
		l.P2P = l.NVLinks > 0
	}

	if l.NVLinks > 0 {
		if a.linkGBps > 0 && b.linkGBps > 0 && a.linkGBps != b.linkGBps {
			asym("GPU %d reads %d GB/s per NVLink, GPU %d reads %d; publishing %d", ia, a.linkGBps, ib, b.linkGBps, min(a.linkGBps, b.linkGBps))
		}
		l.BandwidthGBps = l.NVLinks * min(nonZero(a.linkGBps), nonZero(b.linkGBps))
	} else {
		l.BandwidthGBps = machine.PCIeBandwidthGBps(min(nonZeroGen(a.pcieGen), nonZeroGen(b.pcieGen)), l.PCIe)
	}
	return l, issues, nil
}

// pcieRank orders PCIe levels from nearest (0) to farthest; CrossSocket
// (and anything else) is the farthest.
func pcieRank(l v1alpha1.PCIeLevel) int { return nvmllevel.Rank(l) }

// p2pName names a P2P status for messages.
func p2pName(st nvml.GpuP2PStatus) string {
	switch st {
	case nvml.P2P_STATUS_OK:
		return "OK"
	case nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return "chipset not supported"
	case nvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return "GPU not supported"
	case nvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return "IOH topology not supported"
	case nvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return "disabled by regkey"
	case nvml.P2P_STATUS_NOT_SUPPORTED:
		return "not supported"
	}
	return fmt.Sprintf("status %d", uint32(st))
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

// registerEvents subscribes to critical-XID events on every GPU that
// supports them. Without an event set the agent still sees lost GPUs through
// its periodic reads.
func (s *NVMLSource) registerEvents() {
	set, ret := s.lib.EventSetCreate()
	if ok, _ := s.check("EventSetCreate", ret); !ok {
		return
	}
	count, ret := s.lib.DeviceGetCount()
	if ok, _ := s.check("DeviceGetCount", ret); !ok {
		_ = set.Free()
		return
	}
	registered := 0
	for i := 0; i < count; i++ {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		if ok, _ := s.check("DeviceGetHandleByIndex", ret); !ok {
			continue
		}
		if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
			s.uuidIndex[uuid] = i
		}
		if ok, _ := s.check("RegisterEvents", dev.RegisterEvents(nvml.EventTypeXidCriticalError, set)); ok {
			registered++
		}
	}
	if registered == 0 {
		_ = set.Free()
		return
	}
	s.events = set
}

// WaitHealth implements Source. Critical XIDs mark their GPU unhealthy;
// application XIDs are returned (for logs and metrics) but change nothing.
// ERROR_GPU_IS_LOST from the wait marks the event's GPU, or every GPU when
// the driver does not say which, unhealthy.
func (s *NVMLSource) WaitHealth(timeout time.Duration) ([]HealthEvent, error) {
	s.mu.Lock()
	if err := s.ensureInit(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	set := s.events
	s.mu.Unlock()
	if set == nil {
		time.Sleep(timeout)
		return nil, nil
	}
	ev, ret := set.Wait(uint32(timeout / time.Millisecond))
	s.mu.Lock()
	defer s.mu.Unlock()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_TIMEOUT:
		return nil, nil
	case nvml.ERROR_GPU_IS_LOST:
		s.metrics.nvmlError("EventSetWait", ret)
		var out []HealthEvent
		idx := s.eventIndex(ev)
		for i, gpu := range s.sortedLast() {
			if idx >= 0 && i != idx {
				continue
			}
			s.setHealth(gpu.Index, ReasonGPULost)
			out = append(out, HealthEvent{Index: gpu.Index, UUID: gpu.UUID, Class: XIDCritical, Reason: ReasonGPULost})
		}
		return out, nil
	default:
		s.metrics.nvmlError("EventSetWait", ret)
		return nil, fmt.Errorf("nvml EventSetWait: %w", ret)
	}
	if ev.EventType != nvml.EventTypeXidCriticalError {
		return nil, nil
	}
	idx := s.eventIndex(ev)
	class, reason := ClassifyXID(ev.EventData)
	he := HealthEvent{Index: idx, XID: ev.EventData, Class: class, Reason: reason}
	if gpu, ok := s.lastGPUs[idx]; ok {
		he.UUID = gpu.UUID
	}
	s.metrics.xid(ev.EventData, class)
	if class == XIDCritical && idx >= 0 {
		s.setHealth(idx, reason)
	}
	return []HealthEvent{he}, nil
}

// eventIndex finds the GPU an event belongs to; -1 when unknown.
func (s *NVMLSource) eventIndex(ev nvml.EventData) int {
	if ev.Device == nil {
		return -1
	}
	if uuid, ret := ev.Device.GetUUID(); ret == nvml.SUCCESS {
		if i, ok := s.uuidIndex[uuid]; ok {
			return i
		}
	}
	if i, ret := ev.Device.GetIndex(); ret == nvml.SUCCESS {
		return i
	}
	return -1
}

func (s *NVMLSource) sortedLast() []v1alpha1.GPU {
	out := make([]v1alpha1.GPU, 0, len(s.lastGPUs))
	for _, g := range s.lastGPUs {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}
