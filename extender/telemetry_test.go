package extender

import (
	"context"
	"strings"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

func TestPrometheusTelemetryConfig(t *testing.T) {
	head := "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\n"
	for name, tc := range map[string]struct{ doc, want string }{
		"unknown source":         {"telemetry: {source: dcgm}", `telemetry.source: Unsupported value: "dcgm"`},
		"prometheus without url": {"telemetry: {source: prometheus}", "telemetry.prometheus: Required value: source: prometheus needs prometheus.url"},
		"bad url":                {"telemetry: {source: prometheus, prometheus: {url: 'prometheus:9090'}}", "telemetry.prometheus.url: Invalid value"},
		"block without source":   {"telemetry: {prometheus: {url: 'http://p:9090'}}", "telemetry.prometheus: Forbidden: only with source: prometheus"},
		"maxAge below interval":  {"telemetry: {source: prometheus, prometheus: {url: 'http://p:9090', interval: 1m, maxAge: 30s}}", "telemetry.prometheus.maxAge: Invalid value: \"30s\": must be at least interval (1m0s)"},
		"timeout above interval": {"telemetry: {source: prometheus, prometheus: {url: 'http://p:9090', interval: 5s, timeout: 10s}}", "telemetry.prometheus.timeout"},
		"bad label":              {"telemetry: {source: prometheus, prometheus: {url: 'http://p:9090', nodeLabel: 'kubernetes.node'}}", "telemetry.prometheus.nodeLabel"},
		"bad metric":             {"telemetry: {source: prometheus, prometheus: {url: 'http://p:9090', metrics: {temperature: 'gpu temp'}}}", "telemetry.prometheus.metrics.temperature"},
		"braced selector":        {"telemetry: {source: prometheus, prometheus: {url: 'http://p:9090', selector: '{job=\"dcgm\"}'}}", "telemetry.prometheus.selector"},
		"typo":                   {"telemetry: {source: prometheus, prometheus: {url: 'http://p:9090', intervall: 5s}}", `unknown field "telemetry.prometheus.intervall"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := configv1alpha1.ParseExtender([]byte(head + tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
	c, err := configv1alpha1.ParseExtender([]byte(head + "telemetry: {source: prometheus, prometheus: {url: 'http://prometheus.monitoring:9090'}}"))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Telemetry.Prometheus
	if p.Interval.Duration != 30*time.Second || p.MaxAge.Duration != 2*time.Minute || p.NodeLabel != "Hostname" || p.UUIDLabel != "UUID" || p.Metrics.Utilization != "DCGM_FI_DEV_GPU_UTIL" {
		t.Errorf("prometheus defaults not applied: %+v", p)
	}
}

// externalFor is a complete round of samples for every GPU of a node.
func externalFor(t *testing.T, fixture, node string, util, tempC int32, at time.Time) map[string]ledger.ExternalSample {
	t.Helper()
	out := map[string]ledger.ExternalSample{}
	for _, g := range topo(t, fixture, node).Status.GPUs {
		out[g.UUID] = ledger.ExternalSample{UtilizationPercent: util, TemperatureC: tempC, PowerWatts: 100, Time: at}
	}
	return out
}

// TestExternalTelemetryScoresAndFallback: with the prometheus source the
// scores follow Prometheus's numbers, and each node falls back to its
// NodeGPUTopology telemetry when its samples are missing, incomplete or
// stale, which the fallback gauge reports.
func TestExternalTelemetryScoresAndFallback(t *testing.T) {
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.Telemetry = configv1alpha1.Telemetry{Source: configv1alpha1.TelemetryPrometheus,
		Prometheus: &configv1alpha1.PrometheusTelemetry{URL: "http://prometheus.invalid:9090", MaxAge: metav1.Duration{Duration: time.Minute}}}
	x, _ := newTestExtender(t, cfg)
	// The node agent says a is cool and idle, b hot and busy.
	x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx-a100", "a"), 0, 30, 100, 400))
	x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx-a100", "b"), 90, 84, 390, 400))
	args := &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(2).obj(), NodeNames: &[]string{"a", "b"}}
	scores := func() (a, b int64) {
		t.Helper()
		list, err := x.Prioritize(context.Background(), args)
		if err != nil {
			t.Fatal(err)
		}
		return list[0].Score, list[1].Score
	}
	if a, b := scores(); a <= b {
		t.Fatalf("NodeGPUTopology telemetry: a (cool, idle) scores %d, b (hot, busy) %d; want a above b", a, b)
	}

	// Prometheus says the opposite.
	x.core.Feed().SetExternalTelemetry(ledger.ExternalTelemetry{
		"a": externalFor(t, "dgx-a100", "a", 95, 83, testNow),
		"b": externalFor(t, "dgx-a100", "b", 0, 31, testNow),
	})
	if a, b := scores(); b <= a {
		t.Fatalf("Prometheus telemetry: a (hot, busy) scores %d, b (cool, idle) %d; want b above a", a, b)
	}
	if src, fb := x.core.Report().NodeTelemetrySource("a"); src != configv1alpha1.TelemetryPrometheus || fb != "" {
		t.Errorf("node a reads %q (fallback %q), want prometheus", src, fb)
	}
	if got := metricValue(t, x, "gputopo_extender_gpu_utilization_percent", "node", "a", "gpu_index", "0", "metric", "compute"); got != 95 {
		t.Errorf("utilization gauge of a/0 = %v, want Prometheus's 95", got)
	}

	// One GPU of b missing: b falls back (incomplete); a node Prometheus
	// does not know at all falls back with no_data.
	bSamples := externalFor(t, "dgx-a100", "b", 0, 31, testNow)
	for u := range bSamples {
		delete(bSamples, u)
		break
	}
	x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx-a100", "c"), 0, 30, 100, 400))
	x.core.Feed().SetExternalTelemetry(ledger.ExternalTelemetry{"a": externalFor(t, "dgx-a100", "a", 95, 83, testNow), "b": bSamples})
	for node, want := range map[string]string{"a": "", "b": ledger.FallbackIncomplete, "c": ledger.FallbackNoData} {
		if _, fb := x.core.Report().NodeTelemetrySource(node); fb != want {
			t.Errorf("node %s fallback %q, want %q", node, fb, want)
		}
	}
	if got := metricValue(t, x, "gputopo_extender_gpu_utilization_percent", "node", "b", "gpu_index", "0", "metric", "compute"); got != 90 {
		t.Errorf("utilization gauge of b/0 = %v, want the node agent's 90 after fallback", got)
	}

	// Prometheus stops answering: samples age past maxAge and every node
	// falls back; scores follow the node agent again.
	setClock(x, func() time.Time { return testNow.Add(61 * time.Second) })
	x.core.Feed().RefreshExternalTelemetry()
	bySource, fallback := x.core.Report().TelemetrySources()
	if bySource[configv1alpha1.TelemetryPrometheus] != 0 || fallback[ledger.FallbackStale] != 2 || fallback[ledger.FallbackNoData] != 1 {
		t.Errorf("after maxAge: sources %v, fallback %v; want a and b stale (stale wins over incomplete), c no_data", bySource, fallback)
	}
	if a, b := scores(); a <= b {
		t.Fatalf("after fallback: a scores %d, b %d; want the node agent's view (a above b) back", a, b)
	}
	want := `
# HELP gputopo_extender_telemetry_fallback_nodes Warning: nodes reading NodeGPUTopology telemetry although telemetry.source is prometheus, by reason (no_data, incomplete, stale). Always 0 with source nodeGPUTopology.
# TYPE gputopo_extender_telemetry_fallback_nodes gauge
gputopo_extender_telemetry_fallback_nodes{reason="incomplete"} 0
gputopo_extender_telemetry_fallback_nodes{reason="no_data"} 1
gputopo_extender_telemetry_fallback_nodes{reason="stale"} 2
`
	if err := testutil.GatherAndCompare(x.metrics.Registry, strings.NewReader(want), "gputopo_extender_telemetry_fallback_nodes"); err != nil {
		t.Error(err)
	}
}
