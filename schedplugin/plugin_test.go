package schedplugin

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gputopo/gputopo/topology/machine"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	fwk "k8s.io/kube-scheduler/framework"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/fakeapi"
	"github.com/gputopo/gputopo/placement"
	clusterrt "github.com/gputopo/gputopo/placement/cluster"
)

// cycleState is the part of the framework's CycleState the plugin uses
// (Read, Write, Delete), safe for the parallel Filter and Score calls.
type cycleState struct {
	fwk.CycleState
	mu sync.Mutex
	m  map[fwk.StateKey]fwk.StateData
}

func newState() *cycleState { return &cycleState{m: map[fwk.StateKey]fwk.StateData{}} }

func (s *cycleState) Read(k fwk.StateKey) (fwk.StateData, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.m[k]; ok {
		return d, nil
	}
	return nil, fwk.ErrNotFound
}

func (s *cycleState) Write(k fwk.StateKey, d fwk.StateData) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[k] = d
}

func (s *cycleState) Delete(k fwk.StateKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, k)
}

// nodeInfo is a NodeInfo that knows its Node only.
type nodeInfo struct {
	fwk.NodeInfo
	n *corev1.Node
	c *cluster
}

func (n nodeInfo) Node() *corev1.Node { return n.n }

// GetPods are the pods the ledger holds GPUs for on the node: a snapshot
// that agrees with the ledger.
func (n nodeInfo) GetPods() []fwk.PodInfo {
	if n.c == nil {
		return nil
	}
	var out []fwk.PodInfo
	for _, h := range n.c.x.Core().Report().Holdings() {
		if h.Node == n.n.Name {
			out = append(out, podInfo{p: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: h.Pod.Name, Namespace: h.Pod.Namespace, UID: h.PodUID}}})
		}
	}
	return out
}

var now = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// cluster is a core over a fake API with the named fixture machines, and
// the plugin over it.
type cluster struct {
	x     *extender.Extender
	p     *Plugin
	cs    *fake.Clientset
	nodes []fwk.NodeInfo
}

func newCluster(t *testing.T, fixtures ...string) *cluster {
	t.Helper()
	cs := fake.NewClientset()
	cs.PrependReactor("create", "pods", fakeapi.BindingReactor(cs))
	core, err := placement.New(placement.Options{API: clusterrt.ClientAPI(cs, configv1alpha1.DefaultExtenderConfiguration().BindTimeout.Duration), Clock: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{x: extender.NewForCore(core, extender.NewOptions()), p: NewForCore(core), cs: cs}
	for i, f := range fixtures {
		c.addNode(t, f, f+"-"+string(rune('a'+i)), -1)
	}
	return c
}

// addNode adds a node of a fixture machine whose kubelet reports gpus in
// capacity and allocatable (-1: as many as the machine has).
func (c *cluster) addNode(t *testing.T, fixture, name string, gpus int64) {
	t.Helper()
	fx, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	st := fx.Graph(name).Status()
	st.ObservedTime = metav1.NewTime(now)
	if gpus < 0 {
		gpus = int64(len(st.GPUs))
	}
	res := corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Capacity: res, Allocatable: res.DeepCopy()}}
	if _, err := c.cs.CoreV1().Nodes().Create(context.Background(), node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.x.Core().Feed().UpsertNode(node)
	c.x.Core().Feed().UpsertTopology(&v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: st})
	c.nodes = append(c.nodes, nodeInfo{n: node, c: c})
}

func (c *cluster) names() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Node().Name
	}
	return out
}

// pod makes a pending GPU pod of the gputopo profile in the fake API.
func (c *cluster) pod(t *testing.T, name string, gpus int64, requirement string) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(now)},
		Spec:       corev1.PodSpec{SchedulerName: v1alpha1.DefaultSchedulerName, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
	}
	if gpus > 0 {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(gpus, resource.DecimalSI)}
	}
	if requirement != "" {
		p.Annotations = map[string]string{v1alpha1.AnnotationRequirement: requirement}
	}
	if _, err := c.cs.CoreV1().Pods("default").Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return p
}

// excluded is the status the framework gives a node PreFilter's result
// leaves out (schedule_one.go: "node(s) didn't satisfy plugin(s)").
var excluded = fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "node(s) didn't satisfy plugin(s) [GPUTopology]")

// filter runs PreFilter and, as the framework does, Filter in parallel on
// every node PreFilter's result keeps, and returns each node's status
// (nil: passed). A node the result leaves out gets excluded; every node
// gets PreFilter's own status when PreFilter refuses the pod.
func (c *cluster) filter(t *testing.T, st fwk.CycleState, pod *corev1.Pod) map[string]*fwk.Status {
	t.Helper()
	res, pre := c.p.PreFilter(context.Background(), st, pod, c.nodes)
	out := make(map[string]*fwk.Status, len(c.nodes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		name := n.Node().Name
		switch {
		case !pre.IsSuccess():
			mu.Lock()
			out[name] = pre
			mu.Unlock()
		case !res.AllNodes() && !res.NodeNames.Has(name):
			mu.Lock()
			out[name] = excluded
			mu.Unlock()
		default:
			wg.Go(func() {
				s := c.p.Filter(context.Background(), st, pod, n)
				mu.Lock()
				out[name] = s
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return out
}

const modelNVLink = `{"requireNVLink":true,"strategy":"highest_bandwidth"}`

// TestFilterAndScoreAreTheExtenders: every verdict, reason, code and score
// the plugin gives is the one the extender's verbs give for the same pod
// and nodes.
func TestFilterAndScoreAreTheExtenders(t *testing.T) {
	c := newCluster(t, "dgx-a100", "pcie-8x", "dgx1-v100", "pcie-8x-nvlink-pairs")
	// A node whose topology lists 8 GPUs where kubelet registered 4: the
	// plugin refuses it as untrusted, as the verbs do.
	c.addNode(t, "dgx-a100", "untrusted", 4)
	for _, tc := range []struct {
		name string
		gpus int64
		req  string
	}{
		{"model-4-nvlink", 4, modelNVLink},
		{"model-8-nvlink", 8, modelNVLink},
		{"data-2", 2, `{"strategy":"numa_local"}`},
		{"plain-3", 3, ""},
		{"too-many", 9, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := c.pod(t, tc.name, tc.gpus, tc.req)
			names := c.names()
			want := c.x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
			st := newState()
			got := c.filter(t, st, pod)
			if r := want.FailedNodes["untrusted"]; !strings.Contains(r, "the topology is not trusted") {
				t.Errorf("the extender's filter on the untrusted node: %q, want it refused as untrusted", r)
			}
			res, pre := c.p.PreFilter(context.Background(), newState(), pod, c.nodes)
			var feasible []fwk.NodeInfo
			unresolvable := 0
			for _, n := range c.nodes {
				name := n.Node().Name
				s := got[name]
				refused := want.FailedNodes[name] != "" || want.FailedAndUnresolvableNodes[name] != ""
				if want.FailedAndUnresolvableNodes[name] != "" {
					unresolvable++
				}
				switch {
				case !pre.IsSuccess() || !res.AllNodes() && !res.NodeNames.Has(name):
					// Left out by PreFilter (its result, or its refusal of
					// every node): only a node the extender refuses may be.
					if !refused {
						t.Errorf("%s: left out by PreFilter (%v), but the extender's filter passes it", name, s)
					}
				case want.FailedNodes[name] != "":
					if s.Code() != fwk.Unschedulable || s.Message() != want.FailedNodes[name] {
						t.Errorf("%s: got %v %q, want Unschedulable %q", name, s.Code(), s.Message(), want.FailedNodes[name])
					}
				case want.FailedAndUnresolvableNodes[name] != "":
					if s.Code() != fwk.UnschedulableAndUnresolvable || s.Message() != want.FailedAndUnresolvableNodes[name] {
						t.Errorf("%s: got %v %q, want UnschedulableAndUnresolvable %q", name, s.Code(), s.Message(), want.FailedAndUnresolvableNodes[name])
					}
				default:
					if !s.IsSuccess() {
						t.Errorf("%s: got %v, want it to pass as the extender's filter does", name, s)
					}
					feasible = append(feasible, n)
				}
			}
			if tc.name == "model-8-nvlink" {
				// Only the DGX A100 has 8 GPUs all NVLinked to each
				// other: PreFilter's result is it alone.
				if res.AllNodes() || !res.NodeNames.Equal(sets.New(nodeNames(feasible)...)) {
					t.Errorf("PreFilter's result %v, want exactly the nodes filter passes, %v", res, nodeNames(feasible))
				}
			}
			if !pre.IsSuccess() {
				// Refused in PreFilter: in gputopo's words, and
				// unresolvable exactly when the extender refuses every
				// node as unresolvable.
				wantCode := fwk.Unschedulable
				if unresolvable == len(c.nodes) {
					wantCode = fwk.UnschedulableAndUnresolvable
				}
				if pre.Code() != wantCode || !strings.HasPrefix(pre.Message(), placement.ReasonPrefix) {
					t.Errorf("PreFilter refused the pod with %v %q; want %v in gputopo's words", pre.Code(), pre.Message(), wantCode)
				}
			}
			if len(feasible) == 0 {
				return
			}
			if s := c.p.PreScore(context.Background(), st, pod, feasible); !s.IsSuccess() {
				t.Fatalf("PreScore: %v", s)
			}
			fnames := nodeNames(feasible)
			prio, err := c.x.Prioritize(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &fnames})
			if err != nil {
				t.Fatal(err)
			}
			for _, hp := range prio {
				score, s := c.p.Score(context.Background(), st, pod, nodeInfo{n: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: hp.Host}}})
				if !s.IsSuccess() || score != hp.Score*10 {
					t.Errorf("%s: score %d (%v), want the extender's %d x 10", hp.Host, score, s, hp.Score)
				}
				if score < 0 || score > fwk.MaxNodeScore {
					t.Errorf("%s: score %d outside 0..%d", hp.Host, score, fwk.MaxNodeScore)
				}
			}
		})
	}
}

// TestReserveHoldsAndUnreserveFrees: GPUs reserved in one cycle are not
// offered in the next; Unreserve gives them back; a bound pod keeps them.
func TestReserveHoldsAndUnreserveFrees(t *testing.T) {
	c := newCluster(t, "dgx-a100")
	node := c.names()[0]
	a := c.pod(t, "a", 8, modelNVLink)
	stA := newState()
	if s := c.filter(t, stA, a)[node]; !s.IsSuccess() {
		t.Fatalf("a on an idle 8-GPU node: %v", s)
	}
	if s := c.p.Reserve(context.Background(), stA, a, node); !s.IsSuccess() {
		t.Fatalf("Reserve a: %v", s)
	}
	b := c.pod(t, "b", 1, "")
	stB := newState()
	s := c.filter(t, stB, b)[node]
	if s.IsSuccess() || !strings.Contains(s.Message(), "free") {
		t.Fatalf("b while a holds every GPU: got %v, want a refusal about free GPUs", s)
	}
	c.p.Unreserve(context.Background(), stA, a, node)
	if s := c.filter(t, newState(), b)[node]; !s.IsSuccess() {
		t.Fatalf("b after a's Unreserve: %v, want it to pass", s)
	}

	// Reserve and bind a; a later Unreserve (a failed PostBind-time
	// cycle cannot happen, but a stray call must not free bound GPUs).
	stA = newState()
	c.filter(t, stA, a)
	if s := c.p.Reserve(context.Background(), stA, a, node); !s.IsSuccess() {
		t.Fatalf("Reserve a again: %v", s)
	}
	if s := c.p.Bind(context.Background(), stA, a, node); !s.IsSuccess() {
		t.Fatalf("Bind a: %v", s)
	}
	got, err := c.cs.CoreV1().Pods("default").Get(context.Background(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != node || got.Annotations[v1alpha1.AnnotationAssignedGPUs] == "" || got.Annotations[v1alpha1.AnnotationPlacement] == "" {
		t.Fatalf("after Bind: node %q, annotations %v; want the node with assigned GPUs and placement written with the binding", got.Spec.NodeName, got.Annotations)
	}
	if n := len(strings.Split(got.Annotations[v1alpha1.AnnotationAssignedGPUs], ",")); n != 8 {
		t.Fatalf("assigned %d GPUs, want 8", n)
	}
	c.p.Unreserve(context.Background(), stA, a, node)
	if s := c.filter(t, newState(), b)[node]; s.IsSuccess() {
		t.Fatal("Unreserve after a successful bind freed the bound pod's GPUs")
	}
}

// TestTwoReservationsNeverShareAGPU: concurrent cycles (the framework runs
// one at a time, but binding goroutines overlap with the next cycle) that
// reserve on one node get disjoint GPUs.
func TestTwoReservationsNeverShareAGPU(t *testing.T) {
	c := newCluster(t, "dgx-a100")
	node := c.names()[0]
	var pods []*corev1.Pod
	for i := range 8 {
		pods = append(pods, c.pod(t, "p"+string(rune('0'+i)), 1, ""))
	}
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Go(func() {
			st := newState()
			if _, s := c.p.PreFilter(context.Background(), st, p, c.nodes); !s.IsSuccess() {
				t.Errorf("PreFilter %s: %v", p.Name, s)
				return
			}
			if s := c.p.Reserve(context.Background(), st, p, node); !s.IsSuccess() {
				t.Errorf("Reserve %s: %v", p.Name, s)
				return
			}
			if s := c.p.Bind(context.Background(), st, p, node); !s.IsSuccess() {
				t.Errorf("Bind %s: %v", p.Name, s)
			}
		})
	}
	wg.Wait()
	seen := map[string]string{}
	for _, p := range pods {
		got, err := c.cs.CoreV1().Pods("default").Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		gpu := got.Annotations[v1alpha1.AnnotationAssignedGPUs]
		if gpu == "" {
			t.Fatalf("%s has no assigned GPU", p.Name)
		}
		if other, dup := seen[gpu]; dup {
			t.Fatalf("%s and %s were both given %s", other, p.Name, gpu)
		}
		seen[gpu] = p.Name
	}
}

// TestPodsWithoutGPUsAreLeftToTheDefaults: PreFilter, PreScore and Bind
// skip, so the default plugins and DefaultBinder decide them.
func TestPodsWithoutGPUsAreLeftToTheDefaults(t *testing.T) {
	c := newCluster(t, "dgx-a100")
	p := c.pod(t, "web", 0, "")
	st := newState()
	if _, s := c.p.PreFilter(context.Background(), st, p, c.nodes); !s.IsSkip() {
		t.Errorf("PreFilter: %v, want Skip", s)
	}
	if s := c.p.PreScore(context.Background(), st, p, c.nodes); !s.IsSkip() {
		t.Errorf("PreScore: %v, want Skip", s)
	}
	if s := c.p.Reserve(context.Background(), st, p, c.names()[0]); !s.IsSuccess() {
		t.Errorf("Reserve: %v, want success (nothing to hold)", s)
	}
	if s := c.p.Bind(context.Background(), st, p, c.names()[0]); !s.IsSkip() {
		t.Errorf("Bind: %v, want Skip for DefaultBinder", s)
	}
}

// TestBadRequestsNameTheField: a malformed requirement or GPU request
// ends the cycle as unresolvable with the message that names the field;
// nothing is reserved.
func TestBadRequestsNameTheField(t *testing.T) {
	c := newCluster(t, "dgx-a100")
	for _, tc := range []struct {
		name, req, want string
	}{
		{"bad-json", `{"requireNVLink":`, v1alpha1.AnnotationRequirement},
		{"bad-strategy", `{"strategy":"fastest"}`, "strategy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := c.pod(t, tc.name, 2, tc.req)
			_, s := c.p.PreFilter(context.Background(), newState(), p, c.nodes)
			if s.Code() != fwk.UnschedulableAndUnresolvable || !strings.Contains(s.Message(), tc.want) {
				t.Fatalf("got %v %q, want UnschedulableAndUnresolvable naming %q", s.Code(), s.Message(), tc.want)
			}
		})
	}
	if c.x.Core().Report().Counts().Reserved != 0 {
		t.Fatalf("reservations after refused requests: %+v", c.x.Core().Report().Counts())
	}
}

// TestNotReadyCoreRetries: until the core has synced, GPU pods get an
// error status (retried with backoff), never a decision from an empty
// ledger.
func TestNotReadyCoreRetries(t *testing.T) {
	// A core that was never started: informers not synced.
	rt, err := clusterrt.New(&rest.Config{Host: "http://127.0.0.1:1"}, fake.NewClientset(), clusterrt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := NewForCore(rt.Core())
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1")}},
	}}}}
	_, s := p.PreFilter(context.Background(), newState(), pod, nil)
	if s.Code() != fwk.Error || !strings.Contains(s.Message(), "not ready") {
		t.Fatalf("got %v %q, want Error saying not ready", s.Code(), s.Message())
	}
}

func TestDecodeArgs(t *testing.T) {
	a, err := DecodeArgs(nil)
	if err != nil || a.MetricsBindAddress != DefaultMetricsBindAddress {
		t.Fatalf("nil args: %+v, %v; want defaults", a, err)
	}
	a, err = DecodeArgs(&runtime.Unknown{Raw: []byte(`{"configFile":"/etc/gputopo/extender.yaml","metricsBindAddress":"0"}`)})
	if err != nil || a.ConfigFile != "/etc/gputopo/extender.yaml" || a.MetricsBindAddress != "0" {
		t.Fatalf("got %+v, %v", a, err)
	}
	if _, err := DecodeArgs(&runtime.Unknown{Raw: []byte(`{"configPath":"x"}`)}); err == nil || !strings.Contains(err.Error(), "configPath") {
		t.Fatalf("unknown field: %v, want an error naming it", err)
	}
	if _, err := DecodeArgs(&corev1.Pod{}); err == nil || !strings.Contains(err.Error(), "*v1.Pod") {
		t.Fatalf("wrong type: %v, want an error naming it", err)
	}
}

// TestUnreserveAfterAFailedBind: a Binding the API server certainly did
// not apply frees the reservation at Unreserve; one whose outcome is
// unknown (a timeout, the pod still unbound when read back) keeps it, so
// that the retry gets the same GPUs and no other pod gets them meanwhile.
func TestUnreserveAfterAFailedBind(t *testing.T) {
	for _, tc := range []struct {
		name         string
		answer       error
		wantUnknown  bool
		wantReserved int
	}{
		{"definite failure", apierrors.NewForbidden(fakeapi.PodsGVR.GroupResource(), "p", errors.New("RBAC says no")), false, 0},
		{"outcome unknown", apierrors.NewServerTimeout(fakeapi.PodsGVR.GroupResource(), "create", 1), true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, "dgx-a100")
			node := c.names()[0]
			c.cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetSubresource() != "binding" {
					return false, nil, nil
				}
				return true, nil, tc.answer
			})
			p := c.pod(t, "p", 4, modelNVLink)
			st := newState()
			if s := c.filter(t, st, p)[node]; !s.IsSuccess() {
				t.Fatalf("Filter: %v", s)
			}
			if s := c.p.Reserve(context.Background(), st, p, node); !s.IsSuccess() {
				t.Fatalf("Reserve: %v", s)
			}
			if s := c.p.Bind(context.Background(), st, p, node); s.IsSuccess() {
				t.Fatal("Bind succeeded against an API server that refused or timed out")
			}
			_, err := st.Read(bindKey)
			if unknown := err == nil; unknown != tc.wantUnknown {
				t.Errorf("bind outcome recorded unknown = %v, want %v", unknown, tc.wantUnknown)
			}
			c.p.Unreserve(context.Background(), st, p, node)
			if got := c.x.Core().Report().Counts().Reserved; got != tc.wantReserved {
				t.Errorf("after Unreserve %d GPUs reserved, want %d", got, tc.wantReserved)
			}
		})
	}
}
