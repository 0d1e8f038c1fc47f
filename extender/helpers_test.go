package extender

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/cluster"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/fakeapi"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// podBuilder builds GPU pods for tests.
type podBuilder struct{ p *corev1.Pod }

func makePod(name string) *podBuilder {
	return &podBuilder{p: &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{SchedulerName: v1alpha1.DefaultSchedulerName, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}}
}

func (b *podBuilder) gpus(n int64) *podBuilder {
	b.p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI)}
	return b
}

func (b *podBuilder) annotate(k, v string) *podBuilder {
	if b.p.Annotations == nil {
		b.p.Annotations = map[string]string{}
	}
	b.p.Annotations[k] = v
	return b
}

func (b *podBuilder) req(json string) *podBuilder {
	return b.annotate(v1alpha1.AnnotationRequirement, json)
}

func (b *podBuilder) job(j string) *podBuilder {
	if b.p.Labels == nil {
		b.p.Labels = map[string]string{}
	}
	b.p.Labels[v1alpha1.LabelJob] = j
	return b
}

func (b *podBuilder) uid(u string) *podBuilder { b.p.UID = types.UID(u); return b }

func (b *podBuilder) node(n string) *podBuilder { b.p.Spec.NodeName = n; return b }

func (b *podBuilder) phase(p corev1.PodPhase) *podBuilder { b.p.Status.Phase = p; return b }

func (b *podBuilder) assigned(uuids ...string) *podBuilder {
	return b.annotate(v1alpha1.AnnotationAssignedGPUs, v1alpha1.FormatGPUList(uuids))
}

func (b *podBuilder) obj() *corev1.Pod { return b.p.DeepCopy() }

// topo returns a fresh NodeGPUTopology for a fixture machine.
func topo(t testing.TB, fixture, node string) *v1alpha1.NodeGPUTopology {
	t.Helper()
	f, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	st := f.Graph(node).Status()
	st.ObservedTime = metav1.NewTime(testNow)
	return &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: st}
}

// withTelemetry sets every GPU's telemetry.
func withTelemetry(o *v1alpha1.NodeGPUTopology, util, tempC, powerW, limitW int32) *v1alpha1.NodeGPUTopology {
	o.Status.TelemetryTime = metav1.NewTime(testNow)
	o.Status.Telemetry = nil
	for _, g := range o.Status.GPUs {
		o.Status.Telemetry = append(o.Status.Telemetry, v1alpha1.Telemetry{Index: g.Index, UtilizationPercent: util, TemperatureC: tempC, PowerWatts: powerW, PowerLimitWatts: limitW})
	}
	return o
}

func gpuNode(name string, gpus int64) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			v1alpha1.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI),
		}},
	}
}

// kubeletNode is a Node as kubelet reports it: capacity (every device
// the device plugin registered) and allocatable (the healthy ones).
func kubeletNode(name string, capacity, allocatable int64) *corev1.Node {
	n := gpuNode(name, allocatable)
	n.Status.Capacity = corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(capacity, resource.DecimalSI)}
	return n
}

var testNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// newTestExtender is a Ready extender whose clock is testNow, on a fake
// clientset that binds like kube-apiserver does.
func newTestExtender(t testing.TB, cfg *configv1alpha1.ExtenderConfiguration, objs ...runtime.Object) (*Extender, *fake.Clientset) {
	t.Helper()
	if cfg == nil {
		cfg = configv1alpha1.DefaultExtenderConfiguration()
	}
	cs := fake.NewClientset(objs...)
	cs.PrependReactor("create", "pods", fakeapi.BindingReactor(cs))
	// kube-scheduler only binds to nodes that exist; a node the test did
	// not create reads as a plain untainted one, so that tests about GPUs
	// need not create Node objects.
	cs.PrependReactor("get", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		name := a.(k8stesting.GetAction).GetName()
		if _, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", name); err == nil {
			return false, nil, nil
		}
		return true, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
	})
	x := newExtender(t, cfg, cs)
	setClock(x, func() time.Time { return testNow })
	return x, cs
}

// indicesOf maps UUIDs back to GPU indices on a fixture node.
func indicesOf(t testing.TB, fixture, node string, uuids []string) topology.Mask {
	t.Helper()
	f, _ := machine.FixtureByName(fixture)
	g := f.Graph(node)
	var m topology.Mask
	for _, u := range uuids {
		i, ok := g.IndexOf(u)
		if !ok {
			t.Fatalf("GPU %s is not on node %s", u, node)
		}
		m = m.With(i)
	}
	return m
}

func ptr[T any](v T) *T { return &v }

func keyOf(p *corev1.Pod) types.NamespacedName {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
}

// newExtender is a Ready extender over a core on cs, without informers or
// servers: tests drive its ledger directly. Its core binds through cs and
// has a testRuntime (runtimeOf) as its Gate and Recorder.
func newExtender(t testing.TB, cfg *configv1alpha1.ExtenderConfiguration, cs kubernetes.Interface) *Extender {
	t.Helper()
	rt := &testRuntime{}
	x, err := build(cfg, NewOptions(), func(o cluster.Options) (*placement.Core, *cluster.Runtime, error) {
		co := o.Core
		co.API = cluster.ClientAPI(cs, co.Config.BindTimeout.Duration)
		co.Gate, co.Recorder, co.Clock = rt, rt, rt.clock
		core, err := placement.New(co)
		return core, nil, err
	})
	if err != nil {
		t.Fatal(err)
	}
	rt.core = x.core
	testRuntimes.Store(x, rt)
	x.client = cs
	return x
}

// testRuntime is what a cluster runtime gives a core, for tests that feed
// its ledger themselves: a Gate that leads until stopLeading, and a
// Recorder that hands Events to the recorder a test sets.
type testRuntime struct {
	core    *placement.Core
	standby atomic.Bool
	rec     atomic.Pointer[record.FakeRecorder]
	// now is the core's clock (setClock); nil: the wall clock.
	now atomic.Pointer[func() time.Time]
}

func (r *testRuntime) clock() time.Time {
	if f := r.now.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

// setClock moves x's core (and its ledger) to the clock now.
func setClock(x *Extender, now func() time.Time) { runtimeOf(x).now.Store(&now) }

// testRuntimes maps each test extender to its testRuntime.
var testRuntimes sync.Map

// runtimeOf is x's testRuntime (newExtender).
func runtimeOf(x *Extender) *testRuntime {
	rt, _ := testRuntimes.Load(x)
	return rt.(*testRuntime)
}

func (r *testRuntime) NotReady() string {
	if r.standby.Load() {
		return "not ready: not the leader (another replica holds the lease) or ledger rebuild pending"
	}
	return ""
}
func (r *testRuntime) Leading() bool          { return !r.standby.Load() }
func (r *testRuntime) DeciderRefusal() string { return "" }

// stopLeading makes the replica a standby, as losing its election does.
func (r *testRuntime) stopLeading() { r.standby.Store(true) }

// lead makes it serve again and report what it found meanwhile, as the
// cluster runtime's Lead does.
func (r *testRuntime) lead() {
	r.standby.Store(false)
	r.core.Upkeep().AnnounceDoubleHolds()
}

// setRecorder makes the core's Events go to rec.
func (r *testRuntime) setRecorder(rec *record.FakeRecorder) { r.rec.Store(rec) }

func (r *testRuntime) Event(o runtime.Object, typ, reason, msg string) {
	if rec := r.rec.Load(); rec != nil {
		rec.Event(o, typ, reason, msg)
	}
}
func (r *testRuntime) Eventf(o runtime.Object, typ, reason, format string, args ...any) {
	if rec := r.rec.Load(); rec != nil {
		rec.Eventf(o, typ, reason, format, args...)
	}
}

// metricValue is the value of the gathered metric name (its first series).
func metricValue(t testing.TB, x *Extender, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := x.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
		return 0
	}
	return 0
}

func uuidsOn(node string, idx ...int) []string {
	out := make([]string, len(idx))
	for i, j := range idx {
		out[i] = machine.FixtureUUID(node, j)
	}
	return out
}

// drifted is pod name bound to node a with assigned-gpus (the plan) plan
// and allocated-gpus (what kubelet gave) got.
func drifted(name string, plan, got []int) *corev1.Pod {
	return makePod(name).gpus(int64(len(plan))).node("a").assigned(uuidsOn("a", plan...)...).
		annotate(v1alpha1.AnnotationAllocatedGPUs, v1alpha1.FormatGPUList(uuidsOn("a", got...))).obj()
}
