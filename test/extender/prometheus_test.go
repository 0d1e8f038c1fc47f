//go:build integration

package extender_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/test/harness"
)

// prometheusBinary finds the Prometheus server: $GPUTOPO_PROMETHEUS, else
// prometheus on PATH (Debian's package installs /usr/bin/prometheus).
// Without one the test is skipped, unless GPUTOPO_REQUIRE_PROMETHEUS is
// set (CI sets it), which makes a missing server a failure.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("GPUTOPO_PROMETHEUS"); p != "" {
		return p
	}
	p, err := exec.LookPath("prometheus")
	if err == nil {
		return p
	}
	msg := "no prometheus server: install Debian's package (apt-get install prometheus) or set GPUTOPO_PROMETHEUS"
	if os.Getenv("GPUTOPO_REQUIRE_PROMETHEUS") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// dcgmExporter serves DCGM exporter's metric names and labels for a
// fixture's GPUs, with values the test sets.
type dcgmExporter struct {
	srv                   *httptest.Server
	util, fb, temp, power *prometheus.GaugeVec
	uuids                 map[string][]string // node -> GPU UUIDs
}

func newDCGMExporter(t *testing.T, nodes []string) *dcgmExporter {
	t.Helper()
	reg := prometheus.NewRegistry()
	labels := []string{"gpu", "UUID", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
		reg.MustRegister(g)
		return g
	}
	d := &dcgmExporter{
		util:  gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
		fb:    gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
		temp:  gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),
		power: gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),
		uuids: map[string][]string{},
	}
	f := mustFixture(t)
	for _, n := range nodes {
		for _, g := range f.Graph(n).GPUs() {
			d.uuids[n] = append(d.uuids[n], g.UUID)
		}
	}
	d.srv = httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(d.srv.Close)
	return d
}

// set reports every GPU of node at util % and tempC.
func (d *dcgmExporter) set(node string, util, tempC float64) {
	for i, u := range d.uuids[node] {
		l := prometheus.Labels{"gpu": strconv.Itoa(i), "UUID": u, "device": "nvidia" + strconv.Itoa(i),
			"modelName": "Tesla V100-SXM2-16GB", "Hostname": node, "DCGM_FI_DRIVER_VERSION": "550.54.15"}
		d.util.With(l).Set(util)
		d.fb.With(l).Set(util * 160)
		d.temp.With(l).Set(tempC)
		d.power.With(l).Set(100)
	}
}

// startPrometheus runs a real Prometheus server scraping target every
// second and returns its URL once it is ready.
func startPrometheus(t *testing.T, target string) (*harness.Process, string) {
	t.Helper()
	bin := prometheusBinary(t)
	dir := t.TempDir()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dcgm-exporter
    static_configs:
      - targets: [%q]
`, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p := harness.StartProcess(t, "prometheus", bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	url := "http://" + addr
	harness.Poll(t, time.Minute, "prometheus to be ready", func() (bool, string) {
		resp, err := http.Get(url + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	return p, url
}

// scrapeMetrics reads the extender's /metrics as Prometheus would.
func scrapeMetrics(t *testing.T, x *runningExtender) string {
	t.Helper()
	resp, err := http.Get("http://" + x.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestPrometheusTelemetrySource: the extender reads DCGM metrics that a
// real Prometheus scraped from an exporter, and its scores follow them,
// against what the node agent published; with Prometheus down it falls
// back to the node agent's numbers and says so in a warning metric.
func TestPrometheusTelemetrySource(t *testing.T) {
	e := newEnv(t, 2)
	// The node agent: dgx-0 idle and cool, dgx-1 busy and hot.
	setAgentTelemetry(t, e, "dgx-0", 0, 35)
	setAgentTelemetry(t, e, "dgx-1", 90, 84)
	exp := newDCGMExporter(t, e.nodes)
	// DCGM says the opposite.
	exp.set("dgx-0", 95, 83)
	exp.set("dgx-1", 0, 32)
	prom, promURL := startPrometheus(t, strings.TrimPrefix(exp.srv.URL, "http://"))

	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.Telemetry = configv1alpha1.Telemetry{Source: configv1alpha1.TelemetryPrometheus, Prometheus: &configv1alpha1.PrometheusTelemetry{
		URL: promURL, Interval: metav1.Duration{Duration: time.Second}, Timeout: metav1.Duration{Duration: time.Second}, MaxAge: metav1.Duration{Duration: 4 * time.Second},
	}}
	configv1alpha1.SetExtenderDefaults(cfg)
	x := startExtenderWith(t, e, 0, func(o *extender.Options) { o.Config = cfg })
	waitReady(t, x)

	// scores asks prioritize over HTTP, as kube-scheduler does.
	body, _ := json.Marshal(&extenderv1.ExtenderArgs{Pod: gpuPod("probe", 1, ""), NodeNames: &e.nodes})
	scores := func() (map[string]int64, string) {
		resp, err := http.Post(x.url()+"/prioritize", "application/json", bytes.NewReader(body))
		if err != nil {
			return nil, err.Error()
		}
		defer resp.Body.Close()
		var list extenderv1.HostPriorityList
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			return nil, err.Error()
		}
		out := map[string]int64{}
		for _, h := range list {
			out[h.Host] = h.Score
		}
		s0, f0 := x.Core().Report().NodeTelemetrySource("dgx-0")
		s1, f1 := x.Core().Report().NodeTelemetrySource("dgx-1")
		return out, fmt.Sprintf("scores %v; dgx-0 reads %s (fallback %q), dgx-1 %s (%q)", out, s0, f0, s1, f1)
	}
	prefers := func(what, winner, loser, source string) {
		t.Helper()
		harness.Poll(t, 30*time.Second, what, func() (bool, string) {
			s, msg := scores()
			src0, _ := x.Core().Report().NodeTelemetrySource(winner)
			src1, _ := x.Core().Report().NodeTelemetrySource(loser)
			return s != nil && s[winner] > s[loser] && src0 == source && src1 == source, msg
		})
	}

	prefers("scores to follow Prometheus (dgx-1 idle and cool there)", "dgx-1", "dgx-0", configv1alpha1.TelemetryPrometheus)
	if m := scrapeMetrics(t, x); !strings.Contains(m, `gputopo_extender_telemetry_source_nodes{source="prometheus"} 2`) ||
		!strings.Contains(m, `gputopo_extender_gpu_utilization_percent{gpu_index="0",metric="compute",node="dgx-0"} 95`) {
		t.Errorf("/metrics does not show both nodes on Prometheus telemetry with DCGM's numbers:\n%s", grepLines(m, "telemetry_source", `node="dgx-0"`))
	}
	// DCGM's numbers change; the next scrape turns the scores round.
	exp.set("dgx-0", 0, 31)
	exp.set("dgx-1", 97, 84)
	prefers("scores to follow the new scrape (dgx-0 idle and cool now)", "dgx-0", "dgx-1", configv1alpha1.TelemetryPrometheus)
	exp.set("dgx-0", 95, 83)
	exp.set("dgx-1", 0, 32)
	prefers("scores to follow the scrape back", "dgx-1", "dgx-0", configv1alpha1.TelemetryPrometheus)

	// Prometheus goes down: after maxAge every node falls back to the node
	// agent's telemetry (dgx-0 idle and cool), with the warning metric.
	prom.Stop()
	prefers("fallback to NodeGPUTopology telemetry", "dgx-0", "dgx-1", configv1alpha1.TelemetryNodeGPUTopology)
	m := scrapeMetrics(t, x)
	for _, want := range []string{
		`gputopo_extender_telemetry_fallback_nodes{reason="stale"} 2`,
		`gputopo_extender_telemetry_source_nodes{source="nodeGPUTopology"} 2`,
		`gputopo_extender_gpu_utilization_percent{gpu_index="0",metric="compute",node="dgx-0"} 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(m, "gputopo_extender_", `node="dgx-0"`))
		}
	}
	if !strings.Contains(m, `gputopo_extender_prometheus_query_rounds_total{result="error"}`) {
		t.Errorf("/metrics does not count failed query rounds:\n%s", grepLines(m, "prometheus_query"))
	}
}

func grepLines(s string, subs ...string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
