package extender

import (
	"strconv"
	"strings"
	"testing"
)

// Temperature has its own gauge in degrees Celsius; the percent gauge
// carries percentages only; and both per-GPU gauges are exported by the
// serving replica only, so that standbys do not repeat every GPU's series.
func TestPerGPUGaugesTemperatureOwnGaugeLeaderOnly(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx-a100", "a"), 40, 71, 200, 400))
	series := func() map[string][]string {
		fams, err := x.metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][]string{}
		for _, f := range fams {
			for _, m := range f.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName()+"="+l.GetValue())
				}
				v := m.GetGauge().GetValue()
				out[f.GetName()] = append(out[f.GetName()], strings.Join(labels, ",")+" "+strconv.FormatFloat(v, 'g', -1, 64))
			}
		}
		return out
	}
	got := series()
	temps := got["gputopo_extender_gpu_temperature_celsius"]
	if len(temps) != 8 || !strings.Contains(temps[0], "gpu_index=0,node=a 71") {
		t.Errorf("temperature gauge %v; want 8 GPUs at 71 degrees", temps)
	}
	for _, s := range got["gputopo_extender_gpu_utilization_percent"] {
		if strings.Contains(s, "metric=temperature") {
			t.Errorf("percent gauge carries temperature: %s", s)
		}
	}
	if n := len(got["gputopo_extender_gpu_utilization_percent"]); n != 8*3 {
		t.Errorf("%d percent series; want compute, memory and power for 8 GPUs", n)
	}

	runtimeOf(x).stopLeading()
	got = series()
	for _, name := range []string{"gputopo_extender_gpu_temperature_celsius", "gputopo_extender_gpu_utilization_percent"} {
		if len(got[name]) != 0 {
			t.Errorf("a standby exports %s: %v", name, got[name])
		}
	}
	if len(got["gputopo_extender_ledger_gpus"]) == 0 {
		t.Error("a standby stopped exporting its ledger gauge too; only per-GPU gauges are the leader's")
	}
}
