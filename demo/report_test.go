package demo

import (
	"bytes"
	"encoding/xml"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

func fixtureNode(t *testing.T, fixture, name string) NodeView {
	t.Helper()
	f, err := machine.FixtureByName(fixture)
	if err != nil {
		t.Fatal(err)
	}
	return NodeView{Name: name, Fixture: fixture, Graph: f.Graph(name)}
}

func TestRowsReplayCountOnlyInBindOrderOnTheSameNode(t *testing.T) {
	node := fixtureNode(t, "dgx1-v100", "v100-a")
	pods := []PodView{
		// Listed out of order: the replay must follow Order.
		{Name: "model-4", Node: "v100-a", Intent: "model", GPUs: []int{4, 5, 6, 7}, Order: 2},
		{Name: "single", Node: "v100-a", GPUs: []int{3}, Order: 1},
	}
	rows, err := Rows([]NodeView{node}, alone(pods...))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"single", "model-4"}, []string{rows[0].Pod, rows[1].Pod}); diff != "" {
		t.Fatalf("rows not in bind order (-want +got):\n%s", diff)
	}
	// Count-only takes the lowest free indices: GPU 0 for the first pod,
	// then 1,2,3,4 — which crosses the socket on a DGX-1.
	if diff := cmp.Diff([]int{0}, rows[0].CountOnlyGPUs); diff != "" {
		t.Errorf("count-only single (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{1, 2, 3, 4}, rows[1].CountOnlyGPUs); diff != "" {
		t.Errorf("count-only model-4 (-want +got):\n%s", diff)
	}
	if rows[1].Got.Tier != v1alpha1.TierNVLink {
		t.Errorf("gputopo's 4,5,6,7 tier = %s, want nvlink", rows[1].Got.Tier)
	}
	if rows[1].CountOnly.Tier == v1alpha1.TierNVLink || rows[1].CountOnly.MinPairGBps >= rows[1].Got.MinPairGBps {
		t.Errorf("count-only 1,2,3,4 should be worse than an NVLink quad: got %+v vs %+v", rows[1].CountOnly, rows[1].Got)
	}
	if s := Summary(rows); !strings.Contains(s, "all-NVLink sets: gputopo 1, count-only 0") {
		t.Errorf("summary %q", s)
	}
}

func TestRowsRejectGPUsHeldTwiceOrUnknownNodes(t *testing.T) {
	node := fixtureNode(t, "dgx-a100", "a100-a")
	_, err := Rows([]NodeView{node}, alone(
		PodView{Name: "a", Node: "a100-a", GPUs: []int{0, 1}, Order: 1},
		PodView{Name: "b", Node: "a100-a", GPUs: []int{1, 2}, Order: 2},
	))
	if err == nil || !strings.Contains(err.Error(), "pod b holds GPUs [1 2] on a100-a that were not free") {
		t.Errorf("double-held GPU: err = %v", err)
	}
	_, err = Rows([]NodeView{node}, alone(PodView{Name: "c", Node: "elsewhere", GPUs: []int{0}}))
	if err == nil || !strings.Contains(err.Error(), `node "elsewhere"`) {
		t.Errorf("unknown node: err = %v", err)
	}
}

func TestWriteTableAndSVG(t *testing.T) {
	nodes := []NodeView{fixtureNode(t, "dgx1-v100", "v100-a"), fixtureNode(t, "pcie-8x", "pcie-a")}
	pods := []PodView{
		{Name: "m<1>", Node: "v100-a", Intent: "model", GPUs: []int{0, 1, 2, 3}, Order: 1},
		{Name: "d", Node: "pcie-a", Intent: "data", GPUs: []int{0, 1}, Order: 2},
	}
	rows, err := Rows(nodes, alone(pods...))
	if err != nil {
		t.Fatal(err)
	}
	var tbl bytes.Buffer
	if err := WriteTable(&tbl, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"POD", "m<1>", "0,1,2,3", "nvlink", "COUNT-ONLY"} {
		if !strings.Contains(tbl.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tbl.String())
		}
	}
	if strings.Contains(tbl.String(), "GROUP") {
		t.Errorf("a table without groups shows a GROUP column:\n%s", tbl.String())
	}
	var svg bytes.Buffer
	if err := WriteSVG(&svg, nodes, pods); err != nil {
		t.Fatal(err)
	}
	// Well-formed XML, and the pod name is escaped.
	dec := xml.NewDecoder(&svg)
	circles := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "circle" {
			circles++
		}
	}
	if circles != 16 {
		t.Errorf("SVG has %d GPU circles, want 16", circles)
	}
}

// alone are pods placed each on its own, in no group.
func alone(pods ...PodView) []Placed {
	out := make([]Placed, len(pods))
	for i, p := range pods {
		out[i] = Placed{PodView: p}
	}
	return out
}

// A group's pods show their group and the domain their placement records
// name; a pod placed alone shows dashes.
func TestWriteTableShowsGroupAndDomain(t *testing.T) {
	nodes := []NodeView{fixtureNode(t, "dgx-a100", "a100-a"), fixtureNode(t, "dgx-a100", "a100-b")}
	const dom = "network.topology.nvidia.com/leaf=leaf-dgx-a100"
	pods := []Placed{
		{PodView: PodView{Name: "ft-x", Node: "a100-a", Intent: "model", GPUs: []int{0, 1, 2, 3}, Order: 1}, Group: "ml-team/ft", Domain: dom},
		{PodView: PodView{Name: "ft-y", Node: "a100-b", Intent: "model", GPUs: []int{0, 1, 2, 3}, Order: 2}, Group: "ml-team/ft", Domain: dom},
		{PodView: PodView{Name: "solo", Node: "a100-a", GPUs: []int{4}, Order: 3}},
	}
	rows, err := Rows(nodes, pods)
	if err != nil {
		t.Fatal(err)
	}
	var tbl bytes.Buffer
	if err := WriteTable(&tbl, rows); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(tbl.String()), "\n")
	if f := strings.Fields(lines[0]); len(f) < 5 || f[2] != "GROUP" || f[3] != "DOMAIN" || f[4] != "NODE" {
		t.Fatalf("header %q; want GROUP and DOMAIN after INTENT", lines[0])
	}
	want := map[string][2]string{"ft-x": {"ml-team/ft", dom}, "ft-y": {"ml-team/ft", dom}, "solo": {"-", "-"}}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if w, ok := want[f[0]]; !ok || f[2] != w[0] || f[3] != w[1] {
			t.Errorf("row %q; want group and domain %v", l, w)
		}
		delete(want, f[0])
	}
	if len(want) > 0 {
		t.Errorf("rows missing: %v", want)
	}
}

// Every demo node is in the leaf of its machine, under one spine, by the
// labels the default fabric levels read.
func TestNodeLabelsPlaceMachinesInLeavesUnderOneSpine(t *testing.T) {
	levels := configv1alpha1.DefaultExtenderConfiguration().Fabric.Levels
	for _, lv := range []struct{ name, label string }{{"leaf", labelLeaf}, {"spine", labelSpine}} {
		i, ok := configv1alpha1.FabricLevelIndex(levels, lv.name)
		if !ok || !slices.Contains(levels[i].Labels, lv.label) {
			t.Errorf("the default fabric level %s does not read %s", lv.name, lv.label)
		}
	}
	a, b := nodeLabels("dgx-a100"), nodeLabels("dgx1-v100")
	if a[labelLeaf] == b[labelLeaf] || a[labelSpine] != b[labelSpine] || a[labelMachine] != "dgx-a100" {
		t.Errorf("labels %v and %v; want a leaf per machine under one spine", a, b)
	}
}
