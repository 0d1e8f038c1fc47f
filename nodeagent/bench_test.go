package nodeagent

import (
	"context"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"testing"

	"github.com/go-logr/logr"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// BenchmarkTopology measures one full discovery (every device and every
// pair) through the simulated NVML. Compare the fixtures against pcie-8x,
// the baseline with no NVLink to probe.
func BenchmarkTopology(b *testing.B) {
	for _, name := range []string{"pcie-8x", "dgx-a100", "dgx1-v100", "dgx2"} {
		b.Run(name, func(b *testing.B) {
			f := fixtureB(b, name)
			src := NewNVMLSource(nvmlsim.New(f, testNode).NVML(), logr.Discard(), nil)
			for b.Loop() {
				if _, err := src.Topology(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGetPreferredAllocation compares the plan path (baseline) with
// the local topology fallback on a 16-GPU node.
func BenchmarkGetPreferredAllocation(b *testing.B) {
	f := fixtureB(b, "dgx2")
	st := f.Graph(testNode).Status()
	var ids []string
	for _, g := range st.GPUs {
		ids = append(ids, g.UUID)
	}
	req := &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: ids[3:], AllocationSize: 4,
	}}}
	for _, tc := range []struct {
		name string
		pods []PendingPod
	}{
		{"plan", []PendingPod{planned("a", 4, ids[12:16], 0)}},
		{"topology", nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := NewDevicePlugin(DevicePluginOptions{PluginDir: b.TempDir()}, &fakePods{cached: tc.pods, live: tc.pods}, nil, logr.Discard())
			p.SetTopology(st)
			for b.Loop() {
				if _, err := p.GetPreferredAllocation(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
