package nodeagent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// fakePods is a PodSource with separate cached and live answers.
type fakePods struct {
	cached, live []PendingPod
	liveCalls    int
}

func (f *fakePods) PendingPods(_ context.Context, _ corev1.ResourceName, live bool) ([]PendingPod, error) {
	if live {
		f.liveCalls++
		return append([]PendingPod(nil), f.live...), nil
	}
	return append([]PendingPod(nil), f.cached...), nil
}

// planned is a pending pod with one app container of n GPUs and plan gpus
// (nil: none), created at the given second.
func planned(name string, n int, gpus []string, created int) PendingPod {
	at := time.Date(2026, 1, 1, 12, 0, created, 0, time.UTC)
	return PendingPod{
		Plan:       Plan{Pod: "ns/" + name, UID: types.UID("uid-" + name), GPUs: gpus, Created: at, BoundAt: at},
		Demand:     n,
		Containers: []ContainerGPUs{{Name: "app", GPUs: n}},
	}
}

func newPlugin(t *testing.T, fixtureName string, pods PodSource) (*DevicePlugin, []string) {
	t.Helper()
	f := fixture(t, fixtureName)
	p := NewDevicePlugin(DevicePluginOptions{PluginDir: t.TempDir()}, pods, nil, logr.Discard())
	p.SetTopology(f.Graph(testNode).Status())
	ids := make([]string, f.GPUs)
	for i := range ids {
		ids[i] = machine.FixtureUUID(testNode, i)
	}
	return p, ids
}

func pick(ids []string, idx ...int) []string {
	out := make([]string, len(idx))
	for i, x := range idx {
		out[i] = ids[x]
	}
	return out
}

func TestAdmissionOrderFollowsKubelet(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }
	plans := []Plan{
		{Pod: "ns/streamed-late", BoundAt: at(20), Created: at(-100)},
		{Pod: "ns/batch-young", BoundAt: at(-5), Created: at(-50)},
		{Pod: "ns/streamed-early", BoundAt: at(10), Created: at(5)},
		{Pod: "ns/batch-old", BoundAt: at(-1), Created: at(-60)},
		{Pod: "ns/batch-old-b", BoundAt: at(-2), Created: at(-60)},
	}
	sort.SliceStable(plans, func(i, j int) bool { return admittedBefore(plans[i], plans[j], start.Add(300*time.Millisecond)) })
	var got []string
	for _, p := range plans {
		got = append(got, p.Pod)
	}
	// Bound before kubelet started: one batch, by creation time then
	// name; then the rest by bind time.
	want := []string{"ns/batch-old", "ns/batch-old-b", "ns/batch-young", "ns/streamed-early", "ns/streamed-late"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("admission order (-want +got):\n%s", diff)
	}
}

// TestGetPreferredAllocation: the answer is the plan of the pod the
// request is matched to (without kubelet's PodResources here: the
// matcher's rules with a view are TestChoose's), else the topology-best
// set, leaving out the GPUs planned for other pending pods.
func TestGetPreferredAllocation(t *testing.T) {
	_, ids := newPlugin(t, "dgx1-v100", &fakePods{})
	tests := []struct {
		name        string
		cached      []PendingPod
		live        []PendingPod
		available   []int
		mustInclude []int
		size        int32
		want        []int
		// notIn: the answer must have size GPUs, none of these (the
		// topology's choice otherwise).
		notIn    []int
		wantLive int
	}{
		{
			name:      "the pod whose next container has the size: its plan",
			cached:    []PendingPod{planned("a", 1, pick(ids, 0), 0), planned("b", 4, pick(ids, 4, 5, 6, 7), 1)},
			available: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 4, want: []int{4, 5, 6, 7},
		},
		{
			name:      "two pods of one size and nothing else to tell: the first in admission order",
			cached:    []PendingPod{planned("b", 2, pick(ids, 2, 3), 1), planned("a", 2, pick(ids, 6, 7), 0)},
			available: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 2, want: []int{6, 7},
		},
		{
			name:      "a pod whose plan is no longer free gives way to one whose plan is",
			cached:    []PendingPod{planned("a", 2, pick(ids, 6, 7), 0), planned("b", 2, pick(ids, 2, 3), 1)},
			available: []int{0, 1, 2, 3, 4, 5}, size: 2, want: []int{2, 3},
		},
		{
			name:      "must-include devices come first, then the plan",
			cached:    []PendingPod{planned("b", 2, pick(ids, 4, 5), 0)},
			available: []int{0, 1, 2, 3, 4, 5, 6, 7}, mustInclude: []int{5}, size: 2, want: []int{5, 4},
		},
		{
			name:      "a cache miss is retried live",
			live:      []PendingPod{planned("new", 2, pick(ids, 1, 2), 0)},
			available: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 2, want: []int{1, 2}, wantLive: 1,
		},
		{
			name:      "a plan with a GPU taken is topped up from the free GPUs not planned for others",
			cached:    []PendingPod{planned("a", 2, pick(ids, 6, 7), 0), planned("b", 4, pick(ids, 0, 1, 2, 3), 1)},
			available: []int{0, 1, 2, 3, 4, 5, 6}, size: 2, notIn: []int{0, 1, 2, 3, 7},
		},
		{
			name:      "a pod without a plan does not take the GPUs planned for others",
			cached:    []PendingPod{planned("a", 2, nil, 0), planned("b", 4, pick(ids, 0, 1, 2, 3), 1)},
			available: []int{0, 1, 2, 3, 4, 5, 6, 7}, size: 2, notIn: []int{0, 1, 2, 3},
		},
		{
			// No pod at all: the allocator's best NVLink quad on the
			// hybrid cube-mesh among the free GPUs.
			name:      "without a pod the topology-best local set",
			available: []int{0, 1, 2, 3, 4, 5}, size: 4, want: []int{0, 1, 2, 3}, wantLive: 1,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pods := &fakePods{cached: tc.cached, live: tc.live}
			p, ids := newPlugin(t, "dgx1-v100", pods)
			resp, err := p.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
				ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
					AvailableDeviceIDs: pick(ids, tc.available...), MustIncludeDeviceIDs: pick(ids, tc.mustInclude...), AllocationSize: tc.size,
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			got := resp.ContainerResponses[0].DeviceIDs
			if tc.want == nil {
				if len(got) != int(tc.size) {
					t.Errorf("preferred %v; want %d GPUs", got, tc.size)
				}
				for _, id := range pick(ids, tc.notIn...) {
					if slices.Contains(got, id) {
						t.Errorf("preferred %v includes %s, planned for another pod or taken", got, id)
					}
				}
			} else {
				want := pick(ids, tc.want...)
				if strings.Contains(tc.name, "topology-best") {
					got, want = v1alpha1.SortedGPUList(got), v1alpha1.SortedGPUList(want)
				}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("preferred devices (-want +got):\n%s", diff)
				}
			}
			if pods.liveCalls != tc.wantLive {
				t.Errorf("live pod reads: got %d, want %d", pods.liveCalls, tc.wantLive)
			}
		})
	}
}

func TestAllocateAnswersExactlyKubeletsDevices(t *testing.T) {
	p, ids := newPlugin(t, "hgx-h100", &fakePods{})
	allocated := 0
	p.OnAllocate(func() { allocated++ })
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: pick(ids, 7, 2)}, {DevicesIds: pick(ids, 0)},
	}}
	resp, err := p.Allocate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]string
	for _, cr := range resp.ContainerResponses {
		got = append(got, cr.Envs)
	}
	want := []map[string]string{
		{v1alpha1.EnvVisibleDevices: ids[7] + "," + ids[2]},
		{v1alpha1.EnvVisibleDevices: ids[0]},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("container envs (-want +got):\n%s", diff)
	}
	if allocated != 1 {
		t.Errorf("OnAllocate hooks ran %d times, want 1", allocated)
	}
	_, err = p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-not-here"}}}})
	if err == nil || !strings.Contains(err.Error(), `"GPU-not-here" is not a GPU of this node`) {
		t.Errorf("Allocate of an unknown device: got %v, want an error naming it", err)
	}
}

// fakeKubelet is kubelet's registration service on kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	mu       sync.Mutex
	requests []*pluginapi.RegisterRequest
	srv      *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.requests = append(k.requests, r)
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.requests)
}

// startFakeKubelet serves registration on dir/kubelet.sock, removing the
// other sockets first as a starting kubelet does.
func startFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(lis) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func TestPluginRegistersAndReregistersAfterKubeletRestart(t *testing.T) {
	dir := t.TempDir()
	first := startFakeKubelet(t, dir)
	p := NewDevicePlugin(DevicePluginOptions{PluginDir: dir, ResourceName: "example.com/gpu", WatchInterval: time.Hour}, &fakePods{}, nil, logr.Discard())
	f := fixture(t, "dgx-a100")
	p.SetTopology(f.Graph(testNode).Status())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "first registration", func() bool { return first.count() == 1 })
	want := &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "gputopo-example-com-gpu.sock", ResourceName: "example.com/gpu",
		Options: &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}}
	if got := first.requests[0]; got.Version != want.Version || got.Endpoint != want.Endpoint || got.ResourceName != want.ResourceName || !got.Options.GetPreferredAllocationAvailable {
		t.Errorf("register request: got %v, want %v", got, want)
	}

	// The plugin serves ListAndWatch on its socket; a health change is pushed.
	conn, err := grpc.NewClient("unix://"+p.SocketPath(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Devices) != 8 || msg.Devices[3].Health != pluginapi.Healthy || msg.Devices[3].Topology.Nodes[0].ID != 0 {
		t.Fatalf("first device list: %v; want 8 healthy GPUs with NUMA nodes", msg.Devices)
	}
	st := f.Graph(testNode).Status()
	st.GPUs[3].Health, st.GPUs[3].HealthReason = v1alpha1.GPUUnhealthy, "XID 79: GPU has fallen off the bus"
	p.SetTopology(st)
	if msg, err = stream.Recv(); err != nil {
		t.Fatal(err)
	}
	if msg.Devices[3].Health != pluginapi.Unhealthy || msg.Devices[2].Health != pluginapi.Healthy {
		t.Errorf("device list after GPU 3 failed: %v; want only GPU 3 unhealthy", msg.Devices)
	}

	// kubelet restarts: it wipes the directory and recreates kubelet.sock.
	first.srv.Stop()
	second := startFakeKubelet(t, dir)
	// The plugin records a registration after kubelet has answered it.
	waitFor(t, "registration with the restarted kubelet", func() bool { return second.count() == 1 && p.Registrations() == 2 })
	if _, err := os.Stat(p.SocketPath()); err != nil {
		t.Errorf("plugin socket after re-registration: %v", err)
	}
	if got, want := second.count(), 1; got != want {
		t.Errorf("registrations with the restarted kubelet: got %d, want %d", got, want)
	}
}
