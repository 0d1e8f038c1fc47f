package demo

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"

	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	topomachine "github.com/gputopo/gputopo/topology/machine"
)

// stockDevicePlugin chooses a container's GPUs the way NVIDIA's
// k8s-device-plugin does under plain kube-scheduler: kubelet asks the
// plugin's GetPreferredAllocation for the pod's count among the node's free
// GPUs, and the plugin answers with go-gpuallocator's best-effort policy
// over NVML's view of the links (its "aligned" allocation for whole GPUs).
// Here NVML is each node's simulated one, the same the node agents read
// in the gputopo cluster. It is the comparison's kubelet: it keeps which
// GPUs each node has free, in bind order.
type stockDevicePlugin struct {
	devices map[string]gpuallocator.DeviceList
	// held[node][i] says the node's GPU of index i is allocated.
	held map[string][]bool
}

func newStockDevicePlugin(specs []NodeSpec) (*stockDevicePlugin, error) {
	s := &stockDevicePlugin{devices: map[string]gpuallocator.DeviceList{}, held: map[string][]bool{}}
	for _, n := range specs {
		f, err := topomachine.Load(n.Fixture)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		sim := nvmlsim.New(f, n.Name)
		devs, err := gpuallocator.NewDevices(gpuallocator.WithNvmlLib(sim.NVML()))
		if err != nil {
			return nil, fmt.Errorf("node %s: the device plugin's view of NVML: %w", n.Name, err)
		}
		s.devices[n.Name] = devs
		s.held[n.Name] = make([]bool, len(devs))
	}
	return s, nil
}

// allocate takes count of node's free GPUs as the plugin's preferred
// allocation, and returns their UUIDs.
func (s *stockDevicePlugin) allocate(node string, count int) ([]string, error) {
	devs, ok := s.devices[node]
	if !ok {
		return nil, fmt.Errorf("node %q is not one the demo created", node)
	}
	// The free GPUs in index order, as kubelet lists them.
	var available gpuallocator.DeviceList
	for i, d := range devs {
		if !s.held[node][i] {
			available = append(available, d)
		}
	}
	if count < 1 || count > len(available) {
		return nil, fmt.Errorf("node %s: %d GPU(s) asked, %d free", node, count, len(available))
	}
	got := gpuallocator.NewBestEffortPolicy().Allocate(available, nil, count)
	if len(got) != count {
		return nil, fmt.Errorf("node %s: the best-effort policy chose %d of %d GPU(s)", node, len(got), count)
	}
	uuids := make([]string, len(got))
	for i, d := range got {
		uuids[i] = d.UUID
		s.held[node][d.Index] = true
	}
	return uuids, nil
}

// release gives a deleted pod's GPUs back to node.
func (s *stockDevicePlugin) release(node string, uuids []string) {
	for i, d := range s.devices[node] {
		if slices.Contains(uuids, d.UUID) {
			s.held[node][i] = false
		}
	}
}

// DevicePlugin is NVIDIA's device plugin choosing the GPUs of pods that
// a scheduler bound without choosing them (stockDevicePlugin), for
// comparisons outside the demo (make bench-peers).
type DevicePlugin struct{ s *stockDevicePlugin }

// NewDevicePlugin is the device plugin of every node of nodes, their
// GPUs all free.
func NewDevicePlugin(nodes []NodeSpec) (*DevicePlugin, error) {
	s, err := newStockDevicePlugin(nodes)
	if err != nil {
		return nil, err
	}
	return &DevicePlugin{s: s}, nil
}

// Allocate takes count of node's free GPUs as the plugin would for a pod
// kubelet admits there, and returns their UUIDs.
func (d *DevicePlugin) Allocate(node string, count int) ([]string, error) {
	return d.s.allocate(node, count)
}
