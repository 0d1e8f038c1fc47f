package nodeagent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
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
