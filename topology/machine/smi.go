package machine

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// SMIOptions are what ImportSMI needs besides the matrix.
type SMIOptions struct {
	// Name is the machine's name (a DNS label; nodes are <name>-<i>).
	Name string
	// GPU is a GPUKind key (v100, a100, h100, ...): the NVLink generation,
	// memory and PCIe generation. May be empty when List is given, or when
	// the machine has no NVLink.
	GPU string
	// List is `nvidia-smi -L` output: the product name of every GPU.
	List string
	// PCIMatrix is `nvidia-smi topo -mp` output (PCIe levels only, also
	// between NVLinked GPUs, which -m prints as NV#); optional.
	PCIMatrix string
	// Source is recorded in the machine's source field.
	Source string
}

// maxImportErrors bounds the errors one import reports: a wrong file can
// have hundreds of bad cells.
const maxImportErrors = 20

// errList collects an import's problems, each naming its line, up to
// maxImportErrors (the rest are counted).
type errList struct {
	errs []error
	more int
}

func (e *errList) add(format string, a ...any) {
	if len(e.errs) >= maxImportErrors {
		e.more++
		return
	}
	e.errs = append(e.errs, fmt.Errorf(format, a...))
}

func (e *errList) err() error {
	if e.more > 0 {
		e.errs = append(e.errs, fmt.Errorf("and %d more problems", e.more))
	}
	return errors.Join(e.errs...)
}

// ImportSMI builds a machine from `nvidia-smi topo -m` text: GPU pairs
// (NV# or a PCIe level), NICs with their PCIe distance to each GPU, and the
// NUMA node of every GPU. Malformed or asymmetric matrices, unknown tokens
// and GPU counts that disagree are errors naming the line and the cell;
// nothing is silently fixed. See docs/topology.md, "Importing nvidia-smi
// topo -m", for what is inferred.
func ImportSMI(text string, o SMIOptions) (Fixture, error) {
	if errs := validateName(o.Name, field.NewPath("name")); len(errs) > 0 {
		return Fixture{}, fmt.Errorf("machine name %q: %s", o.Name, errs.ToAggregate().Error())
	}
	m, err := parseSMI(text, "nvidia-smi topo -m")
	if err != nil {
		return Fixture{}, err
	}
	n := m.gpus
	var notes []string

	kind, model, err := importKind(o, n)
	if err != nil {
		return Fixture{}, err
	}
	f := Fixture{
		Name: o.Name, Model: model, GPUs: n, MemoryMiB: kind.MemoryMiB, PCIeGen: kind.PCIeGen,
		NVLinkGen: kind.NVLinkGen, NVLinkGBps: nvlinkGBpsPerLink[kind.NVLinkGen], Source: o.Source,
	}
	if notes, err = importNVLinks(m, kind, &f, notes); err != nil {
		return Fixture{}, err
	}
	f.NUMANodes, notes = importNUMA(m, notes)
	f.NICs = importNICs(m)
	if notes, err = importLevels(m, o.PCIMatrix, &f, notes); err != nil {
		return Fixture{}, err
	}
	f.Notes = notes
	f.Description = describeImport(f)
	if err := f.Validate(); err != nil {
		return Fixture{}, fmt.Errorf("nvidia-smi topo -m: %w", err)
	}
	return f, nil
}

// importNVLinks reads the NV# cells into f's NVLink pairs. A machine whose
// every pair shows the same NV# with more links than a GPU of its
// generation has is an NVSwitch machine, noted as such; NV# cells without
// a known NVLink generation are an error.
func importNVLinks(m *smiMatrix, kind GPUKind, f *Fixture, notes []string) ([]string, error) {
	n := m.gpus
	firstNV := ""
	allNV, k := n > 1, -1
	for a := 0; a < n; a++ {
		for b := a + 1; b < n; b++ {
			c := m.rows[a][b]
			if c.nvlinks == 0 {
				allNV = false
				continue
			}
			if firstNV == "" {
				firstNV = m.cellName(a, b) + " (" + c.tok + ")"
			}
			if k == -1 {
				k = c.nvlinks
			} else if k != c.nvlinks {
				allNV = false
			}
			f.NVLinks = append(f.NVLinks, NVLinkPair{A: a, B: b, Links: c.nvlinks})
		}
	}
	if firstNV != "" && kind.NVLinkGen == 0 {
		return notes, fmt.Errorf("nvidia-smi topo -m: %s: the NVLink generation is needed for the bandwidth of a link and topo -m does not print it; pass --gpu (one of %s) or `nvidia-smi -L` output",
			firstNV, nvlinkKeys())
	}
	if firstNV == "" {
		f.NVLinkGen, f.NVLinkGBps = 0, 0
	}
	if allNV && k*(n-1) > maxNVLinksPerGPU[kind.NVLinkGen] {
		f.NVSwitchLinks, f.NVLinks = k, nil
		notes = append(notes, fmt.Sprintf("every pair shows NV%d and %d GPUs × %d links exceed the %d NVLinks a GPU of NVLink generation %d has, so the links go through an NVSwitch", k, n-1, k, maxNVLinksPerGPU[kind.NVLinkGen], kind.NVLinkGen))
	}
	return notes, nil
}

// importNICs reads the NIC columns, named by the NIC legend when it has
// them, with their level to each GPU.
func importNICs(m *smiMatrix) []NIC {
	n := m.gpus
	var out []NIC
	for c := n; c < len(m.cols); c++ {
		name := m.cols[c]
		if real, ok := m.legend[name]; ok {
			name = real
		}
		nic := NIC{Name: name, PCIe: make([]v1alpha1.PCIeLevel, n)}
		for g := 0; g < n; g++ {
			nic.PCIe[g] = m.rows[g][c].level
		}
		out = append(out, nic)
	}
	return out
}

// importLevels fills f's PCIe level of every pair. NVLinked pairs print
// NV# instead, so theirs come from pciText, `nvidia-smi topo -mp` output,
// when given, and are otherwise inferred (inferLevels, noted); f's NUMA
// nodes must be read first.
func importLevels(m *smiMatrix, pciText string, f *Fixture, notes []string) ([]string, error) {
	n := m.gpus
	var pci *smiMatrix
	if strings.TrimSpace(pciText) != "" {
		var err error
		if pci, err = parseSMI(pciText, "nvidia-smi topo -mp"); err != nil {
			return notes, err
		}
		if pci.gpus != n {
			return notes, fmt.Errorf("nvidia-smi topo -mp: line %d names %d GPUs; topo -m (line %d) names %d", pci.headerLine, pci.gpus, m.headerLine, n)
		}
	}
	f.PCIeLevels = make([][]v1alpha1.PCIeLevel, n)
	for a := range f.PCIeLevels {
		f.PCIeLevels[a] = make([]v1alpha1.PCIeLevel, n)
	}
	unknown := 0
	for a := 0; a < n; a++ {
		for b := 0; b < n; b++ {
			if a == b {
				continue
			}
			c := m.rows[a][b]
			switch {
			case c.nvlinks == 0:
				f.PCIeLevels[a][b] = c.level
			case pci != nil:
				pc := pci.rows[a][b]
				if pc.nvlinks > 0 {
					return notes, fmt.Errorf("nvidia-smi topo -mp: %s: %s; the PCIe-only matrix has no NV# cells", pci.cellName(a, b), pc.tok)
				}
				f.PCIeLevels[a][b] = pc.level
			default:
				unknown++
			}
		}
	}
	if unknown > 0 {
		inferred := inferLevels(m, f.NUMANodes, f.PCIeLevels)
		notes = append(notes, fmt.Sprintf("topo -m prints NV# instead of the PCIe level for NVLinked pairs; %d pairs' levels were inferred (%s); import `nvidia-smi topo -mp` too (--smi-pci) for the printed levels", unknown/2, inferred))
	}
	return notes, nil
}

// importKind resolves the GPU product from --gpu and `nvidia-smi -L`.
func importKind(o SMIOptions, n int) (GPUKind, string, error) {
	var kind GPUKind
	if o.GPU != "" {
		k, err := GPUKindByKey(o.GPU)
		if err != nil {
			return GPUKind{}, "", err
		}
		kind = k
	}
	model := kind.Model
	if strings.TrimSpace(o.List) != "" {
		names, err := parseSMIList(o.List)
		if err != nil {
			return GPUKind{}, "", err
		}
		if len(names) != n {
			return GPUKind{}, "", fmt.Errorf("nvidia-smi -L: lists %d GPUs; topo -m names %d", len(names), n)
		}
		for i, nm := range names[1:] {
			if nm != names[0] {
				return GPUKind{}, "", fmt.Errorf("nvidia-smi -L: GPU %d is %q but GPU 0 is %q; a machine file describes one GPU model", i+1, nm, names[0])
			}
		}
		model = names[0]
		if o.GPU == "" {
			k, ok := GPUKindOfName(model)
			if !ok {
				return GPUKind{}, "", fmt.Errorf("nvidia-smi -L: %q is not a GPU the importer knows; pass --gpu (one of %s)", model, nvlinkKeys())
			}
			kind = k
		}
	}
	if model == "" {
		model = "unknown"
	}
	if mm := memoryRe.FindStringSubmatch(model); mm != nil && strings.TrimSpace(o.List) != "" {
		// The product name's own figure ("A100 80GB PCIe") beats the
		// kind's default.
		gb, _ := strconv.Atoi(mm[1])
		kind.MemoryMiB = int64(gb) * 1024
	}
	return kind, model, nil
}

var memoryRe = regexp.MustCompile(`(?i)\b(\d{1,3})\s?GB\b`)

var listRe = regexp.MustCompile(`^GPU (\d+): (.+?)(?: \(UUID: [^)]*\))?\s*$`)

// parseSMIList reads `nvidia-smi -L`: "GPU 0: NVIDIA A100-SXM4-40GB (UUID:
// GPU-...)" per GPU; MIG lines are skipped.
func parseSMIList(text string) ([]string, error) {
	var names []string
	for i, line := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n") {
		mm := listRe.FindStringSubmatch(strings.TrimSpace(line))
		if mm == nil {
			continue
		}
		idx, _ := strconv.Atoi(mm[1])
		if idx != len(names) {
			return nil, fmt.Errorf("nvidia-smi -L: line %d: GPU %s; want GPU %d (GPUs in order)", i+1, mm[1], len(names))
		}
		names = append(names, mm[2])
	}
	if len(names) == 0 {
		return nil, errors.New("nvidia-smi -L: no \"GPU <i>: <name>\" lines")
	}
	return names, nil
}

var numaNodeRe = regexp.MustCompile(`^(\d+)(?:-(\d+))?$`)

// importNUMA reads each GPU's NUMA node: "GPU NUMA ID", else "NUMA
// Affinity" (the first node of a range), else numbered by CPU affinity.
func importNUMA(m *smiMatrix, notes []string) ([]int, []string) {
	n := m.gpus
	out := make([]int, n)
	ranged := false
	for i := range out {
		out[i] = -1
		for _, v := range []string{m.gpuNUMA[i], m.numaAff[i]} {
			mm := numaNodeRe.FindStringSubmatch(v)
			if mm == nil {
				continue
			}
			out[i], _ = strconv.Atoi(mm[1])
			ranged = ranged || mm[2] != ""
			break
		}
	}
	if ranged {
		notes = append(notes, "some GPUs print a range of NUMA nodes in NUMA Affinity; the first node of the range is taken")
	}
	known := slices.ContainsFunc(out, func(v int) bool { return v >= 0 })
	if !known && m.hasCPU {
		ids := map[string]int{}
		for i, aff := range m.cpuAff {
			if aff == "" {
				continue
			}
			if _, ok := ids[aff]; !ok {
				ids[aff] = len(ids)
			}
			out[i] = ids[aff]
		}
		notes = append(notes, "no NUMA column: GPUs with the same CPU affinity share a NUMA node, numbered in order of appearance")
	}
	return out, notes
}

// inferLevels fills the unknown GPU pairs of levels (NVLinked pairs) and
// says how. In a PCIe tree the common ancestor of a and b is no farther
// than the farther of the common ancestors of a and c, and of c and b, for
// any device c (GPU or NIC); the tightest such bound over every chain of
// printed levels is taken, capped by NODE for GPUs on one NUMA node. What
// remains unknown is NODE on one NUMA node and SYS otherwise.
func inferLevels(m *smiMatrix, numa []int, levels [][]v1alpha1.PCIeLevel) string {
	n := m.gpus
	d := len(m.cols)
	const inf = int8(100)
	dist := make([][]int8, d)
	for a := range dist {
		dist[a] = make([]int8, d)
		for b := range dist[a] {
			dist[a][b] = inf
		}
		dist[a][a] = 0
	}
	for a, row := range m.rows {
		for b, c := range row {
			if a == b || c.nvlinks > 0 || c.tok == "" {
				continue
			}
			r := rankOf(c.level)
			dist[a][b], dist[b][a] = min(dist[a][b], r), min(dist[b][a], r)
		}
	}
	for c := 0; c < d; c++ {
		for a := 0; a < d; a++ {
			for b := 0; b < d; b++ {
				if via := max(dist[a][c], dist[c][b]); via < dist[a][b] {
					dist[a][b] = via
				}
			}
		}
	}
	byChain, byNUMA := 0, 0
	for a := 0; a < n; a++ {
		for b := 0; b < n; b++ {
			if a == b || m.rows[a][b].nvlinks == 0 || levels[a][b] != "" {
				continue
			}
			r := dist[a][b]
			sameNUMA := numa[a] >= 0 && numa[a] == numa[b]
			if sameNUMA && r > rankOf(v1alpha1.PCIeSameNUMA) {
				r = rankOf(v1alpha1.PCIeSameNUMA)
			}
			if r >= inf {
				r = rankOf(v1alpha1.PCIeCrossSocket)
			}
			if r == dist[a][b] {
				byChain++
			} else {
				byNUMA++
			}
			levels[a][b] = pcieLevelOfRank(r)
		}
	}
	return fmt.Sprintf("%d from chains of printed levels through other GPUs and NICs, an upper bound; %d from NUMA nodes", byChain/2, byNUMA/2)
}

// rankOf is the PCIe level's rank (topology.PCIeRank), 0 for an unknown
// level.
func rankOf(l v1alpha1.PCIeLevel) int8 {
	r, _ := topology.PCIeRank(l)
	return int8(r)
}

// pcieLevelOfRank is the PCIe level of rank r, CrossSocket for none.
func pcieLevelOfRank(r int8) v1alpha1.PCIeLevel {
	for _, l := range smiLevels {
		if rankOf(l) == r {
			return l
		}
	}
	return v1alpha1.PCIeCrossSocket
}

func describeImport(f Fixture) string {
	link := "no NVLink"
	switch {
	case f.NVSwitchLinks > 0:
		link = fmt.Sprintf("NVSwitch, %d NVLink%d each (%d GB/s any pair)", f.NVSwitchLinks, f.NVLinkGen, f.NVSwitchLinks*f.NVLinkGBps)
	case len(f.NVLinks) > 0:
		link = fmt.Sprintf("%d directly NVLinked pairs (NVLink%d)", len(f.NVLinks), f.NVLinkGen)
	}
	numa := map[int]bool{}
	for _, v := range f.NUMANodes {
		numa[v] = true
	}
	nodes := make([]int, 0, len(numa))
	for v := range numa {
		nodes = append(nodes, v)
	}
	sort.Ints(nodes)
	return fmt.Sprintf("%d× %s, %s, GPUs on NUMA nodes %v, %d NIC(s); imported from nvidia-smi topo -m", f.GPUs, f.Model, link, nodes, len(f.NICs))
}
