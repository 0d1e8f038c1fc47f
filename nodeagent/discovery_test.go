package nodeagent

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
	"github.com/gputopo/gputopo/topology/machine"
)

const testNode = "gpu-node-1"

// logCapture collects log messages so tests can count them.
type logCapture struct {
	mu   sync.Mutex
	msgs []string
}

func (c *logCapture) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.msgs = append(c.msgs, args)
	}, funcr.Options{Verbosity: 0})
}

func (c *logCapture) count(substr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, m := range c.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

func fixture(t *testing.T, name string) machine.Fixture { return fixtureB(t, name) }

func fixtureB(t testing.TB, name string) machine.Fixture {
	t.Helper()
	f, err := machine.FixtureByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func wantStatus(f machine.Fixture) v1alpha1.NodeGPUTopologyStatus {
	st := f.Graph(testNode).Status()
	st.DriverVersion = nvmlsim.SimulatedDriverVersion
	st.Conditions = []metav1.Condition{consistentCondition()}
	return st
}

// The real discovery code, run over each fixture's simulated NVML, must
// publish exactly the fixture: GPUs, every link (NVLink count, NVSwitch,
// PCIe level, P2P, bandwidth), fabric clique and the topology hash.
func TestTopologyEqualsFixture(t *testing.T) {
	for _, f := range machine.Fixtures() {
		t.Run(f.Name, func(t *testing.T) {
			src := NewNVMLSource(nvmlsim.New(f, testNode).NVML(), logr.Discard(), nil)
			defer src.Close()
			got, err := src.Topology()
			if err != nil {
				t.Fatalf("Topology: %v", err)
			}
			if diff := cmp.Diff(wantStatus(f), got); diff != "" {
				t.Errorf("discovered topology differs from fixture (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNVMLInitFailureIsReportedAndRecovers(t *testing.T) {
	sim := nvmlsim.New(fixture(t, "dgx-a100"), testNode)
	reg := prometheus.NewRegistry()
	src := NewNVMLSource(sim.NVML(), logr.Discard(), NewMetrics(reg, testNode))
	sim.FailInit(nvml.ERROR_LIBRARY_NOT_FOUND)
	_, err := src.Topology()
	if !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) || !strings.Contains(err.Error(), "nvml init") {
		t.Fatalf("Topology with failing init: got %v, want an 'nvml init' error wrapping ERROR_LIBRARY_NOT_FOUND", err)
	}
	if _, err := src.Telemetry(); !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Errorf("Telemetry with failing init: got %v, want ERROR_LIBRARY_NOT_FOUND", err)
	}
	if got := testutil.ToFloat64(src.metrics.nvmlErrors.WithLabelValues("Init", "ERROR_LIBRARY_NOT_FOUND")); got != 2 {
		t.Errorf("nvml errors metric for Init: got %v, want 2", got)
	}
	sim.FailInit(nvml.SUCCESS)
	got, err := src.Topology()
	if err != nil {
		t.Fatalf("Topology after the driver came back: %v", err)
	}
	if diff := cmp.Diff(wantStatus(fixture(t, "dgx-a100")), got); diff != "" {
		t.Errorf("topology after recovery (-want +got):\n%s", diff)
	}
}

func TestGPULostAfterDiscoveryKeepsFactsAndMarksUnhealthy(t *testing.T) {
	f := fixture(t, "dgx1-v100")
	sim := nvmlsim.New(f, testNode)
	src := NewNVMLSource(sim.NVML(), logr.Discard(), nil)
	before, err := src.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if err := sim.LoseGPU(3); err != nil {
		t.Fatal(err)
	}
	tel, err := src.Telemetry()
	if err != nil {
		t.Fatalf("Telemetry with a lost GPU: %v", err)
	}
	if diff := cmp.Diff(v1alpha1.Telemetry{Index: 3}, tel[3]); diff != "" {
		t.Errorf("lost GPU telemetry (-want +got):\n%s", diff)
	}
	select {
	case <-src.HealthChanged():
	default:
		t.Errorf("HealthChanged not signalled after a GPU was lost")
	}
	after, err := src.Topology()
	if err != nil {
		t.Fatalf("Topology with a lost GPU: %v", err)
	}
	want := (&v1alpha1.NodeGPUTopology{Status: before}).DeepCopy().Status
	want.GPUs[3].Health, want.GPUs[3].HealthReason = v1alpha1.GPUUnhealthy, ReasonGPULost
	if diff := cmp.Diff(want, after); diff != "" {
		t.Errorf("topology with GPU 3 lost (-want +got):\n%s", diff)
	}
	if err := sim.RecoverGPU(3); err != nil {
		t.Fatal(err)
	}
	again, err := src.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, again); diff != "" {
		t.Errorf("topology after the GPU answered again (-want +got):\n%s", diff)
	}
}

func TestGPULostBeforeFirstReadFailsDiscovery(t *testing.T) {
	sim := nvmlsim.New(fixture(t, "pcie-8x"), testNode)
	if err := sim.LoseGPU(5); err != nil {
		t.Fatal(err)
	}
	_, err := NewNVMLSource(sim.NVML(), logr.Discard(), nil).Topology()
	if !errors.Is(err, errGPULost) || !strings.Contains(err.Error(), "gpu 5") {
		t.Fatalf("got %v, want an error naming gpu 5 as lost", err)
	}
}

// Each unsupported call degrades to its documented default and is logged
// once, however often discovery runs.
func TestNotSupportedDegrades(t *testing.T) {
	tests := []struct {
		name    string
		fixture string
		calls   []string
		mutate  func(st *v1alpha1.NodeGPUTopologyStatus)
	}{
		{"numa node unknown", "dgx-a100", []string{"GetNumaNodeId"}, func(st *v1alpha1.NodeGPUTopologyStatus) {
			for i := range st.GPUs {
				st.GPUs[i].NUMANode = -1
			}
		}},
		{"nvlink remote type falls back to bus IDs on a cube-mesh", "dgx1-v100", []string{"GetNvLinkRemoteDeviceType"}, nil},
		{"without the remote type an NVSwitch is not believed", "dgx-a100", []string{"GetNvLinkRemoteDeviceType"}, func(st *v1alpha1.NodeGPUTopologyStatus) {
			f := fixture(t, "dgx-a100")
			for i := range st.Links {
				l := &st.Links[i]
				l.NVLinks, l.NVSwitch = 0, false
				l.BandwidthGBps = machine.PCIeBandwidthGBps(f.PCIeGen, l.PCIe)
				// P2P stays as NVML reports it: the fabric is there.
			}
			st.Conditions[0].Status, st.Conditions[0].Reason = metav1.ConditionFalse, v1alpha1.ReasonUnknownRemoteBusID
		}},
		{"link speed falls back to the NVLink version", "hgx-h100", []string{"GetFieldValues"}, nil},
		{"link speed and version unknown count 50 GB/s per link", "dgx1-v100", []string{"GetFieldValues", "GetNvLinkVersion"}, func(st *v1alpha1.NodeGPUTopologyStatus) {
			for i := range st.Links {
				if st.Links[i].NVLinks > 0 {
					st.Links[i].BandwidthGBps = st.Links[i].NVLinks * 50
				}
			}
		}},
		{"no nvlink means PCIe links only", "pcie-8x-nvlink-pairs", []string{"GetNvLinkState"}, func(st *v1alpha1.NodeGPUTopologyStatus) {
			f := fixture(t, "pcie-8x-nvlink-pairs")
			for i := range st.Links {
				l := &st.Links[i]
				l.NVLinks, l.NVSwitch = 0, false
				l.BandwidthGBps = machine.PCIeBandwidthGBps(f.PCIeGen, l.PCIe)
				l.P2P = l.PCIe != v1alpha1.PCIeCrossSocket
			}
		}},
		{"unknown common ancestor counts as cross-socket", "pcie-8x", []string{"GetTopologyCommonAncestor"}, func(st *v1alpha1.NodeGPUTopologyStatus) {
			for i := range st.Links {
				st.Links[i].PCIe = v1alpha1.PCIeCrossSocket
				st.Links[i].BandwidthGBps = machine.PCIeBandwidthGBps(4, v1alpha1.PCIeCrossSocket)
			}
		}},
		{"no fabric info means no clique", "gb200-nvl72-tray", []string{"GetGpuFabricInfo"}, func(st *v1alpha1.NodeGPUTopologyStatus) {
			for i := range st.GPUs {
				st.GPUs[i].FabricClique = ""
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := fixture(t, tc.fixture)
			sim := nvmlsim.New(f, testNode)
			sim.Unsupported(tc.calls...)
			logs := &logCapture{}
			src := NewNVMLSource(sim.NVML(), logs.logger(), nil)
			var got v1alpha1.NodeGPUTopologyStatus
			for range 3 {
				var err error
				if got, err = src.Topology(); err != nil {
					t.Fatalf("Topology: %v", err)
				}
			}
			want := wantStatus(f)
			if tc.mutate != nil {
				tc.mutate(&want)
			}
			if want.Conditions[0].Status == metav1.ConditionFalse {
				// The message is tested where the lie is told; here only
				// that the degraded answer is called out.
				want.Conditions[0].Message = got.Conditions[0].Message
			}
			// The hash covers the facts; recompute it for the degraded ones.
			g, err := topology.NewGraph(want.GPUs, want.Links)
			if err != nil {
				t.Fatal(err)
			}
			want.TopologyHash = g.Hash()
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("degraded topology (-want +got):\n%s", diff)
			}
			for _, c := range tc.calls {
				if n := logs.count(`"call"="` + c + `"`); n != 1 {
					t.Errorf("call %s logged as unsupported %d times, want once", c, n)
				}
			}
		})
	}
}

func TestUnsupportedTelemetryReadsZero(t *testing.T) {
	sim := nvmlsim.New(fixture(t, "pcie-8x"), testNode)
	sim.SetJitter(false)
	sim.Unsupported("GetPowerUsage", "GetEnforcedPowerLimit")
	if err := sim.SetTelemetry(1, nvmlsim.Telemetry{UtilizationPercent: 70, MemoryUsedMiB: 1000, TemperatureC: 60, PowerWatts: 200, PowerLimitWatts: 300}); err != nil {
		t.Fatal(err)
	}
	tel, err := NewNVMLSource(sim.NVML(), logr.Discard(), nil).Telemetry()
	if err != nil {
		t.Fatal(err)
	}
	want := v1alpha1.Telemetry{Index: 1, UtilizationPercent: 70, MemoryUsedMiB: 1000, TemperatureC: 60}
	if diff := cmp.Diff(want, tel[1]); diff != "" {
		t.Errorf("telemetry with power unsupported (-want +got):\n%s", diff)
	}
}

func TestHeatingGPUReportsThermalSlowdown(t *testing.T) {
	sim := nvmlsim.New(fixture(t, "hgx-h100"), testNode)
	sim.SetJitter(false)
	if err := sim.HeatUp(4, 20, 90); err != nil {
		t.Fatal(err)
	}
	src := NewNVMLSource(sim.NVML(), logr.Discard(), nil)
	var temps []int32
	var last v1alpha1.Telemetry
	for range 4 {
		tel, err := src.Telemetry()
		if err != nil {
			t.Fatal(err)
		}
		temps = append(temps, tel[4].TemperatureC)
		last = tel[4]
	}
	if diff := cmp.Diff([]int32{50, 70, 90, 90}, temps); diff != "" {
		t.Errorf("temperatures (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"SwThermalSlowdown"}, last.ThrottleReasons); diff != "" {
		t.Errorf("throttle reasons at 90 °C (-want +got):\n%s", diff)
	}
	if err := sim.HeatUp(8, 1, 90); err == nil {
		t.Errorf("HeatUp on GPU 8 of an 8-GPU node: want an out-of-range error")
	}
}

func TestXIDClassification(t *testing.T) {
	tests := []struct {
		name   string
		xid    uint64
		class  XIDClass
		health v1alpha1.GPUHealth
		reason string
	}{
		{"xid 13 is the application's", 13, XIDApplication, v1alpha1.GPUHealthy, ""},
		{"xid 31 is the application's", 31, XIDApplication, v1alpha1.GPUHealthy, ""},
		{"xid 79 takes the GPU out", 79, XIDCritical, v1alpha1.GPUUnhealthy, "XID 79: GPU has fallen off the bus"},
		{"xid 48 takes the GPU out", 48, XIDCritical, v1alpha1.GPUUnhealthy, "XID 48: double bit ECC error"},
		{"an unnamed xid is critical", 1234, XIDCritical, v1alpha1.GPUUnhealthy, "XID 1234: critical error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sim := nvmlsim.New(fixture(t, "dgx-a100"), testNode)
			reg := prometheus.NewRegistry()
			src := NewNVMLSource(sim.NVML(), logr.Discard(), NewMetrics(reg, testNode))
			if _, err := src.Topology(); err != nil {
				t.Fatal(err)
			}
			if err := sim.InjectXID(2, tc.xid); err != nil {
				t.Fatal(err)
			}
			evs, err := src.WaitHealth(5 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			uuid := machine.FixtureUUID(testNode, 2)
			_, wantReason := ClassifyXID(tc.xid)
			if diff := cmp.Diff([]HealthEvent{{Index: 2, UUID: uuid, XID: tc.xid, Class: tc.class, Reason: wantReason}}, evs); diff != "" {
				t.Errorf("health events (-want +got):\n%s", diff)
			}
			st, err := src.Topology()
			if err != nil {
				t.Fatal(err)
			}
			if st.GPUs[2].Health != tc.health || st.GPUs[2].HealthReason != tc.reason {
				t.Errorf("GPU 2 health: got %s %q, want %s %q", st.GPUs[2].Health, st.GPUs[2].HealthReason, tc.health, tc.reason)
			}
			for i, g := range st.GPUs {
				if i != 2 && g.Health != v1alpha1.GPUHealthy {
					t.Errorf("GPU %d health %s: an XID on GPU 2 must not touch it", i, g.Health)
				}
			}
			if got := testutil.ToFloat64(src.metrics.xids.WithLabelValues(strconv.FormatUint(tc.xid, 10), string(tc.class))); got != 1 {
				t.Errorf("xid metric: got %v, want 1", got)
			}
		})
	}
}

func TestWaitHealthTimesOutQuietly(t *testing.T) {
	src := NewNVMLSource(nvmlsim.New(fixture(t, "dgx-a100"), testNode).NVML(), logr.Discard(), nil)
	evs, err := src.WaitHealth(10 * time.Millisecond)
	if err != nil || len(evs) != 0 {
		t.Fatalf("WaitHealth with no events: got %v, %v; want none, nil", evs, err)
	}
}

// linkAt is the position of pair a<b in a status's links (every pair once,
// sorted by (A, B)).
func linkAt(n, a, b int) int { return a*n - a*(a+1)/2 + (b - a - 1) }

// withoutNVLink is the fixture's link between a and b had they no NVLink.
func withoutNVLink(f machine.Fixture, l v1alpha1.Link) v1alpha1.Link {
	l.NVLinks, l.NVSwitch = 0, false
	l.BandwidthGBps = machine.PCIeBandwidthGBps(f.PCIeGen, l.PCIe)
	return l
}

// dropLinkTo removes one of GPU i's NVLinks to bus busID.
func dropLinkTo(t *testing.T, sim *nvmlsim.Simulator, i int, busID string) {
	t.Helper()
	links, err := sim.NVLinks(i)
	if err != nil {
		t.Fatal(err)
	}
	for k, l := range links {
		if l.RemoteBusID == busID {
			if err := sim.SetNVLinks(i, append(links[:k:k], links[k+1:]...)); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("GPU %d has no NVLink to %s", i, busID)
}

func mustBus(t *testing.T, sim *nvmlsim.Simulator, i int) string {
	t.Helper()
	b, err := sim.BusID(i)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

const phantomBus = "00000000:99:00.0"

// Machines whose NVML answers contradict each other: discovery publishes
// the conservative link, says what disagreed in the TopologyConsistent
// condition and counts it, and never panics.
func TestHostileTopologyDiscovery(t *testing.T) {
	tests := []struct {
		name    string
		fixture string
		script  func(t *testing.T, sim *nvmlsim.Simulator)
		// want changes the fixture's status into the one to publish.
		want func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus)
		// reason is the condition's reason; "" means Consistent.
		reason  string
		message []string
	}{{
		name: "NVLink only the lower GPU reports is not published", fixture: "dgx1-v100",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { dropLinkTo(t, sim, 1, mustBus(t, sim, 0)) },
		want: func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus) {
			st.Links[linkAt(8, 0, 1)] = withoutNVLink(f, st.Links[linkAt(8, 0, 1)])
		},
		reason:  v1alpha1.ReasonAsymmetricLink,
		message: []string{"GPU 0 reports 1 NVLinks to GPU 1, GPU 1 reports 0 to GPU 0; publishing 0"},
	}, {
		name: "NVLink only the higher GPU reports is not published", fixture: "dgx1-v100",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { dropLinkTo(t, sim, 0, mustBus(t, sim, 1)) },
		want: func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus) {
			st.Links[linkAt(8, 0, 1)] = withoutNVLink(f, st.Links[linkAt(8, 0, 1)])
		},
		reason:  v1alpha1.ReasonAsymmetricLink,
		message: []string{"GPU 0 reports 0 NVLinks to GPU 1, GPU 1 reports 1 to GPU 0; publishing 0"},
	}, {
		name: "double link seen single from one end is published single", fixture: "dgx1-v100",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { dropLinkTo(t, sim, 3, mustBus(t, sim, 0)) },
		want: func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus) {
			l := &st.Links[linkAt(8, 0, 3)]
			l.NVLinks, l.BandwidthGBps = 1, 50
		},
		reason:  v1alpha1.ReasonAsymmetricLink,
		message: []string{"GPU 0 reports 2 NVLinks to GPU 3, GPU 3 reports 1 to GPU 0; publishing 1"},
	}, {
		name: "PCIe levels that disagree publish the farther", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { must(t, sim.SetPCIeLevel(1, 0, v1alpha1.PCIeCrossSocket)) },
		want: func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus) {
			l := &st.Links[linkAt(8, 0, 1)]
			l.PCIe, l.BandwidthGBps = v1alpha1.PCIeCrossSocket, machine.PCIeBandwidthGBps(f.PCIeGen, v1alpha1.PCIeCrossSocket)
		},
		reason:  v1alpha1.ReasonAsymmetricLink,
		message: []string{"GPU 0 sees GPU 1 at PCIe level SameSwitch, GPU 1 sees GPU 0 at CrossSocket; publishing CrossSocket"},
	}, {
		name: "PCIe level the lower GPU puts farther is published too", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { must(t, sim.SetPCIeLevel(2, 3, v1alpha1.PCIeSameNUMA)) },
		want: func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus) {
			l := &st.Links[linkAt(8, 2, 3)]
			l.PCIe, l.BandwidthGBps = v1alpha1.PCIeSameNUMA, machine.PCIeBandwidthGBps(f.PCIeGen, v1alpha1.PCIeSameNUMA)
		},
		reason:  v1alpha1.ReasonAsymmetricLink,
		message: []string{"GPU 2 sees GPU 3 at PCIe level SameNUMA, GPU 3 sees GPU 2 at SameSwitch; publishing SameNUMA"},
	}, {
		name: "P2P one end refuses is published unsupported", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { must(t, sim.SetP2P(5, 4, false)) },
		want: func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus) {
			st.Links[linkAt(8, 4, 5)].P2P = false
		},
		reason:  v1alpha1.ReasonAsymmetricLink,
		message: []string{"GPU 4 reports P2P reads to GPU 5 as OK, GPU 5 to GPU 4 as chipset not supported; publishing P2P unsupported"},
	}, {
		name: "per-link speeds that disagree publish the slower", fixture: "hgx-h100",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { must(t, sim.SetNVLinkGBps(3, 25)) },
		want: func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus) {
			for i := range st.Links {
				if l := &st.Links[i]; l.A == 3 || l.B == 3 {
					l.BandwidthGBps = l.NVLinks * 25
				}
			}
		},
		reason:  v1alpha1.ReasonAsymmetricLink,
		message: []string{"GPU 0 reads 50 GB/s per NVLink, GPU 3 reads 25; publishing 25", "GPU 3 reads 25 GB/s per NVLink, GPU 7 reads 50; publishing 25"},
	}, {
		name: "absurd measured link speed is not believed", fixture: "hgx-h100",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { must(t, sim.SetNVLinkGBps(6, 8_000_000)) },
	}, {
		name: "remote GPU at an unknown bus ID is not counted", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) {
			must(t, sim.SetNVLinks(0, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_GPU}, {RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_GPU}}))
		},
		reason:  v1alpha1.ReasonUnknownRemoteBusID,
		message: []string{"GPU 0 NVLinks [0 1] lead to bus ID 00000000:99:00.0 (remote type GPU), which is no other GPU of this node; not counted"},
	}, {
		name: "remote of unknown type at an unknown bus ID is not an NVSwitch", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) {
			must(t, sim.SetNVLinks(0, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_UNKNOWN}}))
			must(t, sim.SetNVLinks(1, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_UNKNOWN}}))
		},
		reason:  v1alpha1.ReasonUnknownRemoteBusID,
		message: []string{"GPU 0 NVLinks [0] lead to bus ID 00000000:99:00.0 (remote type unknown (0xff))", "GPU 1 NVLinks [0]"},
	}, {
		name: "remote of a type go-nvml does not define is not an NVSwitch", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) {
			must(t, sim.SetNVLinks(0, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.IntNvLinkDeviceType(7)}}))
			must(t, sim.SetNVLinks(1, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.IntNvLinkDeviceType(7)}}))
		},
		reason:  v1alpha1.ReasonUnknownRemoteBusID,
		message: []string{"(remote type unknown (0x7))"},
	}, {
		name: "remote type not reported and an unknown bus ID is no phantom NVSwitch", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) {
			sim.Unsupported("GetNvLinkRemoteDeviceType")
			must(t, sim.SetNVLinks(0, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_SWITCH}}))
			must(t, sim.SetNVLinks(1, []nvmlsim.NVLink{{RemoteBusID: "00000000:9A:00.0", RemoteType: nvml.NVLINK_DEVICE_TYPE_SWITCH}}))
		},
		reason:  v1alpha1.ReasonUnknownRemoteBusID,
		message: []string{"GPU 0 NVLinks [0] lead to bus ID 00000000:99:00.0 (remote type not reported by the driver)", "GPU 1 NVLinks [0] lead to bus ID 00000000:9A:00.0"},
	}, {
		name: "remote type not reported still finds GPUs by bus ID", fixture: "pcie-8x-nvlink-pairs",
		script: func(t *testing.T, sim *nvmlsim.Simulator) { sim.Unsupported("GetNvLinkRemoteDeviceType") },
	}, {
		name: "IBM NPU link is a CPU link, neither counted nor an inconsistency", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) {
			must(t, sim.SetNVLinks(0, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_IBMNPU}}))
			must(t, sim.SetNVLinks(1, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_IBMNPU}}))
		},
	}, {
		name: "NVSwitch is believed when NVML says NVSwitch, whatever its bus ID", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) {
			must(t, sim.SetNVLinks(0, []nvmlsim.NVLink{{RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_SWITCH}, {RemoteBusID: phantomBus, RemoteType: nvml.NVLINK_DEVICE_TYPE_SWITCH}}))
			must(t, sim.SetNVLinks(1, []nvmlsim.NVLink{{RemoteBusID: "", RemoteType: nvml.NVLINK_DEVICE_TYPE_SWITCH}}))
		},
		want: func(f machine.Fixture, st *v1alpha1.NodeGPUTopologyStatus) {
			l := &st.Links[linkAt(8, 0, 1)]
			// pcie-8x has no NVLink generation: one link counts 50 GB/s.
			l.NVLinks, l.NVSwitch, l.BandwidthGBps = 1, true, 50
		},
	}, {
		name: "NVLink to the GPU's own bus ID is not counted", fixture: "pcie-8x",
		script: func(t *testing.T, sim *nvmlsim.Simulator) {
			must(t, sim.SetNVLinks(2, []nvmlsim.NVLink{{RemoteBusID: mustBus(t, sim, 2), RemoteType: nvml.NVLINK_DEVICE_TYPE_GPU}}))
		},
		reason:  v1alpha1.ReasonUnknownRemoteBusID,
		message: []string{"GPU 2 NVLinks [0] lead to bus ID 00000000:27:00.0 (remote type GPU)"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := fixture(t, tc.fixture)
			sim := nvmlsim.New(f, testNode)
			tc.script(t, sim)
			reg := prometheus.NewRegistry()
			src := NewNVMLSource(sim.NVML(), logr.Discard(), NewMetrics(reg, testNode))
			got, err := src.Topology()
			if err != nil {
				t.Fatalf("Topology: %v", err)
			}
			want := wantStatus(f)
			if tc.want != nil {
				tc.want(f, &want)
			}
			g, err := topology.NewGraph(want.GPUs, want.Links)
			if err != nil {
				t.Fatalf("expected status is invalid: %v", err)
			}
			want.TopologyHash = g.Hash()
			if diff := cmp.Diff(want.Links, got.Links); diff != "" {
				t.Errorf("published links (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want.GPUs, got.GPUs); diff != "" {
				t.Errorf("published GPUs (-want +got):\n%s", diff)
			}
			if got.TopologyHash != want.TopologyHash {
				t.Errorf("hash %s, want %s", got.TopologyHash, want.TopologyHash)
			}
			checkConsistency(t, got.Conditions, tc.reason, tc.message)
			for reason, kind := range inconsistencyKinds {
				n := testutil.ToFloat64(src.metrics.inconsistencies.WithLabelValues(kind))
				if (reason == tc.reason) != (n > 0) {
					t.Errorf("inconsistencies{kind=%s} = %v after a read with reason %q", kind, n, tc.reason)
				}
			}
		})
	}
}

// checkConsistency asserts the one TopologyConsistent condition: True and
// Consistent when reason is "", else False with reason and every message
// fragment.
func checkConsistency(t *testing.T, conds []metav1.Condition, reason string, message []string) {
	t.Helper()
	if len(conds) != 1 || conds[0].Type != v1alpha1.ConditionTopologyConsistent {
		t.Fatalf("conditions %+v: want exactly one %s", conds, v1alpha1.ConditionTopologyConsistent)
	}
	c := conds[0]
	if reason == "" {
		if c.Status != metav1.ConditionTrue || c.Reason != v1alpha1.ReasonConsistent {
			t.Errorf("condition %s/%s %q: want True/%s", c.Status, c.Reason, c.Message, v1alpha1.ReasonConsistent)
		}
		return
	}
	if c.Status != metav1.ConditionFalse || c.Reason != reason {
		t.Errorf("condition %s/%s %q: want False/%s", c.Status, c.Reason, c.Message, reason)
	}
	for _, m := range message {
		if !strings.Contains(c.Message, m) {
			t.Errorf("condition message %q does not contain %q", c.Message, m)
		}
	}
}

// Two GPUs with one bus ID cannot have their NVLinks told apart: the read
// is refused with a DuplicateBusID condition naming both, not scrambled.
func TestDuplicateBusIDIsRefused(t *testing.T) {
	sim := nvmlsim.New(fixture(t, "dgx1-v100"), testNode)
	must(t, sim.SetBusID(5, mustBus(t, sim, 2)))
	reg := prometheus.NewRegistry()
	src := NewNVMLSource(sim.NVML(), logr.Discard(), NewMetrics(reg, testNode))
	st, err := src.Topology()
	var refused *RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("Topology: got %v, %d GPUs; want a *RefusedError", err, len(st.GPUs))
	}
	checkConsistency(t, []metav1.Condition{refused.Condition}, v1alpha1.ReasonDuplicateBusID,
		[]string{"GPU 2 and GPU 5 both report PCI bus ID 00000000:27:00.0"})
	if len(st.GPUs) != 0 || len(st.Links) != 0 {
		t.Errorf("refused read returned %d GPUs and %d links; want none", len(st.GPUs), len(st.Links))
	}
	if n := testutil.ToFloat64(src.metrics.inconsistencies.WithLabelValues("duplicate_bus_id")); n != 1 {
		t.Errorf("inconsistencies{kind=duplicate_bus_id} = %v, want 1", n)
	}
	// Told the truth again, the same source reads the fixture.
	must(t, sim.SetBusID(5, fmt.Sprintf("00000000:%02X:00.0", 0x07+5*0x10)))
	got, err := src.Topology()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantStatus(fixture(t, "dgx1-v100")), got); diff != "" {
		t.Errorf("after the bus IDs are unique again (-want +got):\n%s", diff)
	}
}

// bigFixture is an NVSwitch machine of n GPUs, two sockets, a PCIe switch
// per pair; beyond topology.MaxGPUs it is a machine the model cannot hold.
func bigFixture(n int) machine.Fixture {
	var switches, sockets [][]int
	sockets = make([][]int, 2)
	for i := 0; i < n; i++ {
		if i%2 == 0 {
			switches = append(switches, []int{i, i + 1})
		}
		sockets[i*2/n] = append(sockets[i*2/n], i)
	}
	return machine.Fixture{Name: fmt.Sprintf("nvswitch-%d", n), Model: "NVIDIA H100 80GB HBM3", GPUs: n, MemoryMiB: 81559,
		NVLinkGen: 4, NVLinkGBps: 50, NVSwitchLinks: 18, PCIeGen: 5, PCIeSwitches: switches, Sockets: sockets}
}

func TestDiscoveryAtTheGPULimit(t *testing.T) {
	// 64 GPUs is the largest node searched directly, 72 an NVL72 domain
	// seen as one node, MaxGPUs the limit.
	for _, n := range []int{64, 72, topology.MaxGPUs} {
		t.Run(fmt.Sprintf("%d GPUs are read whole, a lie on one pair included", n), func(t *testing.T) {
			sim := nvmlsim.New(bigFixture(n), testNode)
			must(t, sim.SetPCIeLevel(n-1, n-2, v1alpha1.PCIeCrossSocket))
			got, err := NewNVMLSource(sim.NVML(), logr.Discard(), nil).Topology()
			if err != nil {
				t.Fatalf("Topology: %v", err)
			}
			if len(got.GPUs) != n || len(got.Links) != n*(n-1)/2 {
				t.Fatalf("got %d GPUs and %d links; want %d and %d", len(got.GPUs), len(got.Links), n, n*(n-1)/2)
			}
			if l := got.Links[linkAt(n, n-2, n-1)]; l.PCIe != v1alpha1.PCIeCrossSocket || l.BandwidthGBps != 900 {
				t.Errorf("link %d-%d = %+v; want CrossSocket, still 900 GB/s over NVSwitch", n-2, n-1, l)
			}
			checkConsistency(t, got.Conditions, v1alpha1.ReasonAsymmetricLink, []string{
				fmt.Sprintf("GPU %d sees GPU %d at PCIe level SameSwitch, GPU %d sees GPU %d at CrossSocket", n-2, n-1, n-1, n-2)})
			// What the agent publishes, the model takes and the allocator
			// answers on: an 8-GPU NVLink set and the whole node.
			g, err := topology.FromStatus(&got)
			if err != nil {
				t.Fatalf("FromStatus: %v", err)
			}
			for _, k := range []int{8, n} {
				res, err := allocator.New(0).Allocate(g, g.All(), topology.Request{Count: k, Requirement: v1alpha1.Requirement{RequireNVLink: true}})
				if err != nil || len(res.GPUs) != k || res.Metrics.Tier != v1alpha1.TierNVSwitch {
					t.Errorf("allocate %d of %d: %v, %+v; want %d GPUs over NVSwitch", k, n, err, res, k)
				}
			}
		})
	}
	t.Run("more than MaxGPUs are refused with the limit named", func(t *testing.T) {
		n := topology.MaxGPUs + 2
		sim := nvmlsim.New(bigFixture(n), testNode)
		_, err := NewNVMLSource(sim.NVML(), logr.Discard(), nil).Topology()
		want := fmt.Sprintf("nvml reports %d GPUs; at most %d are supported per node", n, topology.MaxGPUs)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("Topology of %d GPUs: got %v; want %q", n, err, want)
		}
	})
}
