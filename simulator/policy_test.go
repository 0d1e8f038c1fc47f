package simulator

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

func mustCluster(t *testing.T, spec string) []Node {
	t.Helper()
	nodes, err := ParseCluster(spec)
	if err != nil {
		t.Fatal(err)
	}
	return nodes
}

func mask(idx ...int) topology.Mask { return topology.MaskOf(idx...) }

func TestBaselineSelectionRules(t *testing.T) {
	v100 := mustCluster(t, "dgx1-v100=3")
	mixed := mustCluster(t, "pcie-8x=1,dgx-a100=1")
	tests := []struct {
		name   string
		policy Policy
		job    Job
		free   []topology.Mask
		want   Placement
		wantOK bool
	}{{
		name:   "first fit takes the first node with enough free GPUs and its lowest indices",
		policy: &firstFit{},
		job:    Job{ID: "a", GPUs: 2},
		free:   []topology.Mask{mask(7), mask(3, 5, 6), mask(0, 1, 2, 3, 4, 5, 6, 7)},
		want:   Placement{Node: 1, GPUs: mask(3, 5)}, wantOK: true,
	}, {
		name:   "first fit refuses when no node has enough free GPUs",
		policy: &firstFit{},
		job:    Job{ID: "a", GPUs: 4},
		free:   []topology.Mask{mask(7), mask(3, 5, 6), mask(0, 1)},
	}, {
		name:   "pair sum packs onto the fullest node that fits, then maximizes the pair-bandwidth sum",
		policy: &pairSum{nodes: v100},
		job:    Job{ID: "a", GPUs: 4},
		free:   []topology.Mask{mask(0, 1, 2, 3, 4, 5, 6, 7), mask(1, 2, 3, 4, 5, 6, 7), mask(0, 1, 2)},
		want:   Placement{Node: 1, GPUs: mask(4, 5, 6, 7)}, wantOK: true,
	}, {
		name:   "pair sum takes the first best pair in index order",
		policy: &pairSum{nodes: v100},
		job:    Job{ID: "a", GPUs: 2},
		free:   []topology.Mask{mask(0, 1, 2, 3, 4, 5), {}, {}},
		want:   Placement{Node: 0, GPUs: mask(0, 3)}, wantOK: true,
	}, {
		name:   "partition keeps the split with the best total and returns its best group",
		policy: &partition{nodes: v100},
		job:    Job{ID: "a", GPUs: 2},
		// {0,4},{1,5},{2,3} are three 100 GB/s pairs (300); taking {0,3}
		// first, as pair sum does, leaves {4,5} at 50.
		free: []topology.Mask{mask(0, 1, 2, 3, 4, 5), {}, {}},
		want: Placement{Node: 0, GPUs: mask(0, 4)}, wantOK: true,
	}, {
		name:   "optimum honours the requirement and prefers the faster machine",
		policy: &optimum{nodes: mixed, table: defaultTable()},
		job:    Job{ID: "a", GPUs: 4, Parallelism: v1alpha1.ParallelismModel},
		free:   []topology.Mask{mask(0, 1, 2, 3, 4, 5, 6, 7), mask(0, 1, 2, 3, 4, 5, 6, 7)},
		want:   Placement{Node: 1, GPUs: mask(0, 1, 2, 3)}, wantOK: true,
	}, {
		name:   "optimum refuses a model-parallel job where no free set is NVLinked",
		policy: &optimum{nodes: mixed, table: defaultTable()},
		job:    Job{ID: "a", GPUs: 2, Parallelism: v1alpha1.ParallelismModel},
		free:   []topology.Mask{mask(0, 1, 2, 3, 4, 5, 6, 7), {}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := tc.policy.Place(tc.job, tc.free)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v (placement %+v)", ok, tc.wantOK, got)
			}
			if ok {
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("placement (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestPartitionStopsAtTheLimitWithAValidGroup(t *testing.T) {
	f, err := machine.FixtureByName("dgx2")
	if err != nil {
		t.Fatal(err)
	}
	g := f.Graph("n")
	set, truncated := bestPartitionGroup(g, g.All(), 2, 10)
	if !truncated {
		t.Errorf("16 GPUs in pairs have 2,027,025 splits; a limit of 10 must truncate")
	}
	if set.Count() != 2 || !set.Minus(g.All()).Empty() {
		t.Errorf("group %s: want 2 GPUs of the node", set)
	}
	_, truncated = bestPartitionGroup(g, mask(0, 1, 2, 3, 4, 5, 6, 7), 2, PartitionLimit)
	if truncated {
		t.Errorf("8 GPUs in pairs (105 splits) must not hit PartitionLimit")
	}
}

func TestGputopoPolicyPlacesThroughTheExtender(t *testing.T) {
	nodes := mustCluster(t, "pcie-8x=1,dgx1-v100=1")
	p, err := newGputopoPolicy(nodes, nil, defaultTable())
	if err != nil {
		t.Fatal(err)
	}
	free := []topology.Mask{nodes[0].Graph.All(), nodes[1].Graph.All()}
	job := Job{ID: "m", GPUs: 4, Parallelism: v1alpha1.ParallelismModel}
	got, ok, err := p.Place(job, free)
	if err != nil || !ok {
		t.Fatalf("Place = %+v, %v, %v; want a placement", got, ok, err)
	}
	// Only the V100 node has an NVLinked quad; the extender's ledger now
	// holds it, so the same quad cannot be handed out twice.
	want := Placement{Node: 1, GPUs: got.GPUs}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("placement (-want +got):\n%s", diff)
	}
	if m := nodes[1].Graph.Metrics(got.GPUs, free[1]); m.Tier != v1alpha1.TierNVLink {
		t.Errorf("tier %s, want nvlink", m.Tier)
	}
	second, ok, err := p.Place(Job{ID: "n", GPUs: 4, Parallelism: v1alpha1.ParallelismModel}, free)
	if err != nil || !ok {
		t.Fatalf("second Place = %+v, %v, %v; want the other quad", second, ok, err)
	}
	if second.Node != 1 || !second.GPUs.Intersect(got.GPUs).Empty() {
		t.Errorf("second placement %+v overlaps the first %+v", second, got)
	}
	third, ok, err := p.Place(Job{ID: "o", GPUs: 2, Parallelism: v1alpha1.ParallelismModel}, free)
	if err != nil || ok {
		t.Fatalf("third Place = %+v, %v, %v; want no fit (V100 full, PCIe node has no NVLink)", third, ok, err)
	}
	if err := p.Release(job, got); err != nil {
		t.Fatal(err)
	}
	again, ok, err := p.Place(Job{ID: "o", GPUs: 2, Parallelism: v1alpha1.ParallelismModel}, free)
	if err != nil || !ok || again.Node != 1 || !again.GPUs.Minus(got.GPUs).Empty() {
		t.Errorf("after release Place = %+v, %v, %v; want 2 GPUs of the released quad", again, ok, err)
	}
}

// gputopo-node (extender mode for DRA claim pods) takes gputopo's node and
// the lowest free GPUs there, and the ledger follows them: a 4-GPU
// model-parallel job after a 2-GPU one on a DGX-1 gets GPUs 2-5, across
// both quads, where gputopo gives a quad.
func TestGputopoNodePolicyTakesTheFirstFreeGPUsOfGputoposNode(t *testing.T) {
	nodes := mustCluster(t, "dgx1-v100=1")
	for _, name := range []string{PolicyGputopoNode, PolicyGputopo} {
		p, err := newPolicy(name, nodes, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		free := nodes[0].Graph.All()
		first, ok, err := p.Place(Job{ID: "a", GPUs: 2, Parallelism: v1alpha1.ParallelismData}, []topology.Mask{free})
		if err != nil || !ok {
			t.Fatalf("%s: first Place: %v, %v", name, ok, err)
		}
		free = free.Minus(first.GPUs)
		second, ok, err := p.Place(Job{ID: "b", GPUs: 4, Parallelism: v1alpha1.ParallelismModel}, []topology.Mask{free})
		if err != nil || !ok {
			t.Fatalf("%s: second Place: %v, %v", name, ok, err)
		}
		quad := second.GPUs == mask(0, 1, 2, 3) || second.GPUs == mask(4, 5, 6, 7)
		switch name {
		case PolicyGputopoNode:
			if want := lowestK(free, 4); second.GPUs != want || quad {
				t.Errorf("gputopo-node: second job got %v, want the lowest free %v", second.GPUs.Indices(), want.Indices())
			}
		case PolicyGputopo:
			if !quad {
				t.Errorf("gputopo: second job got %v, want a quad", second.GPUs.Indices())
			}
		}
	}
}
