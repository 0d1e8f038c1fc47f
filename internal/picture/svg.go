// Package picture draws a cluster's GPU nodes and the pods on their GPUs
// as SVG: the demo's placement.svg and kubectl gputopo node --svg. It has
// no cgo dependency, so the kubectl plugin cross-compiles.
package picture

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/topology"
)

// palette colours pods; it cycles when there are more pods than colours.
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

const (
	panelW, panelH = 340, 360
	panelsPerRow   = 3
	gpuR           = 16
	// A domain group: its heading's height and the gap before the next.
	groupHeadH, groupGap = 28, 10
	legendRowH           = 24
)

// Where a machine without an NVLink-connected whole is drawn as its PCIe
// hierarchy: NUMA boxes stacked in the panel, switch boxes side by side in
// them, GPUs in rows in the switch boxes.
const (
	headerH                    = 50 // the node's name and machine
	cell                       = 44 // one GPU's slot
	numaX, numaW               = 15, panelW - 30
	numaPad, numaLabelH        = 8, 18
	switchPad, switchLabelH    = 6, 14
	itemGap, numaGap, bottomH  = 8, 10, 15
	switchCols                 = (numaW - 2*numaPad - 2*switchPad) / cell
	noDomainLabel              = "no fabric domain"
	switchBoxFill, numaBoxFill = "#eef3f8", "#fafafa"
)

// WriteSVG draws every node in panels, three to a row. Nodes are grouped
// by fabric domain (NodeView.Domain): each domain's nodes start a new row
// under a labelled box, domains in sorted order and nodes without one last
// ("no fabric domain"); when no node has a domain there are no groups.
//
// A node whose GPUs are all joined by NVLink (directly or through other
// GPUs) has them on a circle, with its NVLinks as lines whose width follows
// their bandwidth. Any other node (a PCIe server, or one whose NVLink
// bridges join only pairs) is drawn as its PCIe hierarchy: a box per NUMA
// node, inside it a box per PCIe switch that two or more GPUs share, and
// its GPUs in rows inside those, with any NVLinks as lines or arcs. Each
// GPU is filled with the colour of the pod that holds it (white when free).
//
// The elements carry data attributes for tools and tests: data-node and
// data-domain on each node's group, data-gpu, data-numa and (under a shared
// switch) data-switch on each GPU's circle, and data-switch or data-numa
// with data-gpus on each box.
func WriteSVG(w io.Writer, nodes []NodeView, pods []PodView) error {
	owner := map[string]map[int]int{} // node -> gpu -> pod index
	for i, p := range pods {
		if owner[p.Node] == nil {
			owner[p.Node] = map[int]int{}
		}
		for _, g := range p.GPUs {
			owner[p.Node][g] = i
		}
	}
	groups := groupByDomain(nodes)
	headed := len(groups) > 0 && groups[0].domain != ""
	cols := 1
	for _, gr := range groups {
		cols = max(cols, min(panelsPerRow, len(gr.nodes)))
	}
	width := panelW * cols

	// Lay everything out first: a row is as tall as its tallest panel.
	type panel struct {
		n      NodeView
		ox, oy int
		l      layout
	}
	type groupBox struct {
		g        group
		top, bot int
		panels   []panel
	}
	var boxes []groupBox
	y := 0
	for _, gr := range groups {
		gb := groupBox{g: gr, top: y}
		if headed {
			y += groupHeadH
		}
		for start := 0; start < len(gr.nodes); start += cols {
			row := gr.nodes[start:min(start+cols, len(gr.nodes))]
			rowH := 0
			for i, n := range row {
				l := layoutNode(n.Graph)
				gb.panels = append(gb.panels, panel{n: n, ox: i * panelW, oy: y, l: l})
				rowH = max(rowH, l.h)
			}
			for i := len(gb.panels) - len(row); i < len(gb.panels); i++ {
				gb.panels[i].l.h = rowH
			}
			y += rowH
		}
		gb.bot = y
		if headed {
			y += groupGap
		}
		boxes = append(boxes, gb)
	}
	legendCols := max(1, min(cols, 3))
	legendRows := (len(pods) + legendCols - 1) / legendCols
	height := y + legendRowH*legendRows + 40

	p := &printer{w: w}
	p.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	p.f(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	for _, gb := range boxes {
		p.f(`<g class="domain" data-domain="%s">`+"\n", attr(gb.g.domain))
		if headed {
			label := gb.g.domain
			if label == "" {
				label = noDomainLabel
			}
			p.f(`<rect class="domain-box" x="2" y="%d" width="%d" height="%d" rx="6" fill="#f4f6fb" stroke="#7a86a8" stroke-width="1.5"/>`+"\n",
				gb.top, width-4, gb.bot-gb.top+4)
			p.f(`<text class="domain-label" x="14" y="%d" font-size="14" font-weight="bold" fill="#2f3b5c">%s</text><text x="%d" y="%d" fill="#555555" text-anchor="end">%s</text>`+"\n",
				gb.top+19, html.EscapeString(label), width-14, gb.top+19, nodesCount(len(gb.g.nodes)))
		}
		for _, pn := range gb.panels {
			drawNode(p, pn.n, owner[pn.n.Name], pn.ox, pn.oy, pn.l)
		}
		p.f("</g>\n")
	}
	ly := y + 20
	for i, pod := range pods {
		x, y := 20+(i%legendCols)*(width/legendCols), ly+(i/legendCols)*legendRowH
		p.f(`<rect x="%d" y="%d" width="14" height="14" fill="%s"/><text x="%d" y="%d">%s (%s, GPUs %s)</text>`+"\n",
			x, y, palette[i%len(palette)], x+20, y+12, html.EscapeString(pod.Name), html.EscapeString(pod.Node), Indices(pod.GPUs))
	}
	p.f("</svg>\n")
	return p.err
}

func nodesCount(n int) string {
	if n == 1 {
		return "1 node"
	}
	return strconv.Itoa(n) + " nodes"
}

// group is the nodes of one fabric domain, in the order given.
type group struct {
	domain string
	nodes  []NodeView
}

// groupByDomain groups nodes by Domain: domains sorted, the nodes without
// one last, each group's nodes in their given order.
func groupByDomain(nodes []NodeView) []group {
	at := map[string]int{}
	var out []group
	for _, n := range nodes {
		i, ok := at[n.Domain]
		if !ok {
			i = len(out)
			at[n.Domain] = i
			out = append(out, group{domain: n.Domain})
		}
		out[i].nodes = append(out[i].nodes, n)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i].domain, out[j].domain
		if (a == "") != (b == "") {
			return b == ""
		}
		return a < b
	})
	return out
}

// layout is where a node's GPUs and boxes go, relative to its panel.
type layout struct {
	pos    [][2]float64
	circle bool
	// numa and switches are the boxes of the PCIe drawing, NUMA first.
	numa, switches []box
	// numaOf and switchOf name each GPU's box (switchOf is "" for a GPU
	// that shares no switch).
	numaOf, switchOf []string
	h                int
}

type box struct {
	id, label  string
	x, y, w, h float64
	gpus       []int
}

// layoutNode lays a node out: on a circle when its GPUs are all joined by
// NVLink, else as its PCIe hierarchy.
func layoutNode(g *topology.Graph) layout {
	if g == nil {
		return layout{h: panelH}
	}
	l := layout{numaOf: make([]string, g.Len()), switchOf: make([]string, g.Len()), h: panelH}
	numas := domains(g, topology.DomainLevels-1, allGPUs(g.Len()))
	for _, members := range numas {
		id := numaID(g, members)
		for _, i := range members {
			l.numaOf[i] = id
		}
	}
	if nvConnected(g) {
		l.circle = true
		l.pos = circle(g.Len())
		if g.Len() > 8 {
			l.h = panelH + 20 // room under the wider circle for the NUMA line
		}
		return l
	}
	l.pos = make([][2]float64, g.Len())
	y := float64(headerH)
	switchNo := 0
	for _, members := range numas {
		x0, right := float64(numaX+numaPad), float64(numaX+numaW-numaPad)
		x, lineY, lineH := x0, y+numaLabelH, 0.0
		for _, sw := range domains(g, 0, members) {
			shared := len(sw) > 1
			cols := min(len(sw), switchCols)
			rows := (len(sw) + cols - 1) / cols
			pad := 0.0
			if shared {
				pad = switchPad
			}
			w, h := float64(cols*cell)+2*pad, float64(switchLabelH+rows*cell+switchPad)
			if x > x0 && x+w > right {
				x, lineY, lineH = x0, lineY+lineH+itemGap, 0
			}
			if shared {
				id := strconv.Itoa(switchNo)
				switchNo++
				l.switches = append(l.switches, box{id: id, label: "PCIe switch " + id, x: x, y: lineY, w: w, h: h, gpus: sw})
				for _, i := range sw {
					l.switchOf[i] = id
				}
			}
			for j, i := range sw {
				c, r := j%cols, j/cols
				l.pos[i] = [2]float64{x + pad + float64(c*cell) + cell/2, lineY + switchLabelH + float64(r*cell) + cell/2}
			}
			x += w + itemGap
			lineH = max(lineH, h)
		}
		h := lineY + lineH + numaPad - y
		id := l.numaOf[members[0]]
		l.numa = append(l.numa, box{id: id, label: "NUMA " + id, x: numaX, y: y, w: numaW, h: h, gpus: members})
		y += h + numaGap
	}
	l.h = max(panelH, int(math.Ceil(y))-numaGap+bottomH)
	return l
}

func allGPUs(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// domains splits members by their domain at level t, each part in index
// order and the parts in the order of their first GPU.
func domains(g *topology.Graph, t int, members []int) [][]int {
	return topology.PartitionBy(members, func(i int) int { return g.Domain(t, i) })
}

// numaID is the NUMA node the GPUs report when they agree on one, else "?".
func numaID(g *topology.Graph, members []int) string {
	n := g.GPU(members[0]).NUMANode
	for _, i := range members {
		if g.GPU(i).NUMANode != n {
			return "?"
		}
	}
	if n < 0 {
		return "?"
	}
	return strconv.Itoa(n)
}

// nvConnected reports whether every GPU reaches every other over NVLink.
func nvConnected(g *topology.Graph) bool {
	n := g.Len()
	if n == 0 {
		return true
	}
	seen := make([]bool, n)
	seen[0] = true
	stack, count := []int{0}, 1
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for u := 0; u < n; u++ {
			if !seen[u] && g.NVLinked(v, u) {
				seen[u] = true
				count++
				stack = append(stack, u)
			}
		}
	}
	return count == n
}

// circle places n GPUs on a circle in the panel, GPU 0 at the top.
func circle(n int) [][2]float64 {
	cx, cy, r := float64(panelW/2), float64(panelH/2+10), 120.0
	if n > 8 {
		r = 135
	}
	pos := make([][2]float64, n)
	for i := range pos {
		a := 2*math.Pi*float64(i)/float64(n) - math.Pi/2
		pos[i] = [2]float64{cx + r*math.Cos(a), cy + r*math.Sin(a)}
	}
	return pos
}

func drawNode(p *printer, n NodeView, owner map[int]int, ox, oy int, l layout) {
	p.f(`<g class="node" data-node="%s" data-domain="%s">`+"\n", attr(n.Name), attr(n.Domain))
	defer p.f("</g>\n")
	p.f(`<rect class="panel" x="%d" y="%d" width="%d" height="%d" fill="#ffffff" stroke="#cccccc"/>`+"\n", ox+5, oy+5, panelW-10, l.h-10)
	p.f(`<text x="%d" y="%d" font-weight="bold">%s</text><text x="%d" y="%d" fill="#555555">%s</text>`+"\n",
		ox+15, oy+24, html.EscapeString(n.Name), ox+15, oy+40, html.EscapeString(n.Fixture))
	g := n.Graph
	if g == nil {
		p.f(`<text x="%d" y="%d" fill="#555555">no topology</text>`+"\n", ox+15, oy+70)
		return
	}
	at := func(i int) (float64, float64) { return float64(ox) + l.pos[i][0], float64(oy) + l.pos[i][1] }
	for _, b := range l.numa {
		p.f(`<rect class="numa" data-numa="%s" data-gpus="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="4" fill="%s" stroke="#8c8c8c" stroke-dasharray="4 3"/><text x="%.1f" y="%.1f" font-size="11" fill="#444444">%s</text>`+"\n",
			b.id, Indices(b.gpus), float64(ox)+b.x, float64(oy)+b.y, b.w, b.h, numaBoxFill, float64(ox)+b.x+6, float64(oy)+b.y+13, b.label)
	}
	for _, b := range l.switches {
		p.f(`<rect class="pcie-switch" data-switch="%s" data-gpus="%s" x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="4" fill="%s" stroke="#5b7fa6"/><text x="%.1f" y="%.1f" font-size="10" fill="#2c4a6b">%s</text>`+"\n",
			b.id, Indices(b.gpus), float64(ox)+b.x, float64(oy)+b.y, b.w, b.h, switchBoxFill, float64(ox)+b.x+5, float64(oy)+b.y+11, b.label)
	}
	maxBW := 1
	for a := 0; a < g.Len(); a++ {
		for b := a + 1; b < g.Len(); b++ {
			if g.NVLinked(a, b) && g.Bandwidth(a, b) > maxBW {
				maxBW = g.Bandwidth(a, b)
			}
		}
	}
	for a := 0; a < g.Len(); a++ {
		for b := a + 1; b < g.Len(); b++ {
			if !g.NVLinked(a, b) {
				continue
			}
			color, pa, pb := "#999999", -1, -2
			if v, ok := owner[a]; ok {
				pa = v
			}
			if v, ok := owner[b]; ok {
				pb = v
			}
			if pa == pb {
				color = palette[pa%len(palette)]
			}
			width := 0.5 + 4*float64(g.Bandwidth(a, b))/float64(maxBW)
			ax, ay := at(a)
			bx, by := at(b)
			if l.circle || (math.Abs(ay-by) < 1 && math.Abs(ax-bx) <= cell+1) {
				p.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f" stroke-opacity="0.8"/>`+"\n",
					ax, ay, bx, by, color, width)
				continue
			}
			// Not neighbours in the PCIe drawing: an arc above the GPUs
			// between them.
			mx, my := (ax+bx)/2, min(ay, by)-gpuR-0.25*math.Hypot(bx-ax, by-ay)
			p.f(`<path d="M%.1f,%.1f Q%.1f,%.1f %.1f,%.1f" fill="none" stroke="%s" stroke-width="%.1f" stroke-opacity="0.8"/>`+"\n",
				ax, ay, mx, my, bx, by, color, width)
		}
	}
	for i := range l.pos {
		fill := "#ffffff"
		if v, ok := owner[i]; ok {
			fill = palette[v%len(palette)]
		}
		sw := ""
		if l.switchOf[i] != "" {
			sw = ` data-switch="` + l.switchOf[i] + `"`
		}
		x, y := at(i)
		p.f(`<circle data-gpu="%d" data-numa="%s"%s cx="%.1f" cy="%.1f" r="%d" fill="%s" stroke="#333333"/><text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n",
			i, l.numaOf[i], sw, x, y, gpuR, fill, x, y+4, i)
	}
	if l.circle {
		// The NUMA nodes, lightly, under the circle.
		var parts []string
		for _, members := range domains(g, topology.DomainLevels-1, allGPUs(g.Len())) {
			parts = append(parts, "NUMA "+l.numaOf[members[0]]+": GPUs "+Spans(members))
		}
		p.f(`<text x="%d" y="%d" font-size="10" fill="#777777">%s</text>`+"\n", ox+15, oy+l.h-14, html.EscapeString(strings.Join(parts, " · ")))
	}
}

// Spans renders indices sorted, runs shortened: [6 2 0 1 3] is "0-3,6",
// [0 1] is "0,1".
func Spans(idx []int) string {
	v := slices.Sorted(slices.Values(idx))
	var parts []string
	for i := 0; i < len(v); {
		j := i
		for j+1 < len(v) && v[j+1] == v[j]+1 {
			j++
		}
		switch {
		case j == i:
			parts = append(parts, strconv.Itoa(v[i]))
		case j == i+1:
			parts = append(parts, strconv.Itoa(v[i]), strconv.Itoa(v[j]))
		default:
			parts = append(parts, strconv.Itoa(v[i])+"-"+strconv.Itoa(v[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// attr escapes s for an attribute value.
func attr(s string) string { return html.EscapeString(s) }

type printer struct {
	w   io.Writer
	err error
}

func (p *printer) f(format string, args ...any) {
	if p.err != nil {
		return
	}
	_, p.err = fmt.Fprintf(p.w, format, args...)
}

// NodeView is one node as the report shows it.
type NodeView struct {
	Name    string
	Fixture string
	// Domain is the node's fabric domain as a label ("leaf=rack-1"); the
	// picture groups nodes by it. Empty: the node is in none.
	Domain string
	Graph  *topology.Graph
}

// PodView is one placed pod.
type PodView struct {
	Name string
	Node string
	// Intent is the workload's parallelism ("model", "data" or "").
	Intent string
	// GPUs are the assigned GPU indices on Node, in assignment order.
	GPUs []int
	// Order is the bind order, used to replay count-only scheduling.
	Order int
}

// Indices renders GPU indices as "0,1,2".
func Indices(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
