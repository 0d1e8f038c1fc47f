package cluster

import (
	"context"
	"fmt"
	"math"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/ledger"
)

// Telemetry fallback reasons (see ledger.FallbackNoData and the others).
const (
	fallbackNoData     = ledger.FallbackNoData
	fallbackIncomplete = ledger.FallbackIncomplete
	fallbackStale      = ledger.FallbackStale
)

// ExternalSample is one GPU's telemetry read from Prometheus.
type ExternalSample = ledger.ExternalSample

// ExternalTelemetry is a query round's samples by node name and GPU UUID.
type ExternalTelemetry = ledger.ExternalTelemetry

// promTelemetry queries DCGM exporter metrics from Prometheus every
// interval and hands them to the ledger.
type promTelemetry struct {
	cfg    *configv1alpha1.PrometheusTelemetry
	api    promv1.API
	feed   placement.Feed
	report placement.Report
	obs    placement.Observer
	now    func() time.Time
	// lastFallback is the fallback count last logged, to log changes only.
	lastFallback int
}

func newPromTelemetry(cfg *configv1alpha1.PrometheusTelemetry, x *placement.Core, obs placement.Observer) (*promTelemetry, error) {
	c, err := promapi.NewClient(promapi.Config{Address: cfg.URL})
	if err != nil {
		return nil, fmt.Errorf("telemetry.prometheus.url %q: %w", cfg.URL, err)
	}
	return &promTelemetry{cfg: cfg, api: promv1.NewAPI(c), feed: x.Feed(), report: x.Report(), obs: obs, now: time.Now, lastFallback: -1}, nil
}

// run queries at once, then every interval, until ctx ends.
func (p *promTelemetry) run(ctx context.Context) {
	wait.UntilWithContext(ctx, p.round, p.cfg.Interval.Duration)
}

// round runs one query round. A failed round keeps the previous samples,
// which fall back node by node as they pass maxAge.
func (p *promTelemetry) round(ctx context.Context) {
	log := klog.FromContext(ctx).WithName("prometheus-telemetry")
	data, err := p.query(ctx)
	if err != nil {
		if p.obs != nil {
			p.obs.TelemetryRound(false, p.now())
		}
		log.Error(err, "query round failed; nodes keep their last samples until telemetry.prometheus.maxAge, then fall back to NodeGPUTopology telemetry", "url", p.cfg.URL)
		p.feed.RefreshExternalTelemetry()
	} else {
		if p.obs != nil {
			p.obs.TelemetryRound(true, p.now())
		}
		p.feed.SetExternalTelemetry(data)
	}
	bySource, fallback := p.report.TelemetrySources()
	total := 0
	for _, n := range fallback {
		total += n
	}
	if total != p.lastFallback {
		if total > 0 {
			log.Info("WARNING: nodes read NodeGPUTopology telemetry instead of Prometheus", "fallbackNodes", total,
				"noData", fallback[fallbackNoData], "incomplete", fallback[fallbackIncomplete], "stale", fallback[fallbackStale],
				"prometheusNodes", bySource[configv1alpha1.TelemetryPrometheus])
		} else {
			log.Info("every node reads Prometheus telemetry", "nodes", bySource[configv1alpha1.TelemetryPrometheus])
		}
		p.lastFallback = total
	}
}

// query reads the utilization, its scrape time, framebuffer, temperature,
// power and power limit of every GPU. A GPU counts only with utilization,
// scrape time, temperature and power all present.
func (p *promTelemetry) query(ctx context.Context) (ExternalTelemetry, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	sel := ""
	if p.cfg.Selector != "" {
		sel = "{" + p.cfg.Selector + "}"
	}
	type partial struct {
		s    ExternalSample
		have uint8
	}
	const (
		haveUtil = 1 << iota
		haveTime
		haveTemp
		havePower
		haveAll = haveUtil | haveTime | haveTemp | havePower
	)
	gpus := make(map[[2]string]*partial)
	m := p.cfg.Metrics
	for _, q := range []struct {
		expr string
		set  func(*partial, float64)
	}{
		{m.Utilization + sel, func(g *partial, v float64) { g.s.UtilizationPercent = toInt32(v); g.have |= haveUtil }},
		{"timestamp(" + m.Utilization + sel + ")", func(g *partial, v float64) {
			g.s.Time = time.Unix(0, int64(v*1e9))
			g.have |= haveTime
		}},
		{m.FramebufferUsed + sel, func(g *partial, v float64) { g.s.MemoryUsedMiB = int64(toInt32(v)) }},
		{m.Temperature + sel, func(g *partial, v float64) { g.s.TemperatureC = toInt32(v); g.have |= haveTemp }},
		{m.Power + sel, func(g *partial, v float64) { g.s.PowerWatts = toInt32(v); g.have |= havePower }},
		{m.PowerLimit + sel, func(g *partial, v float64) { g.s.PowerLimitWatts = toInt32(v) }},
	} {
		val, _, _, err := p.api.Query(ctx, q.expr, p.now())
		if err != nil {
			return nil, fmt.Errorf("query %s: %w", q.expr, err)
		}
		vec, ok := val.(model.Vector)
		if !ok {
			return nil, fmt.Errorf("query %s: got a %s, want a vector", q.expr, val.Type())
		}
		for _, smp := range vec {
			node := string(smp.Metric[model.LabelName(p.cfg.NodeLabel)])
			uuid := string(smp.Metric[model.LabelName(p.cfg.UUIDLabel)])
			if node == "" || uuid == "" {
				continue
			}
			k := [2]string{node, uuid}
			g := gpus[k]
			if g == nil {
				g = &partial{}
				gpus[k] = g
			}
			q.set(g, float64(smp.Value))
		}
	}
	out := make(ExternalTelemetry)
	for k, g := range gpus {
		if g.have != haveAll {
			continue
		}
		if out[k[0]] == nil {
			out[k[0]] = make(map[string]ExternalSample)
		}
		out[k[0]][k[1]] = g.s
	}
	return out, nil
}

// toInt32 rounds a sample value, mapping NaN and out-of-range values to 0
// and the int32 bounds.
func toInt32(v float64) int32 {
	switch {
	case math.IsNaN(v):
		return 0
	case v > math.MaxInt32:
		return math.MaxInt32
	case v < math.MinInt32:
		return math.MinInt32
	}
	return int32(math.Round(v))
}
