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
