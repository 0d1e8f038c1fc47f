package nodeagent

import (
	"fmt"
	"sort"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

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
