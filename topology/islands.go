package topology

// Islands returns the machine's NVLink islands: the connected components
// of its NVLink graph (direct links and NVSwitch paths), in order of their
// lowest GPU. A GPU with no NVLink is an island of its own. On an NVSwitch
// machine every GPU is in one island; on a PCIe server with NVLink bridges
// each bridged pair is one.
func (g *Graph) Islands() []Mask {
	var out []Mask
	var seen Mask
	for i := range g.n {
		if seen.Has(i) {
			continue
		}
		island := MaskOf(i)
		for frontier := island; !frontier.Empty(); {
			var next Mask
			for _, v := range frontier.Indices() {
				next = next.Union(g.nvW[v])
			}
			next = next.Minus(island)
			island = island.Union(next)
			frontier = next
		}
		seen = seen.Union(island)
		out = append(out, island)
	}
	return out
}

// PeakBandwidth is the highest bandwidth between any two of the machine's
// GPUs, GB/s (0 for a single GPU): what the machine can offer the most
// demanding pair.
func (g *Graph) PeakBandwidth() int {
	peak := 0
	for a := range g.n {
		for b := a + 1; b < g.n; b++ {
			peak = max(peak, g.bw[a*g.n+b])
		}
	}
	return peak
}
