package topology_test

import (
	"testing"

	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

func mustFixture(t testing.TB, name string) *topology.Graph {
	t.Helper()
	return FixturesMust(t, name).Graph("node-a")
}

func FixturesMust(t testing.TB, name string) machine.Fixture {
	t.Helper()
	f, err := machine.FixtureByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
