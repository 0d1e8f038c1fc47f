// Package dashboard checks that what operators read about metrics (the
// Grafana dashboard, the PrometheusRule, the docs) names only metrics the
// code exports, so that a rename cannot leave an empty panel, a silent
// alert or a stale page behind. No API server.
package dashboard

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/placement/ledger"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/placement/metrics"
)

// capture is a Registerer that keeps what is registered.
type capture struct{ cs []prometheus.Collector }

func (c *capture) Register(x prometheus.Collector) error   { c.cs = append(c.cs, x); return nil }
func (c *capture) MustRegister(xs ...prometheus.Collector) { c.cs = append(c.cs, xs...) }
func (c *capture) Unregister(prometheus.Collector) bool    { return true }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// exported is every metric name the extender and the node agent export,
// with a histogram's _bucket, _sum and _count series.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		metrics.New(ledger.New(ledger.Options{}).Report()).Describe(ch)
		var c capture
		nodeagent.NewMetrics(&c, "n")
		for _, x := range c.cs {
			x.Describe(ch)
		}
		close(ch)
	}()
	names := map[string]bool{}
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("no fqName in %s", d)
		}
		names[m[1]] = true
		for _, s := range []string{"_bucket", "_sum", "_count"} {
			names[m[1]+s] = true
		}
	}
	for _, want := range []string{"gputopo_extender_scheduling_latency_seconds", "gputopo_extender_filter_results_total",
		"gputopo_extender_prioritize_scores", "gputopo_extender_gpu_utilization_percent", "gputopo_extender_errors_total"} {
		if !names[want] {
			t.Errorf("the design's metric %s is not exported", want)
		}
		// Its design name, deprecated, for one release (docs/extender.md).
		if old := "gpu_extender_" + strings.TrimPrefix(want, "gputopo_extender_"); !names[old] {
			t.Errorf("the deprecated name %s of %s is not exported", old, want)
		}
	}
	return names
}

// ours are gputopo's metric names in a text (the gputopo_ ones and the
// deprecated gpu_extender_ names of five of them).
var ours = regexp.MustCompile(`\b(?:gpu_extender|gputopo)_[a-z0-9_]*[a-z0-9]\b`)

func repo(parts ...string) string {
	return filepath.Join(append([]string{localcluster.RepoRoot()}, parts...)...)
}

type dashboard struct {
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

func TestEveryDashboardPanelQueriesAnExportedMetric(t *testing.T) {
	names := exported(t)
	b, err := os.ReadFile(repo("charts", "gputopo", "files", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if len(d.Panels) == 0 {
		t.Fatal("dashboard has no panels")
	}
	charted := map[string]bool{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %d %q has no query", p.ID, p.Title)
		}
		for _, q := range p.Targets {
			used := ours.FindAllString(q.Expr, -1)
			if len(used) == 0 {
				t.Errorf("panel %d %q: query %q names no gputopo metric", p.ID, p.Title, q.Expr)
			}
			for _, m := range used {
				charted[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count"), "_sum")] = true
				if !names[m] {
					t.Errorf("panel %d %q: %s is not exported (query %q)", p.ID, p.Title, m, q.Expr)
				}
			}
		}
	}
	for _, v := range d.Templating.List {
		for _, m := range ours.FindAllString(v.Definition, -1) {
			if !names[m] {
				t.Errorf("variable %s: %s is not exported", v.Name, m)
			}
		}
	}
	// What the issue asked operators to see: ledger, drift, tiers, XIDs,
	// Allocate latency, shadow differences.
	for _, want := range []string{"gputopo_extender_ledger_gpus", "gputopo_nodeagent_assignment_drift_total",
		"gputopo_extender_placements_total", "gputopo_nodeagent_xid_events_total",
		"gputopo_nodeagent_allocate_duration_seconds", "gputopo_extender_shadow_differences_total",
		"gputopo_extender_gpu_temperature_celsius"} {
		if !charted[want] {
			t.Errorf("no panel charts %s", want)
		}
	}
}

func TestEveryAlertQueriesAnExportedMetric(t *testing.T) {
	names := exported(t)
	b, err := os.ReadFile(repo("charts", "gputopo", "templates", "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	exprs := regexp.MustCompile(`(?m)^\s*expr: (.+)$`).FindAllStringSubmatch(string(b), -1)
	if len(exprs) == 0 {
		t.Fatal("prometheusrule.yaml has no expr")
	}
	for _, e := range exprs {
		used := ours.FindAllString(e[1], -1)
		if len(used) == 0 {
			t.Errorf("alert expression %q names no gputopo metric", e[1])
		}
		for _, m := range used {
			if !names[m] {
				t.Errorf("alert expression %q: %s is not exported", e[1], m)
			}
		}
	}
}

// Every metric name the docs, the README and the chart's values and
// templates mention is one the code exports.
func TestDocsNameOnlyExportedMetrics(t *testing.T) {
	names := exported(t)
	files, err := filepath.Glob(repo("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob(repo("charts", "gputopo", "templates", "*"))
	files = append(append(files, repo("README.md"), repo("charts", "gputopo", "values.yaml")), more...)
	var missing []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ours.FindAllString(string(b), -1) {
			if !names[m] {
				missing = append(missing, filepath.Base(f)+": "+m)
			}
		}
	}
	sort.Strings(missing)
	missing = slices.Compact(missing)
	for _, m := range missing {
		t.Errorf("%s is not an exported metric", m)
	}
}
