package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/topology/machine"
)

var (
	realTopo = filepath.Join("..", "..", "..", "topology", "machine", "testdata", "smi", "dgx1-v100.txt")
	ncclDump = filepath.Join("..", "..", "..", "topology", "machine", "testdata", "nccl", "azure-ncv4.xml")
)

func TestMachineImportReadsAnNCCLTopologyDump(t *testing.T) {
	file := filepath.Join(t.TempDir(), "ncv4.yaml")
	if out, err := run(t, "machine", "import", "--nccl-topo", ncclDump, "-o", file); err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	f, err := machine.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if f.GPUs != 4 || len(f.NVLinks) != 2 || f.NVLinkGen != 3 || !strings.Contains(f.Source, "NCCL topology dump (azure-ncv4.xml)") {
		t.Errorf("imported %d GPUs, %d NVLink pairs, NVLink%d, source %q", f.GPUs, len(f.NVLinks), f.NVLinkGen, f.Source)
	}
}

// import, then show and dump the machine: the user's five-minute path.
func TestMachineImportShowAndDumpRoundTrip(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lab-v100.yaml")
	out, err := run(t, "machine", "import", "--smi", realTopo, "--gpu", "v100", "-o", file)
	if err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	if !strings.Contains(out, "wrote "+file) || !strings.Contains(out, "note:") {
		t.Errorf("import output does not name the file and its notes:\n%s", out)
	}
	f, err := machine.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	if f.Name != "lab-v100" || f.GPUs != 8 || len(f.NVLinks) != 16 {
		t.Errorf("imported %s with %d GPUs and %d NVLink pairs; want lab-v100, 8, 16", f.Name, f.GPUs, len(f.NVLinks))
	}
	out, err = run(t, "machine", "show", file)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"machine lab-v100", "GPU0     X      NV1     NV1     NV2     NV2     SYS", "PCIe levels (nvidia-smi topo -mp)", f.Graph("lab-v100-0").Hash()} {
		if !strings.Contains(out, want) {
			t.Errorf("show output lacks %q:\n%s", want, out)
		}
	}
	dumped := filepath.Join(dir, "dumped.yaml")
	if out, err := run(t, "nodeagent", "dump", "--simulate", file, "--name", "lab-v100", "-o", dumped); err != nil {
		t.Fatalf("dump: %v\n%s", err, out)
	}
	back, err := machine.Load(dumped)
	if err != nil {
		t.Fatal(err)
	}
	if back.Graph("n").Hash() != f.Graph("n").Hash() {
		t.Error("the dump of the simulated imported machine is another graph")
	}
}

func TestMachineImportReportsBadInput(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(realTopo)
	if err != nil {
		t.Fatal(err)
	}
	asym := filepath.Join(dir, "asym.txt")
	// GPU5's row says NV1 to GPU4; GPU4's row says NV1 too, so make GPU4's
	// cell for GPU5 disagree.
	text := strings.Replace(string(data), "GPU4    NV2     SYS     SYS     SYS      X      NV1", "GPU4    NV2     SYS     SYS     SYS      X      NV2", 1)
	if err := os.WriteFile(asym, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no --smi":            {[]string{"machine", "import", "--gpu", "v100", "--name", "x"}, "--smi or --nccl-topo: give exactly one"},
		"both inputs":         {[]string{"machine", "import", "--smi", realTopo, "--nccl-topo", ncclDump, "--name", "x"}, "give exactly one"},
		"no NVLink gen":       {[]string{"machine", "import", "--smi", realTopo, "--name", "x"}, "NVLink generation"},
		"asymmetric":          {[]string{"machine", "import", "--smi", asym, "--gpu", "v100", "--name", "x"}, "line 9, row GPU4, column GPU5 says NV2 but line 10, row GPU5, column GPU4 says NV1"},
		"stdout needs a name": {[]string{"machine", "import", "--smi", realTopo, "--gpu", "v100"}, "--name: required"},
		"unknown machine":     {[]string{"machine", "show", "dgx-9"}, `fixture "dgx-9": unknown`},
		"dump unknown sim":    {[]string{"nodeagent", "dump", "--simulate", "nope.yaml"}, "--simulate: machine file nope.yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := run(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: err = %v; want it to contain %q", tc.args, err, tc.want)
			}
		})
	}
}

func TestMachineImportReadsStdinAndWritesStdout(t *testing.T) {
	data, err := os.ReadFile(realTopo)
	if err != nil {
		t.Fatal(err)
	}
	cmd := NewCommand(t.Context())
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetIn(strings.NewReader(string(data)))
	cmd.SetArgs([]string{"machine", "import", "--smi", "-", "--gpu", "v100", "--name", "piped"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	f, err := machine.Parse([]byte(out.String()))
	if err != nil || f.Name != "piped" {
		t.Fatalf("stdout is not the machine file: %v\n%s", err, out.String())
	}
}

// `gputopo simulate --cluster mybox.yaml=N,...` end to end from the CLI.
func TestSimulateTakesAnImportedMachineFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "lab-v100.yaml")
	if out, err := run(t, "machine", "import", "--smi", realTopo, "--gpu", "v100", "-o", file); err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	out, err := run(t, "simulate", "--cluster", file+"=2,dgx-a100=1", "--trace", "gen:mixed:seed=5:jobs=40", "--policy", "gputopo")
	if err != nil {
		t.Fatalf("simulate: %v\n%s", err, out)
	}
	if !strings.Contains(out, "3 nodes, 24 GPUs") {
		t.Errorf("simulate did not run on the imported nodes:\n%s", out)
	}
}
