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

// GPUKind is what the importer knows of a GPU product that
// `nvidia-smi topo -m` does not print: its NVLink generation (and so the
// bandwidth of one link), memory and PCIe generation.
type GPUKind struct {
	// Key is the --gpu value and the text matched in a product name.
	Key       string
	Model     string
	NVLinkGen int
	MemoryMiB int64
	PCIeGen   int
}

// gpuKinds is ordered so that the first key found in a product name is the
// right one ("a100" before "a10", "h100" before "h10").
var gpuKinds = []GPUKind{
	{"gb200", "NVIDIA GB200", 5, 189471, 5},
	{"b200", "NVIDIA B200", 5, 183359, 5},
	{"h200", "NVIDIA H200", 4, 143771, 5},
	{"h100", "NVIDIA H100 80GB HBM3", 4, 81559, 5},
	{"h800", "NVIDIA H800", 4, 81559, 5},
	{"h20", "NVIDIA H20", 4, 97871, 5},
	{"a100", "NVIDIA A100-SXM4-40GB", 3, 40960, 4},
	{"a800", "NVIDIA A800-SXM4-80GB", 3, 81920, 4},
	{"a30", "NVIDIA A30", 3, 24576, 4},
	{"a40", "NVIDIA A40", 3, 46068, 4},
	{"a6000", "NVIDIA RTX A6000", 3, 49140, 4},
	{"3090", "NVIDIA GeForce RTX 3090", 3, 24576, 4},
	{"v100", "Tesla V100-SXM2-16GB", 2, 16384, 3},
	{"p100", "Tesla P100-SXM2-16GB", 1, 16384, 3},
	{"l40s", "NVIDIA L40S", 0, 46068, 4},
	{"l40", "NVIDIA L40", 0, 46068, 4},
	{"a10", "NVIDIA A10", 0, 23028, 4},
	{"l4", "NVIDIA L4", 0, 23034, 4},
	{"t4", "Tesla T4", 0, 15360, 3},
	{"k80", "Tesla K80", 0, 11441, 3},
	{"4090", "NVIDIA GeForce RTX 4090", 0, 24564, 4},
	{"5090", "NVIDIA GeForce RTX 5090", 0, 32607, 5},
}

// GPUKinds lists the --gpu values the importer knows, in match order.
func GPUKinds() []GPUKind { return append([]GPUKind(nil), gpuKinds...) }

// GPUKindByKey finds a kind by its --gpu key (case-insensitive).
func GPUKindByKey(key string) (GPUKind, error) {
	var keys []string
	for _, k := range gpuKinds {
		if strings.EqualFold(k.Key, strings.TrimSpace(key)) {
			return k, nil
		}
		keys = append(keys, k.Key)
	}
	return GPUKind{}, fmt.Errorf("gpu %q: unknown; known GPUs are %s", key, strings.Join(keys, ", "))
}

// GPUKindOfName finds the kind of an NVML product name such as
// "NVIDIA A100-SXM4-80GB"; false when none matches.
func GPUKindOfName(name string) (GPUKind, bool) {
	l := strings.ToLower(name)
	for _, k := range gpuKinds {
		if strings.Contains(l, k.Key) {
			return k, true
		}
	}
	return GPUKind{}, false
}

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

var (
	gpuColRe   = regexp.MustCompile(`^GPU(\d+)$`)
	nvRe       = regexp.MustCompile(`^NV(\d+)$`)
	legendRe   = regexp.MustCompile(`^\s*(NIC\d+):\s*(\S+)\s*$`)
	numaNodeRe = regexp.MustCompile(`^(\d+)(?:-(\d+))?$`)
)

// smiCell is one parsed cell of the matrix.
type smiCell struct {
	tok     string
	nvlinks int // NV#
	level   v1alpha1.PCIeLevel
	line    int
}

// smiMatrix is a parsed `nvidia-smi topo -m` (or -mp) text.
type smiMatrix struct {
	headerLine int
	cols       []string // device names as printed
	gpus       int      // the first gpus columns are GPU0..GPUn-1
	rows       map[int][]smiCell
	rowLine    map[int]int
	cpuAff     []string
	numaAff    []string
	gpuNUMA    []string
	hasNUMA    bool
	hasGPUNUMA bool
	hasCPU     bool
	legend     map[string]string
}

func (m *smiMatrix) cellName(row, col int) string {
	return fmt.Sprintf("line %d, row %s, column %s", m.rowLine[row], m.cols[row], m.cols[col])
}

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

// parseSMI reads the matrix: header, one row per device, the NIC legend.
// Lines before the header (a shell prompt, "GPU Topology:") and after the
// rows (the legend) are skipped.
func parseSMI(text, what string) (*smiMatrix, error) {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	m := &smiMatrix{rows: map[int][]smiCell{}, rowLine: map[int]int{}, legend: map[string]string{}}
	var el errList
	type info int
	const (
		infoCPU info = iota
		infoNUMA
		infoGPUNUMA
	)
	var infos []info
	h := -1
	for i, line := range lines {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "GPU0" && (len(f) == 1 || f[1] != "X") {
			h = i
			break
		}
	}
	if h < 0 {
		return nil, fmt.Errorf("%s: no matrix header found (a line starting with GPU0 followed by the other device names, as `nvidia-smi topo -m` prints it)", what)
	}
	m.headerLine = h + 1
	hf := strings.Fields(lines[h])
	for i := 0; i < len(hf); i++ {
		next := func(words ...string) bool {
			if i+len(words) > len(hf) {
				return false
			}
			for k, w := range words {
				if hf[i+k] != w {
					return false
				}
			}
			return true
		}
		switch {
		case next("CPU", "Affinity"):
			infos, i = append(infos, infoCPU), i+1
		case next("NUMA", "Affinity"):
			infos, i = append(infos, infoNUMA), i+1
		case next("GPU", "NUMA", "ID"):
			infos, i = append(infos, infoGPUNUMA), i+2
		case len(infos) > 0:
			el.add("%s: line %d, header column %q after the affinity columns: not a column nvidia-smi prints", what, h+1, hf[i])
		default:
			if mm := gpuColRe.FindStringSubmatch(hf[i]); mm != nil {
				if idx, _ := strconv.Atoi(mm[1]); idx != m.gpus || len(m.cols) != m.gpus {
					el.add("%s: line %d, header column %q: GPU columns must come first and in order; want GPU%d", what, h+1, hf[i], len(m.cols))
				}
				m.gpus++
			}
			if slices.Contains(m.cols, hf[i]) {
				el.add("%s: line %d, header column %q appears twice", what, h+1, hf[i])
			}
			m.cols = append(m.cols, hf[i])
		}
	}
	if err := el.err(); err != nil {
		return nil, err
	}
	if m.gpus < 1 || m.gpus > topology.MaxGPUs {
		return nil, fmt.Errorf("%s: line %d: the header names %d GPUs; 1..%d are supported", what, h+1, m.gpus, topology.MaxGPUs)
	}
	n := m.gpus
	m.cpuAff, m.numaAff, m.gpuNUMA = make([]string, n), make([]string, n), make([]string, n)
	for _, in := range infos {
		switch in {
		case infoCPU:
			m.hasCPU = true
		case infoNUMA:
			m.hasNUMA = true
		case infoGPUNUMA:
			m.hasGPUNUMA = true
		}
	}
	colOf := map[string]int{}
	for i, c := range m.cols {
		colOf[c] = i
	}
	inRows := true
	for i := h + 1; i < len(lines); i++ {
		line := lines[i]
		if mm := legendRe.FindStringSubmatch(line); mm != nil {
			m.legend[mm[1]] = mm[2]
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if strings.HasPrefix(f[0], "Legend") {
			inRows = false
			continue
		}
		if !inRows {
			continue
		}
		r, ok := colOf[f[0]]
		if !ok {
			if gpuColRe.MatchString(f[0]) {
				el.add("%s: line %d: row %s has no column in the header (line %d names GPU0..GPU%d); the GPU counts of rows and columns disagree", what, i+1, f[0], h+1, n-1)
			}
			continue
		}
		if _, dup := m.rows[r]; dup {
			el.add("%s: line %d: row %s again (first on line %d)", what, i+1, f[0], m.rowLine[r])
			continue
		}
		m.rowLine[r] = i + 1
		cells := f[1:]
		if len(cells) < len(m.cols) {
			el.add("%s: line %d: row %s has %d cells; the header (line %d) names %d devices", what, i+1, f[0], len(cells), h+1, len(m.cols))
			continue
		}
		extra := cells[len(m.cols):]
		cells = cells[:len(m.cols)]
		if r < n {
			if len(extra) > len(infos) {
				el.add("%s: line %d: row %s has %d cells after the %d devices; the header names %d affinity columns", what, i+1, f[0], len(extra), len(m.cols), len(infos))
			}
			for k, v := range extra {
				if k >= len(infos) {
					break
				}
				switch infos[k] {
				case infoCPU:
					m.cpuAff[r] = v
				case infoNUMA:
					m.numaAff[r] = v
				case infoGPUNUMA:
					m.gpuNUMA[r] = v
				}
			}
		}
		row := make([]smiCell, len(m.cols))
		for c, tok := range cells {
			cell := smiCell{tok: tok, line: i + 1}
			where := fmt.Sprintf("%s: line %d, row %s, column %s", what, i+1, f[0], m.cols[c])
			switch {
			case c == r:
				if tok != "X" {
					el.add("%s: %q on the diagonal; a device's cell with itself is X", where, tok)
				}
			case tok == "X":
				el.add("%s: X off the diagonal; X marks a device with itself", where)
			default:
				if mm := nvRe.FindStringSubmatch(tok); mm != nil {
					k, _ := strconv.Atoi(mm[1])
					if k < 1 || k > topology.MaxNVLinks {
						el.add("%s: %s; an NVLink bond has 1..%d links", where, tok, topology.MaxNVLinks)
					}
					if r >= n || c >= n {
						el.add("%s: %s between a GPU and a NIC; NVLink joins GPUs", where, tok)
					}
					cell.nvlinks = k
					break
				}
				l, ok := smiLevels[tok]
				if !ok || tok == "INT" {
					el.add("%s: unknown token %q; the legend has X, NV#, PIX, PXB, PHB, NODE, SYS (SOC on old drivers)", where, tok)
				}
				cell.level = l
			}
			row[c] = cell
		}
		m.rows[r] = row
	}
	var missing []string
	for r := 0; r < n; r++ {
		if _, ok := m.rows[r]; !ok {
			missing = append(missing, m.cols[r])
		}
	}
	if len(missing) > 0 {
		el.add("%s: the header (line %d) names %d GPUs but rows are missing for %s; the GPU counts of rows and columns disagree", what, h+1, n, strings.Join(missing, ", "))
	}
	if err := el.err(); err != nil {
		return nil, err
	}
	// Symmetry: every pair is printed twice; both must agree. Rows of NICs
	// are optional (they repeat the GPU rows), but when present they must
	// agree too.
	for a := range m.cols {
		for b := a + 1; b < len(m.cols); b++ {
			ra, okA := m.rows[a]
			rb, okB := m.rows[b]
			if !okA || !okB || (a >= n && b >= n) {
				continue
			}
			if ra[b].tok != rb[a].tok {
				el.add("%s: %s says %s but %s says %s; the matrix is asymmetric and is not imported (check which is right)",
					what, m.cellName(a, b), ra[b].tok, m.cellName(b, a), rb[a].tok)
			}
		}
	}
	if err := el.err(); err != nil {
		return nil, err
	}
	return m, nil
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

	// NVLink.
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
		return Fixture{}, fmt.Errorf("nvidia-smi topo -m: %s: the NVLink generation is needed for the bandwidth of a link and topo -m does not print it; pass --gpu (one of %s) or `nvidia-smi -L` output",
			firstNV, nvlinkKeys())
	}
	if firstNV == "" {
		f.NVLinkGen, f.NVLinkGBps = 0, 0
	}
	if allNV && k*(n-1) > maxNVLinksPerGPU[kind.NVLinkGen] {
		f.NVSwitchLinks, f.NVLinks = k, nil
		notes = append(notes, fmt.Sprintf("every pair shows NV%d and %d GPUs × %d links exceed the %d NVLinks a GPU of NVLink generation %d has, so the links go through an NVSwitch", k, n-1, k, maxNVLinksPerGPU[kind.NVLinkGen], kind.NVLinkGen))
	}

	// NUMA node of every GPU.
	f.NUMANodes, notes = importNUMA(m, notes)

	// NICs.
	for c := n; c < len(m.cols); c++ {
		name := m.cols[c]
		if real, ok := m.legend[name]; ok {
			name = real
		}
		nic := NIC{Name: name, PCIe: make([]v1alpha1.PCIeLevel, n)}
		for g := 0; g < n; g++ {
			nic.PCIe[g] = m.rows[g][c].level
		}
		f.NICs = append(f.NICs, nic)
	}

	// PCIe levels; NVLinked pairs print NV# instead, so theirs come from
	// `nvidia-smi topo -mp` when given, else are inferred.
	var pci *smiMatrix
	if strings.TrimSpace(o.PCIMatrix) != "" {
		if pci, err = parseSMI(o.PCIMatrix, "nvidia-smi topo -mp"); err != nil {
			return Fixture{}, err
		}
		if pci.gpus != n {
			return Fixture{}, fmt.Errorf("nvidia-smi topo -mp: line %d names %d GPUs; topo -m (line %d) names %d", pci.headerLine, pci.gpus, m.headerLine, n)
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
					return Fixture{}, fmt.Errorf("nvidia-smi topo -mp: %s: %s; the PCIe-only matrix has no NV# cells", pci.cellName(a, b), pc.tok)
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
	f.Notes = notes
	f.Description = describeImport(f)
	if err := f.Validate(); err != nil {
		return Fixture{}, fmt.Errorf("nvidia-smi topo -m: %w", err)
	}
	return f, nil
}

func nvlinkKeys() string {
	var keys []string
	for _, k := range gpuKinds {
		if k.NVLinkGen > 0 {
			keys = append(keys, k.Key)
		}
	}
	return strings.Join(keys, ", ")
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

// RenderSMI prints the machine as `nvidia-smi topo -m` would: the GPU and
// NIC matrix with NV# for NVLinked pairs (with pciOnly, the PCIe level
// instead, as `nvidia-smi topo -mp` prints it), the NUMA node of every GPU
// and the legends. ImportSMI reads it back. NIC rows are left out: they
// repeat the GPU rows, and the PCIe level between two NICs is not known.
func RenderSMI(f Fixture, pciOnly bool) string {
	var b strings.Builder
	cell := func(s string) { fmt.Fprintf(&b, "%-8s", s) }
	b.WriteString("        ")
	for i := 0; i < f.GPUs; i++ {
		cell(fmt.Sprintf("GPU%d", i))
	}
	for i := range f.NICs {
		cell(fmt.Sprintf("NIC%d", i))
	}
	b.WriteString("CPU Affinity    NUMA Affinity   GPU NUMA ID\n")
	for a := 0; a < f.GPUs; a++ {
		cell(fmt.Sprintf("GPU%d", a))
		for c := 0; c < f.GPUs; c++ {
			switch l := f.Link(min(a, c), max(a, c)); {
			case a == c:
				cell(" X")
			case l.NVLinks > 0 && !pciOnly:
				cell(fmt.Sprintf("NV%d", l.NVLinks))
			default:
				cell(smiToken(l.PCIe))
			}
		}
		for _, nic := range f.NICs {
			cell(smiToken(nic.PCIe[a]))
		}
		numa := "N/A"
		if v := f.NUMANode(a); v >= 0 {
			numa = strconv.Itoa(v)
		}
		fmt.Fprintf(&b, "%-16s%-16sN/A\n", "N/A", numa)
	}
	b.WriteString(`
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
`)
	if len(f.NICs) > 0 {
		b.WriteString("\nNIC Legend:\n\n")
		for i, nic := range f.NICs {
			fmt.Fprintf(&b, "  NIC%d: %s\n", i, nic.Name)
		}
	}
	return b.String()
}
