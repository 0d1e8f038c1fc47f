package machine

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// xmlElem is one element of an NCCL topology dump with the line it starts
// on, for errors.
type xmlElem struct {
	name     string
	attrs    map[string]string
	line     int
	children []*xmlElem
	parent   *xmlElem
}

func (e *xmlElem) attr(k string) string { return e.attrs[k] }

// parseXMLTree reads the whole document into elements with line numbers.
func parseXMLTree(text string) (*xmlElem, error) {
	dec := xml.NewDecoder(strings.NewReader(text))
	root := &xmlElem{name: "#document"}
	cur := root
	lineAt := func(off int64) int { return 1 + bytes.Count([]byte(text[:min(int(off), len(text))]), []byte("\n")) }
	for {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("NCCL topology: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			e := &xmlElem{name: t.Name.Local, attrs: map[string]string{}, line: lineAt(start), parent: cur}
			for _, a := range t.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			cur.children = append(cur.children, e)
			cur = e
		case xml.EndElement:
			if cur.parent != nil {
				cur = cur.parent
			}
		}
	}
	return root, nil
}

// ncclDevice is a GPU or NIC found in the dump with its place in the PCIe
// tree: the CPU (NUMA node) it hangs from and the bus IDs of the PCIe
// bridges and switches above it, root first.
type ncclDevice struct {
	name   string
	cpu    int
	bridge []string
	line   int
}

// ncclLevel is the PCIe level between two devices of the tree, in
// nvidia-smi's terms: across CPUs SYS; under one switch (nothing but that
// switch between them) PIX; under a tree of switches PXB; under one CPU
// with no common switch PHB, as NCCL names that path.
func ncclLevel(a, b ncclDevice) v1alpha1.PCIeLevel {
	if a.cpu != b.cpu {
		return v1alpha1.PCIeCrossSocket
	}
	c := 0
	for c < len(a.bridge) && c < len(b.bridge) && a.bridge[c] == b.bridge[c] {
		c++
	}
	switch {
	case c == 0:
		return v1alpha1.PCIeHostBridge
	case c == len(a.bridge) && c == len(b.bridge):
		return v1alpha1.PCIeSameSwitch
	}
	return v1alpha1.PCIeMultipleSwitches
}

// pcieGenOfSpeed maps NCCL's link_speed ("16.0 GT/s PCIe") to a generation.
func pcieGenOfSpeed(s string) int {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	for gen, gts := range map[int]float64{1: 2.5, 2: 5, 3: 8, 4: 16, 5: 32, 6: 64} {
		if v == gts {
			return gen
		}
	}
	return 0
}

// nvlinkGenOfSM maps a compute capability (NCCL's sm attribute) to the
// NVLink generation its SXM parts carry.
func nvlinkGenOfSM(sm int) int {
	return map[int]int{6: 1, 7: 2, 8: 3, 9: 4, 10: 5}[sm/10]
}

// ImportNCCLTopo builds a machine from NCCL's topology dump
// (NCCL_TOPO_DUMP_FILE): GPUs with their NVLinks (to GPUs, or into an
// NVSwitch), the PCIe tree (so every pair's PCIe level, NVLinked pairs
// included), PCIe link speeds, NUMA nodes and NICs. The compute capability
// (sm) gives the NVLink generation when neither o.GPU nor o.List does.
// Errors name the line of the element.
func ImportNCCLTopo(text string, o SMIOptions) (Fixture, error) {
	if errs := validateName(o.Name, field.NewPath("name")); len(errs) > 0 {
		return Fixture{}, fmt.Errorf("machine name %q: %s", o.Name, errs.ToAggregate().Error())
	}
	root, err := parseXMLTree(text)
	if err != nil {
		return Fixture{}, err
	}
	d := &ncclDump{}
	d.walk(root, -1, nil, nil)
	if err := d.el.err(); err != nil {
		return Fixture{}, err
	}
	byBus, err := d.indexGPUs()
	if err != nil {
		return Fixture{}, err
	}
	n, first := len(d.gpus), d.gpus[0]
	kind, model, err := importKind(o, n)
	if err != nil {
		return Fixture{}, err
	}
	var notes []string
	if o.GPU == "" && strings.TrimSpace(o.List) == "" {
		kind.NVLinkGen = nvlinkGenOfSM(first.sm)
		model = fmt.Sprintf("GPU sm_%d", first.sm)
		notes = append(notes, fmt.Sprintf("the model is not in the dump: sm %d gives NVLink generation %d; pass --gpu or nvidia-smi -L output for the product and its memory", first.sm, kind.NVLinkGen))
	}
	f := Fixture{
		Name: o.Name, Model: model, GPUs: n, MemoryMiB: kind.MemoryMiB, NVLinkGen: kind.NVLinkGen,
		NVLinkGBps: nvlinkGBpsPerLink[kind.NVLinkGen], Source: o.Source,
		NUMANodes: make([]int, n), PCIBusIDs: make([]string, n),
	}
	// PCIe generation: the GPUs' own links; the dump may leave it empty
	// (virtual machines), then the product's.
	f.PCIeGen = first.gen
	if f.PCIeGen == 0 {
		f.PCIeGen = kind.PCIeGen
	}
	d.placeGPUs(&f)
	d.nvlinks(byBus, &f)
	if err := d.el.err(); err != nil {
		return Fixture{}, err
	}
	if err := d.nvlinkKind(&f); err != nil {
		return Fixture{}, err
	}
	d.levels(&f)
	notes = append(notes, "PCIe levels come from the dump's PCIe tree; NCCL does not tell host bridges of one CPU apart, so GPUs under one CPU with no common switch are PHB")
	f.Notes = notes
	f.Description = strings.Replace(describeImport(f), "imported from nvidia-smi topo -m", "imported from an NCCL topology dump", 1)
	if err := f.Validate(); err != nil {
		return Fixture{}, fmt.Errorf("NCCL topology: %w", err)
	}
	return f, nil
}

// ncclGPU is a GPU of the dump and its NVLinks.
type ncclGPU struct {
	dev    ncclDevice
	index  int
	sm     int
	busID  string
	gen    int
	links  map[string]int // target bus ID -> count, GPU targets
	toSw   int
	linkAt map[string]int // target -> line
}

// ncclDump is what walking a dump finds: its GPUs and NICs, and its
// problems.
type ncclDump struct {
	gpus []*ncclGPU
	nics []ncclDevice
	el   errList
}

// walk visits e under CPU (NUMA node) cpu and the PCIe bridges and
// switches bridges, root first; ownPCI is e's closest <pci> element.
func (d *ncclDump) walk(e *xmlElem, cpu int, bridges []string, ownPCI *xmlElem) {
	switch e.name {
	case "cpu":
		id, err := strconv.Atoi(e.attr("numaid"))
		if err != nil {
			d.el.add("NCCL topology: line %d: <cpu numaid=%q>: want a NUMA node number", e.line, e.attr("numaid"))
			return
		}
		for _, c := range e.children {
			d.walk(c, id, nil, nil)
		}
		return
	case "pci":
		for _, c := range e.children {
			next := bridges
			if !hasChild(e, "gpu") && !hasChild(e, "nic") {
				next = append(append([]string(nil), bridges...), strings.ToLower(e.attr("busid")))
			}
			d.walk(c, cpu, next, e)
		}
		return
	case "gpu":
		d.gpu(e, cpu, bridges, ownPCI)
		return
	case "nic":
		for _, c := range e.children {
			if c.name == "net" {
				d.nics = append(d.nics, ncclDevice{name: c.attr("name"), cpu: cpu, bridge: bridges, line: c.line})
			}
		}
		return
	}
	for _, c := range e.children {
		d.walk(c, cpu, bridges, ownPCI)
	}
}

// gpu reads a <gpu> element and its <nvlink> children, to GPUs or into an
// NVSwitch.
func (d *ncclDump) gpu(e *xmlElem, cpu int, bridges []string, ownPCI *xmlElem) {
	if ownPCI == nil {
		d.el.add("NCCL topology: line %d: <gpu> outside a <pci> element; its bus ID is unknown", e.line)
		return
	}
	dev, err := strconv.Atoi(e.attr("dev"))
	if err != nil || dev < 0 {
		d.el.add("NCCL topology: line %d: <gpu dev=%q>: want the GPU's index", e.line, e.attr("dev"))
		return
	}
	sm, _ := strconv.Atoi(e.attr("sm"))
	g := &ncclGPU{
		dev:   ncclDevice{name: fmt.Sprintf("GPU%d", dev), cpu: cpu, bridge: bridges, line: e.line},
		index: dev, sm: sm, busID: strings.ToLower(ownPCI.attr("busid")), gen: pcieGenOfSpeed(ownPCI.attr("link_speed")),
		links: map[string]int{}, linkAt: map[string]int{},
	}
	for _, l := range e.children {
		if l.name != "nvlink" {
			continue
		}
		count, err := strconv.Atoi(l.attr("count"))
		if err != nil || count < 1 || count > topology.MaxNVLinks {
			d.el.add("NCCL topology: line %d: <nvlink count=%q>: want 1..%d", l.line, l.attr("count"), topology.MaxNVLinks)
			continue
		}
		switch tc := strings.ToLower(l.attr("tclass")); {
		case strings.HasPrefix(tc, "0x0302"), strings.HasPrefix(tc, "0x0300"):
			t := strings.ToLower(l.attr("target"))
			g.links[t] += count
			g.linkAt[t] = l.line
		case tc == "0x068000":
			g.toSw += count
		default:
			d.el.add("NCCL topology: line %d: <nvlink tclass=%q>: neither a GPU (0x0302..) nor an NVSwitch (0x068000)", l.line, l.attr("tclass"))
		}
	}
	d.gpus = append(d.gpus, g)
}

// indexGPUs orders the GPUs by index, which must be 0..n-1 each once, and
// maps each bus ID, which must be unique, to its GPU.
func (d *ncclDump) indexGPUs() (map[string]int, error) {
	n := len(d.gpus)
	if n == 0 || n > topology.MaxGPUs {
		return nil, fmt.Errorf("NCCL topology: %d <gpu> elements; 1..%d are supported", n, topology.MaxGPUs)
	}
	sort.Slice(d.gpus, func(i, j int) bool { return d.gpus[i].index < d.gpus[j].index })
	byBus := map[string]int{}
	for i, g := range d.gpus {
		if g.index != i {
			return nil, fmt.Errorf("NCCL topology: line %d: <gpu dev=\"%d\">: GPU indices must be 0..%d, each once", g.dev.line, g.index, n-1)
		}
		if j, dup := byBus[g.busID]; dup {
			return nil, fmt.Errorf("NCCL topology: line %d: GPU %d has bus ID %s, as GPU %d", g.dev.line, i, g.busID, j)
		}
		byBus[g.busID] = i
	}
	return byBus, nil
}

// placeGPUs sets every GPU's NUMA node and bus ID.
func (d *ncclDump) placeGPUs(f *Fixture) {
	for i, g := range d.gpus {
		f.NUMANodes[i] = g.dev.cpu
		f.PCIBusIDs[i] = canonicalBusID(g.busID)
	}
}

// nvlinks reads the GPUs' direct NVLinks into f, each pair checked from
// both ends and listed by A then B, and checks that every GPU has as many
// NVLinks into NVSwitches as GPU 0.
func (d *ncclDump) nvlinks(byBus map[string]int, f *Fixture) {
	switchLinks := d.gpus[0].toSw
	for i, g := range d.gpus {
		if g.toSw != switchLinks {
			d.el.add("NCCL topology: line %d: GPU %d has %d NVLinks into NVSwitches, GPU 0 has %d; a machine file has one NVSwitch link count", g.dev.line, i, g.toSw, switchLinks)
		}
		for t, count := range g.links {
			j, ok := byBus[t]
			if !ok {
				d.el.add("NCCL topology: line %d: GPU %d's NVLink targets %s, which is no GPU of the dump", g.linkAt[t], i, t)
				continue
			}
			if back := d.gpus[j].links[g.busID]; back != count {
				if i > j && back != 0 {
					continue // reported from GPU j's side
				}
				d.el.add("NCCL topology: line %d: GPU %d has %d NVLinks to GPU %d but GPU %d (line %d) has %d back; the dump is asymmetric and is not imported", g.linkAt[t], i, count, j, j, d.gpus[j].dev.line, back)
				continue
			}
			if i < j {
				f.NVLinks = append(f.NVLinks, NVLinkPair{A: i, B: j, Links: count})
			}
		}
	}
	sort.Slice(f.NVLinks, func(a, b int) bool {
		if f.NVLinks[a].A != f.NVLinks[b].A {
			return f.NVLinks[a].A < f.NVLinks[b].A
		}
		return f.NVLinks[a].B < f.NVLinks[b].B
	})
}

// nvlinkKind settles f's NVLink: an NVSwitch fabric (the GPUs' NVLinks into
// NVSwitches), direct pairs, or none; NVLinks need a known generation.
func (d *ncclDump) nvlinkKind(f *Fixture) error {
	first := d.gpus[0]
	if first.toSw > 0 {
		if len(f.NVLinks) > 0 {
			return errors.New("NCCL topology: GPUs have both NVSwitch links and direct NVLinks; a machine file describes one or the other")
		}
		f.NVSwitchLinks = first.toSw
	}
	if (f.NVSwitchLinks > 0 || len(f.NVLinks) > 0) && f.NVLinkGen == 0 {
		return fmt.Errorf("NCCL topology: line %d: NVLinks, but sm %d gives no NVLink generation; pass --gpu (one of %s)", first.dev.line, first.sm, nvlinkKeys())
	}
	if f.NVSwitchLinks == 0 && len(f.NVLinks) == 0 {
		f.NVLinkGen, f.NVLinkGBps = 0, 0
	}
	return nil
}

// levels sets the PCIe level of every GPU pair and every NIC to each GPU
// from their places in the PCIe tree.
func (d *ncclDump) levels(f *Fixture) {
	n := len(d.gpus)
	f.PCIeLevels = make([][]v1alpha1.PCIeLevel, n)
	for a := range f.PCIeLevels {
		f.PCIeLevels[a] = make([]v1alpha1.PCIeLevel, n)
		for b := range f.PCIeLevels[a] {
			if a != b {
				f.PCIeLevels[a][b] = ncclLevel(d.gpus[a].dev, d.gpus[b].dev)
			}
		}
	}
	for _, nic := range d.nics {
		out := NIC{Name: nic.name, PCIe: make([]v1alpha1.PCIeLevel, n)}
		for i, g := range d.gpus {
			out.PCIe[i] = ncclLevel(g.dev, nic)
		}
		f.NICs = append(f.NICs, out)
	}
}

func hasChild(e *xmlElem, name string) bool {
	for _, c := range e.children {
		if c.name == name {
			return true
		}
	}
	return false
}

// canonicalBusID writes a bus ID as NVML does: an 8-digit domain, upper
// case ("0000:07:00.0" → "00000000:07:00.0").
func canonicalBusID(id string) string {
	id = strings.ToUpper(id)
	if dom, rest, ok := strings.Cut(id, ":"); ok && len(dom) < 8 {
		return strings.Repeat("0", 8-len(dom)) + dom + ":" + rest
	}
	return id
}
