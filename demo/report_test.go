package demo

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
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

// podOf is a pod of job on node holding gpus, in bind order order.
func podOf(job, name, node string, order int, gpus ...int) Placed {
	return Placed{PodView: PodView{Name: name, Node: node, GPUs: gpus, Order: order}, Job: job}
}

func ring(t *testing.T, n NodeView, gpus ...int) int {
	t.Helper()
	set := topology.MaskOf(gpus...)
	return n.Graph.Metrics(set, set).RingGBps
}

// A job's pace is its slowest multi-GPU pod's ring inside a node, capped,
// when its pods are on several nodes, by the bandwidth of the tightest
// fabric level they share; single-GPU pods without an intent have none.
// Preemptions are counted on both sides.
func TestJobsPaceIsTheSlowestRingAndTheSharedFabricLevel(t *testing.T) {
	v100a, v100b := fixtureNode(t, "dgx1-v100", "dgx1-v100-1"), fixtureNode(t, "dgx1-v100", "dgx1-v100-2")
	pcie := fixtureNode(t, "pcie-8x", "pcie-8x-1")
	nodes := []NodeView{v100a, v100b, pcie}
	ws := []Workload{
		{Name: "ft", Intent: v1alpha1.ParallelismModel, Pods: 2, GPUs: 4},
		{Name: "nb", Pods: 1, GPUs: 1, Bare: true},
		{Name: "batch", Pods: 2, GPUs: 1, Bare: true, Fill: true, Priority: PriorityBatch},
		{Name: "serve", Intent: v1alpha1.ParallelismModel, Pods: 1, GPUs: 2, Priority: PriorityServing},
	}
	evicted := func(p Placed, by string) Placed { p.Evicted, p.EvictedBy = true, by; return p }
	gputopo := []Placed{
		podOf("ft", "ft-a", "dgx1-v100-1", 1, 0, 1, 2, 3),
		podOf("ft", "ft-b", "dgx1-v100-2", 2, 4, 5, 6, 7),
		podOf("nb", "nb-0", "dgx1-v100-1", 3, 4),
		evicted(podOf("batch", "batch-0", "dgx1-v100-1", 4, 5), "serve"),
		evicted(podOf("batch", "batch-1", "dgx1-v100-1", 5, 6), "serve"),
		podOf("serve", "serve-0", "dgx1-v100-1", 6, 5, 6),
	}
	plain := []Placed{
		podOf("ft", "ft-x", "dgx1-v100-1", 1, 0, 1, 2, 4),
		podOf("ft", "ft-y", "pcie-8x-1", 2, 0, 1, 2, 3),
		podOf("nb", "nb-0", "pcie-8x-1", 3, 4),
		podOf("batch", "batch-0", "pcie-8x-1", 4, 5),
		evicted(podOf("batch", "batch-1", "pcie-8x-1", 5, 6), "serve"),
		podOf("serve", "serve-0", "pcie-8x-1", 6, 6, 7),
	}
	rows, err := Jobs(ws, nodes, gputopo, plain)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		Together         string
		Pace             int
		Preempted, Evict int
	}
	of := func(jp JobPlacement) got { return got{jp.Together, jp.PaceGBps, jp.Preempted, jp.Evicted} }
	want := map[string][2]got{
		// One leaf (100 GB/s) above two NVLink quads: the quads set the pace.
		// Plain: a DGX-1 and a PCIe node share only the spine (50 GB/s).
		"ft":    {{"leaf", ring(t, v100a, 0, 1, 2, 3), 0, 0}, {"spine", min(50, ring(t, v100a, 0, 1, 2, 4), ring(t, pcie, 0, 1, 2, 3)), 0, 0}},
		"nb":    {{"node", 0, 0, 0}, {"node", 0, 0, 0}},
		"batch": {{"node", 0, 0, 2}, {"node", 0, 0, 1}},
		"serve": {{"node", ring(t, v100a, 5, 6), 2, 0}, {"node", ring(t, pcie, 6, 7), 1, 0}},
	}
	for _, r := range rows {
		w := want[r.Workload.Name]
		if diff := cmp.Diff(w, [2]got{of(r.GPUTopo), of(r.Plain)}); diff != "" {
			t.Errorf("job %s (-want +got):\n%s", r.Workload.Name, diff)
		}
	}
	if want["ft"][0].Pace <= want["ft"][1].Pace {
		t.Fatalf("the fixture's NVLink quad (%d GB/s) is not faster than the plain placement (%d GB/s): the test proves nothing", want["ft"][0].Pace, want["ft"][1].Pace)
	}
	var out bytes.Buffer
	if err := WriteJobs(&out, rows); err != nil {
		t.Fatal(err)
	}
	ratio := fmt.Sprintf("%.1fx", float64(want["ft"][0].Pace)/float64(want["ft"][1].Pace))
	for _, s := range []string{"dgx1-v100-1 [0-3], dgx1-v100-2 [4-7]", "dgx1-v100-1 [0-2,4], pcie-8x-1 [0-3]", ratio,
		"preempted 2 pod(s)", "; 2 preempted later", "model-parallel, demo-serving"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, out.String())
		}
	}
	h := Headline(rows)
	if !strings.Contains(h, "geometric mean of 2 jobs") || !strings.Contains(h, "faster") {
		t.Errorf("headline %q", h)
	}
}

func TestJobsRejectUnknownNodes(t *testing.T) {
	nodes := []NodeView{fixtureNode(t, "dgx-a100", "a100-a")}
	_, err := Jobs([]Workload{{Name: "x", Pods: 1, GPUs: 1}}, nodes, []Placed{podOf("x", "x-0", "elsewhere", 1, 0)}, nil)
	if err == nil || !strings.Contains(err.Error(), `node "elsewhere"`) {
		t.Errorf("unknown node: err = %v", err)
	}
}

func TestHeadlineIsTheGeometricMeanOfPaceRatios(t *testing.T) {
	row := func(g, p int) JobRow {
		return JobRow{GPUTopo: JobPlacement{PaceGBps: g}, Plain: JobPlacement{PaceGBps: p}}
	}
	h := Headline([]JobRow{row(400, 100), row(50, 50), row(25, 100), row(0, 10)})
	// (4 * 1 * 0.25)^(1/3) = 1.
	if want := "1.0x the bandwidth under gputopo (geometric mean of 3 jobs; faster 1, equal 1, slower 1)"; !strings.Contains(h, want) {
		t.Errorf("headline %q, want it to contain %q", h, want)
	}
	if h := Headline([]JobRow{row(0, 0)}); !strings.Contains(h, "nothing to compare") {
		t.Errorf("headline without talking jobs %q", h)
	}
}

func TestRanges(t *testing.T) {
	for in, want := range map[string]string{"4 6 5 7": "4-7", "0 3": "0,3", "0 1": "0,1", "0 1 2 5 6": "0-2,5,6", "": ""} {
		var idx []int
		for _, f := range strings.Fields(in) {
			var i int
			fmt.Sscan(f, &i)
			idx = append(idx, i)
		}
		if got := Ranges(idx); got != want {
			t.Errorf("Ranges(%v) = %q, want %q", idx, got, want)
		}
	}
}

// The comparison's device plugin is NVIDIA's best-effort policy on the
// node's simulated NVML: an idle DGX-1 gives a 4-GPU pod an NVLink quad;
// GPUs are held until released; asking for more than is free fails.
func TestStockDevicePluginChoosesByNVMLLinks(t *testing.T) {
	dp, err := newStockDevicePlugin([]NodeSpec{{Name: "v100", Fixture: "dgx1-v100"}})
	if err != nil {
		t.Fatal(err)
	}
	g := fixtureNode(t, "dgx1-v100", "v100").Graph
	indices := func(uuids []string) []int {
		var out []int
		for _, u := range uuids {
			i, ok := g.IndexOf(u)
			if !ok {
				t.Fatalf("GPU %s is not the node's", u)
			}
			out = append(out, i)
		}
		return out
	}
	quad, err := dp.allocate("v100", 4)
	if err != nil {
		t.Fatal(err)
	}
	set := topology.MaskOf(indices(quad)...)
	if tier := g.Metrics(set, set).Tier; tier != v1alpha1.TierNVLink {
		t.Errorf("4 GPUs of an idle DGX-1: %v, tier %s; want an NVLink-connected quad", indices(quad), tier)
	}
	rest, err := dp.allocate("v100", 4)
	if err != nil {
		t.Fatal(err)
	}
	if both := set.Union(topology.MaskOf(indices(rest)...)); both.Count() != 8 {
		t.Errorf("second 4 GPUs %v overlap the first %v", indices(rest), indices(quad))
	}
	if _, err := dp.allocate("v100", 1); err == nil || !strings.Contains(err.Error(), "1 GPU(s) asked, 0 free") {
		t.Errorf("allocate on a full node: err = %v", err)
	}
	dp.release("v100", quad[:2])
	again, err := dp.allocate("v100", 2)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(indices(quad[:2]), indices(again), cmpopts.SortSlices(func(a, b int) bool { return a < b })); diff != "" {
		t.Errorf("after release, 2 GPUs (-want +got):\n%s", diff)
	}
	if _, err := dp.allocate("nowhere", 1); err == nil || !strings.Contains(err.Error(), `node "nowhere"`) {
		t.Errorf("unknown node: err = %v", err)
	}
}

func TestWriteSVG(t *testing.T) {
	nodes := []NodeView{fixtureNode(t, "dgx1-v100", "v100-a"), fixtureNode(t, "pcie-8x", "pcie-a")}
	pods := []PodView{
		{Name: "m<1>", Node: "v100-a", Intent: "model", GPUs: []int{0, 1, 2, 3}, Order: 1},
		{Name: "d", Node: "pcie-a", Intent: "data", GPUs: []int{0, 1}, Order: 2},
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

// The README's first screen shows the demo's table: its header and its
// headline are what WriteJobs and Headline print today.
func TestREADMEShowsTheDemoTable(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteJobs(&out, nil); err != nil {
		t.Fatal(err)
	}
	header := strings.Split(strings.TrimSpace(out.String()), "\n")
	head := header[len(header)-1]
	sample := string(readme)
	i := strings.Index(sample, "$ make demo\n")
	if i < 0 {
		t.Fatal("README.md shows no `$ make demo` output")
	}
	sample = sample[i:]
	sample = sample[:strings.Index(sample, "```")]
	fields := strings.Fields(head)
	for i, f := range fields {
		fields[i] = regexp.QuoteMeta(f)
	}
	if !regexp.MustCompile(`(?m)^` + strings.Join(fields, `\s+`) + `$`).MatchString(sample) {
		t.Errorf("README.md's demo table lacks today's header %q", head)
	}
	h := regexp.MustCompile(`(?m)^jobs whose GPUs talk run at \d+\.\dx the bandwidth under gputopo \(geometric mean of \d+ jobs; faster \d+, equal \d+, slower \d+\)$`)
	if !h.MatchString(sample) || !h.MatchString(Headline([]JobRow{{GPUTopo: JobPlacement{PaceGBps: 2}, Plain: JobPlacement{PaceGBps: 1}}})) {
		t.Errorf("README.md's demo headline and Headline's form differ")
	}
	for _, w := range DefaultWorkloads {
		if !strings.Contains(sample, "\n"+w.Name+" ") || !strings.Contains(sample, w.Shows) {
			t.Errorf("README.md's demo output lacks job %s as the demo shows it", w.Name)
		}
	}
}
