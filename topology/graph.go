package topology

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Graph is the immutable description of one node's GPUs and the link between
// every pair of them. It is built once per observed topology and then only
// read, so one Graph is safe for any number of concurrent readers.
type Graph struct {
	n       int
	gpus    []v1alpha1.GPU
	healthy Bitset
	// uuid finds a GPU by UUID on graphs of more than uuidScan GPUs; a
	// smaller one is scanned.
	uuid     map[string]int
	hash     string
	healthyW Mask
	// The link tables, which graphs of one machine shape share
	// (SharingTables): a node's graph then costs its GPUs and little more.
	*tables
}

// tables are a graph's link tables, derived from its links alone.
type tables struct {
	links []v1alpha1.Link // n*n, symmetric; links[i*n+j] has A<B
	bw    []int           // n*n pair bandwidth, GB/s bidirectional
	// The set searches' view, filled on graphs of at most WindowGPUs GPUs
	// (a larger graph is searched through windows of it, wide.go).
	nv   []Bitset // nv[i]: GPUs NVLinked to i
	rank []int8   // n*n PCIe level rank, see pcieRanks
	// domBit[t][i] is the bit of dom[t][i]; OR-ing them over a set and
	// counting bits gives the number of domains the set spans at level t.
	domBit [DomainLevels][]Bitset
	// dom[t][i] numbers the PCIe/NUMA domain of GPU i at domain level t
	// (see domainLevels), 0..n-1.
	dom [DomainLevels][]int
	nvW []Mask // nvW[i]: GPUs NVLinked to i, on graphs of any size
}

// uuidScan is the most GPUs a graph finds a UUID in by scanning them.
const uuidScan = 16

// pcieRanks orders the PCIe levels from nearest to farthest, as NVML does.
var pcieRanks = map[v1alpha1.PCIeLevel]int8{
	v1alpha1.PCIeInternal:         0,
	v1alpha1.PCIeSameSwitch:       1,
	v1alpha1.PCIeMultipleSwitches: 2,
	v1alpha1.PCIeHostBridge:       3,
	v1alpha1.PCIeSameNUMA:         4,
	v1alpha1.PCIeCrossSocket:      5,
}

var pcieLevelNames = []string{
	string(v1alpha1.PCIeInternal), string(v1alpha1.PCIeSameSwitch), string(v1alpha1.PCIeMultipleSwitches),
	string(v1alpha1.PCIeHostBridge), string(v1alpha1.PCIeSameNUMA), string(v1alpha1.PCIeCrossSocket),
}

// domainLevels are the boundaries DomainsCrossed counts: a PCIe switch, a
// tree of PCIe switches, a host bridge (root complex) and a NUMA node. Two
// GPUs are in the same domain at level t when their PCIe level ranks at most
// t (transitively); every domain a set spans beyond the first at each level
// is one boundary crossed. Crossing sockets crosses every level, so it costs
// the most.
var domainLevels = [DomainLevels]int8{1, 2, 3, 4}

// DomainLevels is the number of domain levels: a GPU's domain at level t
// (0 <= t < DomainLevels) is Graph.DomainBit's.
const DomainLevels = 4

// Ceilings on what one link may claim. They keep a hostile or mistaken
// status (a figure in MB/s, an NVLink bandwidth without nvlinks) from being
// believed, and they bound every sum the allocator forms: the largest, the
// cut of a 64-GPU node, is 64 × 64 × MaxPairGBps ≈ 8.2 million, far inside
// an int.
const (
	// MaxPCIeGBps is the most a pair without NVLink can carry, GB/s
	// bidirectional: one PCIe Gen6 x16 link (128 GB/s each way). Peer
	// traffic between two GPUs crosses at least each GPU's own x16 link, and
	// no GPU has a wider or faster one, so a PCIe pair never gets more.
	MaxPCIeGBps = 256
	// MaxPairGBps is the most any pair may claim, GB/s bidirectional:
	// above NVLink5's 1,800 (18 links × 100, GB200 and B200 through
	// NVSwitch), with room for a measured figure a little above the
	// published one.
	MaxPairGBps = 2000
	// MaxNVLinks is the most NVLinks a pair may have: NVML's
	// NVLINK_MAX_LINKS (36), the links one GPU can have at all.
	MaxNVLinks = 36
)

// NewGraph validates GPUs and links and builds a Graph. GPUs may come in any
// order; their indices must be exactly 0..n-1. Every pair of GPUs must be
// described by exactly one link (A and B in either order). Every problem
// found is reported, each naming the offending entry.
func NewGraph(gpus []v1alpha1.GPU, links []v1alpha1.Link) (*Graph, error) {
	return newGraph(gpus, links, false)
}

// newGraph is NewGraph; with keep, the graph holds gpus itself when they
// are listed in index order, rather than a copy.
func newGraph(gpus []v1alpha1.GPU, links []v1alpha1.Link, keep bool) (*Graph, error) {
	n := len(gpus)
	if n > MaxGPUs {
		return nil, fmt.Errorf("gpus: %d GPUs listed; at most %d are supported per node", n, MaxGPUs)
	}
	var bad problems
	g := &Graph{n: n, tables: &tables{}}
	if keep && inIndexOrder(gpus) {
		g.gpus = gpus
	} else {
		g.gpus = make([]v1alpha1.GPU, n)
	}
	if n > uuidScan {
		g.uuid = make(map[string]int, n)
	}
	seen := g.addGPUs(gpus, &bad)
	linkPos := g.addLinks(links, &bad)
	missingLinks(n, seen, linkPos, &bad)
	if len(bad) > 0 {
		return nil, errors.Join(bad...)
	}
	g.index()
	return g, nil
}

func inIndexOrder(gpus []v1alpha1.GPU) bool {
	for i := range gpus {
		if gpus[i].Index != i {
			return false
		}
	}
	return true
}

// listedBefore finds the index of a GPU placed before gpus[pos] with its
// UUID.
func (g *Graph) listedBefore(gpus []v1alpha1.GPU, pos int, seen []int) (int, bool) {
	if g.uuid != nil {
		i, ok := g.uuid[gpus[pos].UUID]
		return i, ok
	}
	for q, o := range gpus[:pos] {
		if o.UUID == gpus[pos].UUID && o.Index >= 0 && o.Index < len(seen) && seen[o.Index] == q+1 {
			return o.Index, true
		}
	}
	return 0, false
}

// problems collects what NewGraph finds wrong, in the order it finds it.
type problems []error

func (p *problems) add(format string, args ...any) {
	*p = append(*p, fmt.Errorf(format, args...))
}

// addGPUs checks and places every GPU at its index; seen[i] is the
// position in gpus of GPU i, plus one (0: no GPU has index i).
func (g *Graph) addGPUs(gpus []v1alpha1.GPU, bad *problems) (seen []int) {
	n := g.n
	seen = make([]int, n)
	for pos, gpu := range gpus {
		switch {
		case gpu.Index < 0 || gpu.Index >= n:
			bad.add("gpus[%d].index: %d is out of range; indices must be 0..%d, one per GPU", pos, gpu.Index, n-1)
			continue
		case seen[gpu.Index] != 0:
			bad.add("gpus[%d].index: %d is also used by gpus[%d]; indices must be unique", pos, gpu.Index, seen[gpu.Index]-1)
			continue
		}
		seen[gpu.Index] = pos + 1
		if gpu.UUID == "" {
			bad.add("gpus[%d].uuid: must not be empty (GPU %d)", pos, gpu.Index)
		} else if other, dup := g.listedBefore(gpus, pos, seen); dup {
			bad.add("gpus[%d].uuid: %q is also the UUID of GPU %d; UUIDs must be unique", pos, gpu.UUID, other)
		} else if g.uuid != nil {
			g.uuid[gpu.UUID] = gpu.Index
		}
		if gpu.MemoryMiB < 0 {
			bad.add("gpus[%d].memoryMiB: %d must not be negative", pos, gpu.MemoryMiB)
		}
		if gpu.NUMANode < -1 {
			bad.add("gpus[%d].numaNode: %d must be -1 (unknown) or a NUMA node number", pos, gpu.NUMANode)
		}
		switch gpu.Health {
		case "", v1alpha1.GPUHealthy, v1alpha1.GPUUnhealthy:
		default:
			bad.add("gpus[%d].health: %q is not one of %q, %q", pos, gpu.Health, v1alpha1.GPUHealthy, v1alpha1.GPUUnhealthy)
		}
		if &g.gpus[gpu.Index] != &gpus[pos] { // not kept as they are
			g.gpus[gpu.Index] = gpu
		}
	}
	return seen
}

// addLinks checks and places every link, both ways; linkPos[a*n+b] (a<b)
// is the position in links of the pair's link, plus one.
func (g *Graph) addLinks(links []v1alpha1.Link, bad *problems) (linkPos []int) {
	n := g.n
	g.links = make([]v1alpha1.Link, n*n)
	linkPos = make([]int, n*n)
	for pos, l := range links {
		a, b := l.A, l.B
		switch {
		case a < 0 || a >= n || b < 0 || b >= n:
			bad.add("links[%d]: GPU %d-GPU %d names a GPU that does not exist; indices must be 0..%d", pos, a, b, n-1)
			continue
		case a == b:
			bad.add("links[%d]: links GPU %d to itself; a link joins two different GPUs", pos, a)
			continue
		}
		if a > b {
			a, b = b, a
			l.A, l.B = a, b
		}
		if p := linkPos[a*n+b]; p != 0 {
			what := "describes the same pair"
			if links[p-1].A != links[pos].A {
				what = "describes the same pair in the other direction"
			}
			bad.add("links[%d]: GPU %d-GPU %d %s as links[%d]; list every pair once", pos, a, b, what, p-1)
			continue
		}
		linkPos[a*n+b] = pos + 1
		checkLink(pos, l, bad)
		g.links[a*n+b] = l
		g.links[b*n+a] = l
	}
	return linkPos
}

// checkLink checks what one link claims: its PCIe level, NVLinks and
// bandwidth, against each other and the ceilings.
func checkLink(pos int, l v1alpha1.Link, bad *problems) {
	if _, ok := pcieRanks[l.PCIe]; !ok {
		bad.add("links[%d].pcie: %q is not a known PCIe level; want one of %v", pos, l.PCIe, pcieLevelNames)
	}
	switch {
	case l.NVLinks < 0:
		bad.add("links[%d].nvlinks: %d must not be negative", pos, l.NVLinks)
	case l.NVLinks > MaxNVLinks:
		bad.add("links[%d].nvlinks: %d; a GPU has at most %d NVLinks (NVML's NVLINK_MAX_LINKS)", pos, l.NVLinks, MaxNVLinks)
	}
	if l.NVSwitch && l.NVLinks <= 0 {
		bad.add("links[%d].nvswitch: set but nvlinks is %d; an NVSwitch path needs the GPU's NVLink count", pos, l.NVLinks)
	}
	switch {
	case l.BandwidthGBps < 0:
		bad.add("links[%d].bandwidthGBps: %d must not be negative", pos, l.BandwidthGBps)
	case l.BandwidthGBps > MaxPairGBps:
		bad.add("links[%d].bandwidthGBps: %d; a GPU pair carries at most %d GB/s (NVLink5 through NVSwitch, the fastest, gives 1,800)", pos, l.BandwidthGBps, MaxPairGBps)
	case l.NVLinks > 0 && l.BandwidthGBps == 0:
		bad.add("links[%d].bandwidthGBps: 0 with %d NVLinks; an NVLinked pair needs its bandwidth (nvlinks × GB/s per link)", pos, l.NVLinks)
	case l.NVLinks <= 0 && l.BandwidthGBps > MaxPCIeGBps:
		bad.add("links[%d].bandwidthGBps: %d; a PCIe link carries at most %d GB/s (PCIe Gen6 x16, bidirectional); a faster pair needs its nvlinks", pos, l.BandwidthGBps, MaxPCIeGBps)
	}
}

// missingLinks reports the pairs of listed GPUs that no link describes,
// the first five by name.
func missingLinks(n int, seen, linkPos []int, bad *problems) {
	missing := 0
	for a := 0; a < n; a++ {
		for b := a + 1; b < n; b++ {
			if linkPos[a*n+b] == 0 && seen[a] != 0 && seen[b] != 0 {
				if missing < 5 {
					bad.add("links: no link between GPU %d and GPU %d; every pair of GPUs needs exactly one link", a, b)
				}
				missing++
			}
		}
	}
	if missing > 5 {
		bad.add("links: %d more pairs have no link", missing-5)
	}
}

// FromStatus builds a Graph from a NodeGPUTopology status. Telemetry, times
// and the stored hash are not read: the hash is recomputed from the facts.
func FromStatus(st *v1alpha1.NodeGPUTopologyStatus) (*Graph, error) {
	return fromStatus(st, false)
}

// FromStatusKeeping is FromStatus for a status that never changes (an
// informer cache's objects are read-only): the graph holds the status's
// GPU list itself rather than a copy, so a cached topology's GPUs are in
// memory once.
func FromStatusKeeping(st *v1alpha1.NodeGPUTopologyStatus) (*Graph, error) {
	return fromStatus(st, true)
}

func fromStatus(st *v1alpha1.NodeGPUTopologyStatus, keep bool) (*Graph, error) {
	if st == nil {
		return nil, errors.New("status: is nil")
	}
	g, err := newGraph(st.GPUs, st.Links, keep)
	if err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return g, nil
}

// index fills the derived tables of a validated graph.
func (g *Graph) index() {
	n := g.n
	g.bw = make([]int, n*n)
	g.rank = make([]int8, n*n)
	g.nvW = make([]Mask, n)
	for a := 0; a < n; a++ {
		if g.gpus[a].Health != v1alpha1.GPUUnhealthy {
			g.healthyW = g.healthyW.With(a)
		}
		for b := 0; b < n; b++ {
			if a == b {
				continue
			}
			l := g.links[a*n+b]
			g.bw[a*n+b] = l.BandwidthGBps
			g.rank[a*n+b] = pcieRanks[l.PCIe]
			if l.NVLinks > 0 {
				g.nvW[a] = g.nvW[a].With(b)
			}
		}
	}
	for t, level := range domainLevels {
		comp := make([]int, n)
		for i := range comp {
			comp[i] = -1
		}
		next := 0
		for i := 0; i < n; i++ {
			if comp[i] >= 0 {
				continue
			}
			stack := []int{i}
			comp[i] = next
			for len(stack) > 0 {
				v := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				for u := 0; u < n; u++ {
					if u != v && comp[u] < 0 && g.rank[v*n+u] <= level {
						comp[u] = next
						stack = append(stack, u)
					}
				}
			}
			next++
		}
		g.dom[t] = comp
	}
	if n <= WindowGPUs {
		g.indexBits()
	}
	g.hash = g.computeHash()
}

// indexBits fills the search's view of a graph of at most WindowGPUs GPUs
// from its wide tables.
func (g *Graph) indexBits() {
	g.healthy = g.healthyW.Bitset()
	g.nv = make([]Bitset, g.n)
	for i, m := range g.nvW {
		g.nv[i] = m.Bitset()
	}
	for t := range domainLevels {
		g.domBit[t] = make([]Bitset, g.n)
		for i, c := range g.dom[t] {
			g.domBit[t][i] = 1 << c
		}
	}
}

// computeHash identifies what the allocator's answers depend on: each GPU's
// static facts and every link. UUIDs, health, fabric clique and telemetry
// are left out so that identical machines share one hash (and so one memo
// entry and one set of tables).
func (g *Graph) computeHash() string {
	h := sha256.New()
	fmt.Fprintf(h, "gputopo-graph-v1 n=%d\n", g.n)
	for _, gpu := range g.gpus {
		fmt.Fprintf(h, "gpu %d %q %d %d %q\n", gpu.Index, gpu.Model, gpu.MemoryMiB, gpu.NUMANode, gpu.PCIBusID)
	}
	for a := 0; a < g.n; a++ {
		for b := a + 1; b < g.n; b++ {
			l := g.links[a*g.n+b]
			fmt.Fprintf(h, "link %d %d %d %t %s %t %d\n", a, b, l.NVLinks, l.NVSwitch, l.PCIe, l.P2P, l.BandwidthGBps)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Status renders the graph as NodeGPUTopology status: GPUs in index order,
// every pair once with A<B sorted by (A, B), and the topology hash. Driver
// version, telemetry and times are the publisher's to fill.
func (g *Graph) Status() v1alpha1.NodeGPUTopologyStatus {
	links := make([]v1alpha1.Link, 0, g.n*(g.n-1)/2)
	for a := 0; a < g.n; a++ {
		for b := a + 1; b < g.n; b++ {
			links = append(links, g.links[a*g.n+b])
		}
	}
	return v1alpha1.NodeGPUTopologyStatus{GPUs: g.GPUs(), Links: links, TopologyHash: g.hash}
}

// SharingTables returns g with its link tables (links, bandwidths, PCIe
// ranks, NVLink adjacency, domains) taken from o when both describe the
// same machine (equal Hash and size); otherwise g itself. The tables are
// read-only, so graphs of identical machines can hold one copy of them:
// a fleet of one machine shape then keeps only each node's GPUs (UUIDs,
// health) per node. g is not modified.
func (g *Graph) SharingTables(o *Graph) *Graph {
	if o == nil || o == g || o.n != g.n || o.hash != g.hash {
		return g
	}
	c := *g
	c.tables = o.tables
	return &c
}

// Rebased is g holding gpus, a newer copy of its own GPU list (a status
// the node agent wrote again with only its telemetry changed), in place of
// the list it holds: a read-only status's list is then kept once, however
// often the status is rewritten. g itself when gpus is not the same list
// in index order.
func (g *Graph) Rebased(gpus []v1alpha1.GPU) *Graph {
	if len(gpus) != g.n || len(gpus) > 0 && &gpus[0] == &g.gpus[0] {
		return g
	}
	for i := range gpus {
		if gpus[i] != g.gpus[i] {
			return g
		}
	}
	c := *g
	c.gpus = gpus
	if g.uuid != nil {
		c.uuid = make(map[string]int, len(gpus))
		for i := range gpus {
			c.uuid[gpus[i].UUID] = i
		}
	}
	return &c
}

// Len is the number of GPUs.
func (g *Graph) Len() int { return g.n }

// GPUs returns a copy of the GPUs in index order.
func (g *Graph) GPUs() []v1alpha1.GPU { return append([]v1alpha1.GPU(nil), g.gpus...) }

// Link returns the link between a and b with A<B; the zero Link when a==b or
// either index is out of range.
func (g *Graph) Link(a, b int) v1alpha1.Link {
	if !g.valid(a, b) {
		return v1alpha1.Link{}
	}
	return g.links[a*g.n+b]
}

// Bandwidth is the pair's bandwidth in GB/s, bidirectional; 0 when a==b or
// either index is out of range.
func (g *Graph) Bandwidth(a, b int) int {
	if !g.valid(a, b) {
		return 0
	}
	return g.bw[a*g.n+b]
}

// NVLinked reports whether a and b are joined by NVLink, directly or through
// an NVSwitch.
func (g *Graph) NVLinked(a, b int) bool {
	return g.valid(a, b) && g.links[a*g.n+b].NVLinks > 0
}

func (g *Graph) valid(a, b int) bool { return a != b && a >= 0 && b >= 0 && a < g.n && b < g.n }

// Hash identifies the topology (GPU models, memory, NUMA nodes, PCI bus IDs
// and links; not UUIDs, health or telemetry): identical machines share it.
func (g *Graph) Hash() string { return g.hash }

// All is the set of every GPU.
func (g *Graph) All() Mask { return firstN(g.n) }

// all is All as a Bitset, on a graph of at most WindowGPUs GPUs.
func (g *Graph) all() Bitset {
	if g.n == WindowGPUs {
		return ^Bitset(0)
	}
	return Bitset(1)<<g.n - 1
}

// Healthy is the set of GPUs whose health is Healthy or not reported.
func (g *Graph) Healthy() Mask { return g.healthyW }

// IndexOf finds a GPU by UUID.
func (g *Graph) IndexOf(uuid string) (int, bool) {
	if g.uuid != nil {
		i, ok := g.uuid[uuid]
		return i, ok
	}
	for i := range g.gpus {
		if g.gpus[i].UUID == uuid && uuid != "" {
			return i, true
		}
	}
	return 0, false
}

// GPU returns GPU i; the zero GPU when i is out of range.
func (g *Graph) GPU(i int) v1alpha1.GPU {
	if i < 0 || i >= g.n {
		return v1alpha1.GPU{}
	}
	return g.gpus[i]
}

// BW is Bandwidth for two GPUs of g without the range check, for the inner
// loops of set searches: a and b must be 0..Len()-1 (a == b gives 0).
func (g *Graph) BW(a, b int) int { return g.bw[a*g.n+b] }

// NVAdjacency is, on a graph of at most WindowGPUs GPUs, each GPU's
// NVLinked GPUs (directly or through an NVSwitch) as a Bitset; nil on a
// larger graph. The slice is the graph's own: callers only read it.
func (g *Graph) NVAdjacency() []Bitset { return g.nv }

// DomainBit is, on a graph of at most WindowGPUs GPUs, the domain of GPU i
// at domain level t (0 <= t < DomainLevels) as a single bit: OR-ing them
// over a set and counting the bits gives the number of domains the set
// spans at that level.
func (g *Graph) DomainBit(t, i int) Bitset { return g.domBit[t][i] }

// Domain numbers the domain of GPU i at domain level t (0 <= t <
// DomainLevels; 0 is a PCIe switch, DomainLevels-1 a NUMA node), 0..Len()-1,
// on a graph of any size: two GPUs share the domain when their numbers are
// equal. It is -1 when t or i is out of range.
func (g *Graph) Domain(t, i int) int {
	if t < 0 || t >= DomainLevels || i < 0 || i >= g.n {
		return -1
	}
	return g.dom[t][i]
}

// PCIeRank orders the PCIe levels from nearest (0: two GPUs on one board)
// to farthest (5: across sockets), as NVML does; ok is false for a level
// that is none of the API's.
func PCIeRank(l v1alpha1.PCIeLevel) (rank int, ok bool) {
	r, ok := pcieRanks[l]
	return int(r), ok
}
