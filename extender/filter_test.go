package extender

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gputopo/gputopo/topology/machine"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
)

const modelParallel = `{"requireNVLink":true,"strategy":"highest_bandwidth"}`

// holdOn makes a bound pod hold the given GPU indices on a fixture node.
func holdOn(x *Extender, name, node string, idx ...int) {
	uuids := make([]string, len(idx))
	for i, j := range idx {
		uuids[i] = machine.FixtureUUID(node, j)
	}
	x.core.Feed().UpsertPod(makePod(name).gpus(int64(len(idx))).node(node).assigned(uuids...).obj())
}

func TestFilter(t *testing.T) {
	type want struct {
		passed       []string
		failed       map[string]string // node -> substring of the reason
		unresolvable map[string]string
		errContains  string
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, x *Extender)
		pod   *corev1.Pod
		nodes []string
		want  want
	}{{
		name:  "4-GPU model-parallel pod fits an empty DGX-1",
		pod:   makePod("p").gpus(4).req(modelParallel).obj(),
		nodes: []string{"a"},
		want:  want{passed: []string{"a"}},
	}, {
		name: "NVLink island broken by held GPUs is a resolvable failure with the island size",
		setup: func(t *testing.T, x *Extender) {
			holdOn(x, "h1", "a", 0, 7)
		},
		pod:   makePod("p").gpus(4).req(modelParallel).obj(),
		nodes: []string{"a"},
		want:  want{failed: map[string]string{"a": "gputopo: needs NVLink between 4 GPUs; largest free NVLink-connected set has 3"}},
	}, {
		name:  "8 fully NVLinked GPUs can never fit a DGX-1",
		pod:   makePod("p").gpus(8).req(modelParallel).obj(),
		nodes: []string{"a"},
		want:  want{unresolvable: map[string]string{"a": "can never fit this node, even with every GPU free and healthy: needs NVLink between 8 GPUs"}},
	}, {
		name:  "more GPUs than the node has is unresolvable",
		pod:   makePod("p").gpus(9).obj(),
		nodes: []string{"a"},
		want:  want{unresolvable: map[string]string{"a": "pod requests 9 GPUs; node has 8"}},
	}, {
		name: "node advertising fewer GPUs than requested is unresolvable",
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertNode(gpuNode("a", 2))
		},
		pod:   makePod("p").gpus(4).obj(),
		nodes: []string{"a"},
		want:  want{unresolvable: map[string]string{"a": "node advertises 2 nvidia.com/gpu"}},
	}, {
		name:  "node without NodeGPUTopology fails with a reason naming the node agent",
		pod:   makePod("p").gpus(1).obj(),
		nodes: []string{"unknown-node"},
		want:  want{failed: map[string]string{"unknown-node": "has no NodeGPUTopology; the gputopo node agent"}},
	}, {
		name: "stale topology fails with the agent's reason",
		setup: func(t *testing.T, x *Extender) {
			o := topo(t, "dgx1-v100", "s")
			o.Status.Stale, o.Status.StaleReason = true, "NVML: driver not loaded"
			x.core.Feed().UpsertTopology(o)
		},
		pod:   makePod("p").gpus(1).obj(),
		nodes: []string{"s"},
		want:  want{failed: map[string]string{"s": "stale (NVML: driver not loaded)"}},
	}, {
		name: "topology not refreshed within topologyMaxAge is stale",
		setup: func(t *testing.T, x *Extender) {
			o := topo(t, "dgx1-v100", "old")
			o.Status.ObservedTime = metav1.NewTime(testNow.Add(-time.Hour))
			x.core.Feed().UpsertTopology(o)
		},
		pod:   makePod("p").gpus(1).obj(),
		nodes: []string{"old"},
		want:  want{failed: map[string]string{"old": "not refreshed for more than 15m0s"}},
	}, {
		name: "unhealthy GPUs make a full-node pod wait, not unresolvable",
		setup: func(t *testing.T, x *Extender) {
			o := topo(t, "dgx1-v100", "sick")
			o.Status.GPUs[3].Health = v1alpha1.GPUUnhealthy
			x.core.Feed().UpsertTopology(o)
		},
		pod:   makePod("p").gpus(8).obj(),
		nodes: []string{"sick"},
		want:  want{failed: map[string]string{"sick": "needs 8 GPUs; 7 of 8 are free and healthy (1 unhealthy)"}},
	}, {
		name:  "memory floor above the machine's GPUs is unresolvable",
		pod:   makePod("p").gpus(1).req(`{"gpuMemoryMiB":80000}`).obj(),
		nodes: []string{"a"},
		want:  want{unresolvable: map[string]string{"a": "needs 80000 MiB per GPU"}},
	}, {
		name:  "pod without a requirement gets the default strategy and passes",
		pod:   makePod("p").gpus(2).obj(),
		nodes: []string{"a", "b"},
		want:  want{passed: []string{"a", "b"}},
	}, {
		name:  "pod requesting no GPUs passes every node untouched",
		pod:   makePod("p").obj(),
		nodes: []string{"a", "nowhere"},
		want:  want{passed: []string{"a", "nowhere"}},
	}, {
		name:  "malformed requirement is an Error naming the field",
		pod:   makePod("p").gpus(2).req(`{"requireNVLink":"yes"}`).obj(),
		nodes: []string{"a"},
		want:  want{errContains: "requireNVLink"},
	}, {
		name:  "unknown strategy is an Error naming the field and the choices",
		pod:   makePod("p").gpus(2).req(`{"strategy":"fastest"}`).obj(),
		nodes: []string{"a"},
		want:  want{errContains: `strategy: Unsupported value: "fastest"`},
	}, {
		name: "pods whose GPUs are not recorded count against capacity",
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertPod(makePod("other").gpus(6).node("a").obj())
		},
		pod:   makePod("p").gpus(4).obj(),
		nodes: []string{"a"},
		want:  want{failed: map[string]string{"a": "needs 4 GPUs; 2 of 8 are free (6 more are held by pods whose GPUs are not recorded yet)"}},
	}, {
		name: "a Node whose kubelet agrees with the topology passes",
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertNode(kubeletNode("a", 8, 8))
		},
		pod:   makePod("p").gpus(4).req(modelParallel).obj(),
		nodes: []string{"a"},
		want:  want{passed: []string{"a"}},
	}, {
		name: "a topology listing more GPUs than the Node's capacity is untrusted, resolvable",
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertNode(kubeletNode("a", 4, 4))
		},
		pod:   makePod("p").gpus(1).obj(),
		nodes: []string{"a", "b"},
		want: want{passed: []string{"b"}, failed: map[string]string{"a": "node's NodeGPUTopology lists 8 GPUs but the Node advertises capacity 4 nvidia.com/gpu; " +
			"the topology is not trusted until they agree; check the gputopo node agent on this node"}},
	}, {
		name: "an untrusted topology is refused before the pod is measured against it",
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertNode(kubeletNode("a", 4, 4))
		},
		pod:   makePod("p").gpus(16).obj(),
		nodes: []string{"a"},
		want:  want{failed: map[string]string{"a": "lists 8 GPUs but the Node advertises capacity 4"}},
	}, {
		name: "a topology claiming more healthy GPUs than allocatable is untrusted",
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().UpsertNode(kubeletNode("a", 8, 6))
		},
		pod:   makePod("p").gpus(1).obj(),
		nodes: []string{"a"},
		want:  want{failed: map[string]string{"a": "lists 8 healthy GPUs but the Node advertises 6 allocatable nvidia.com/gpu"}},
	}, {
		name: "a GPU UUID another node listed first makes the later topology untrusted",
		setup: func(t *testing.T, x *Extender) {
			x.core.Feed().TopologiesListed()
			o := topo(t, "dgx1-v100", "c")
			o.Status.GPUs[0].UUID = machine.FixtureUUID("a", 6)
			x.core.Feed().UpsertTopology(o)
		},
		pod:   makePod("p").gpus(1).obj(),
		nodes: []string{"a", "c"},
		want: want{passed: []string{"a"}, failed: map[string]string{"c": "lists GPU " + machine.FixtureUUID("a", 6) +
			", which node a's NodeGPUTopology listed first; the topology is not trusted while both list it"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, _ := newTestExtender(t, nil)
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "b"))
			if tc.setup != nil {
				tc.setup(t, x)
			}
			names := append([]string(nil), tc.nodes...)
			res := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: tc.pod, NodeNames: &names})
			if tc.want.errContains != "" {
				if !strings.Contains(res.Error, tc.want.errContains) {
					t.Fatalf("Error = %q, want it to contain %q", res.Error, tc.want.errContains)
				}
				return
			}
			if res.Error != "" {
				t.Fatalf("unexpected Error %q", res.Error)
			}
			if diff := cmp.Diff(tc.want.passed, *res.NodeNames, cmpEmpty); diff != "" {
				t.Errorf("passed nodes (-want +got):\n%s", diff)
			}
			checkReasons(t, "FailedNodes", tc.want.failed, res.FailedNodes)
			checkReasons(t, "FailedAndUnresolvableNodes", tc.want.unresolvable, res.FailedAndUnresolvableNodes)
		})
	}
}

var cmpEmpty = cmp.FilterValues(func(a, b []string) bool { return len(a) == 0 && len(b) == 0 }, cmp.Ignore())

func checkReasons(t *testing.T, what string, want map[string]string, got extenderv1.FailedNodesMap) {
	t.Helper()
	if len(want) != len(got) {
		t.Errorf("%s = %v, want nodes %v", what, got, want)
	}
	for node, sub := range want {
		if !strings.HasPrefix(got[node], placement.ReasonPrefix) || !strings.Contains(got[node], sub) {
			t.Errorf("%s[%s] = %q, want %q prefix and %q", what, node, got[node], placement.ReasonPrefix, sub)
		}
	}
}

func TestFilterFullNodesModeReturnsNodeObjects(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	holdOn(x, "h", "b", 0, 1, 2, 3, 4, 5, 6, 7)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "b"))
	nodes := &corev1.NodeList{Items: []corev1.Node{*gpuNode("a", 8), *gpuNode("b", 8)}}
	res := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), Nodes: nodes})
	if res.NodeNames != nil {
		t.Errorf("NodeNames = %v, want nil in full-node mode", *res.NodeNames)
	}
	var got []string
	for _, n := range res.Nodes.Items {
		got = append(got, n.Name)
	}
	if diff := cmp.Diff([]string{"a"}, got); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	if !strings.Contains(res.FailedNodes["b"], "needs 1 GPUs; 0 of 8 are free") {
		t.Errorf("FailedNodes[b] = %q", res.FailedNodes["b"])
	}
}

func TestFilterReleasesFollowPods(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	holdOn(x, "h", "a", 0, 1, 2, 3, 4, 5, 6, 7)
	names := []string{"a"}
	pod := makePod("p").gpus(4).req(modelParallel).obj()
	if res := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}); len(*res.NodeNames) != 0 {
		t.Fatalf("full node passed: %v", *res.NodeNames)
	}
	// The holder finishes: its GPUs are free for the next request.
	done := makePod("h").gpus(8).node("a").phase(corev1.PodSucceeded).obj()
	x.core.Feed().UpsertPod(done)
	if res := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}); len(*res.NodeNames) != 1 {
		t.Fatalf("node still rejected after the holder finished: %v", res.FailedNodes)
	}
}
