package nodeagent

import (
	"errors"
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

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
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

func fixture(t *testing.T, name string) topology.Fixture { return fixtureB(t, name) }

func fixtureB(t testing.TB, name string) topology.Fixture {
	t.Helper()
	f, err := topology.FixtureByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func wantStatus(f topology.Fixture) v1alpha1.NodeGPUTopologyStatus {
	st := f.Graph(testNode).Status()
	st.DriverVersion = SimulatedDriverVersion
	return st
}

// The real discovery code, run over each fixture's simulated NVML, must
// publish exactly the fixture: GPUs, every link (NVLink count, NVSwitch,
// PCIe level, P2P, bandwidth), fabric clique and the topology hash.
func TestTopologyEqualsFixture(t *testing.T) {
	for _, f := range topology.Fixtures() {
		t.Run(f.Name, func(t *testing.T) {
			src := NewNVMLSource(NewSimulator(f, testNode).NVML(), logr.Discard(), nil)
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
	sim := NewSimulator(fixture(t, "dgx-a100"), testNode)
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
	sim := NewSimulator(f, testNode)
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
	sim := NewSimulator(fixture(t, "pcie-8x"), testNode)
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
		{"nvlink remote type falls back to bus IDs on NVSwitch", "dgx-a100", []string{"GetNvLinkRemoteDeviceType"}, nil},
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
				l.BandwidthGBps = topology.PCIeBandwidthGBps(f.PCIeGen, l.PCIe)
				l.P2P = l.PCIe != v1alpha1.PCIeCrossSocket
			}
		}},
		{"unknown common ancestor counts as cross-socket", "pcie-8x", []string{"GetTopologyCommonAncestor"}, func(st *v1alpha1.NodeGPUTopologyStatus) {
			for i := range st.Links {
				st.Links[i].PCIe = v1alpha1.PCIeCrossSocket
				st.Links[i].BandwidthGBps = topology.PCIeBandwidthGBps(4, v1alpha1.PCIeCrossSocket)
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
			sim := NewSimulator(f, testNode)
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
			want := f.Graph(testNode).Status()
			if tc.mutate != nil {
				tc.mutate(&want)
			}
			want.DriverVersion = SimulatedDriverVersion
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
	sim := NewSimulator(fixture(t, "pcie-8x"), testNode)
	sim.SetJitter(false)
	sim.Unsupported("GetPowerUsage", "GetEnforcedPowerLimit")
	if err := sim.SetTelemetry(1, SimTelemetry{UtilizationPercent: 70, MemoryUsedMiB: 1000, TemperatureC: 60, PowerWatts: 200, PowerLimitWatts: 300}); err != nil {
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
	sim := NewSimulator(fixture(t, "hgx-h100"), testNode)
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
			sim := NewSimulator(fixture(t, "dgx-a100"), testNode)
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
			uuid := topology.FixtureUUID(testNode, 2)
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
	src := NewNVMLSource(NewSimulator(fixture(t, "dgx-a100"), testNode).NVML(), logr.Discard(), nil)
	evs, err := src.WaitHealth(10 * time.Millisecond)
	if err != nil || len(evs) != 0 {
		t.Fatalf("WaitHealth with no events: got %v, %v; want none, nil", evs, err)
	}
}
