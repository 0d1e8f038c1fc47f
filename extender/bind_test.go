package extender

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/fakeapi"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

func bindArgs(p *corev1.Pod, node string) *extenderv1.ExtenderBindingArgs {
	return &extenderv1.ExtenderBindingArgs{PodName: p.Name, PodNamespace: p.Namespace, PodUID: p.UID, Node: node}
}

func getPod(t *testing.T, cs *fake.Clientset, name string) *corev1.Pod {
	t.Helper()
	p, err := cs.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func assignedOf(t *testing.T, p *corev1.Pod) []string {
	t.Helper()
	uuids, err := v1alpha1.ParseGPUList(v1alpha1.AnnotationAssignedGPUs, p.Annotations[v1alpha1.AnnotationAssignedGPUs])
	if err != nil {
		t.Fatal(err)
	}
	return uuids
}

func TestBindWritesAssignmentAndPlacementInTheBinding(t *testing.T) {
	pod := makePod("mp").gpus(4).req(modelParallel).obj()
	x, cs := newTestExtender(t, nil, pod)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	x.core.Feed().UpsertPod(pod)

	if res := x.Bind(context.Background(), bindArgs(pod, "a")); res.Error != "" {
		t.Fatalf("bind: %s", res.Error)
	}
	got := getPod(t, cs, "mp")
	if got.Spec.NodeName != "a" {
		t.Fatalf("nodeName = %q, want a", got.Spec.NodeName)
	}
	uuids := assignedOf(t, got)
	set := indicesOf(t, "dgx1-v100", "a", uuids)
	if set != topology.MaskOf(0, 1, 2, 3) && set != topology.MaskOf(4, 5, 6, 7) {
		t.Errorf("assigned GPUs %v: want one of the two fully NVLinked quads", set)
	}
	pl, err := v1alpha1.ParsePlacement(got.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		t.Fatal(err)
	}
	if pl.Node != "a" || pl.Tier != v1alpha1.TierNVLink || pl.Strategy != v1alpha1.StrategyHighestBandwidth || topology.MaskOf(pl.GPUIndices...) != set {
		t.Errorf("placement = %+v, want node a, nvlink tier, highest_bandwidth, indices %v", pl, set)
	}
	if pl.MinPairBandwidthGBps != 50 {
		t.Errorf("placement minPairBandwidthGBps = %d, want 50 (single NVLink2 links inside a DGX-1 quad)", pl.MinPairBandwidthGBps)
	}
	// Bound but not yet seen by the informer: held, not reserved.
	if c := x.core.Report().Counts(); c.Held != 4 || c.Reserved != 0 || c.Free != 4 {
		t.Errorf("ledger after bind: %s; want held=4 reserved=0 free=4", c)
	}
	// The informer delivers the bound pod: nothing changes.
	x.core.Feed().UpsertPod(got)
	if diff := cmp.Diff([]ledger.Holding{{PodUID: pod.UID, Pod: keyOf(pod), Node: "a", GPUs: uuids}}, x.core.Report().Holdings()); diff != "" {
		t.Errorf("holdings (-want +got):\n%s", diff)
	}
}

func TestBindIsIdempotentPerPodUID(t *testing.T) {
	pod := makePod("p").gpus(2).obj()
	x, cs := newTestExtender(t, nil, pod)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	// The first Binding times out at the client although the API server
	// applies it; kube-scheduler retries.
	var calls int
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "binding" {
			return false, nil, nil
		}
		calls++
		if calls == 1 {
			_, _, _ = fakeapi.BindingReactor(cs)(action)
			return true, nil, apierrors.NewServerTimeout(fakeapi.PodsGVR.GroupResource(), "create", 1)
		}
		return false, nil, nil
	})
	if res := x.Bind(context.Background(), bindArgs(pod, "a")); res.Error != "" {
		t.Fatalf("first bind (ambiguous, settled by reading the pod): %s", res.Error)
	}
	first := assignedOf(t, getPod(t, cs, "p"))
	if res := x.Bind(context.Background(), bindArgs(pod, "a")); res.Error != "" {
		t.Fatalf("retried bind: %s", res.Error)
	}
	if diff := cmp.Diff(first, assignedOf(t, getPod(t, cs, "p"))); diff != "" {
		t.Errorf("retry changed the GPUs (-first +now):\n%s", diff)
	}
	if c := x.core.Report().Counts(); c.Held != 2 || c.Free != 6 {
		t.Errorf("ledger: %s; want held=2 free=6", c)
	}
}

func TestBindAmbiguousUnboundKeepsReservationForTheRetry(t *testing.T) {
	pod := makePod("p").gpus(2).obj()
	x, cs := newTestExtender(t, nil, pod)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	fail := true
	cs.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() == "binding" && fail && action.(k8stesting.CreateAction).GetObject().(*corev1.Binding).Name == "p" {
			return true, nil, context.DeadlineExceeded
		}
		return false, nil, nil
	})
	res := x.Bind(context.Background(), bindArgs(pod, "a"))
	if !strings.Contains(res.Error, "outcome unknown") || !strings.Contains(res.Error, "stay reserved") {
		t.Fatalf("bind error = %q, want an outcome-unknown error", res.Error)
	}
	reserved := x.core.Report().Holdings()
	if len(reserved) != 1 || !reserved[0].Reserved {
		t.Fatalf("holdings = %+v, want one reservation", reserved)
	}
	// Another pod cannot take the reserved GPUs meanwhile.
	other := makePod("q").gpus(6).obj()
	if _, err := cs.CoreV1().Pods("default").Create(context.Background(), other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	x.core.Feed().UpsertPod(other)
	if res := x.Bind(context.Background(), bindArgs(other, "a")); res.Error != "" {
		t.Fatalf("bind other: %s", res.Error)
	}
	otherGPUs := assignedOf(t, getPod(t, cs, "q"))
	x.core.Feed().UpsertPod(getPod(t, cs, "q"))
	// The node is full (2 reserved, 6 bound). The retry's Filter and
	// Prioritize see the pod's own reservation as free for it, so
	// kube-scheduler can send it back to the GPUs it was promised; any
	// other pod still finds the node full.
	names := []string{"a"}
	if res := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}); res.Error != "" || res.NodeNames == nil || len(*res.NodeNames) != 1 {
		t.Fatalf("filter of the pod holding the reservation = %+v, want node a feasible", res)
	}
	if res, err := x.Prioritize(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}); err != nil || len(res) != 1 || res[0].Score <= 0 {
		t.Errorf("prioritize of the pod holding the reservation = %+v, %v; want node a scored as feasible", res, err)
	}
	third := makePod("r").gpus(2).obj()
	if res := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: third, NodeNames: &names}); res.NodeNames != nil && len(*res.NodeNames) != 0 {
		t.Fatalf("filter of another pod = %v, want node a full (its free GPUs are reserved)", *res.NodeNames)
	}
	fail = false
	if res := x.Bind(context.Background(), bindArgs(pod, "a")); res.Error != "" {
		t.Fatalf("retry: %s", res.Error)
	}
	got := assignedOf(t, getPod(t, cs, "p"))
	if diff := cmp.Diff(reserved[0].GPUs, got); diff != "" {
		t.Errorf("retry got other GPUs than reserved (-reserved +got):\n%s", diff)
	}
	if !indicesOf(t, "dgx1-v100", "a", got).Intersect(indicesOf(t, "dgx1-v100", "a", otherGPUs)).Empty() {
		t.Errorf("pods share GPUs: %v and %v", got, otherGPUs)
	}
}

func TestBindFailures(t *testing.T) {
	tests := []struct {
		name string
		// reactor answers the Binding; nil binds as the API server does.
		reactor  k8stesting.ReactionFunc
		mutate   func(t *testing.T, x *Extender, cs *fake.Clientset, pod *corev1.Pod) *extenderv1.ExtenderBindingArgs
		wantErr  string
		wantHeld int
	}{{
		name: "definite API failure releases the reservation",
		reactor: func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(fakeapi.PodsGVR.GroupResource(), "p", errors.New("RBAC says no"))
		},
		wantErr: "forbidden",
	}, {
		name: "pod recreated with the same name is refused and releases",
		mutate: func(t *testing.T, x *Extender, cs *fake.Clientset, pod *corev1.Pod) *extenderv1.ExtenderBindingArgs {
			a := bindArgs(pod, "a")
			a.PodUID = "uid-of-the-deleted-pod"
			return a
		},
		wantErr: "it was deleted and recreated",
	}, {
		name: "pod recreated between reserve and Binding: UID precondition conflict releases",
		mutate: func(t *testing.T, x *Extender, cs *fake.Clientset, pod *corev1.Pod) *extenderv1.ExtenderBindingArgs {
			// The cache still has the old pod; the API server has a new one.
			fresh := pod.DeepCopy()
			fresh.UID = "uid-new"
			if err := cs.Tracker().Update(fakeapi.PodsGVR, fresh, "default"); err != nil {
				t.Fatal(err)
			}
			return bindArgs(pod, "a")
		},
		wantErr: "it was deleted and recreated",
	}, {
		name: "missing pod is an error",
		mutate: func(t *testing.T, x *Extender, cs *fake.Clientset, pod *corev1.Pod) *extenderv1.ExtenderBindingArgs {
			a := bindArgs(pod, "a")
			a.PodName, a.PodUID = "ghost", "uid-ghost"
			return a
		},
		wantErr: "pod default/ghost not found",
	}, {
		name: "node that cannot fit is refused with the filter reason",
		mutate: func(t *testing.T, x *Extender, cs *fake.Clientset, pod *corev1.Pod) *extenderv1.ExtenderBindingArgs {
			holdOn(x, "h", "a", 0, 1, 2, 3, 4, 5, 6)
			return bindArgs(pod, "a")
		},
		wantErr:  "needs 2 GPUs; 1 of 8 are free",
		wantHeld: 7,
	}, {
		name: "unknown node is refused",
		mutate: func(t *testing.T, x *Extender, cs *fake.Clientset, pod *corev1.Pod) *extenderv1.ExtenderBindingArgs {
			return bindArgs(pod, "nowhere")
		},
		wantErr: "has no NodeGPUTopology",
	}, {
		name: "pod bound elsewhere by someone else after an ambiguous failure releases",
		reactor: func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewInternalError(errors.New("etcd leader changed"))
		},
		mutate: func(t *testing.T, x *Extender, cs *fake.Clientset, pod *corev1.Pod) *extenderv1.ExtenderBindingArgs {
			gets := 0
			cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				// Bind reads the pod unbound; settling reads it bound.
				if gets++; gets == 1 {
					return false, nil, nil
				}
				p := pod.DeepCopy()
				p.Spec.NodeName = "b"
				return true, p, nil
			})
			return bindArgs(pod, "a")
		},
		wantErr: "the pod is bound to node b",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := makePod("p").gpus(2).obj()
			x, cs := newTestExtender(t, nil, pod)
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
			x.core.Feed().UpsertPod(pod)
			if tc.reactor != nil {
				cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if a.GetSubresource() != "binding" {
						return false, nil, nil
					}
					return tc.reactor(a)
				})
			}
			args := bindArgs(pod, "a")
			if tc.mutate != nil {
				args = tc.mutate(t, x, cs, pod)
			}
			res := x.Bind(context.Background(), args)
			if !strings.Contains(res.Error, tc.wantErr) {
				t.Fatalf("bind error = %q, want it to contain %q", res.Error, tc.wantErr)
			}
			if c := x.core.Report().Counts(); c.Held != tc.wantHeld || c.Reserved != 0 {
				t.Errorf("ledger after failed bind: %s; want held=%d reserved=0", c, tc.wantHeld)
			}
		})
	}
}

func TestConcurrentBindsToOneNodeNeverShareAGPU(t *testing.T) {
	const pods = 24 // three times the node's 8 GPUs
	var objs []runtime.Object
	var list []*corev1.Pod
	for i := range pods {
		p := makePod(fmt.Sprintf("p%02d", i)).gpus(int64(1 + i%2)).obj()
		objs = append(objs, p)
		list = append(list, p)
	}
	x, cs := newTestExtender(t, nil, objs...)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	for _, p := range list {
		x.core.Feed().UpsertPod(p)
	}
	var wg sync.WaitGroup
	for _, p := range list {
		wg.Go(func() { x.Bind(context.Background(), bindArgs(p, "a")) })
	}
	wg.Wait()
	owner := map[string]string{}
	total := 0
	for _, p := range list {
		got := getPod(t, cs, p.Name)
		if got.Spec.NodeName == "" {
			continue
		}
		uuids := assignedOf(t, got)
		if want, _ := ledger.GPUCount(p, v1alpha1.ResourceGPU); len(uuids) != want {
			t.Errorf("pod %s got %d GPUs, want %d", p.Name, len(uuids), want)
		}
		for _, u := range uuids {
			if o, dup := owner[u]; dup {
				t.Errorf("GPU %s given to %s and %s", u, o, p.Name)
			}
			owner[u] = p.Name
		}
		total += len(uuids)
	}
	c := x.core.Report().Counts()
	if total > 8 || c.Held != total || c.Free != 8-total || c.Reserved != 0 {
		t.Errorf("bound %d GPUs, ledger %s; want at most 8, all held, the rest free", total, c)
	}
	if total < 7 {
		t.Errorf("only %d of 8 GPUs bound by 24 pods of 1-2 GPUs", total)
	}
}
