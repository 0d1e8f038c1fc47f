package machine

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// The parser of `nvidia-smi topo -m` (and -mp) text, which ImportSMI
// builds a machine from.

// gpuColRe, nvRe and legendRe match a GPU column, an NV# cell and a line
// of the NIC legend.
var (
	gpuColRe = regexp.MustCompile(`^GPU(\d+)$`)
	nvRe     = regexp.MustCompile(`^NV(\d+)$`)
	legendRe = regexp.MustCompile(`^\s*(NIC\d+):\s*(\S+)\s*$`)
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

// parseSMI reads the matrix: header, one row per device, the NIC legend.
// Lines before the header (a shell prompt, "GPU Topology:") and after the
// rows (the legend) are skipped.
func parseSMI(text, what string) (*smiMatrix, error) {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	h := smiHeaderLine(lines)
	if h < 0 {
		return nil, fmt.Errorf("%s: no matrix header found (a line starting with GPU0 followed by the other device names, as `nvidia-smi topo -m` prints it)", what)
	}
	m := &smiMatrix{headerLine: h + 1, rows: map[int][]smiCell{}, rowLine: map[int]int{}, legend: map[string]string{}}
	p := &smiParser{m: m, what: what}
	p.header(strings.Fields(lines[h]))
	if err := p.el.err(); err != nil {
		return nil, err
	}
	if m.gpus < 1 || m.gpus > topology.MaxGPUs {
		return nil, fmt.Errorf("%s: line %d: the header names %d GPUs; 1..%d are supported", what, h+1, m.gpus, topology.MaxGPUs)
	}
	p.rows(lines, h+1)
	p.missingRows()
	if err := p.el.err(); err != nil {
		return nil, err
	}
	p.symmetry()
	if err := p.el.err(); err != nil {
		return nil, err
	}
	return m, nil
}

// smiHeaderLine is the index of the matrix's header line, -1 for none: the
// first line starting with GPU0 that is not GPU0's row.
func smiHeaderLine(lines []string) int {
	for i, line := range lines {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "GPU0" && (len(f) == 1 || f[1] != "X") {
			return i
		}
	}
	return -1
}

// smiInfo is an affinity column that follows the devices.
type smiInfo int

const (
	infoCPU smiInfo = iota
	infoNUMA
	infoGPUNUMA
)

// smiParser reads one text into m, collecting its problems in el.
type smiParser struct {
	m     *smiMatrix
	what  string    // the input, as errors name it
	infos []smiInfo // the affinity columns, in order
	el    errList
}

// header reads the header's device names, GPUs first and in order, then
// its affinity columns, and sizes the affinity of every GPU.
func (p *smiParser) header(hf []string) {
	m, line := p.m, p.m.headerLine
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
			p.infos, i = append(p.infos, infoCPU), i+1
		case next("NUMA", "Affinity"):
			p.infos, i = append(p.infos, infoNUMA), i+1
		case next("GPU", "NUMA", "ID"):
			p.infos, i = append(p.infos, infoGPUNUMA), i+2
		case len(p.infos) > 0:
			p.el.add("%s: line %d, header column %q after the affinity columns: not a column nvidia-smi prints", p.what, line, hf[i])
		default:
			if mm := gpuColRe.FindStringSubmatch(hf[i]); mm != nil {
				if idx, _ := strconv.Atoi(mm[1]); idx != m.gpus || len(m.cols) != m.gpus {
					p.el.add("%s: line %d, header column %q: GPU columns must come first and in order; want GPU%d", p.what, line, hf[i], len(m.cols))
				}
				m.gpus++
			}
			if slices.Contains(m.cols, hf[i]) {
				p.el.add("%s: line %d, header column %q appears twice", p.what, line, hf[i])
			}
			m.cols = append(m.cols, hf[i])
		}
	}
	n := m.gpus
	m.cpuAff, m.numaAff, m.gpuNUMA = make([]string, n), make([]string, n), make([]string, n)
	for _, in := range p.infos {
		switch in {
		case infoCPU:
			m.hasCPU = true
		case infoNUMA:
			m.hasNUMA = true
		case infoGPUNUMA:
			m.hasGPUNUMA = true
		}
	}
}

// rows reads the lines from index from on: the device rows, until a
// Legend line, and the NIC legend wherever it stands.
func (p *smiParser) rows(lines []string, from int) {
	m := p.m
	colOf := map[string]int{}
	for i, c := range m.cols {
		colOf[c] = i
	}
	inRows := true
	for i := from; i < len(lines); i++ {
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
				p.el.add("%s: line %d: row %s has no column in the header (line %d names GPU0..GPU%d); the GPU counts of rows and columns disagree", p.what, i+1, f[0], m.headerLine, m.gpus-1)
			}
			continue
		}
		if _, dup := m.rows[r]; dup {
			p.el.add("%s: line %d: row %s again (first on line %d)", p.what, i+1, f[0], m.rowLine[r])
			continue
		}
		m.rowLine[r] = i + 1
		p.row(r, f, i+1)
	}
}

// row reads device r's row f (its name, then its cells) on line line: a
// cell per device, then, for a GPU, its affinity columns.
func (p *smiParser) row(r int, f []string, line int) {
	m := p.m
	cells := f[1:]
	if len(cells) < len(m.cols) {
		p.el.add("%s: line %d: row %s has %d cells; the header (line %d) names %d devices", p.what, line, f[0], len(cells), m.headerLine, len(m.cols))
		return
	}
	extra := cells[len(m.cols):]
	cells = cells[:len(m.cols)]
	if r < m.gpus {
		if len(extra) > len(p.infos) {
			p.el.add("%s: line %d: row %s has %d cells after the %d devices; the header names %d affinity columns", p.what, line, f[0], len(extra), len(m.cols), len(p.infos))
		}
		for k, v := range extra {
			if k >= len(p.infos) {
				break
			}
			switch p.infos[k] {
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
		where := fmt.Sprintf("%s: line %d, row %s, column %s", p.what, line, f[0], m.cols[c])
		row[c] = p.cell(r, c, tok, line, where)
	}
	m.rows[r] = row
}

// cell reads the token of row r, column c: X on the diagonal, NV# between
// two GPUs, else a PCIe level.
func (p *smiParser) cell(r, c int, tok string, line int, where string) smiCell {
	cell := smiCell{tok: tok, line: line}
	switch {
	case c == r:
		if tok != "X" {
			p.el.add("%s: %q on the diagonal; a device's cell with itself is X", where, tok)
		}
	case tok == "X":
		p.el.add("%s: X off the diagonal; X marks a device with itself", where)
	default:
		if mm := nvRe.FindStringSubmatch(tok); mm != nil {
			k, _ := strconv.Atoi(mm[1])
			if k < 1 || k > topology.MaxNVLinks {
				p.el.add("%s: %s; an NVLink bond has 1..%d links", where, tok, topology.MaxNVLinks)
			}
			if r >= p.m.gpus || c >= p.m.gpus {
				p.el.add("%s: %s between a GPU and a NIC; NVLink joins GPUs", where, tok)
			}
			cell.nvlinks = k
			break
		}
		l, ok := smiLevels[tok]
		if !ok || tok == "INT" {
			p.el.add("%s: unknown token %q; the legend has X, NV#, PIX, PXB, PHB, NODE, SYS (SOC on old drivers)", where, tok)
		}
		cell.level = l
	}
	return cell
}

// missingRows reports the GPUs the header names that have no row.
func (p *smiParser) missingRows() {
	m := p.m
	var missing []string
	for r := 0; r < m.gpus; r++ {
		if _, ok := m.rows[r]; !ok {
			missing = append(missing, m.cols[r])
		}
	}
	if len(missing) > 0 {
		p.el.add("%s: the header (line %d) names %d GPUs but rows are missing for %s; the GPU counts of rows and columns disagree", p.what, m.headerLine, m.gpus, strings.Join(missing, ", "))
	}
}

// symmetry checks that every pair, printed twice, agrees. Rows of NICs are
// optional (they repeat the GPU rows), but when present they must agree
// too.
func (p *smiParser) symmetry() {
	m := p.m
	for a := range m.cols {
		for b := a + 1; b < len(m.cols); b++ {
			ra, okA := m.rows[a]
			rb, okB := m.rows[b]
			if !okA || !okB || (a >= m.gpus && b >= m.gpus) {
				continue
			}
			if ra[b].tok != rb[a].tok {
				p.el.add("%s: %s says %s but %s says %s; the matrix is asymmetric and is not imported (check which is right)",
					p.what, m.cellName(a, b), ra[b].tok, m.cellName(b, a), rb[a].tok)
			}
		}
	}
}
