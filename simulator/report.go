package simulator

import (
	"bufio"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable prints one row per policy, in Markdown table syntax so that
// the same text reads in a terminal and in docs/simulator.md.
func WriteTable(w io.Writer, results []Result) error {
	tw := markdownTable(w, "policy", "accepted", "model jobs placed", "model on NVLink", "model ring GB/s", "ring GB/s mean", "ring GB/s worst", "island share", "mean wait", "effective wait", "model NVLink work", "decision mean", "decision p99")
	for _, r := range results {
		fmt.Fprintf(tw, "| %s\t| %d/%d (%.1f%%)\t| %d/%d\t| %.1f%%\t| %.1f\t| %.1f\t| %.0f\t| %.3f\t| %s\t| %s\t| %.1f%%\t| %s\t| %s\t|\n",
			r.Policy, r.Accepted, r.Jobs, 100*r.AcceptanceRate(), r.ModelAccepted, r.ModelJobs, 100*r.NVLinkShare(), r.ModelRingMeanGBps,
			r.RingMeanGBps, r.RingWorstGBps, r.IslandShare, r.MeanWait.Round(time.Second), r.EffectiveWait.Round(time.Second), 100*r.NVLinkWork,
			roundDur(r.DecisionMean), roundDur(r.DecisionP99))
	}
	return tw.Flush()
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond)
	}
	return d
}

// svg colours per policy, in PolicyNames order, then a fallback.
var palette = []string{"#1b7837", "#762a83", "#d73027", "#fc8d59", "#4575b4", "#999999"}

// WriteSVG draws two panels: the fragmentation measure (island share)
// over simulated time per policy, and bars of acceptance and model-on-
// NVLink share per policy. Plain SVG 1.1, no scripts or fonts beyond
// sans-serif.
func WriteSVG(w io.Writer, title string, results []Result) error {
	const W, H = 900, 660
	const left, right, top1, h1 = 70.0, 180.0, 85.0, 260.0
	const top2, h2 = 425.0, 180.0
	b := bufio.NewWriter(w)
	fmt.Fprintf(b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	// The title is "trace ...; cluster ...; ...": one line per clause.
	for i, line := range strings.Split(title, "; ") {
		weight := "normal"
		if i == 0 {
			weight = "bold"
		}
		fmt.Fprintf(b, `<text x="%d" y="%d" font-size="13" font-weight="%s">%s</text>`+"\n", int(left), 16+15*i, weight, esc(line))
	}
	pw := W - left - right
	var tmax time.Duration
	for _, r := range results {
		if n := len(r.Series); n > 0 && r.Series[n-1].T > tmax {
			tmax = r.Series[n-1].T
		}
	}
	if tmax == 0 {
		tmax = time.Second
	}
	x := func(t time.Duration) float64 { return left + pw*float64(t)/float64(tmax) }
	y := func(v float64) float64 { return top1 + h1*(1-v) }
	// Panel 1 axes and grid.
	fmt.Fprintf(b, `<text x="%d" y="%.0f">Free NVLink island share over simulated time (1 = no island broken)</text>`+"\n", int(left), top1-10)
	for i := 0; i <= 4; i++ {
		v := float64(i) / 4
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, left, y(v), left+pw, y(v))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%.2f</text>`+"\n", left-6, y(v)+4, v)
	}
	hours := tmax.Hours()
	step := math.Max(1, math.Ceil(hours/10))
	for hr := 0.0; hr <= hours; hr += step {
		xx := x(time.Duration(hr * float64(time.Hour)))
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%gh</text>`+"\n", xx, top1+h1+16, hr)
	}
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", left, top1, pw, h1)
	for i, r := range results {
		col := palette[min(i, len(palette)-1)]
		var pts strings.Builder
		for k, s := range r.Series {
			// Step plot: the value holds until the next sample.
			if k > 0 {
				fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.T), y(r.Series[k-1].IslandShare))
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(s.T), y(s.IslandShare))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.2" stroke-opacity="0.8" points="%s"/>`+"\n", col, strings.TrimSpace(pts.String()))
		ly := top1 + 14 + float64(i)*18
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`, left+pw+12, ly-4, left+pw+32, ly-4, col)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f">%s (mean %.3f)</text>`+"\n", left+pw+36, ly, esc(r.Policy), r.IslandShare)
	}
	// Panel 2: grouped bars.
	fmt.Fprintf(b, `<text x="%d" y="%.0f">Accepted jobs (solid) and placed model-parallel jobs on NVLink (hatched), %%</text>`+"\n", int(left), top2-10)
	fmt.Fprintf(b, `<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" height="6" fill="white" fill-opacity="0.55"/></pattern></defs>`+"\n")
	for i := 0; i <= 4; i++ {
		v := float64(i) / 4
		yy := top2 + h2*(1-v)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`, left, yy, left+pw, yy)
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end">%d</text>`+"\n", left-6, yy+4, i*25)
	}
	n := max(len(results), 1)
	slot := pw / float64(n)
	bw := slot * 0.3
	for i, r := range results {
		col := palette[min(i, len(palette)-1)]
		x0 := left + slot*float64(i) + slot*0.15
		for k, v := range []float64{r.AcceptanceRate(), r.NVLinkShare()} {
			bx := x0 + float64(k)*(bw+slot*0.1)
			by := top2 + h2*(1-v)
			fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`, bx, by, bw, top2+h2-by, col)
			if k == 1 {
				fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="url(#hatch)"/>`, bx, by, bw, top2+h2-by)
			}
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%.0f</text>`+"\n", bx+bw/2, by-3, 100*v)
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", left+slot*(float64(i)+0.5), top2+h2+16, esc(r.Policy))
	}
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", left, top2, pw, h2)
	fmt.Fprintln(b, `</svg>`)
	return b.Flush()
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// WritePlacements writes every accepted job of every policy as CSV:
// policy, job, start_s, gpus, parallelism, node, fixture, indices, tier,
// ring_gbps. It is the evidence behind the table: where each job ran.
func WritePlacements(w io.Writer, results []Result) error {
	b := csv.NewWriter(w)
	_ = b.Write(strings.Split("policy,job,start_s,gpus,parallelism,node,fixture,indices,tier,ring_gbps", ","))
	for _, r := range results {
		for _, p := range r.Placed {
			par := string(p.Job.Parallelism)
			if par == "" {
				par = "none"
			}
			idx := make([]string, len(p.GPUs))
			for i, g := range p.GPUs {
				idx[i] = strconv.Itoa(g)
			}
			_ = b.Write([]string{r.Policy, p.Job.ID, strconv.FormatFloat(p.Start.Seconds(), 'f', -1, 64),
				strconv.Itoa(p.Job.GPUs), par, p.Node, p.Fixture, strings.Join(idx, " "), string(p.Tier), strconv.Itoa(p.RingGBps)})
		}
	}
	b.Flush() // a write error sticks and is returned here
	if err := b.Error(); err != nil {
		return fmt.Errorf("write placements: %w", err)
	}
	return nil
}

// markdownTable is a table writer on w, its header row (cols) and the
// separator row written: rows are "| a\t| b\t|" lines, aligned on Flush.
func markdownTable(w io.Writer, cols ...string) *tabwriter.Writer {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	var head, sep strings.Builder
	for _, c := range cols {
		head.WriteString("| " + c + "\t")
		sep.WriteString("|---\t")
	}
	fmt.Fprintln(tw, head.String()+"|")
	fmt.Fprintln(tw, sep.String()+"|")
	return tw
}
