package machine

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Machine files describe one machine's GPU topology in YAML (or JSON): what
// a built-in fixture holds, plus explicit per-pair PCIe levels, the NUMA
// node of every GPU and the NICs with their PCIe distance to each GPU.
// `gputopo machine import` writes them from `nvidia-smi topo -m`,
// `gputopo nodeagent dump` from NVML; every place that takes a fixture name
// takes a machine file too (Load). docs/topology.md documents the
// format.
const (
	// APIVersion and Kind head every machine file.
	APIVersion = "gputopo.io/v1alpha1"
	Kind       = "Machine"
)

// machineFile is the file format. Field names are the YAML keys.
type machineFile struct {
	APIVersion   string      `json:"apiVersion"`
	Kind         string      `json:"kind"`
	Name         string      `json:"name"`
	Description  string      `json:"description,omitempty"`
	Source       string      `json:"source,omitempty"`
	Notes        []string    `json:"notes,omitempty"`
	Model        string      `json:"model"`
	GPUs         int         `json:"gpus"`
	MemoryMiB    int64       `json:"memoryMiB,omitempty"`
	NVLink       *nvlinkSpec `json:"nvlink,omitempty"`
	PCIe         pcieSpec    `json:"pcie"`
	NUMANodes    []int       `json:"numaNodes,omitempty"`
	PCIBusIDs    []string    `json:"pciBusIDs,omitempty"`
	NICs         []nicSpec   `json:"nics,omitempty"`
	FabricClique string      `json:"fabricClique,omitempty"`
}

type nvlinkSpec struct {
	// Generation is the NVLink generation (1 P100, 2 V100, 3 A100, 4
	// H100/H200, 5 B200/GB200); it fixes the bandwidth of one link.
	Generation int `json:"generation"`
	// GBpsPerLink overrides the generation's bandwidth of one link, GB/s
	// bidirectional (a measured figure).
	GBpsPerLink int `json:"gbpsPerLink,omitempty"`
	// NVSwitchLinks is each GPU's NVLink count into an NVSwitch fabric that
	// joins every pair; Pairs lists direct links instead.
	NVSwitchLinks int        `json:"nvswitchLinks,omitempty"`
	Pairs         []pairSpec `json:"pairs,omitempty"`
}

type pairSpec struct {
	A     int `json:"a"`
	B     int `json:"b"`
	Links int `json:"links"`
}

type pcieSpec struct {
	Generation int     `json:"generation,omitempty"`
	Switches   [][]int `json:"switches,omitempty"`
	Sockets    [][]int `json:"sockets,omitempty"`
	// Levels is the GPU×GPU PCIe matrix, one row per GPU, cells in
	// nvidia-smi's tokens (X, PIX, PXB, PHB, NODE, SYS; INT for two GPUs on
	// one board) separated by spaces.
	Levels []string `json:"levels,omitempty"`
}

type nicSpec struct {
	Name string `json:"name"`
	// PCIe is the NIC's level to each GPU, one token per GPU.
	PCIe string `json:"pcie"`
}

// smiLevels maps nvidia-smi's PCIe tokens to the API's levels. SOC is what
// drivers before 2017 printed for SYS; INT is the machine file's token for
// NVML's TOPOLOGY_INTERNAL, which nvidia-smi does not print.
var smiLevels = map[string]v1alpha1.PCIeLevel{
	"INT":  v1alpha1.PCIeInternal,
	"PIX":  v1alpha1.PCIeSameSwitch,
	"PXB":  v1alpha1.PCIeMultipleSwitches,
	"PHB":  v1alpha1.PCIeHostBridge,
	"NODE": v1alpha1.PCIeSameNUMA,
	"SYS":  v1alpha1.PCIeCrossSocket,
	"SOC":  v1alpha1.PCIeCrossSocket,
}

// smiToken is the nvidia-smi token of a level.
func smiToken(l v1alpha1.PCIeLevel) string {
	for _, t := range []string{"INT", "PIX", "PXB", "PHB", "NODE", "SYS"} {
		if smiLevels[t] == l {
			return t
		}
	}
	return string(l)
}

// Parse reads a machine file. Unknown fields are refused with their
// path, and every problem found is reported at once, each naming its field.
func Parse(data []byte) (Fixture, error) {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return Fixture{}, fmt.Errorf("parse: %w", err)
	}
	if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
		return Fixture{}, errors.New("parse: the file is empty; a machine file starts with apiVersion: " + APIVersion)
	}
	var mf machineFile
	strict, err := sigsjson.UnmarshalStrict(j, &mf)
	if err != nil {
		return Fixture{}, fmt.Errorf("parse: %w", err)
	}
	if len(strict) > 0 {
		return Fixture{}, fmt.Errorf("parse: %w (docs/topology.md lists the fields of a machine file)", errors.Join(strict...))
	}
	return mf.fixture()
}

// fixture validates the file and builds the machine.
func (mf machineFile) fixture() (Fixture, error) {
	var errs field.ErrorList
	if mf.APIVersion != APIVersion {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), mf.APIVersion, "want "+APIVersion))
	}
	if mf.Kind != Kind {
		errs = append(errs, field.Invalid(field.NewPath("kind"), mf.Kind, "want "+Kind))
	}
	errs = append(errs, validateName(mf.Name, field.NewPath("name"))...)
	if mf.GPUs < 1 || mf.GPUs > topology.MaxGPUs {
		errs = append(errs, field.Invalid(field.NewPath("gpus"), mf.GPUs, fmt.Sprintf("must be 1..%d", topology.MaxGPUs)))
		return Fixture{}, errs.ToAggregate()
	}
	n := mf.GPUs
	if mf.MemoryMiB < 0 {
		errs = append(errs, field.Invalid(field.NewPath("memoryMiB"), mf.MemoryMiB, "must not be negative"))
	}
	f := Fixture{
		Name: mf.Name, Description: mf.Description, Source: mf.Source, Notes: mf.Notes,
		Model: mf.Model, GPUs: n, MemoryMiB: mf.MemoryMiB, PCIeGen: mf.PCIe.Generation,
		FabricClique: mf.FabricClique,
	}
	if mf.NVLink != nil {
		errs = mf.NVLink.apply(&f, field.NewPath("nvlink"), errs)
	}
	errs = mf.PCIe.apply(&f, field.NewPath("pcie"), errs)
	if mf.NUMANodes != nil {
		f.NUMANodes, errs = numaNodes(mf.NUMANodes, n, field.NewPath("numaNodes"), errs)
	}
	if mf.PCIBusIDs != nil {
		f.PCIBusIDs, errs = busIDs(mf.PCIBusIDs, n, field.NewPath("pciBusIDs"), errs)
	}
	f.NICs, errs = nics(mf.NICs, n, field.NewPath("nics"), errs)
	if len(errs) > 0 {
		return Fixture{}, errs.ToAggregate()
	}
	if err := f.Validate(); err != nil {
		return Fixture{}, err
	}
	return f, nil
}

// apply checks the nvlink section and sets f's NVLink generation,
// bandwidth per link, NVSwitch links and pairs.
func (nv *nvlinkSpec) apply(f *Fixture, p *field.Path, errs field.ErrorList) field.ErrorList {
	n := f.GPUs
	f.NVLinkGen, f.NVLinkGBps, f.NVSwitchLinks = nv.Generation, nv.GBpsPerLink, nv.NVSwitchLinks
	if f.NVLinkGBps == 0 {
		f.NVLinkGBps = nvlinkGBpsPerLink[nv.Generation]
	}
	if _, ok := nvlinkGBpsPerLink[nv.Generation]; !ok && nv.GBpsPerLink == 0 {
		errs = append(errs, field.Invalid(p.Child("generation"), nv.Generation, "the NVLink generation is needed for the bandwidth of a link: 1 (P100), 2 (V100), 3 (A100), 4 (H100/H200), 5 (B200); or give gbpsPerLink"))
	}
	if nv.GBpsPerLink < 0 || nv.GBpsPerLink > topology.MaxPairGBps {
		errs = append(errs, field.Invalid(p.Child("gbpsPerLink"), nv.GBpsPerLink, fmt.Sprintf("must be 0 (the generation's figure) or up to %d", topology.MaxPairGBps)))
	}
	if nv.NVSwitchLinks < 0 || nv.NVSwitchLinks > topology.MaxNVLinks {
		errs = append(errs, field.Invalid(p.Child("nvswitchLinks"), nv.NVSwitchLinks, fmt.Sprintf("must be 0..%d", topology.MaxNVLinks)))
	}
	if nv.NVSwitchLinks > 0 && len(nv.Pairs) > 0 {
		errs = append(errs, field.Forbidden(p.Child("pairs"), "an NVSwitch joins every pair; give nvswitchLinks or pairs, not both"))
	}
	if nv.NVSwitchLinks == 0 && len(nv.Pairs) == 0 {
		errs = append(errs, field.Required(p, "an nvlink section needs nvswitchLinks or pairs; drop the section for a machine without NVLink"))
	}
	seen := map[[2]int]int{}
	for i, pr := range nv.Pairs {
		pp := p.Child("pairs").Index(i)
		switch {
		case pr.A < 0 || pr.A >= n || pr.B < 0 || pr.B >= n:
			errs = append(errs, field.Invalid(pp, fmt.Sprintf("%d-%d", pr.A, pr.B), fmt.Sprintf("GPU indices must be 0..%d", n-1)))
			continue
		case pr.A == pr.B:
			errs = append(errs, field.Invalid(pp, fmt.Sprintf("%d-%d", pr.A, pr.B), "a link joins two different GPUs"))
			continue
		case pr.Links < 1 || pr.Links > topology.MaxNVLinks:
			errs = append(errs, field.Invalid(pp.Child("links"), pr.Links, fmt.Sprintf("must be 1..%d", topology.MaxNVLinks)))
		}
		key := [2]int{min(pr.A, pr.B), max(pr.A, pr.B)}
		if j, dup := seen[key]; dup {
			errs = append(errs, field.Duplicate(pp, fmt.Sprintf("GPU %d-GPU %d is also pairs[%d]; list each pair once with its link count", key[0], key[1], j)))
			continue
		}
		seen[key] = i
		f.NVLinks = append(f.NVLinks, NVLinkPair{A: pr.A, B: pr.B, Links: pr.Links})
	}
	return errs
}

// apply checks the pcie section and sets f's PCIe switches, sockets and
// level matrix (the generation is the caller's).
func (ps pcieSpec) apply(f *Fixture, p *field.Path, errs field.ErrorList) field.ErrorList {
	if g := ps.Generation; g != 0 && (g < 1 || g > 6) {
		errs = append(errs, field.Invalid(p.Child("generation"), g, "must be 1..6 (0: unknown, modelled as Gen4)"))
	}
	f.PCIeSwitches, errs = groups(ps.Switches, f.GPUs, p.Child("switches"), errs)
	f.Sockets, errs = groups(ps.Sockets, f.GPUs, p.Child("sockets"), errs)
	if len(ps.Levels) > 0 {
		f.PCIeLevels, errs = levelMatrix(ps.Levels, f.GPUs, p.Child("levels"), errs)
	}
	return errs
}

// numaNodes checks the NUMA node of every GPU (-1: unknown).
func numaNodes(in []int, n int, p *field.Path, errs field.ErrorList) ([]int, field.ErrorList) {
	if len(in) != n {
		errs = append(errs, field.Invalid(p, len(in), fmt.Sprintf("lists %d NUMA nodes for %d GPUs; give one per GPU (-1: unknown)", len(in), n)))
	}
	for i, v := range in {
		if v < -1 {
			errs = append(errs, field.Invalid(p.Index(i), v, "must be -1 (unknown) or a NUMA node number"))
		}
	}
	return in, errs
}

// busIDs checks the PCI bus ID of every GPU: one each, none empty, no two
// alike (case aside).
func busIDs(in []string, n int, p *field.Path, errs field.ErrorList) ([]string, field.ErrorList) {
	if len(in) != n {
		errs = append(errs, field.Invalid(p, len(in), fmt.Sprintf("lists %d bus IDs for %d GPUs; give one per GPU", len(in), n)))
	}
	seen := map[string]int{}
	for i, id := range in {
		if id == "" {
			errs = append(errs, field.Required(p.Index(i), "a bus ID such as 00000000:07:00.0"))
		} else if j, dup := seen[strings.ToLower(id)]; dup {
			errs = append(errs, field.Duplicate(p.Index(i), fmt.Sprintf("%s is also GPU %d's", id, j)))
		}
		seen[strings.ToLower(id)] = i
	}
	return in, errs
}

// nics checks the NICs, each named once with its level to every GPU, and
// reads their levels.
func nics(in []nicSpec, n int, p *field.Path, errs field.ErrorList) ([]NIC, field.ErrorList) {
	var out []NIC
	names := map[string]int{}
	for i, nic := range in {
		np := p.Index(i)
		if nic.Name == "" {
			errs = append(errs, field.Required(np.Child("name"), "the NIC's name, e.g. mlx5_0"))
		} else if j, dup := names[nic.Name]; dup {
			errs = append(errs, field.Duplicate(np.Child("name"), fmt.Sprintf("%s is also nics[%d]", nic.Name, j)))
		}
		names[nic.Name] = i
		cells := strings.Fields(nic.PCIe)
		if len(cells) != n {
			errs = append(errs, field.Invalid(np.Child("pcie"), nic.PCIe, fmt.Sprintf("has %d cells for %d GPUs; give the NIC's level to each GPU", len(cells), n)))
			continue
		}
		nicOut := NIC{Name: nic.Name, PCIe: make([]v1alpha1.PCIeLevel, n)}
		for g, c := range cells {
			l, ok := smiLevels[strings.ToUpper(c)]
			if !ok {
				errs = append(errs, field.NotSupported(np.Child("pcie").Index(g), c, []string{"PIX", "PXB", "PHB", "NODE", "SYS"}))
			}
			nicOut.PCIe[g] = l
		}
		out = append(out, nicOut)
	}
	return out, errs
}

// Validate checks that the machine builds a valid graph: every pair's
// bandwidth within bounds, indices, bus IDs and NUMA nodes sane.
func (f Fixture) Validate() error {
	if f.GPUs < 1 || f.GPUs > topology.MaxGPUs {
		return fmt.Errorf("gpus: %d; must be 1..%d", f.GPUs, topology.MaxGPUs)
	}
	gpus, links := f.Parts("validate")
	if _, err := topology.NewGraph(gpus, links); err != nil {
		return fmt.Errorf("machine %s does not build a valid graph: %w", f.Name, err)
	}
	return nil
}

// ValidateName checks a machine's name: a DNS label of at most 50
// characters, since simulated nodes are named <name>-<i>.
func ValidateName(name string) error {
	return validateName(name, field.NewPath("name")).ToAggregate()
}

func validateName(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "a name for the machine, e.g. dgx-a100-lab; simulated nodes are named <name>-<i>")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(p, name, msg+"; node names are built from it"))
	}
	if len(name) > 50 {
		errs = append(errs, field.TooLong(p, name, 50))
	}
	return errs
}

func groups(in [][]int, n int, p *field.Path, errs field.ErrorList) ([][]int, field.ErrorList) {
	if in == nil {
		return nil, errs
	}
	seen := map[int]string{}
	for gi, g := range in {
		for mi, m := range g {
			mp := p.Index(gi).Index(mi)
			if m < 0 || m >= n {
				errs = append(errs, field.Invalid(mp, m, fmt.Sprintf("GPU indices must be 0..%d", n-1)))
				continue
			}
			if where, dup := seen[m]; dup {
				errs = append(errs, field.Duplicate(mp, fmt.Sprintf("GPU %d is also in %s; a GPU belongs to one group", m, where)))
			}
			seen[m] = mp.String()
		}
	}
	return in, errs
}

// levelMatrix reads the GPU×GPU PCIe rows. An asymmetric matrix is an error
// naming both cells; it is never made symmetric.
func levelMatrix(rows []string, n int, p *field.Path, errs field.ErrorList) ([][]v1alpha1.PCIeLevel, field.ErrorList) {
	if len(rows) != n {
		return nil, append(errs, field.Invalid(p, len(rows), fmt.Sprintf("has %d rows for %d GPUs; give one row per GPU", len(rows), n)))
	}
	out := make([][]v1alpha1.PCIeLevel, n)
	ok := true
	for i, row := range rows {
		cells := strings.Fields(row)
		if len(cells) != n {
			errs = append(errs, field.Invalid(p.Index(i), row, fmt.Sprintf("row of GPU %d has %d cells for %d GPUs", i, len(cells), n)))
			ok = false
			continue
		}
		out[i] = make([]v1alpha1.PCIeLevel, n)
		for j, c := range cells {
			cp := p.Index(i).Index(j)
			if i == j {
				if c != "X" {
					errs = append(errs, field.Invalid(cp, c, fmt.Sprintf("the diagonal (GPU %d with itself) must be X", i)))
				}
				continue
			}
			l, known := smiLevels[strings.ToUpper(c)]
			if !known {
				errs = append(errs, field.NotSupported(cp, c, []string{"PIX", "PXB", "PHB", "NODE", "SYS", "INT"}))
				ok = false
			}
			out[i][j] = l
		}
	}
	if !ok {
		return out, errs
	}
	for i := 0; i < n; i++ {
		for j := i + 1; j < n; j++ {
			if out[i][j] != out[j][i] {
				errs = append(errs, field.Invalid(p.Index(i).Index(j), smiToken(out[i][j]),
					fmt.Sprintf("GPU %d→%d says %s but %s says %s; the matrix must be symmetric (check which is right; it is not guessed)",
						i, j, smiToken(out[i][j]), p.Index(j).Index(i), smiToken(out[j][i]))))
			}
		}
	}
	return out, errs
}

// Load resolves a machine: a built-in fixture name (see Fixtures) or
// the path of a machine file. Every place that accepts a fixture name
// accepts what Load accepts.
func Load(spec string) (Fixture, error) {
	spec = strings.TrimSpace(spec)
	f, err := FixtureByName(spec)
	if err == nil {
		return f, nil
	}
	if !looksLikePath(spec) {
		return Fixture{}, fmt.Errorf("%w; nor is it a machine file (a path ending in .yaml, .yml or .json; `gputopo machine import` writes one)", err)
	}
	data, err := os.ReadFile(spec)
	if err != nil {
		return Fixture{}, fmt.Errorf("machine file %s: %w", spec, err)
	}
	f, err = Parse(data)
	if err != nil {
		return Fixture{}, fmt.Errorf("machine file %s: %w", spec, err)
	}
	return f, nil
}

// IsFile reports whether spec names a machine file rather than a
// built-in fixture.
func IsFile(spec string) bool {
	_, err := FixtureByName(strings.TrimSpace(spec))
	return err != nil && looksLikePath(strings.TrimSpace(spec))
}

func looksLikePath(spec string) bool {
	if strings.ContainsRune(spec, os.PathSeparator) || strings.ContainsRune(spec, '/') {
		return true
	}
	for _, ext := range []string{".yaml", ".yml", ".json"} {
		if strings.HasSuffix(strings.ToLower(spec), ext) {
			return true
		}
	}
	_, err := os.Stat(spec)
	return err == nil
}

// sortedGroups returns groups with members sorted and groups ordered by
// their first member, singletons included only when keepSingles.
func sortedGroups(groupOf []int, keepSingles bool) [][]int {
	byID := map[int][]int{}
	var ids []int
	for i, g := range groupOf {
		if _, ok := byID[g]; !ok {
			ids = append(ids, g)
		}
		byID[g] = append(byID[g], i)
	}
	var out [][]int
	for _, id := range ids {
		m := byID[id]
		if len(m) > 1 || keepSingles {
			slices.Sort(m)
			out = append(out, m)
		}
	}
	return out
}
