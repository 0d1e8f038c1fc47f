package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology/machine"
)

// renamedNames are the five metrics renamed from gpu_extender_* to
// gputopo_extender_*, exported under both names for one release.
var renamedNames = []string{
	"gputopo_extender_scheduling_latency_seconds",
	"gputopo_extender_filter_results_total",
	"gputopo_extender_prioritize_scores",
	"gputopo_extender_gpu_utilization_percent",
	"gputopo_extender_errors_total",
}

// TestDeprecatedNamesDuplicateTheRenamedMetrics: each renamed metric is
// exported under its old gpu_extender_* name too, series for series and
// value for value, with a help text that names the new one; a standby
// exports neither utilization name. The registry is pedantic, so every
// series must match its description.
func TestDeprecatedNamesDuplicateTheRenamedMetrics(t *testing.T) {
	m := New(ledger.New(ledger.Options{}).Report())
	leading := true
	m.Leader = func() bool { return leading }
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.collectors...)

	m.Latency("filter", 3*time.Millisecond)
	m.Latency("bind", 2*time.Second)
	m.Filtered(placement.ReasonNone, 5)
	m.Filtered(placement.ReasonNVLink, 2)
	var counts [placement.MaxScore + 1]uint64
	counts[0], counts[7], counts[10] = 1, 3, 2
	m.Scored(&counts)
	m.Error("filter", ErrDecode)
	m.Failed(placement.PhaseBind, placement.ErrAPIUnknown)
	f, err := machine.FixtureByName("hgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	m.setTelemetry("n", f.Graph("n"), []v1alpha1.Telemetry{{Index: 0, UtilizationPercent: 42, PowerWatts: 350, PowerLimitWatts: 700}, {Index: 1, UtilizationPercent: 7}})

	families := func() map[string]string {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, mf := range mfs {
			var b strings.Builder
			if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
				t.Fatal(err)
			}
			out[mf.GetName()] = b.String()
		}
		return out
	}
	got := families()
	for _, name := range renamedNames {
		old := "gpu_extender_" + strings.TrimPrefix(name, "gputopo_extender_")
		if got[name] == "" {
			t.Errorf("%s is not exported", name)
			continue
		}
		want := strings.ReplaceAll(got[name], name, old)
		want = strings.Replace(want, "# HELP "+old+" ", "# HELP "+old+" Deprecated: use "+name+"; ", 1)
		if got[old] != want {
			t.Errorf("deprecated %s:\n%s\nwant the same series as %s:\n%s", old, got[old], name, want)
		}
	}

	leading = false
	got = families()
	for _, name := range []string{"gputopo_extender_gpu_utilization_percent", "gpu_extender_gpu_utilization_percent"} {
		if got[name] != "" {
			t.Errorf("a standby exports %s:\n%s", name, got[name])
		}
	}
	if got["gpu_extender_errors_total"] == "" {
		t.Error("a standby stopped exporting gpu_extender_errors_total; only the per-GPU gauges are the leader's")
	}
}
