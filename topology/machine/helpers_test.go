package machine

import (
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
)

func mustFixture(t testing.TB, name string) *topology.Graph {
	t.Helper()
	f, err := FixtureByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return f.Graph("node-a")
}

func req(k int, s v1alpha1.Strategy) topology.Request {
	return topology.Request{Count: k, Requirement: v1alpha1.Requirement{Strategy: s}}
}

func mustAllocate(t *testing.T, g *topology.Graph, free topology.Mask, r topology.Request) topology.Result {
	t.Helper()
	res, err := allocator.New(0).Allocate(g, free, r)
	if err != nil {
		t.Fatalf("Allocate(free=%s, k=%d, %s): %v", free, r.Count, r.Requirement, err)
	}
	return res
}
