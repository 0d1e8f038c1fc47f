package machine

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// FuzzImportSMI feeds arbitrary text as `nvidia-smi topo -m` output to the
// importer: it may refuse, never panic, and a machine it accepts must write
// a machine file that reads back to the same graph, and print (RenderSMI)
// a matrix that imports back to the same links.
func FuzzImportSMI(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "smi", "*.txt"))
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(data), uint8(6))
	}
	f.Add("GPU0 GPU1\nGPU0 X NV2\nGPU1 NV2 X\n", uint8(12))
	f.Add("\tGPU0\tNIC0\tCPU Affinity\nGPU0\t X \tPIX\t0-3\nNIC0\tPIX\t X \n", uint8(0))
	f.Fuzz(func(t *testing.T, text string, kindIdx uint8) {
		kind := gpuKinds[int(kindIdx)%len(gpuKinds)]
		m, err := ImportSMI(text, SMIOptions{Name: "fuzz", GPU: kind.Key})
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("accepted machine does not validate: %v", err)
		}
		data, err := m.Marshal()
		if err != nil {
			t.Fatalf("accepted machine does not write: %v", err)
		}
		back, err := Parse(data)
		if err != nil {
			t.Fatalf("machine file does not read back: %v\n%s", err, data)
		}
		if back.Graph("n").Hash() != m.Graph("n").Hash() {
			t.Fatalf("machine file reads back to another graph:\n%s", data)
		}
		again, err := ImportSMI(RenderSMI(m, false), SMIOptions{Name: "fuzz", GPU: kind.Key, PCIMatrix: RenderSMI(m, true)})
		if err != nil {
			t.Fatalf("rendered matrix does not import: %v\n%s", err, RenderSMI(m, false))
		}
		if diff := cmp.Diff(m.Graph("n").Status().Links, again.Graph("n").Status().Links); diff != "" {
			t.Fatalf("rendered matrix imports to other links (-first +again):\n%s", diff)
		}
	})
}

// FuzzParseMachine feeds arbitrary bytes as a machine file: refused or
// accepted, never a panic, and an accepted machine writes and reads back to
// the same graph.
func FuzzParseMachine(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "smi", "*.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(minimalMachine))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		out, err := m.Marshal()
		if err != nil {
			t.Fatalf("accepted machine does not write: %v", err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("written machine does not read back: %v\n%s", err, out)
		}
		if back.Graph("n").Hash() != m.Graph("n").Hash() {
			t.Fatalf("written machine reads back to another graph:\n%s", out)
		}
	})
}

// FuzzImportNCCLTopo feeds arbitrary text as an NCCL topology dump: refused
// or accepted, never a panic, and an accepted machine writes a machine
// file that reads back to the same graph.
func FuzzImportNCCLTopo(f *testing.F) {
	data, err := os.ReadFile(filepath.Join("testdata", "nccl", "azure-ncv4.xml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(data))
	f.Add(ncclTree)
	f.Add(`<system><cpu numaid="0"><pci busid="0:1:0.0"><gpu dev="0" sm="90"/></pci></cpu></system>`)
	f.Fuzz(func(t *testing.T, text string) {
		m, err := ImportNCCLTopo(text, SMIOptions{Name: "fuzz"})
		if err != nil {
			return
		}
		out, err := m.Marshal()
		if err != nil {
			t.Fatalf("accepted machine does not write: %v", err)
		}
		back, err := Parse(out)
		if err != nil {
			t.Fatalf("machine file does not read back: %v\n%s", err, out)
		}
		if back.Graph("n").Hash() != m.Graph("n").Hash() {
			t.Fatalf("machine file reads back to another graph:\n%s", out)
		}
	})
}
