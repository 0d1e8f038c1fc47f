package extender

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// nvswitchTopo is a NodeGPUTopology of n GPUs joined by NVSwitch at gbps
// GB/s any pair, observed at testNow; n may exceed what the model holds.
func nvswitchTopo(node string, n, gbps int) *v1alpha1.NodeGPUTopology {
	st := v1alpha1.NodeGPUTopologyStatus{ObservedTime: metav1.NewTime(testNow)}
	for i := 0; i < n; i++ {
		st.GPUs = append(st.GPUs, v1alpha1.GPU{Index: i, UUID: machine.FixtureUUID(node, i), Model: "NVIDIA H100 80GB HBM3",
			MemoryMiB: 81559, NUMANode: i * 2 / n, PCIBusID: fmt.Sprintf("00000000:%02X:00.0", 0x07+i*0x10), Health: v1alpha1.GPUHealthy})
		for j := i + 1; j < n; j++ {
			level := v1alpha1.PCIeSameNUMA
			if i*2/n != j*2/n {
				level = v1alpha1.PCIeCrossSocket
			}
			st.Links = append(st.Links, v1alpha1.Link{A: i, B: j, NVLinks: 18, NVSwitch: true, P2P: true, PCIe: level, BandwidthGBps: gbps})
		}
	}
	return &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: st}
}

// linkOf finds the link of pair a-b in a fixture node's status.
func linkOf(t *testing.T, o *v1alpha1.NodeGPUTopology, a, b int) *v1alpha1.Link {
	t.Helper()
	for i := range o.Status.Links {
		if l := &o.Status.Links[i]; l.A == a && l.B == b {
			return l
		}
	}
	t.Fatalf("no link %d-%d", a, b)
	return nil
}

// filterOne runs filter for pod on node and returns whether the node
// passed and, if not, its reason and whether it was unresolvable.
func filterOne(t *testing.T, x *Extender, pb *podBuilder, node string) (passed bool, reason string, unresolvable bool) {
	t.Helper()
	names := []string{node}
	res := x.Filter(context.Background(), &extenderv1.ExtenderArgs{Pod: pb.obj(), NodeNames: &names})
	if res.Error != "" {
		t.Fatalf("filter Error %q", res.Error)
	}
	if res.NodeNames != nil && len(*res.NodeNames) == 1 {
		return true, "", false
	}
	if r, ok := res.FailedAndUnresolvableNodes[node]; ok {
		return false, r, true
	}
	r, ok := res.FailedNodes[node]
	if !ok {
		t.Fatalf("node %s neither passed nor failed: %+v", node, res)
	}
	return false, r, false
}

// Filter refuses a topology whose observedTime is missing or too far in
// the future, with a reason a person can act on; the age check's own
// switch (topologyMaxAge) is honoured.
func TestFilterDistrustsObservedTime(t *testing.T) {
	ageOff := func() *configv1alpha1.ExtenderConfiguration {
		cfg := configv1alpha1.DefaultExtenderConfiguration()
		cfg.TopologyMaxAge = &metav1.Duration{Duration: -1}
		return cfg
	}
	tests := []struct {
		name     string
		cfg      func() *configv1alpha1.ExtenderConfiguration
		observed func(o *v1alpha1.NodeGPUTopology)
		// reason is a fragment of the refusal; "" means the node passes.
		reason string
	}{
		{"fresh topology passes", nil, func(*v1alpha1.NodeGPUTopology) {}, ""},
		{"no observedTime: the agent has not published", nil, func(o *v1alpha1.NodeGPUTopology) { o.Status.ObservedTime = metav1.Time{} },
			"node's NodeGPUTopology has no observedTime; the gputopo node agent has not published a topology read"},
		{"observedTime 10m ahead: check the node's clock", nil, func(o *v1alpha1.NodeGPUTopology) {
			o.Status.ObservedTime = metav1.NewTime(testNow.Add(10 * time.Minute))
		},
			"node's NodeGPUTopology observedTime is 10m0s in the future (more than the 2m0s clock-skew allowance); check the node's clock"},
		{"observedTime years ahead is in the future, not old", nil, func(o *v1alpha1.NodeGPUTopology) {
			o.Status.ObservedTime = metav1.NewTime(time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC))
		}, "in the future"},
		{"observedTime within the clock-skew allowance passes", nil, func(o *v1alpha1.NodeGPUTopology) { o.Status.ObservedTime = metav1.NewTime(testNow.Add(time.Minute)) }, ""},
		{"observedTime older than topologyMaxAge is stale", nil, func(o *v1alpha1.NodeGPUTopology) { o.Status.ObservedTime = metav1.NewTime(testNow.Add(-time.Hour)) },
			"not refreshed for more than 15m0s"},
		{"observedTime before 1970 is old, not missing", nil, func(o *v1alpha1.NodeGPUTopology) {
			o.Status.ObservedTime = metav1.NewTime(time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC))
		}, "not refreshed for more than 15m0s"},
		{"age check off: a future observedTime is not judged", ageOff, func(o *v1alpha1.NodeGPUTopology) {
			o.Status.ObservedTime = metav1.NewTime(testNow.Add(10 * time.Minute))
		}, ""},
		{"age check off: an old or pre-1970 observedTime is not judged", ageOff, func(o *v1alpha1.NodeGPUTopology) {
			o.Status.ObservedTime = metav1.NewTime(time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC))
		}, ""},
		{"age check off: a missing observedTime still is", ageOff, func(o *v1alpha1.NodeGPUTopology) { o.Status.ObservedTime = metav1.Time{} },
			"has no observedTime"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var cfg *configv1alpha1.ExtenderConfiguration
			if tc.cfg != nil {
				cfg = tc.cfg()
			}
			x, _ := newTestExtender(t, cfg)
			o := topo(t, "dgx1-v100", "n")
			tc.observed(o)
			x.core.Feed().UpsertTopology(o)
			passed, reason, unresolvable := filterOne(t, x, makePod("p").gpus(1), "n")
			switch {
			case tc.reason == "" && !passed:
				t.Errorf("node refused: %q", reason)
			case tc.reason != "" && passed:
				t.Errorf("node passed; want refused with %q", tc.reason)
			case tc.reason != "" && (unresolvable || !strings.HasPrefix(reason, placement.ReasonPrefix) || !strings.Contains(reason, tc.reason)):
				t.Errorf("reason %q (unresolvable %v); want a resolvable %q", reason, unresolvable, tc.reason)
			}
		})
	}
}

// Statuses a broken or hostile node agent could publish go through the
// ledger, the graph and the allocator into filter: no panic; a refused
// topology fails the node with a reason naming the field; one the model
// accepts is placed as usual.
func TestHostileTopologyThroughFilter(t *testing.T) {
	const maxInt = int(^uint(0) >> 1)
	nvlinkPod := makePod("p").gpus(2).req(modelParallel)
	tests := []struct {
		name  string
		topo  func(t *testing.T) *v1alpha1.NodeGPUTopology
		pod   *podBuilder
		check func(t *testing.T, passed bool, reason string)
	}{{
		name: "asymmetric NVLink published as none: the pair is PCIe to the allocator",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "pcie-8x-nvlink-pairs", "n")
			for _, p := range [][2]int{{0, 1}, {2, 3}, {4, 5}} {
				l := linkOf(t, o, p[0], p[1])
				l.NVLinks, l.BandwidthGBps = 0, machine.PCIeBandwidthGBps(4, l.PCIe)
			}
			o.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionTopologyConsistent, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonAsymmetricLink, Message: "GPU 0 reports 12 NVLinks to GPU 1, GPU 1 reports 0 to GPU 0; publishing 0"}}
			return o
		},
		pod: makePod("p").gpus(4).req(modelParallel),
		check: func(t *testing.T, passed bool, reason string) {
			if passed || !strings.Contains(reason, "needs NVLink between 4 GPUs; largest free NVLink-connected set has 2") {
				t.Errorf("passed %v, reason %q; want refused for want of NVLink", passed, reason)
			}
		},
	}, {
		name: "inconsistent but conservative topology still takes pods it can",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "pcie-8x-nvlink-pairs", "n")
			l := linkOf(t, o, 0, 1)
			l.NVLinks, l.BandwidthGBps = 0, machine.PCIeBandwidthGBps(4, l.PCIe)
			o.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionTopologyConsistent, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonAsymmetricLink, Message: "x"}}
			return o
		},
		pod:   nvlinkPod,
		check: wantPassed,
	}, {
		name: "NVLinked pair at 0 GB/s is refused naming the field",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "dgx1-v100", "n")
			linkOf(t, o, 0, 3).BandwidthGBps = 0
			return o
		},
		pod:   nvlinkPod,
		check: wantInvalid("bandwidthGBps: 0 with 2 NVLinks; an NVLinked pair needs its bandwidth"),
	}, {
		name: "PCIe pair claiming 900 GB/s is refused naming the field",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "pcie-8x", "n")
			linkOf(t, o, 0, 1).BandwidthGBps = 900
			return o
		},
		pod:   makePod("p").gpus(2),
		check: wantInvalid("links[0].bandwidthGBps: 900; a PCIe link carries at most 256 GB/s"),
	}, {
		name: "MaxInt-scale bandwidths, NVLink counts and indices are refused naming each field",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "hgx-h100", "n")
			o.Status.Links[0].BandwidthGBps = maxInt
			o.Status.Links[1].NVLinks = maxInt
			o.Status.Links[2].BandwidthGBps = math.MaxInt32
			o.Status.GPUs[7].Index = maxInt
			return o
		},
		pod:   makePod("p").gpus(8),
		check: wantInvalid("links[0].bandwidthGBps: 9223372036854775807; a GPU pair carries at most 2000 GB/s", "links[1].nvlinks: 9223372036854775807", "links[2].bandwidthGBps: 2147483647", "gpus[7].index: 9223372036854775807 is out of range"),
	}, {
		name: "MaxInt-scale memory and NUMA node are facts, not sums: placed",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "hgx-h100", "n")
			for i := range o.Status.GPUs {
				o.Status.GPUs[i].MemoryMiB, o.Status.GPUs[i].NUMANode = math.MaxInt64, maxInt
			}
			return o
		},
		pod:   makePod("p").gpus(8).req(`{"gpuMemoryMiB":80000,"requireNVLink":true}`),
		check: wantPassed,
	}, {
		name:  "every pair at the ceiling on 64 GPUs is placed without overflow",
		topo:  func(t *testing.T) *v1alpha1.NodeGPUTopology { return nvswitchTopo("n", 64, topology.MaxPairGBps) },
		pod:   makePod("p").gpus(64).req(`{"requireNVLink":true,"strategy":"highest_bandwidth","minPairBandwidthGBps":2000}`),
		check: wantPassed,
	}, {
		name:  "64-GPU node takes an 8-GPU NVLink pod",
		topo:  func(t *testing.T) *v1alpha1.NodeGPUTopology { return nvswitchTopo("n", 64, 900) },
		pod:   makePod("p").gpus(8).req(modelParallel),
		check: wantPassed,
	}, {
		name:  "72-GPU node takes an 8-GPU NVLink pod",
		topo:  func(t *testing.T) *v1alpha1.NodeGPUTopology { return nvswitchTopo("n", 72, 1800) },
		pod:   makePod("p").gpus(8).req(modelParallel),
		check: wantPassed,
	}, {
		name:  "every pair at the ceiling on 72 GPUs: the whole node is placed without overflow",
		topo:  func(t *testing.T) *v1alpha1.NodeGPUTopology { return nvswitchTopo("n", 72, topology.MaxPairGBps) },
		pod:   makePod("p").gpus(72).req(`{"requireNVLink":true,"strategy":"highest_bandwidth","minPairBandwidthGBps":2000}`),
		check: wantPassed,
	}, {
		name: "every pair at the ceiling on 128 GPUs: a 70-GPU NVLink pod is placed without overflow",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			return nvswitchTopo("n", topology.MaxGPUs, topology.MaxPairGBps)
		},
		pod:   makePod("p").gpus(70).req(`{"requireNVLink":true,"strategy":"lowest_fragmentation"}`),
		check: wantPassed,
	}, {
		name:  "129-GPU node is refused cleanly: a node holds at most 128",
		topo:  func(t *testing.T) *v1alpha1.NodeGPUTopology { return nvswitchTopo("n", topology.MaxGPUs+1, 1800) },
		pod:   makePod("p").gpus(1),
		check: wantInvalid("gpus: 129 GPUs listed; at most 128 are supported per node"),
	}, {
		name: "duplicate bus IDs refused by the agent: stale with its reason",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "dgx1-v100", "n")
			o.Status.Stale = true
			o.Status.StaleReason = "nvml topology refused: DuplicateBusID: GPU 2 and GPU 5 both report PCI bus ID 00000000:27:00.0"
			return o
		},
		pod:   makePod("p").gpus(1),
		check: wantStale("GPU 2 and GPU 5 both report PCI bus ID 00000000:27:00.0"),
	}, {
		name: "duplicate bus IDs published anyway: the model takes them as facts, UUIDs decide",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "dgx1-v100", "n")
			o.Status.GPUs[5].PCIBusID = o.Status.GPUs[2].PCIBusID
			return o
		},
		pod:   nvlinkPod,
		check: wantPassed,
	}, {
		name: "duplicate UUIDs are refused naming both GPUs",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "dgx1-v100", "n")
			o.Status.GPUs[5].UUID = o.Status.GPUs[2].UUID
			return o
		},
		pod:   makePod("p").gpus(1),
		check: wantInvalid("gpus[5].uuid", "is also the UUID of GPU 2"),
	}, {
		name: "NVSwitch claimed by a PCIe-only pair is refused",
		topo: func(t *testing.T) *v1alpha1.NodeGPUTopology {
			o := topo(t, "pcie-8x", "n")
			linkOf(t, o, 2, 3).NVSwitch = true
			return o
		},
		pod:   makePod("p").gpus(1),
		check: wantInvalid("nvswitch: set but nvlinks is 0"),
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x, _ := newTestExtender(t, nil)
			x.core.Feed().UpsertTopology(tc.topo(t))
			passed, reason, unresolvable := filterOne(t, x, tc.pod, "n")
			if !passed && !strings.HasPrefix(reason, placement.ReasonPrefix) {
				t.Errorf("reason %q lacks the %q prefix", reason, placement.ReasonPrefix)
			}
			if unresolvable && strings.Contains(reason, "invalid") {
				t.Errorf("invalid topology is unresolvable (%q); the agent may fix it", reason)
			}
			tc.check(t, passed, reason)
		})
	}
}

func wantPassed(t *testing.T, passed bool, reason string) {
	t.Helper()
	if !passed {
		t.Errorf("node refused: %q", reason)
	}
}

func wantInvalid(fragments ...string) func(t *testing.T, passed bool, reason string) {
	return func(t *testing.T, passed bool, reason string) {
		t.Helper()
		if passed {
			t.Fatalf("node passed; want refused as invalid")
		}
		if !strings.Contains(reason, "NodeGPUTopology is invalid") {
			t.Errorf("reason %q does not say the topology is invalid", reason)
		}
		for _, f := range fragments {
			if !strings.Contains(reason, f) {
				t.Errorf("reason %q does not contain %q", reason, f)
			}
		}
	}
}

func wantStale(fragment string) func(t *testing.T, passed bool, reason string) {
	return func(t *testing.T, passed bool, reason string) {
		t.Helper()
		if passed || !strings.Contains(reason, "stale") || !strings.Contains(reason, fragment) {
			t.Errorf("passed %v, reason %q; want stale with %q", passed, reason, fragment)
		}
	}
}
