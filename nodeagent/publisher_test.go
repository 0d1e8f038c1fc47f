package nodeagent

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
)

// writeCounter counts status writes to NodeGPUTopology and can fail the
// next ones with a conflict.
type writeCounter struct {
	creates, updates atomic.Int32
	conflicts        atomic.Int32
}

func newFakeClient(t *testing.T, wc *writeCounter, node string) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: types.UID("uid-" + node)}}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(n).
		WithStatusSubresource(&v1alpha1.NodeGPUTopology{}).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				wc.creates.Add(1)
				return c.Create(ctx, obj, opts...)
			},
			SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
				wc.updates.Add(1)
				if wc.conflicts.Load() > 0 {
					wc.conflicts.Add(-1)
					return apierrors.NewConflict(schema.GroupResource{Group: "gputopo.io", Resource: "nodegputopologies"}, obj.GetName(), nil)
				}
				return c.SubResource(sub).Update(ctx, obj, opts...)
			},
		}).Build()
}

func getNGT(t *testing.T, c client.Client, name string) *v1alpha1.NodeGPUTopology {
	t.Helper()
	obj := &v1alpha1.NodeGPUTopology{}
	if err := c.Get(context.Background(), client.ObjectKey{Name: name}, obj); err != nil {
		t.Fatalf("get NodeGPUTopology %s: %v", name, err)
	}
	return obj
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestPublisherCreatesOwnedObjectWithFixtureTopology(t *testing.T) {
	f := fixture(t, "dgx1-v100")
	wc := &writeCounter{}
	c := newFakeClient(t, wc, testNode)
	src := NewNVMLSource(nvmlsim.New(f, testNode).NVML(), logr.Discard(), nil)
	p := NewPublisher(c, src, PublisherOptions{NodeName: testNode}, nil, logr.Discard())
	if err := p.Sync(context.Background(), t0, false); err != nil {
		t.Fatal(err)
	}
	obj := getNGT(t, c, testNode)
	wantOwner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: testNode, UID: types.UID("uid-" + testNode)}}
	if diff := cmp.Diff(wantOwner, obj.OwnerReferences); diff != "" {
		t.Errorf("owner references (-want +got):\n%s", diff)
	}
	want := wantStatus(f)
	if diff := cmp.Diff(want.Links, obj.Status.Links); diff != "" {
		t.Errorf("published links (-want +got):\n%s", diff)
	}
	if obj.Status.TopologyHash != want.TopologyHash || len(obj.Status.Telemetry) != 8 || obj.Status.Stale {
		t.Errorf("published status: hash %q (want %q), %d telemetry entries (want 8), stale %v (want false)",
			obj.Status.TopologyHash, want.TopologyHash, len(obj.Status.Telemetry), obj.Status.Stale)
	}
	if !obj.Status.ObservedTime.Time.Equal(t0) || !obj.Status.TelemetryTime.Time.Equal(t0) {
		t.Errorf("times: observed %v telemetry %v, want both %v", obj.Status.ObservedTime, obj.Status.TelemetryTime, t0)
	}
}

// An idle node writes once at start and once per topology refresh; the
// jitter of idle GPUs stays under the thresholds. With the thresholds off
// every telemetry read is a write.
func TestPublisherIdleWrites(t *testing.T) {
	tests := []struct {
		name       string
		always     bool
		wantWrites int32
	}{
		{"thresholds keep an idle node quiet", false, 3},   // t=0, 5m, 10m
		{"without thresholds every read writes", true, 21}, // every 30s for 10m, plus t=0
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wc := &writeCounter{}
			c := newFakeClient(t, wc, testNode)
			src := NewNVMLSource(nvmlsim.New(fixture(t, "hgx-h100"), testNode).NVML(), logr.Discard(), nil)
			p := NewPublisher(c, src, PublisherOptions{NodeName: testNode, Always: tc.always}, nil, logr.Discard())
			for s := 0; s <= 600; s++ {
				if err := p.Sync(context.Background(), t0.Add(time.Duration(s)*time.Second), false); err != nil {
					t.Fatal(err)
				}
			}
			if got := wc.updates.Load(); got != tc.wantWrites {
				t.Errorf("status writes over 10 idle minutes: got %d, want %d", got, tc.wantWrites)
			}
			if got := wc.creates.Load(); got != 1 {
				t.Errorf("creates: got %d, want 1", got)
			}
		})
	}
}

func TestPublisherWritesTelemetryThatMoved(t *testing.T) {
	wc := &writeCounter{}
	c := newFakeClient(t, wc, testNode)
	sim := nvmlsim.New(fixture(t, "hgx-h100"), testNode)
	src := NewNVMLSource(sim.NVML(), logr.Discard(), nil)
	p := NewPublisher(c, src, PublisherOptions{NodeName: testNode}, nil, logr.Discard())
	ctx := context.Background()
	if err := p.Sync(ctx, t0, false); err != nil {
		t.Fatal(err)
	}
	if err := sim.SetTelemetry(6, nvmlsim.Telemetry{UtilizationPercent: 95, MemoryUsedMiB: 60000, TemperatureC: 70, PowerWatts: 600, PowerLimitWatts: 700}); err != nil {
		t.Fatal(err)
	}
	if err := p.Sync(ctx, t0.Add(30*time.Second), false); err != nil {
		t.Fatal(err)
	}
	if got := wc.updates.Load(); got != 2 {
		t.Fatalf("status writes: got %d, want 2 (start, then the busy GPU)", got)
	}
	tel := getNGT(t, c, testNode).Status.Telemetry[6]
	if tel.UtilizationPercent < 95 || tel.TemperatureC < 70 || tel.MemoryUsedMiB != 60000 {
		t.Errorf("published telemetry of GPU 6: %+v, want the busy readings", tel)
	}
}

func TestPublisherRefreshesAtOnceOnHealthChange(t *testing.T) {
	wc := &writeCounter{}
	c := newFakeClient(t, wc, testNode)
	sim := nvmlsim.New(fixture(t, "dgx-a100"), testNode)
	src := NewNVMLSource(sim.NVML(), logr.Discard(), nil)
	p := NewPublisher(c, src, PublisherOptions{NodeName: testNode}, nil, logr.Discard())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	waitFor(t, "first publish", func() bool { return wc.updates.Load() >= 1 })
	if err := sim.LoseGPU(5); err != nil {
		t.Fatal(err)
	}
	// The lost GPU is seen by the next NVML read; the health watcher makes
	// one happen without waiting for the topology interval.
	if _, err := src.Telemetry(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "GPU 5 published unhealthy", func() bool {
		return getNGT(t, c, testNode).Status.GPUs[5].Health == v1alpha1.GPUUnhealthy
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestPublisherMarksStale(t *testing.T) {
	wc := &writeCounter{}
	c := newFakeClient(t, wc, testNode)
	f := fixture(t, "pcie-8x")
	sim := nvmlsim.New(f, testNode)
	src := NewNVMLSource(sim.NVML(), logr.Discard(), nil)
	p := NewPublisher(c, src, PublisherOptions{NodeName: testNode}, nil, logr.Discard())
	ctx := context.Background()

	sim.FailInit(nvml.ERROR_DRIVER_NOT_LOADED)
	if err := p.Sync(ctx, t0, false); err != nil {
		t.Fatal(err)
	}
	st := getNGT(t, c, testNode).Status
	if !st.Stale || st.StaleReason != "nvml init: ERROR_DRIVER_NOT_LOADED" || len(st.GPUs) != 0 {
		t.Errorf("with no good read: stale %v reason %q, %d GPUs; want stale, the init error, no GPUs", st.Stale, st.StaleReason, len(st.GPUs))
	}

	sim.FailInit(nvml.SUCCESS)
	if err := p.Sync(ctx, t0.Add(5*time.Minute), false); err != nil {
		t.Fatal(err)
	}
	good := getNGT(t, c, testNode).Status
	if good.Stale || good.TopologyHash != wantStatus(f).TopologyHash {
		t.Fatalf("after the driver came back: stale %v hash %q; want fresh %q", good.Stale, good.TopologyHash, wantStatus(f).TopologyHash)
	}

	// The driver fails mid-run: the source keeps its session, so make the
	// device count fail, as a driver in trouble does.
	sim.FailDeviceCount(nvml.ERROR_UNKNOWN)
	if err := p.Sync(ctx, t0.Add(10*time.Minute), false); err != nil {
		t.Fatal(err)
	}
	stale := getNGT(t, c, testNode).Status
	if !stale.Stale || stale.StaleReason != "nvml DeviceGetCount: ERROR_UNKNOWN" {
		t.Errorf("after a failed read: stale %v reason %q; want stale with the NVML error", stale.Stale, stale.StaleReason)
	}
	if diff := cmp.Diff(good.Links, stale.Links); diff != "" || stale.TopologyHash != good.TopologyHash {
		t.Errorf("stale status must keep the last good topology (-good +stale):\n%s", diff)
	}
}

// The TopologyConsistent condition travels with the topology: its
// lastTransitionTime moves only when its status does, a refused read
// (duplicate bus IDs) publishes the last good topology as stale with the
// refusal's condition, and the truth told again clears it.
func TestPublisherPublishesConsistency(t *testing.T) {
	wc := &writeCounter{}
	c := newFakeClient(t, wc, testNode)
	f := fixture(t, "dgx1-v100")
	sim := nvmlsim.New(f, testNode)
	src := NewNVMLSource(sim.NVML(), logr.Discard(), nil)
	p := NewPublisher(c, src, PublisherOptions{NodeName: testNode}, nil, logr.Discard())
	ctx := context.Background()
	condition := func() metav1.Condition {
		t.Helper()
		st := getNGT(t, c, testNode).Status
		if len(st.Conditions) != 1 {
			t.Fatalf("published conditions %+v: want exactly one", st.Conditions)
		}
		return st.Conditions[0]
	}
	sync := func(at time.Duration) {
		t.Helper()
		if err := p.Sync(ctx, t0.Add(at), true); err != nil {
			t.Fatal(err)
		}
	}

	sync(0)
	if c := condition(); c.Status != metav1.ConditionTrue || !c.LastTransitionTime.Time.Equal(t0) {
		t.Fatalf("first read: %s since %v; want True since %v", c.Status, c.LastTransitionTime, t0)
	}
	sync(5 * time.Minute)
	if c := condition(); !c.LastTransitionTime.Time.Equal(t0) {
		t.Errorf("unchanged condition moved its lastTransitionTime to %v", c.LastTransitionTime)
	}

	must(t, sim.SetBusID(5, mustBus(t, sim, 2)))
	sync(10 * time.Minute)
	st := getNGT(t, c, testNode).Status
	if c := condition(); c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonDuplicateBusID || !c.LastTransitionTime.Time.Equal(t0.Add(10*time.Minute)) {
		t.Errorf("duplicate bus IDs: condition %s/%s since %v; want False/%s since %v", c.Status, c.Reason, c.LastTransitionTime, v1alpha1.ReasonDuplicateBusID, t0.Add(10*time.Minute))
	}
	if !st.Stale || !strings.Contains(st.StaleReason, "GPU 2 and GPU 5 both report PCI bus ID") || st.TopologyHash != wantStatus(f).TopologyHash {
		t.Errorf("duplicate bus IDs: stale %v reason %q hash %s; want the last good topology, stale, naming GPUs 2 and 5", st.Stale, st.StaleReason, st.TopologyHash)
	}

	must(t, sim.SetBusID(5, "00000000:57:00.0"))
	sync(15 * time.Minute)
	st = getNGT(t, c, testNode).Status
	if c := condition(); c.Status != metav1.ConditionTrue || st.Stale {
		t.Errorf("bus IDs unique again: condition %s, stale %v; want True and fresh", c.Status, st.Stale)
	}
}

func TestPublisherRetriesConflicts(t *testing.T) {
	wc := &writeCounter{}
	c := newFakeClient(t, wc, testNode)
	src := NewNVMLSource(nvmlsim.New(fixture(t, "dgx2"), testNode).NVML(), logr.Discard(), nil)
	p := NewPublisher(c, src, PublisherOptions{NodeName: testNode}, nil, logr.Discard())
	wc.conflicts.Store(2)
	if err := p.Sync(context.Background(), t0, false); err != nil {
		t.Fatalf("Sync with two conflicts: %v", err)
	}
	if got := len(getNGT(t, c, testNode).Status.GPUs); got != 16 {
		t.Errorf("published GPUs after conflicts: got %d, want 16", got)
	}
	if got := wc.updates.Load(); got != 3 {
		t.Errorf("status update attempts: got %d, want 3 (two conflicts, one success)", got)
	}
}

// waitFor polls cond every 10ms, failing the test if it does not hold
// within 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}
