package app

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/topology/machine"
)

func init() { subcommands = append(subcommands, newMachineCommand) }

func newMachineCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "machine",
		Short: "Import and show machine descriptions (the shape of a real GPU server)",
		Long: `A machine file describes one server's GPUs and how they are connected:
NVLinks, PCIe levels, NUMA nodes and NICs. Every place that takes a fixture
name (simulate --cluster, demo --machines, nodeagent --simulate) takes a
machine file too. See docs/topology.md ("Machine files").`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newMachineImportCommand(), newMachineShowCommand())
	return cmd
}

// machineImport holds the flags of `gputopo machine import`.
type machineImport struct {
	smi, smiPCI, smiList, ncclTopo, gpu, name, out string
}

func newMachineImportCommand() *cobra.Command {
	var o machineImport
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Write a machine file from `nvidia-smi topo -m` output or an NCCL topology dump",
		Long: `import reads the matrix printed by 'nvidia-smi topo -m' (as printed, with or
without its legend, tabs or spaces) and writes a machine file. The NVLink
generation, which fixes the bandwidth of a link, is not in that output:
give --gpu, or 'nvidia-smi -L' output with --smi-list. 'nvidia-smi topo -mp'
output (--smi-pci) gives the PCIe level of NVLinked pairs, which -m prints
as NV#; without it those levels are inferred and the file's notes say how.

--nccl-topo reads NCCL's topology dump (NCCL_TOPO_DUMP_FILE) instead: its
PCIe tree gives every pair's PCIe level, NVLinked pairs included, and its
compute capability the NVLink generation.

A malformed or asymmetric matrix, an unknown token, GPU counts that differ
between rows and columns or a missing NVLink generation is an error naming
the line and the cell; nothing is guessed silently.`,
		Example: `  nvidia-smi topo -m > topo.txt; nvidia-smi -L > gpus.txt
  gputopo machine import --smi topo.txt --smi-list gpus.txt -o mybox.yaml
  gputopo machine import --smi topo.txt --gpu a100 --name lab-a100 -o lab-a100.yaml
  NCCL_TOPO_DUMP_FILE=topo.xml all_reduce_perf -g 8; gputopo machine import --nccl-topo topo.xml --smi-list gpus.txt -o lab.yaml
  gputopo simulate --cluster mybox.yaml=8,dgx-a100=4`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd.InOrStdin(), cmd.OutOrStdout()) },
	}
	f := cmd.Flags()
	f.StringVar(&o.smi, "smi", "", "file with 'nvidia-smi topo -m' output (- for stdin); this or --nccl-topo is required")
	f.StringVar(&o.ncclTopo, "nccl-topo", "", "file with NCCL's topology dump (NCCL_TOPO_DUMP_FILE), instead of --smi (- for stdin)")
	f.StringVar(&o.smiPCI, "smi-pci", "", "file with 'nvidia-smi topo -mp' output: PCIe levels of NVLinked pairs (optional)")
	f.StringVar(&o.smiList, "smi-list", "", "file with 'nvidia-smi -L' output: the GPU product, hence NVLink generation and memory (optional)")
	f.StringVar(&o.gpu, "gpu", "", "GPU product when --smi-list is not given: "+gpuKeys())
	f.StringVar(&o.name, "name", "", "machine name, a DNS label; nodes are named <name>-<i> (default: the output file's base name)")
	f.StringVarP(&o.out, "output", "o", "", "machine file to write (default: stdout)")
	return cmd
}

func gpuKeys() string {
	var keys []string
	for _, k := range machine.GPUKinds() {
		keys = append(keys, k.Key)
	}
	return strings.Join(keys, "|")
}

func (o machineImport) run(stdin io.Reader, stdout io.Writer) error {
	if (o.smi == "") == (o.ncclTopo == "") {
		return errors.New("--smi or --nccl-topo: give exactly one, the file with `nvidia-smi topo -m` output or NCCL's topology dump (- for stdin)")
	}
	if o.ncclTopo != "" && o.smiPCI != "" {
		return errors.New("--smi-pci: only with --smi; an NCCL topology dump has the PCIe tree already")
	}
	read := func(flag, path string) (string, error) {
		if path == "" {
			return "", nil
		}
		var data []byte
		var err error
		if path == "-" {
			data, err = io.ReadAll(stdin)
		} else {
			data, err = os.ReadFile(path)
		}
		if err != nil {
			return "", fmt.Errorf("--%s: %w", flag, err)
		}
		return string(data), nil
	}
	input, flag := o.smi, "smi"
	if o.ncclTopo != "" {
		input, flag = o.ncclTopo, "nccl-topo"
	}
	text, err := read(flag, input)
	if err != nil {
		return err
	}
	pci, err := read("smi-pci", o.smiPCI)
	if err != nil {
		return err
	}
	list, err := read("smi-list", o.smiList)
	if err != nil {
		return err
	}
	name := o.name
	if name == "" && o.out != "" {
		name = strings.TrimSuffix(filepath.Base(o.out), filepath.Ext(o.out))
	}
	if name == "" {
		return errors.New("--name: required when writing to stdout (e.g. --name lab-a100)")
	}
	source := "nvidia-smi topo -m"
	if o.ncclTopo != "" {
		source = "NCCL topology dump"
	}
	if input != "-" {
		source += " (" + filepath.Base(input) + ")"
	}
	opts := machine.SMIOptions{Name: name, GPU: o.gpu, List: list, PCIMatrix: pci, Source: source}
	var f machine.Fixture
	if o.ncclTopo != "" {
		f, err = machine.ImportNCCLTopo(text, opts)
	} else {
		f, err = machine.ImportSMI(text, opts)
	}
	if err != nil {
		return err
	}
	return writeMachine(f, o.out, stdout)
}

// writeMachine writes f as a machine file to path, or stdout when empty.
func writeMachine(f machine.Fixture, path string, stdout io.Writer) error {
	data, err := f.Marshal()
	if err != nil {
		return err
	}
	if path == "" {
		_, err := stdout.Write(data)
		return err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	fmt.Fprintf(stdout, "wrote %s: %s\n", path, f.Description)
	for _, n := range f.Notes {
		fmt.Fprintf(stdout, "  note: %s\n", n)
	}
	return nil
}

func newMachineShowCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "show MACHINE",
		Short: "Print a machine (a fixture name or a machine file) as nvidia-smi topo -m would",
		Example: `  gputopo machine show mybox.yaml
  gputopo machine show dgx1-v100`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := machine.Load(args[0])
			if err != nil {
				return err
			}
			return showMachine(cmd.OutOrStdout(), f)
		},
	}
}

func showMachine(w io.Writer, f machine.Fixture) error {
	fmt.Fprintf(w, "machine %s: %s\n", f.Name, f.Description)
	if f.Source != "" {
		fmt.Fprintf(w, "source: %s\n", f.Source)
	}
	for _, n := range f.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	g := f.Graph(f.Name + "-0")
	link := "no NVLink"
	switch {
	case f.NVSwitchLinks > 0:
		link = fmt.Sprintf("NVSwitch, %d NVLink%d links per GPU, %d GB/s any pair", f.NVSwitchLinks, f.NVLinkGen, f.NVSwitchLinks*f.NVLinkGBps)
	case len(f.NVLinks) > 0:
		link = fmt.Sprintf("%d NVLinked pairs (NVLink%d, %d GB/s per link)", len(f.NVLinks), f.NVLinkGen, f.NVLinkGBps)
	}
	fmt.Fprintf(w, "%d× %s, %d MiB each; %s; PCIe Gen%d; topology hash %s\n\n", f.GPUs, f.Model, f.MemoryMiB, link, f.PCIeGen, g.Hash())
	fmt.Fprintln(w, "nvidia-smi topo -m:")
	fmt.Fprint(w, machine.RenderSMI(f, false))
	if f.NVSwitchLinks > 0 || len(f.NVLinks) > 0 {
		fmt.Fprintln(w, "\nPCIe levels (nvidia-smi topo -mp):")
		fmt.Fprint(w, machine.RenderSMI(f, true))
	}
	return nil
}

// nodeAgentDump holds the flags of `gputopo nodeagent dump`.
type nodeAgentDump struct {
	name, out, simulate, node string
}

func newNodeAgentDumpCommand() *cobra.Command {
	var o nodeAgentDump
	cmd := &cobra.Command{
		Use:   "dump",
		Short: "Write this node's machine file from NVML (for a bug report or a simulation)",
		Long: `dump reads the node's GPUs through NVML with the node agent's own discovery
code and writes a machine file: GPU model and memory, every pair's NVLinks
and PCIe level, NUMA nodes, PCI bus IDs and the NVLink and PCIe
generations. Share it in a bug report, or simulate with it:
gputopo simulate --cluster this-node.yaml=8. NICs are not visible to NVML;
'gputopo machine import' adds them from nvidia-smi topo -m.`,
		Example: `  gputopo nodeagent dump -o $(hostname).yaml
  kubectl exec -n gputopo-system ds/gputopo-nodeagent -- gputopo nodeagent dump`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd.OutOrStdout()) },
	}
	f := cmd.Flags()
	f.StringVar(&o.name, "name", "", "machine name in the file, a DNS label (default: from --node-name or the host name)")
	f.StringVarP(&o.out, "output", "o", "", "machine file to write (default: stdout)")
	f.StringVar(&o.node, "node-name", os.Getenv("NODE_NAME"), "node name the machine name defaults to (default $NODE_NAME, else the host name)")
	f.StringVar(&o.simulate, "simulate", "", "dump a simulated node built from this machine (a fixture name or a machine file) instead of the NVIDIA driver")
	return cmd
}

func (o nodeAgentDump) run(stdout io.Writer) error {
	name := o.name
	if name == "" {
		node := o.node
		if node == "" {
			node, _ = os.Hostname()
		}
		name = nodeagent.DumpName(node)
	}
	var lib nvml.Interface
	sysfs := false
	if o.simulate != "" {
		f, err := machine.Load(o.simulate)
		if err != nil {
			return fmt.Errorf("--simulate: %w", err)
		}
		lib = nvmlsim.New(f, name).NVML()
	} else {
		lib, sysfs = nvml.New(), true
	}
	f, err := nodeagent.DumpMachine(lib, klog.Background(), nodeagent.DumpOptions{Name: name, SysfsNUMA: sysfs})
	if err != nil {
		return err
	}
	return writeMachine(f, o.out, stdout)
}
