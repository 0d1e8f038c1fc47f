package picture_test

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/picture"
	"github.com/gputopo/gputopo/topology/machine"
)

// elem is one element of a drawn SVG.
type elem struct {
	XMLName  xml.Name
	Attrs    []xml.Attr `xml:",any,attr"`
	Children []*elem    `xml:",any"`
	Text     string     `xml:",chardata"`
}

func (e *elem) attr(name string) (string, bool) {
	for _, a := range e.Attrs {
		if a.Name.Local == name {
			return a.Value, true
		}
	}
	return "", false
}

func (e *elem) num(t *testing.T, name string) float64 {
	t.Helper()
	v, ok := e.attr(name)
	if !ok {
		t.Fatalf("<%s> has no %s", e.XMLName.Local, name)
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("<%s %s=%q>: %v", e.XMLName.Local, name, v, err)
	}
	return f
}

// all is every element under e (e included) that keep accepts, in
// document order.
func (e *elem) all(keep func(*elem) bool) []*elem {
	var out []*elem
	if keep(e) {
		out = append(out, e)
	}
	for _, c := range e.Children {
		out = append(out, c.all(keep)...)
	}
	return out
}

func tag(name string) func(*elem) bool {
	return func(e *elem) bool { return e.XMLName.Local == name }
}

func class(name string) func(*elem) bool {
	return func(e *elem) bool { c, _ := e.attr("class"); return c == name }
}

// draw renders the nodes and parses the result strictly as XML.
func draw(t *testing.T, nodes []picture.NodeView, pods []picture.PodView) *elem {
	t.Helper()
	var b bytes.Buffer
	if err := picture.WriteSVG(&b, nodes, pods); err != nil {
		t.Fatal(err)
	}
	d := xml.NewDecoder(bytes.NewReader(b.Bytes()))
	d.Strict = true
	root := &elem{}
	if err := d.Decode(root); err != nil {
		t.Fatalf("the SVG is not well-formed XML: %v\n%s", err, b.String())
	}
	if root.XMLName.Local != "svg" {
		t.Fatalf("root element %q, want svg", root.XMLName.Local)
	}
	return root
}

func fixture(t *testing.T, name, node string) picture.NodeView {
	t.Helper()
	f, err := machine.FixtureByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return picture.NodeView{Name: node, Fixture: f.Name, Graph: f.Graph(node)}
}

type rect struct{ x, y, w, h float64 }

func rectOf(t *testing.T, e *elem) rect {
	t.Helper()
	return rect{e.num(t, "x"), e.num(t, "y"), e.num(t, "width"), e.num(t, "height")}
}

// holds reports whether the circle lies wholly inside r.
func (r rect) holds(cx, cy, radius float64) bool {
	return cx-radius >= r.x && cx+radius <= r.x+r.w && cy-radius >= r.y && cy+radius <= r.y+r.h
}

func (r rect) contains(o rect) bool {
	return o.x >= r.x && o.y >= r.y && o.x+o.w <= r.x+r.w && o.y+o.h <= r.y+r.h
}

func (r rect) overlaps(o rect) bool {
	return r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h
}

type circle struct {
	gpu        int
	cx, cy, r  float64
	numa, swit string
	e          *elem
}

func circles(t *testing.T, e *elem) []circle {
	t.Helper()
	var out []circle
	for _, c := range e.all(tag("circle")) {
		g, err := strconv.Atoi(must(t, c, "data-gpu"))
		if err != nil {
			t.Fatal(err)
		}
		sw, _ := c.attr("data-switch")
		out = append(out, circle{gpu: g, cx: c.num(t, "cx"), cy: c.num(t, "cy"), r: c.num(t, "r"), numa: must(t, c, "data-numa"), swit: sw, e: c})
	}
	return out
}

func must(t *testing.T, e *elem, name string) string {
	t.Helper()
	v, ok := e.attr(name)
	if !ok {
		t.Fatalf("<%s> has no %s", e.XMLName.Local, name)
	}
	return v
}

func texts(e *elem) []string {
	var out []string
	for _, x := range e.all(tag("text")) {
		out = append(out, x.Text)
	}
	return out
}

// A PCIe server is drawn as its hierarchy: one box per PCIe switch with
// exactly its GPUs inside, one per NUMA node around its switches, so a
// pair under one switch is visibly together.
func TestPCIeServerDrawsSwitchesAndNUMANodes(t *testing.T) {
	root := draw(t, []picture.NodeView{fixture(t, "pcie-8x", "pcie-1")},
		[]picture.PodView{{Name: "ml/data-0", Node: "pcie-1", GPUs: []int{2, 3}}})
	switches := root.all(class("pcie-switch"))
	want := map[string][]int{"0": {0, 1}, "1": {2, 3}, "2": {4, 5}, "3": {6, 7}}
	if len(switches) != len(want) {
		t.Fatalf("%d switch boxes, want %d", len(switches), len(want))
	}
	cs := circles(t, root)
	if len(cs) != 8 {
		t.Fatalf("%d GPU circles, want 8", len(cs))
	}
	for _, s := range switches {
		id := must(t, s, "data-switch")
		r := rectOf(t, s)
		var inside []int
		for _, c := range cs {
			if r.holds(c.cx, c.cy, c.r) {
				inside = append(inside, c.gpu)
			}
		}
		if !slices.Equal(inside, want[id]) {
			t.Errorf("switch box %s holds GPUs %v, want %v", id, inside, want[id])
		}
		if got := must(t, s, "data-gpus"); got != picture.Indices(want[id]) {
			t.Errorf("switch box %s: data-gpus %q, want %q", id, got, picture.Indices(want[id]))
		}
	}
	for _, c := range cs {
		if wantSw := strconv.Itoa(c.gpu / 2); c.swit != wantSw {
			t.Errorf("GPU %d: data-switch %q, want %q", c.gpu, c.swit, wantSw)
		}
		if wantNUMA := strconv.Itoa(c.gpu / 4); c.numa != wantNUMA {
			t.Errorf("GPU %d: data-numa %q, want %q", c.gpu, c.numa, wantNUMA)
		}
	}
	numas := root.all(class("numa"))
	if len(numas) != 2 {
		t.Fatalf("%d NUMA boxes, want 2", len(numas))
	}
	for _, n := range numas {
		id := must(t, n, "data-numa")
		r := rectOf(t, n)
		for _, c := range cs {
			if in, want := r.holds(c.cx, c.cy, c.r), c.numa == id; in != want {
				t.Errorf("NUMA box %s holds GPU %d: %t, want %t", id, c.gpu, in, want)
			}
		}
		for _, s := range switches {
			sr := rectOf(t, s)
			if sr.overlaps(r) && !r.contains(sr) {
				t.Errorf("switch box %s sticks out of NUMA box %s", must(t, s, "data-switch"), id)
			}
		}
	}
	for _, label := range []string{"PCIe switch 0", "PCIe switch 3", "NUMA 0", "NUMA 1"} {
		if !slices.Contains(texts(root), label) {
			t.Errorf("no label %q in %q", label, texts(root))
		}
	}
	// The pod's GPUs are coloured, the rest white.
	for _, c := range cs {
		fill := must(t, c.e, "fill")
		if held := c.gpu == 2 || c.gpu == 3; held == (fill == "#ffffff") {
			t.Errorf("GPU %d: fill %s", c.gpu, fill)
		}
	}
}

// NVLink bridges that join only pairs do not make the node one NVLink
// whole: it is drawn as its PCIe hierarchy, with the bridges as lines.
func TestNVLinkPairsDrawHierarchyAndBridges(t *testing.T) {
	root := draw(t, []picture.NodeView{fixture(t, "pcie-8x-nvlink-pairs", "n")}, nil)
	if got := len(root.all(class("pcie-switch"))); got != 2 {
		t.Errorf("%d switch boxes, want 2 (one per socket)", got)
	}
	if got := len(root.all(tag("line"))) + len(root.all(tag("path"))); got != 4 {
		t.Errorf("%d NVLink lines, want 4", got)
	}
}

// A machine whose GPUs are all NVLinked keeps the circle: no PCIe boxes,
// a line per NVLinked pair, and the NUMA nodes named lightly.
func TestNVLinkMachineKeepsTheCircle(t *testing.T) {
	root := draw(t, []picture.NodeView{fixture(t, "dgx-a100", "dgx")}, nil)
	if got := len(root.all(class("pcie-switch"))) + len(root.all(class("numa"))); got != 0 {
		t.Errorf("%d PCIe boxes on an NVSwitch machine, want none", got)
	}
	if got := len(root.all(tag("line"))); got != 28 {
		t.Errorf("%d NVLink lines, want 28", got)
	}
	if !slices.Contains(texts(root), "NUMA 0: GPUs 0-3 · NUMA 1: GPUs 4-7") {
		t.Errorf("no NUMA line in %q", texts(root))
	}
	cs := circles(t, root)
	for _, c := range cs {
		if c.swit != "" {
			t.Errorf("GPU %d has data-switch %q on the circle drawing", c.gpu, c.swit)
		}
	}
}

// A GPU alone under its switch gets no switch box; one switch of more GPUs
// than fit a line wraps them inside its box.
func TestLoneGPUsAndWideSwitches(t *testing.T) {
	lone := machine.Synthetic("lone", 3, func(a, b int) v1alpha1.Link {
		lvl := v1alpha1.PCIeSameNUMA
		if a == 0 && b == 1 {
			lvl = v1alpha1.PCIeSameSwitch
		}
		return v1alpha1.Link{PCIe: lvl, P2P: true, BandwidthGBps: 32}
	})
	wide := machine.Synthetic("wide", 10, func(a, b int) v1alpha1.Link {
		return v1alpha1.Link{PCIe: v1alpha1.PCIeSameSwitch, P2P: true, BandwidthGBps: 64}
	})
	root := draw(t, []picture.NodeView{{Name: "lone", Graph: lone}, {Name: "wide", Graph: wide}}, nil)
	nodes := root.all(class("node"))
	if len(nodes) != 2 {
		t.Fatalf("%d nodes drawn, want 2", len(nodes))
	}
	sw := nodes[0].all(class("pcie-switch"))
	if len(sw) != 1 || must(t, sw[0], "data-gpus") != "0,1" {
		t.Fatalf("lone: switch boxes %d, want one of GPUs 0,1", len(sw))
	}
	for _, c := range circles(t, nodes[0]) {
		if in := rectOf(t, sw[0]).holds(c.cx, c.cy, c.r); in != (c.gpu < 2) {
			t.Errorf("lone: GPU %d inside the switch box %t", c.gpu, in)
		}
	}
	sw = nodes[1].all(class("pcie-switch"))
	if len(sw) != 1 {
		t.Fatalf("wide: %d switch boxes, want 1", len(sw))
	}
	panel := rectOf(t, nodes[1].all(class("panel"))[0])
	rows := map[float64]bool{}
	for _, c := range circles(t, nodes[1]) {
		if !rectOf(t, sw[0]).holds(c.cx, c.cy, c.r) {
			t.Errorf("wide: GPU %d outside its switch box", c.gpu)
		}
		if !panel.holds(c.cx, c.cy, c.r) {
			t.Errorf("wide: GPU %d outside its panel", c.gpu)
		}
		rows[c.cy] = true
	}
	if len(rows) < 2 {
		t.Errorf("wide: 10 GPUs on %d row, want them wrapped", len(rows))
	}
}

// Nodes are grouped by fabric domain: one labelled box per domain, domains
// sorted and the nodes without one last, each node inside its domain's box
// in the order given.
func TestNodesGroupedByDomain(t *testing.T) {
	var nodes []picture.NodeView
	for _, c := range []struct{ name, fixture, domain string }{
		{"n1", "dgx-a100", "leaf=b"}, {"n2", "pcie-8x", ""}, {"n3", "pcie-8x", "leaf=a"},
		{"n4", "dgx1-v100", "leaf=b"}, {"n5", "dgx-a100", "leaf=a"}, {"n6", "hgx-h100", "leaf=b"}, {"n7", "dgx2", "leaf=b"},
	} {
		n := fixture(t, c.fixture, c.name)
		n.Domain = c.domain
		nodes = append(nodes, n)
	}
	root := draw(t, nodes, nil)
	groups := root.all(class("domain"))
	var got []string
	for _, g := range groups {
		var names []string
		for _, n := range g.all(class("node")) {
			names = append(names, must(t, n, "data-node"))
		}
		got = append(got, must(t, g, "data-domain")+":"+strings.Join(names, ","))
	}
	if want := []string{"leaf=a:n3,n5", "leaf=b:n1,n4,n6,n7", ":n2"}; !slices.Equal(got, want) {
		t.Fatalf("groups %q, want %q", got, want)
	}
	var labels []string
	for _, l := range root.all(class("domain-label")) {
		labels = append(labels, l.Text)
	}
	if want := []string{"leaf=a", "leaf=b", "no fabric domain"}; !slices.Equal(labels, want) {
		t.Errorf("headings %q, want %q", labels, want)
	}
	var boxes []rect
	for _, g := range groups {
		b := g.all(class("domain-box"))
		if len(b) != 1 {
			t.Fatalf("domain %q: %d boxes, want 1", must(t, g, "data-domain"), len(b))
		}
		box := rectOf(t, b[0])
		for _, p := range g.all(class("panel")) {
			if !box.contains(rectOf(t, p)) {
				t.Errorf("domain %q: a panel sticks out of its box", must(t, g, "data-domain"))
			}
		}
		for _, c := range circles(t, g) {
			if !box.holds(c.cx, c.cy, c.r) {
				t.Errorf("domain %q: GPU %d outside its box", must(t, g, "data-domain"), c.gpu)
			}
		}
		for _, o := range boxes {
			if o.overlaps(box) {
				t.Errorf("domain %q's box overlaps an earlier one", must(t, g, "data-domain"))
			}
		}
		boxes = append(boxes, box)
	}
	// A domain starts a new row: the fifth panel of leaf=b is not beside
	// leaf=a's.
	first := rectOf(t, groups[1].all(class("panel"))[0])
	last := rectOf(t, groups[0].all(class("panel"))[1])
	if first.y <= last.y {
		t.Errorf("leaf=b's first panel at y=%v, not below leaf=a's at y=%v", first.y, last.y)
	}
}

// Without any domain there are no group boxes or headings.
func TestNoDomainsNoGroups(t *testing.T) {
	root := draw(t, []picture.NodeView{fixture(t, "dgx-a100", "a"), fixture(t, "pcie-8x", "b")}, nil)
	if got := len(root.all(class("domain-box"))) + len(root.all(class("domain-label"))); got != 0 {
		t.Errorf("%d group boxes and headings without domains, want none", got)
	}
}

// No two GPU circles overlap and no two panels do, on every fixture and
// on large synthetic PCIe machines, all in one picture; every circle lies
// inside its node's panel and the picture.
func TestNothingOverlaps(t *testing.T) {
	var nodes []picture.NodeView
	for _, f := range machine.Fixtures() {
		nodes = append(nodes, picture.NodeView{Name: f.Name, Fixture: f.Name, Graph: f.Graph(f.Name), Domain: "d=" + f.Name[:3]})
	}
	for _, n := range []int{2, 16, 32, 64} {
		name := fmt.Sprintf("pcie-%d", n)
		nodes = append(nodes, picture.NodeView{Name: name, Graph: machine.SyntheticPCIe(n)})
	}
	root := draw(t, nodes, []picture.PodView{{Name: `a<b&"c"`, Node: "pcie-8x", GPUs: []int{0, 1}}})
	w, h := root.num(t, "width"), root.num(t, "height")
	var all []circle
	var panels []rect
	for _, n := range root.all(class("node")) {
		name := must(t, n, "data-node")
		ps := n.all(class("panel"))
		if len(ps) != 1 {
			t.Fatalf("node %s: %d panels", name, len(ps))
		}
		panel := rectOf(t, ps[0])
		for _, o := range panels {
			if o.overlaps(panel) {
				t.Errorf("node %s's panel overlaps another", name)
			}
		}
		panels = append(panels, panel)
		cs := circles(t, n)
		for _, c := range cs {
			if !panel.holds(c.cx, c.cy, c.r) {
				t.Errorf("node %s: GPU %d at (%v,%v) outside its panel %+v", name, c.gpu, c.cx, c.cy, panel)
			}
			if c.cx+c.r > w || c.cy+c.r > h {
				t.Errorf("node %s: GPU %d outside the picture", name, c.gpu)
			}
		}
		all = append(all, cs...)
	}
	if len(all) < 8*len(machine.Fixtures()) {
		t.Fatalf("only %d circles drawn", len(all))
	}
	for i, a := range all {
		for _, b := range all[i+1:] {
			if d := math.Hypot(a.cx-b.cx, a.cy-b.cy); d < a.r+b.r {
				t.Fatalf("GPU %d and GPU %d overlap (%v apart)", a.gpu, b.gpu, d)
			}
		}
	}
	// The switch and NUMA boxes of one level never overlap each other.
	for _, cls := range []string{"pcie-switch", "numa"} {
		bs := root.all(class(cls))
		for i := range bs {
			for j := i + 1; j < len(bs); j++ {
				if rectOf(t, bs[i]).overlaps(rectOf(t, bs[j])) {
					t.Errorf("two %s boxes overlap: %v and %v", cls, must(t, bs[i], "data-gpus"), must(t, bs[j], "data-gpus"))
				}
			}
		}
	}
}

// A node without a graph is drawn as an empty panel, not a crash.
func TestNodeWithoutGraph(t *testing.T) {
	root := draw(t, []picture.NodeView{{Name: "bare"}}, nil)
	if !slices.Contains(texts(root), "no topology") {
		t.Errorf("texts %q, want a no topology note", texts(root))
	}
}
