package machine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

func TestImportNCCLTopoRealAzureNCv4MatchesGolden(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "nccl", "azure-ncv4.xml"))
	if err != nil {
		t.Fatal(err)
	}
	list := strings.Repeat("", 0)
	for i := 0; i < 4; i++ {
		list += "GPU " + string(rune('0'+i)) + ": NVIDIA A100 80GB PCIe (UUID: GPU-0)\n"
	}
	f, err := ImportNCCLTopo(string(data), SMIOptions{Name: "azure-ncv4", List: list, Source: "topology/machine/testdata/nccl/azure-ncv4.xml"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]NVLinkPair{{0, 1, 12}, {2, 3, 12}}, f.NVLinks); diff != "" {
		t.Errorf("NVLink pairs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 1, 2, 3}, f.NUMANodes); diff != "" {
		t.Errorf("NUMA nodes (-want +got):\n%s", diff)
	}
	if f.Model != "NVIDIA A100 80GB PCIe" || f.NVLinkGen != 3 || f.PCIeGen != 4 || f.PCIBusIDs[1] != "00000002:00:00.0" {
		t.Errorf("model %q NVLink%d Gen%d bus %v", f.Model, f.NVLinkGen, f.PCIeGen, f.PCIBusIDs)
	}
	if len(f.NICs) != 1 || f.NICs[0].Name != "eth0" || f.NICs[0].PCIe[0] != v1alpha1.PCIeHostBridge || f.NICs[0].PCIe[1] != v1alpha1.PCIeCrossSocket {
		t.Errorf("NICs %+v; want eth0 on GPU 0's CPU", f.NICs)
	}
	g := f.Graph("n")
	if l := g.Link(0, 1); l.BandwidthGBps != 600 || l.PCIe != v1alpha1.PCIeCrossSocket {
		t.Errorf("GPU 0-1 %+v; want 600 GB/s of NVLink between two NUMA nodes", l)
	}
	// The allocator takes a bridged pair for 2 GPUs, as on the fixture of
	// the same shape.
	fx, _ := FixtureByName("pcie-8x-nvlink-pairs")
	got := mustAllocate(t, g, g.All(), req(2, v1alpha1.StrategyHighestBandwidth))
	want := mustAllocate(t, fx.Graph("n"), fx.Graph("n").All(), req(2, v1alpha1.StrategyHighestBandwidth))
	if topology.MaskOf(got.GPUs...) != topology.MaskOf(want.GPUs...) || got.Metrics.Tier != v1alpha1.TierNVLink {
		t.Errorf("k=2: imported %v (%s), fixture %v", got.GPUs, got.Metrics.Tier, want.GPUs)
	}
	out, err := f.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "nccl", "azure-ncv4.yaml")
	if updateGolden {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wantFile, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (GPUTOPO_UPDATE_GOLDEN=1 writes it)", err)
	}
	if diff := cmp.Diff(string(wantFile), string(out)); diff != "" {
		t.Errorf("machine file differs from %s (-want +got):\n%s", golden, diff)
	}
}

// A DGX-A100-like tree: GPUs 0 and 1 under one switch, GPU 2 under a
// sibling switch of the same tree, GPU 3 under another root port of the
// same CPU, GPU 4 on the other CPU; NICs beside GPUs 0 and 1; NVSwitch.
const ncclTree = `<system version="1">
  <cpu numaid="3">
    <pci busid="0000:01:00.0" link_speed="16.0 GT/s PCIe" link_width="16">
      <pci busid="0000:03:00.0" link_speed="16.0 GT/s PCIe" link_width="16">
        <pci busid="0000:07:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
          <gpu dev="0" sm="80" rank="0" gdr="1">
            <nvlink target="0000:c4:00.0" count="6" tclass="0x068000"/>
            <nvlink target="0000:c5:00.0" count="6" tclass="0x068000"/>
          </gpu>
        </pci>
        <pci busid="0000:08:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
          <gpu dev="1" sm="80" rank="1" gdr="1">
            <nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/>
          </gpu>
        </pci>
        <pci busid="0000:0c:00.0" class="0x020700" link_speed="16.0 GT/s PCIe" link_width="16">
          <nic><net name="mlx5_0" dev="0"/><net name="mlx5_1" dev="1"/></nic>
        </pci>
      </pci>
      <pci busid="0000:0d:00.0">
        <pci busid="0000:0f:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
          <gpu dev="2" sm="80" rank="2" gdr="1"><nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/></gpu>
        </pci>
      </pci>
    </pci>
    <pci busid="0000:40:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="3" sm="80" rank="3" gdr="1"><nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/></gpu>
    </pci>
  </cpu>
  <cpu numaid="7">
    <pci busid="0000:87:00.0" class="0x030200" link_speed="16.0 GT/s PCIe" link_width="16">
      <gpu dev="4" sm="80" rank="4" gdr="1"><nvlink target="0000:c4:00.0" count="12" tclass="0x068000"/></gpu>
    </pci>
  </cpu>
</system>
`

func TestImportNCCLTopoReadsThePCIeTreeAndNVSwitch(t *testing.T) {
	f, err := ImportNCCLTopo(ncclTree, SMIOptions{Name: "tree"})
	if err != nil {
		t.Fatal(err)
	}
	if f.NVSwitchLinks != 12 || f.NVLinkGen != 3 || f.PCIeGen != 4 {
		t.Errorf("NVSwitch %d links, NVLink%d, Gen%d; want 12, 3 (sm 80), 4 (16 GT/s)", f.NVSwitchLinks, f.NVLinkGen, f.PCIeGen)
	}
	for pair, want := range map[[2]int]v1alpha1.PCIeLevel{
		{0, 1}: v1alpha1.PCIeSameSwitch, {0, 2}: v1alpha1.PCIeMultipleSwitches, {1, 3}: v1alpha1.PCIeHostBridge, {2, 4}: v1alpha1.PCIeCrossSocket,
	} {
		if got := f.PCIeLevel(pair[0], pair[1]); got != want {
			t.Errorf("GPU %d-%d: %s; want %s", pair[0], pair[1], got, want)
		}
	}
	if diff := cmp.Diff([]int{3, 3, 3, 3, 7}, f.NUMANodes); diff != "" {
		t.Errorf("NUMA nodes (-want +got):\n%s", diff)
	}
	if len(f.NICs) != 2 || f.NICs[1].Name != "mlx5_1" {
		t.Fatalf("NICs %+v", f.NICs)
	}
	want := []v1alpha1.PCIeLevel{v1alpha1.PCIeSameSwitch, v1alpha1.PCIeSameSwitch, v1alpha1.PCIeMultipleSwitches, v1alpha1.PCIeHostBridge, v1alpha1.PCIeCrossSocket}
	if diff := cmp.Diff(want, f.NICs[0].PCIe); diff != "" {
		t.Errorf("mlx5_0's levels (-want +got):\n%s", diff)
	}
	if !strings.Contains(strings.Join(f.Notes, " "), "sm 80") {
		t.Errorf("notes %q do not say the NVLink generation came from sm", f.Notes)
	}
}

func TestImportNCCLTopoRefusesBadDumpsNamingTheLine(t *testing.T) {
	for name, c := range map[string]struct {
		xml  string
		want []string
	}{
		"asymmetric NVLink": {strings.Replace(readNCv4(t), `<nvlink target="0001:00:00.0" count="12"`, `<nvlink target="0001:00:00.0" count="6"`, 1),
			[]string{"line 12: GPU 0 has 12 NVLinks to GPU 1 but GPU 1 (line 21) has 6 back", "asymmetric"}},
		"NVLink to a missing GPU": {strings.Replace(readNCv4(t), `target="0004:00:00.0"`, `target="0009:00:00.0"`, 1), []string{"GPU 2's NVLink targets 0009:00:00.0", "no GPU"}},
		"unknown tclass":          {strings.Replace(readNCv4(t), `tclass="0x030200"`, `tclass="0x0b4000"`, 1), []string{"line 12", `tclass="0x0b4000"`}},
		"bad dev":                 {strings.Replace(readNCv4(t), `<gpu dev="2"`, `<gpu dev="two"`, 1), []string{`<gpu dev="two">`}},
		"index twice":             {strings.Replace(readNCv4(t), `<gpu dev="2"`, `<gpu dev="1"`, 1), []string{"GPU indices must be 0..3"}},
		"bad numaid":              {strings.Replace(readNCv4(t), `numaid="2"`, `numaid="x"`, 1), []string{`<cpu numaid="x">`}},
		"NVSwitch counts differ":  {strings.Replace(ncclTree, `count="12" tclass="0x068000"/></gpu>`, `count="6" tclass="0x068000"/></gpu>`, 1), []string{"GPU 2 has 6 NVLinks into NVSwitches, GPU 0 has 12"}},
		"not XML":                 {"<system><cpu>", []string{"NCCL topology", "unexpected EOF"}},
		"no GPU":                  {`<system version="1"></system>`, []string{"0 <gpu> elements"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ImportNCCLTopo(c.xml, SMIOptions{Name: "m"})
			if err == nil {
				t.Fatalf("imported; want an error containing %q", c.want)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func readNCv4(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "nccl", "azure-ncv4.xml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
