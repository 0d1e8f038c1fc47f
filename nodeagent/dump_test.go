package nodeagent

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/topology/machine"
)

// dumpMachines are the simulated machines the dump is tested on: every
// built-in fixture and every machine imported from a real
// `nvidia-smi topo -m` (explicit PCIe levels, NUMA nodes such as 3 and 7).
func dumpMachines(t *testing.T) []machine.Fixture {
	t.Helper()
	machines := machine.Fixtures()
	files, err := filepath.Glob(filepath.Join("..", "topology", "machine", "testdata", "smi", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no imported machines: %v", err)
	}
	for _, file := range files {
		f, err := machine.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		machines = append(machines, f)
	}
	return machines
}

// The simulated NVML serves any machine description, explicit PCIe levels
// and NUMA nodes included: discovery publishes exactly the machine's graph.
func TestTopologyEqualsImportedMachines(t *testing.T) {
	for _, f := range dumpMachines(t) {
		if f.Source == "" {
			continue // built-in fixtures: TestTopologyEqualsFixture
		}
		t.Run(f.Name, func(t *testing.T) {
			src := NewNVMLSource(nvmlsim.New(f, testNode).NVML(), logr.Discard(), nil)
			defer src.Close()
			got, err := src.Topology()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantStatus(f), got); diff != "" {
				t.Errorf("discovered topology differs from the machine (-want +got):\n%s", diff)
			}
		})
	}
}

// A dump through go-nvml's mock of each simulated machine writes a machine
// file that reads back to the same graph as the machine, and as what the
// agent itself publishes.
func TestDumpRoundTripsEverySimulatedMachine(t *testing.T) {
	for _, f := range dumpMachines(t) {
		t.Run(f.Name, func(t *testing.T) {
			sim := nvmlsim.New(f, testNode)
			dumped, err := DumpMachine(sim.NVML(), logr.Discard(), DumpOptions{Name: "dumped"})
			if err != nil {
				t.Fatalf("dump: %v", err)
			}
			data, err := dumped.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			back, err := machine.Parse(data)
			if err != nil {
				t.Fatalf("the dump does not re-import: %v\n%s", err, data)
			}
			want := f.Graph(testNode).Status()
			got := back.Graph(testNode).Status()
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("re-imported dump differs from the machine (-machine +dump):\n%s\n%s", diff, data)
			}
			if back.NVLinkGen != f.NVLinkGen || back.PCIeGen != f.PCIeGen {
				t.Errorf("NVLink%d PCIe Gen%d; want NVLink%d PCIe Gen%d", back.NVLinkGen, back.PCIeGen, f.NVLinkGen, f.PCIeGen)
			}
			for _, note := range back.Notes {
				if strings.Contains(note, "P2P") || strings.Contains(note, "disagreed") {
					t.Errorf("a faithful simulated machine dumps with note %q", note)
				}
			}
		})
	}
}

func TestDumpRecordsWhatNVMLGotWrong(t *testing.T) {
	f, err := machine.FixtureByName("dgx1-v100")
	if err != nil {
		t.Fatal(err)
	}
	sim := nvmlsim.New(f, testNode)
	// GPU 0 says it shares a switch with GPU 5; GPU 5 says they cross
	// sockets: the dump keeps the conservative answer and says so.
	if err := sim.SetPCIeLevel(0, 5, v1alpha1.PCIeSameSwitch); err != nil {
		t.Fatal(err)
	}
	// GPU 1 refuses P2P reads to GPU 2 although they share a socket.
	if err := sim.SetP2P(1, 2, false); err != nil {
		t.Fatal(err)
	}
	dumped, err := DumpMachine(sim.NVML(), logr.Discard(), DumpOptions{Name: "v100"})
	if err != nil {
		t.Fatal(err)
	}
	if got := dumped.PCIeLevel(0, 5); got != v1alpha1.PCIeCrossSocket {
		t.Errorf("GPU 0-5 dumped as %s; want the conservative CrossSocket", got)
	}
	notes := strings.Join(dumped.Notes, "\n")
	for _, want := range []string{"NVML answers disagreed", "GPU 0", "NICs are not visible to NVML"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes do not mention %q:\n%s", want, notes)
		}
	}
}

func TestDumpFailsClearly(t *testing.T) {
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	sim := nvmlsim.New(f, testNode)
	sim.FailInit(nvml.ERROR_DRIVER_NOT_LOADED)
	if _, err := DumpMachine(sim.NVML(), logr.Discard(), DumpOptions{Name: "a"}); err == nil || !strings.Contains(err.Error(), "nvml init") {
		t.Errorf("dump with the driver down: %v; want the nvml init error", err)
	}
	sim.FailInit(nvml.SUCCESS)
	if _, err := DumpMachine(sim.NVML(), logr.Discard(), DumpOptions{Name: "Not A Label"}); err == nil || !strings.Contains(err.Error(), "name") {
		t.Errorf("dump with a bad name: %v; want the name refused", err)
	}
	// One GPU off the NVSwitch fabric: the format has one fabric or none.
	if err := sim.SetNVLinks(3, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := DumpMachine(sim.NVML(), logr.Discard(), DumpOptions{Name: "a"}); err == nil || !strings.Contains(err.Error(), "NVSwitch and others do not") {
		t.Errorf("dump with GPU 3 off the fabric: %v; want it refused naming why", err)
	}
}

func TestDumpName(t *testing.T) {
	for in, want := range map[string]string{"gpu-node-1.example.com": "gpu-node-1", "GPU-A": "gpu-a", "": "machine"} {
		if got := DumpName(in); got != want {
			t.Errorf("DumpName(%q) = %q; want %q", in, got, want)
		}
	}
}

// `gputopo nodeagent --simulate mybox.yaml` is validated like a fixture
// name: a machine file is accepted, a broken one refused naming the flag.
func TestOptionsSimulateTakesMachineFiles(t *testing.T) {
	file := filepath.Join("..", "topology", "machine", "testdata", "smi", "a30-nvlink-pairs.yaml")
	fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
	var o Options
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--node-name", "n1", "--simulate", file}); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("--simulate %s: %v", file, err)
	}
	o.Simulate = filepath.Join(t.TempDir(), "missing.yaml")
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "simulate") || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("--simulate with a missing file: %v; want the flag and the file named", err)
	}
}
