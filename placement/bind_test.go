package placement

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// memAPI is bind's API over pods and nodes in memory. bindErr, when set,
// answers the next Binding (after applying it when apply is set: a write
// that landed although its answer was lost).
type memAPI struct {
	mu      sync.Mutex
	pods    map[types.NamespacedName]*corev1.Pod
	nodes   map[string]*corev1.Node
	bindErr error
	apply   bool
	binds   int
}

func newMemAPI() *memAPI {
	return &memAPI{pods: map[types.NamespacedName]*corev1.Pod{}, nodes: map[string]*corev1.Node{}}
}

func (a *memAPI) add(p *corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}] = p.DeepCopy()
}

func (a *memAPI) pod(key types.NamespacedName) (*corev1.Pod, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.pods[key]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("pods"), key.Name)
	}
	return p.DeepCopy(), nil
}

func (a *memAPI) Pod(_ context.Context, key types.NamespacedName, _ types.UID) (*corev1.Pod, error) {
	return a.pod(key)
}

func (a *memAPI) FreshPod(_ context.Context, key types.NamespacedName) (*corev1.Pod, error) {
	return a.pod(key)
}

func (a *memAPI) Node(_ context.Context, name string) (*corev1.Node, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n, ok := a.nodes[name]; ok {
		return n, nil
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
}

func (a *memAPI) Bind(_ context.Context, b *corev1.Binding) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.binds++
	err := a.bindErr
	a.bindErr = nil
	if err != nil && !a.apply {
		return err
	}
	p := a.pods[types.NamespacedName{Namespace: b.Namespace, Name: b.Name}]
	if p == nil || p.UID != b.UID {
		return apierrors.NewNotFound(corev1.Resource("pods"), b.Name)
	}
	if p.Spec.NodeName != "" {
		return apierrors.NewConflict(corev1.Resource("pods/binding"), b.Name, errors.New("pod is already assigned to a node"))
	}
	p.Spec.NodeName = b.Target.Name
	for k, v := range b.Annotations {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
	return err
}

// bindCore is an offline core binding through a memAPI, fed n dgx1-v100
// nodes.
func bindCore(t *testing.T, n int) (*Core, *memAPI, []string) {
	t.Helper()
	api := newMemAPI()
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.TopologyMaxAge = &metav1.Duration{Duration: -1}
	x, err := New(Options{Config: cfg, API: api})
	if err != nil {
		t.Fatal(err)
	}
	x.setClock(func() time.Time { return groupEpoch })
	return x, api, feedNodes(t, x, "dgx1-v100", n, func(int) map[string]string { return nil })
}

// bindPod is a pending pod for gputopo-scheduler asking gpus GPUs.
func bindPod(name string, gpus int, ann map[string]string) *corev1.Pod {
	p := gpuPod(name, gpus, ann)
	p.Spec.SchedulerName = v1alpha1.DefaultSchedulerName
	return p
}

func bindReq(p *corev1.Pod, node string) BindRequest {
	return BindRequest{Key: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, UID: p.UID, Node: node}
}

// TestBindWritesTheGPUsItHoldsInOneBinding: a bind reserves the pod's GPUs
// on the node, writes one Binding whose annotations name them and their
// placement, and confirms them in the ledger; binding the same pod again
// (an answer lost) changes nothing.
func TestBindWritesTheGPUsItHoldsInOneBinding(t *testing.T) {
	x, api, names := bindCore(t, 1)
	p := bindPod("mp", 4, reqAnn(`{"requireNVLink":true,"strategy":"highest_bandwidth"}`))
	api.add(p)
	x.ledger.UpsertPod(p)
	res := x.Bind(context.Background(), bindReq(p, names[0]))
	if res.Outcome != Bound || res.Err != nil {
		t.Fatalf("bind: outcome %d, %v", res.Outcome, res.Err)
	}
	got, _ := api.pod(bindReq(p, "").Key)
	if got.Spec.NodeName != names[0] || got.Annotations[v1alpha1.AnnotationAssignedGPUs] != v1alpha1.FormatGPUList(res.UUIDs) {
		t.Errorf("bound pod: node %q, assigned %q; want %s and %v", got.Spec.NodeName, got.Annotations[v1alpha1.AnnotationAssignedGPUs], names[0], res.UUIDs)
	}
	pl, err := v1alpha1.ParsePlacement(got.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil || len(pl.GPUIndices) != 4 || (pl.Tier != v1alpha1.TierNVLink && pl.Tier != v1alpha1.TierNVSwitch) {
		t.Errorf("placement %+v (%v): want 4 GPUs on NVLink", pl, err)
	}
	if c := x.ledger.Report().Counts(); c.Held != 4 || c.Reserved != 0 {
		t.Errorf("ledger after bind: %s, want 4 held, none reserved", c)
	}
	again := x.Bind(context.Background(), bindReq(got, names[0]))
	if again.Outcome != Bound || again.Err != nil || api.binds != 1 {
		t.Errorf("bind again: outcome %d, %v, %d Bindings written; want Bound without a second Binding", again.Outcome, again.Err, api.binds)
	}
}

// TestExtenderBindOfAClaimPodWritesAPlainBinding: bound without the
// cycle's request (the HTTP extender), a pod that asks for its GPUs
// through ResourceClaims gets a Binding without GPUs, and the ledger
// reserves none for it: DynamicResources allocated the claims' devices
// before the bind, and the ledger takes them from the claims. Its
// request, read alone (ParsePod), counts the claims' GPUs; a pod that
// asks for GPUs neither way is still refused.
func TestExtenderBindOfAClaimPodWritesAPlainBinding(t *testing.T) {
	api := newMemAPI()
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.TopologyMaxAge = &metav1.Duration{Duration: -1}
	x, err := New(Options{Config: cfg, API: api, ClaimGPUs: func(p *corev1.Pod) int {
		if len(p.Spec.ResourceClaims) > 0 {
			return 4
		}
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	x.setClock(func() time.Time { return groupEpoch })
	names := feedNodes(t, x, "dgx1-v100", 1, func(int) map[string]string { return nil })
	p := bindPod("claims", 0, reqAnn(`{"requireNVLink":true}`))
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("claims-gpus")}}
	api.add(p)
	pr, err := x.ParsePod(p)
	if err != nil || pr.Count != 4 || !pr.claims || !pr.req.RequireNVLink {
		t.Fatalf("ParsePod: count %d, claims %v, requirement %+v, err %v; want 4 through claims, NVLink required", pr.Count, pr.claims, pr.req, err)
	}
	res := x.Bind(context.Background(), bindReq(p, names[0]))
	if res.Outcome != Bound || res.Err != nil || len(res.UUIDs) != 0 {
		t.Fatalf("bind: outcome %d, GPUs %v, %v; want Bound without GPUs of its own", res.Outcome, res.UUIDs, res.Err)
	}
	got, _ := api.pod(bindReq(p, "").Key)
	if got.Spec.NodeName != names[0] || got.Annotations[v1alpha1.AnnotationAssignedGPUs] != "" {
		t.Errorf("bound pod: node %q, assigned %q; want %s and no GPUs on the Binding", got.Spec.NodeName, got.Annotations[v1alpha1.AnnotationAssignedGPUs], names[0])
	}
	if c := x.ledger.Report().Counts(); c.Held != 0 || c.Reserved != 0 {
		t.Errorf("ledger after bind: %s, want nothing held by the bind (the claims hold)", c)
	}
	if again := x.Bind(context.Background(), bindReq(got, names[0])); again.Outcome != Bound || again.Err != nil || api.binds != 1 {
		t.Errorf("bind again: outcome %d, %v, %d Bindings; want Bound without a second Binding", again.Outcome, again.Err, api.binds)
	}
	cpu := bindPod("cpu", 0, nil)
	api.add(cpu)
	if res := x.Bind(context.Background(), bindReq(cpu, names[0])); res.Err == nil || !strings.Contains(res.Err.Error(), "no GPUs through ResourceClaims") {
		t.Errorf("bind of a pod without GPUs: %v; want refused", res.Err)
	}
}

// TestBindOutcomes: each way a bind can end leaves the ledger as its
// outcome says: Released frees what was reserved, Unknown keeps it for
// the retry, Unchanged never touched it.
func TestBindOutcomes(t *testing.T) {
	timeout := apierrors.NewServerTimeout(corev1.Resource("pods"), "create", 1)
	for _, tc := range []struct {
		name     string
		setup    func(api *memAPI, p *corev1.Pod) BindRequest
		outcome  Outcome
		kind     ErrorKind
		reserved int
		held     int
		msg      string
	}{{
		name:    "pod deleted before binding",
		setup:   func(api *memAPI, p *corev1.Pod) BindRequest { return bindReq(p, "node-0") },
		outcome: Released, kind: ErrBadRequest, msg: "not found",
	}, {
		name: "pod recreated with another UID",
		setup: func(api *memAPI, p *corev1.Pod) BindRequest {
			q := p.DeepCopy()
			q.UID = "uid-other"
			api.add(q)
			return bindReq(p, "node-0")
		},
		outcome: Released, kind: ErrConflict, msg: "deleted and recreated",
	}, {
		name: "pod addressed to another scheduler",
		setup: func(api *memAPI, p *corev1.Pod) BindRequest {
			p.Spec.SchedulerName = "default-scheduler"
			api.add(p)
			return bindReq(p, "node-0")
		},
		outcome: Released, kind: ErrRefused, msg: `schedulerName "default-scheduler" is not a gputopo scheduler profile`,
	}, {
		name: "node tainted against the pod",
		setup: func(api *memAPI, p *corev1.Pod) BindRequest {
			api.nodes["node-0"] = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-0"},
				Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpu", Value: "broken", Effect: corev1.TaintEffectNoSchedule}}}}
			api.add(p)
			return bindReq(p, "node-0")
		},
		outcome: Released, kind: ErrRefused, msg: "does not tolerate the node's taint gpu=broken:NoSchedule",
	}, {
		name: "the API server refuses the Binding",
		setup: func(api *memAPI, p *corev1.Pod) BindRequest {
			api.add(p)
			api.bindErr = apierrors.NewForbidden(corev1.Resource("pods/binding"), p.Name, errors.New("no"))
			return bindReq(p, "node-0")
		},
		outcome: Released, kind: ErrAPIDefinite, msg: "forbidden",
	}, {
		name: "the answer is lost and the pod is not bound: its GPUs stay reserved",
		setup: func(api *memAPI, p *corev1.Pod) BindRequest {
			api.add(p)
			api.bindErr = timeout
			return bindReq(p, "node-0")
		},
		outcome: Unknown, kind: ErrAPIUnknown, reserved: 2, msg: "stay reserved for the retry",
	}, {
		name: "the answer is lost but the Binding landed: bound",
		setup: func(api *memAPI, p *corev1.Pod) BindRequest {
			api.add(p)
			api.bindErr, api.apply = timeout, true
			return bindReq(p, "node-0")
		},
		outcome: Bound, held: 2,
	}, {
		name: "the pod is bound elsewhere already",
		setup: func(api *memAPI, p *corev1.Pod) BindRequest {
			p.Spec.NodeName = "node-1"
			api.add(p)
			return bindReq(p, "node-0")
		},
		outcome: Unchanged, kind: ErrConflict, msg: "already bound to node node-1",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			x, api, _ := bindCore(t, 2)
			p := bindPod("p", 2, map[string]string{})
			x.ledger.UpsertPod(p)
			res := x.Bind(context.Background(), tc.setup(api, p))
			if res.Outcome != tc.outcome || res.Kind != tc.kind {
				t.Errorf("outcome %d kind %q (%v), want %d %q", res.Outcome, res.Kind, res.Err, tc.outcome, tc.kind)
			}
			if tc.msg != "" && (res.Err == nil || !strings.Contains(res.Err.Error(), tc.msg)) {
				t.Errorf("error %v, want it to say %q", res.Err, tc.msg)
			}
			if c := x.ledger.Report().Counts(); c.Reserved != tc.reserved || c.Held != tc.held {
				t.Errorf("ledger after the bind: %s, want %d reserved, %d held", c, tc.reserved, tc.held)
			}
		})
	}
}

// TestConcurrentBindsNeverShareAGPU: 8 binds of 1-GPU pods to one 8-GPU
// node at once each get their own GPU.
func TestConcurrentBindsNeverShareAGPU(t *testing.T) {
	x, api, names := bindCore(t, 1)
	var wg sync.WaitGroup
	results := make([]BindResult, 8)
	for i := range 8 {
		p := bindPod("p"+string(rune('a'+i)), 1, map[string]string{})
		api.add(p)
		x.ledger.UpsertPod(p)
		wg.Go(func() { results[i] = x.Bind(context.Background(), bindReq(p, names[0])) })
	}
	wg.Wait()
	seen := map[string]bool{}
	for i, r := range results {
		if r.Err != nil || len(r.UUIDs) != 1 {
			t.Fatalf("bind %d: %v %v", i, r.UUIDs, r.Err)
		}
		if seen[r.UUIDs[0]] {
			t.Fatalf("GPU %s bound twice", r.UUIDs[0])
		}
		seen[r.UUIDs[0]] = true
	}
}

// A pod of higher priority bound to GPUs that preemption victims of lower
// priority held gets a PreemptionFreedGPUs Event naming each of them of
// its namespace and the GPUs it freed, and counting those of other
// namespaces without naming them; a pod of the victims' priority gets none.
func TestBindAfterPreemptionNamesTheVictimsAndTheirGPUs(t *testing.T) {
	api := newMemAPI()
	rec := record.NewFakeRecorder(8)
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.TopologyMaxAge = &metav1.Duration{Duration: -1}
	x, err := New(Options{Config: cfg, API: api, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	x.setClock(func() time.Time { return groupEpoch })
	names := feedNodes(t, x, "dgx-a100", 1, func(int) map[string]string { return nil })
	node := names[0]
	// Eight 1-GPU victims fill the node; kube-scheduler marks and deletes them.
	var victims []string
	var bound []*corev1.Pod
	for i := range 8 {
		v := bindPod(fmt.Sprintf("low-%d", i), 1, map[string]string{})
		if i >= 6 {
			v.Namespace = "other-team" // a tenant the event must not name
		}
		api.add(v)
		x.ledger.UpsertPod(v)
		if res := x.Bind(context.Background(), bindReq(v, node)); res.Err != nil {
			t.Fatal(res.Err)
		}
		b, _ := api.pod(bindReq(v, "").Key)
		x.ledger.UpsertPod(b)
		bound = append(bound, b)
		victims = append(victims, v.Namespace+"/"+v.Name)
	}
	for _, b := range bound {
		gone := b.DeepCopy()
		gone.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: corev1.PodReasonPreemptionByScheduler}}
		x.ledger.UpsertPod(gone)
		x.ledger.DeletePod(bindReq(b, "").Key, b.UID)
	}
	for len(rec.Events) > 0 {
		<-rec.Events
	}
	// A pod of the victims' priority (which could not have preempted them)
	// takes one freed GPU: no Event.
	other := bindPod("other", 1, map[string]string{})
	api.add(other)
	x.ledger.UpsertPod(other)
	if res := x.Bind(context.Background(), bindReq(other, node)); res.Err != nil {
		t.Fatal(res.Err)
	}
	if len(rec.Events) != 0 {
		t.Errorf("a pod bound without preempting got %q", <-rec.Events)
	}
	high := bindPod("high", 7, map[string]string{})
	prio := int32(1000)
	high.Spec.Priority = &prio
	api.add(high)
	x.ledger.UpsertPod(high)
	res := x.Bind(context.Background(), bindReq(high, node))
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	var events []string
	for len(rec.Events) > 0 {
		events = append(events, <-rec.Events)
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], "Normal "+ReasonPreemptionFreedGPUs+" node "+node+": preemption freed the GPUs of ") {
		t.Fatalf("events = %q, want one PreemptionFreedGPUs event", events)
	}
	named, hidden := 0, 0
	for i, v := range victims {
		u := bound[i].Annotations[v1alpha1.AnnotationAssignedGPUs]
		idx := slices.IndexFunc([]int{0, 1, 2, 3, 4, 5, 6, 7}, func(j int) bool { return machine.FixtureUUID(node, j) == u })
		want := fmt.Sprintf("%s (GPUs %d: %s)", v, idx, u)
		got := strings.Contains(events[0], v+" ")
		switch {
		case bound[i].Namespace != "ml":
			if got || strings.Contains(events[0], u) {
				t.Errorf("event %q names %s of another namespace, or its GPU's UUID", events[0], v)
			}
			if slices.Contains(res.UUIDs, u) {
				hidden++
			}
		case slices.Contains(res.UUIDs, u) && !strings.Contains(events[0], want):
			t.Errorf("event %q does not name victim %s and its GPU: %q", events[0], v, want)
		case !slices.Contains(res.UUIDs, u) && got:
			t.Errorf("event %q names victim %s, whose GPU the pod did not get", events[0], v)
		case got:
			named++
		}
	}
	if named+hidden != 7 || hidden > 0 && !strings.Contains(events[0], fmt.Sprintf("; %d pods of other namespaces (GPUs ", hidden)) {
		t.Errorf("event %q: names %d victims and counts %d of other namespaces, want the 7 whose GPUs the pod got, those of other namespaces only counted", events[0], named, hidden)
	}
}
