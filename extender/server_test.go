package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/prometheus/client_golang/prometheus/testutil"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func post(t testing.TB, h http.Handler, path, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

func manyNames(n int) *[]string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node-%05d", i)
	}
	return &names
}

func TestBadRequests(t *testing.T) {
	pod := makePod("p").gpus(1).obj()
	tests := []struct {
		name       string
		path       string
		body       string
		wantStatus int
		// wantBody must appear in the response.
		wantBody string
	}{
		{"malformed JSON", "/filter", `{"Pod":`, 400, "malformed request"},
		{"not JSON at all", "/prioritize", `hello`, 400, "malformed request"},
		{"trailing garbage", "/filter", mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{}}) + `{}`, 400, "unexpected data"},
		{"missing pod", "/filter", `{"NodeNames":["a"]}`, 400, "Pod is required"},
		{"missing nodes", "/scheduler/filter", mustJSON(t, extenderv1.ExtenderArgs{Pod: pod}), 400, "NodeNames"},
		{"wrong type for NodeNames", "/filter", `{"Pod":{},"NodeNames":"a"}`, 400, "malformed request"},
		{"unknown node", "/filter", mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"ghost"}}), 200, `"ghost":"gputopo: node has no NodeGPUTopology`},
		{"pod with no requirement", "/filter", mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"a"}}), 200, `"NodeNames":["a"]`},
		{"pod with malformed requirement", "/filter", mustJSON(t, extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).req(`{"strategy":1}`).obj(), NodeNames: &[]string{"a"}}), 200, `"Error":"pod default/p: metadata.annotations[gputopo.io/gpu-topology-requirement].strategy: Invalid value`},
		{"prioritize with malformed requirement", "/prioritize", mustJSON(t, extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).req(`[]`).obj(), NodeNames: &[]string{"a"}}), 400, "gpu-topology-requirement"},
		{"10,000 node names", "/filter", mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: manyNames(10000)}), 200, `"node-09999":"gputopo: node has no NodeGPUTopology`},
		{"10,000 node names prioritize", "/scheduler/prioritize", mustJSON(t, extenderv1.ExtenderArgs{Pod: pod, NodeNames: manyNames(10000)}), 200, `{"Host":"node-09999","Score":0}`},
		{"body over the limit", "/filter", `{"Pod":{},"NodeNames":["` + strings.Repeat("x", 2<<20) + `"]}`, 413, "raise maxRequestBytes"},
		{"bind without fields", "/bind", `{}`, 400, "[PodName PodNamespace PodUID Node] required"},
		{"bind malformed", "/scheduler/bind", `{"PodName":5}`, 400, "malformed request"},
		{"bind missing pod", "/bind", `{"PodName":"ghost","PodNamespace":"default","PodUID":"u","Node":"a"}`, 200, `"Error":"pod default/ghost not found`},
	}
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.MaxRequestBytes = 1 << 20
	x, _ := newTestExtender(t, cfg)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
	h := x.Handler()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, h, tc.path, tc.body)
			if code != tc.wantStatus || !strings.Contains(body, tc.wantBody) {
				if len(body) > 300 {
					body = body[:300] + "..."
				}
				t.Errorf("POST %s: %d %s\nwant %d containing %q", tc.path, code, body, tc.wantStatus, tc.wantBody)
			}
		})
	}
}

func TestVerbsRefuseUntilReadyAndProbesSaySo(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	runtimeOf(x).stopLeading()
	h := x.Handler()
	body := mustJSON(t, extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &[]string{"a"}})
	if code, resp := post(t, h, "/filter", body); code != 503 || !strings.Contains(resp, "not the leader") {
		t.Errorf("filter while not leading: %d %s; want 503 naming leadership", code, resp)
	}
	get := func(path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	if c := get("/readyz"); c != 503 {
		t.Errorf("/readyz while not leading = %d, want 503", c)
	}
	if c := get("/healthz"); c != 200 {
		t.Errorf("/healthz = %d, want 200 (alive even when not ready)", c)
	}
	if c := get("/filter"); c != http.StatusMethodNotAllowed {
		t.Errorf("GET /filter = %d, want 405", c)
	}
	runtimeOf(x).lead()
	if c := get("/readyz"); c != 200 {
		t.Errorf("/readyz when ready = %d, want 200", c)
	}
	if code, resp := post(t, h, "/filter", body); code != 200 {
		t.Errorf("filter when ready: %d %s", code, resp)
	}
}

func TestMetricsFollowRequests(t *testing.T) {
	x, _ := newTestExtender(t, nil)
	x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "a"), 42, 50, 100, 300))
	holdOn(x, "h", "b", 0, 7)
	x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "b"))
	h := x.Handler()
	body := mustJSON(t, extenderv1.ExtenderArgs{Pod: makePod("p").gpus(4).req(modelParallel).obj(), NodeNames: &[]string{"a", "b", "ghost"}})
	if code, resp := post(t, h, "/filter", body); code != 200 {
		t.Fatalf("filter: %d %s", code, resp)
	}
	if code, resp := post(t, h, "/prioritize", body); code != 200 {
		t.Fatalf("prioritize: %d %s", code, resp)
	}
	post(t, h, "/filter", `{`)
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"passed", metricValue(t, x, "gputopo_extender_filter_results_total", "result", "passed", "reason", ""), 1},
		{"failed nvlink", metricValue(t, x, "gputopo_extender_filter_results_total", "result", "failed", "reason", "nvlink"), 1},
		{"failed no_topology", metricValue(t, x, "gputopo_extender_filter_results_total", "result", "failed", "reason", "no_topology"), 1},
		{"decode errors", metricValue(t, x, "gputopo_extender_errors_total", "phase", "filter", "error_type", "decode"), 1},
		{"utilization gauge", metricValue(t, x, "gputopo_extender_gpu_utilization_percent", "node", "a", "gpu_index", "3", "metric", "compute"), 42},
		{"power gauge", metricValue(t, x, "gputopo_extender_gpu_utilization_percent", "node", "a", "gpu_index", "3", "metric", "power"), 100 * 100.0 / 300},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if n, err := testutil.GatherAndCount(x.metrics.Registry, "gputopo_extender_prioritize_scores"); err != nil || n != 1 {
		t.Errorf("prioritize_scores series = %d, want 1 (no per-node label)", n)
	}
	rec := httptest.NewRecorder()
	x.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	out, _ := io.ReadAll(rec.Body)
	for _, want := range []string{
		`gputopo_extender_ledger_gpus{state="free"} 14`,
		`gputopo_extender_ledger_gpus{state="held"} 2`,
		`gputopo_extender_scheduling_latency_seconds_count{phase="filter"} 2`,
		`gputopo_extender_prioritize_scores_bucket{le="10"} 3`,
	} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	x.core.Feed().DeleteTopology("a")
	if n, err := testutil.GatherAndCount(x.metrics.Registry, "gputopo_extender_gpu_utilization_percent"); err != nil || n != 0 {
		t.Errorf("utilization series after the topology went = %d, want 0", n)
	}
}
