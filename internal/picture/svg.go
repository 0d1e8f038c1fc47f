// Package picture draws a cluster's GPU nodes and the pods on their GPUs
// as SVG: the demo's placement.svg and kubectl gputopo node --svg. It has
// no cgo dependency, so the kubectl plugin cross-compiles.
package picture

import (
	"fmt"
	"html"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/topology"
)

// palette colours pods; it cycles when there are more pods than colours.
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

const (
	panelW, panelH = 340, 360
	panelsPerRow   = 3
)

// WriteSVG draws every node: GPUs on a circle, NVLink connections as lines
// whose width follows their bandwidth, and each GPU filled with the colour of
// the pod that holds it (white when free).
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
	rows := (len(nodes) + panelsPerRow - 1) / panelsPerRow
	legendH := 24 * ((len(pods) + 2) / 3)
	width, height := panelW*panelsPerRow, panelH*rows+legendH+40
	p := &printer{w: w}
	p.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	p.f(`<rect width="100%%" height="100%%" fill="#ffffff"/>` + "\n")
	for i, n := range nodes {
		ox, oy := (i%panelsPerRow)*panelW, (i/panelsPerRow)*panelH
		drawNode(p, n, owner[n.Name], ox, oy)
	}
	ly := rows*panelH + 20
	for i, pod := range pods {
		x, y := 20+(i%3)*(width/3), ly+(i/3)*24
		p.f(`<rect x="%d" y="%d" width="14" height="14" fill="%s"/><text x="%d" y="%d">%s (%s, GPUs %s)</text>`+"\n",
			x, y, palette[i%len(palette)], x+20, y+12, html.EscapeString(pod.Name), html.EscapeString(pod.Node), Indices(pod.GPUs))
	}
	p.f("</svg>\n")
	return p.err
}

func drawNode(p *printer, n NodeView, owner map[int]int, ox, oy int) {
	g := n.Graph
	cx, cy, r := float64(ox+panelW/2), float64(oy+panelH/2+10), 120.0
	if g.Len() > 8 {
		r = 135
	}
	pos := make([][2]float64, g.Len())
	for i := range pos {
		a := 2*math.Pi*float64(i)/float64(g.Len()) - math.Pi/2
		pos[i] = [2]float64{cx + r*math.Cos(a), cy + r*math.Sin(a)}
	}
	p.f(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#cccccc"/>`+"\n", ox+5, oy+5, panelW-10, panelH-10)
	p.f(`<text x="%d" y="%d" font-weight="bold">%s</text><text x="%d" y="%d" fill="#555555">%s</text>`+"\n",
		ox+15, oy+24, html.EscapeString(n.Name), ox+15, oy+40, html.EscapeString(n.Fixture))
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
			p.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f" stroke-opacity="0.8"/>`+"\n",
				pos[a][0], pos[a][1], pos[b][0], pos[b][1], color, width)
		}
	}
	for i := range pos {
		fill := "#ffffff"
		if v, ok := owner[i]; ok {
			fill = palette[v%len(palette)]
		}
		p.f(`<circle cx="%.1f" cy="%.1f" r="16" fill="%s" stroke="#333333"/><text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n",
			pos[i][0], pos[i][1], fill, pos[i][0], pos[i][1]+4, i)
	}
}

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
	Graph   *topology.Graph
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
