package extender

import (
	"context"
	"fmt"
	"math"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Telemetry fallback reasons: why a node reads its NodeGPUTopology
// telemetry although the prometheus source is configured.
const (
	fallbackNone = ""
	// fallbackNoData: Prometheus has no series for the node (exporter not
	// scraped, node label not matching, or Prometheus unreachable since
	// the extender started).
	fallbackNoData = "no_data"
	// fallbackIncomplete: some healthy GPU of the node has no complete
	// sample (utilization, temperature and power).
	fallbackIncomplete = "incomplete"
	// fallbackStale: the newest sample of some GPU is older than maxAge
	// (Prometheus or the exporter is down).
	fallbackStale = "stale"
)

var fallbackReasons = []string{fallbackNoData, fallbackIncomplete, fallbackStale}

// ExternalSample is one GPU's telemetry read from Prometheus.
type ExternalSample struct {
	UtilizationPercent int32
	MemoryUsedMiB      int64
	TemperatureC       int32
	PowerWatts         int32
	// PowerLimitWatts is 0 when Prometheus has none; the node agent's
	// limit is used then.
	PowerLimitWatts int32
	// Time is when the sample was scraped.
	Time time.Time
}

// ExternalTelemetry is a query round's samples by node name and GPU UUID.
type ExternalTelemetry map[string]map[string]ExternalSample

// useExternalTelemetry switches the ledger to prefer external telemetry
// no older than maxAge.
func (l *Ledger) useExternalTelemetry(maxAge time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.extMaxAge = maxAge
}

// SetExternalTelemetry records a successful query round: every node's
// samples are replaced by data (a node absent from it has none).
func (l *Ledger) SetExternalTelemetry(data ExternalTelemetry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.extData = data
	for _, n := range l.nodes {
		l.applyTelemetryLocked(n)
	}
}

// RefreshExternalTelemetry re-decides every node's telemetry source after
// a failed query round, so that samples age out into the fallback.
func (l *Ledger) RefreshExternalTelemetry() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.nodes {
		l.applyTelemetryLocked(n)
	}
}

// TelemetrySources counts nodes with a topology by the telemetry source
// prioritize reads, and the fallback ones by reason.
func (l *Ledger) TelemetrySources() (bySource map[string]int, fallback map[string]int) {
	bySource = map[string]int{TelemetryNodeGPUTopology: 0, TelemetryPrometheus: 0}
	fallback = make(map[string]int, len(fallbackReasons))
	for _, r := range fallbackReasons {
		fallback[r] = 0
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	for _, n := range l.nodes {
		if n.graph == nil {
			continue
		}
		bySource[n.telSource]++
		if n.fallback != fallbackNone {
			fallback[n.fallback]++
		}
	}
	return bySource, fallback
}

// NodeTelemetrySource says which source prioritize reads for node, and
// why it fell back, if it did.
func (l *Ledger) NodeTelemetrySource(node string) (source, fallback string) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if n, ok := l.nodes[node]; ok {
		return n.telSource, n.fallback
	}
	return "", ""
}

// applyTelemetryLocked picks the node's telemetry (external when
// configured, complete and fresh; else the NodeGPUTopology status), sets
// the values requests read and tells the metrics.
func (l *Ledger) applyTelemetryLocked(n *nodeState) {
	tel, at := n.statusTel, n.statusTelTime
	n.telSource, n.fallback = TelemetryNodeGPUTopology, fallbackNone
	if l.extMaxAge > 0 && n.graph != nil {
		if ext, extAt, reason := l.externalLocked(n); reason == fallbackNone {
			tel, at, n.telSource = ext, extAt, TelemetryPrometheus
		} else {
			n.fallback = reason
		}
	}
	n.telemetryNs = 0
	if !at.IsZero() {
		n.telemetryNs = at.UnixNano()
	}
	n.util, n.tel = nil, nil
	if n.graph != nil && len(tel) > 0 {
		size := n.graph.Len()
		n.util = make([]int32, size)
		if size <= len(n.telInline) {
			n.telInline = [len(n.telInline)]gpuTelemetry{}
			n.tel = n.telInline[:size]
		} else {
			n.tel = make([]gpuTelemetry, size)
		}
		for _, t := range tel {
			if t.Index < 0 || t.Index >= size {
				continue
			}
			n.util[t.Index] = min(max(t.UtilizationPercent, 0), 100)
			n.tel[t.Index] = gpuTelemetry{util: n.util[t.Index], tempC: t.TemperatureC, powerW: max(t.PowerWatts, 0), limitW: max(t.PowerLimitWatts, 0)}
		}
	}
	l.recomputeLocked(n)
	if l.onTelemetry != nil {
		if n.graph == nil {
			tel = nil
		}
		l.onTelemetry(n.name, n.graph, tel)
	}
}

// externalLocked converts the node's external samples to telemetry by GPU
// index. It succeeds only when every healthy GPU has a sample no older
// than extMaxAge: half a node on fresh numbers and half on old ones would
// compare GPUs measured at different times.
func (l *Ledger) externalLocked(n *nodeState) ([]v1alpha1.Telemetry, time.Time, string) {
	ext := l.extData[n.name]
	if len(ext) == 0 {
		return nil, time.Time{}, fallbackNoData
	}
	oldest := l.now().Add(-l.extMaxAge)
	limits := make(map[int]int32, len(n.statusTel))
	for _, t := range n.statusTel {
		limits[t.Index] = t.PowerLimitWatts
	}
	out := make([]v1alpha1.Telemetry, 0, n.graph.Len())
	var covered topology.Mask
	var at time.Time
	stale := false
	for uuid, s := range ext {
		i, ok := n.graph.IndexOf(uuid)
		if !ok {
			continue
		}
		if s.Time.Before(oldest) {
			stale = true
			continue
		}
		covered = covered.With(i)
		if at.IsZero() || s.Time.Before(at) {
			at = s.Time
		}
		limit := s.PowerLimitWatts
		if limit <= 0 {
			limit = limits[i]
		}
		out = append(out, v1alpha1.Telemetry{Index: i, UtilizationPercent: s.UtilizationPercent, MemoryUsedMiB: s.MemoryUsedMiB,
			TemperatureC: s.TemperatureC, PowerWatts: s.PowerWatts, PowerLimitWatts: limit})
	}
	if !n.graph.Healthy().Minus(covered).Empty() {
		if stale {
			return nil, time.Time{}, fallbackStale
		}
		return nil, time.Time{}, fallbackIncomplete
	}
	return out, at, fallbackNone
}

// promTelemetry queries DCGM exporter metrics from Prometheus every
// interval and hands them to the ledger.
type promTelemetry struct {
	cfg     *PrometheusTelemetry
	api     promv1.API
	ledger  *Ledger
	metrics *Metrics
	now     func() time.Time
	// lastFallback is the fallback count last logged, to log changes only.
	lastFallback int
}

func newPromTelemetry(cfg *PrometheusTelemetry, l *Ledger, m *Metrics) (*promTelemetry, error) {
	c, err := promapi.NewClient(promapi.Config{Address: cfg.URL})
	if err != nil {
		return nil, fmt.Errorf("telemetry.prometheus.url %q: %w", cfg.URL, err)
	}
	l.useExternalTelemetry(cfg.MaxAge.Duration)
	return &promTelemetry{cfg: cfg, api: promv1.NewAPI(c), ledger: l, metrics: m, now: time.Now, lastFallback: -1}, nil
}

// run queries at once, then every interval, until ctx ends.
func (p *promTelemetry) run(ctx context.Context) {
	t := time.NewTicker(p.cfg.Interval.Duration)
	defer t.Stop()
	for {
		p.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round runs one query round. A failed round keeps the previous samples,
// which fall back node by node as they pass maxAge.
func (p *promTelemetry) round(ctx context.Context) {
	log := klog.FromContext(ctx).WithName("prometheus-telemetry")
	data, err := p.query(ctx)
	if err != nil {
		p.metrics.promQueries.WithLabelValues("error").Inc()
		log.Error(err, "query round failed; nodes keep their last samples until telemetry.prometheus.maxAge, then fall back to NodeGPUTopology telemetry", "url", p.cfg.URL)
		p.ledger.RefreshExternalTelemetry()
	} else {
		p.metrics.promQueries.WithLabelValues("success").Inc()
		p.metrics.promLastSuccess.Set(float64(p.now().UnixNano()) / 1e9)
		p.ledger.SetExternalTelemetry(data)
	}
	bySource, fallback := p.ledger.TelemetrySources()
	total := 0
	for _, n := range fallback {
		total += n
	}
	if total != p.lastFallback {
		if total > 0 {
			log.Info("WARNING: nodes read NodeGPUTopology telemetry instead of Prometheus", "fallbackNodes", total,
				"noData", fallback[fallbackNoData], "incomplete", fallback[fallbackIncomplete], "stale", fallback[fallbackStale],
				"prometheusNodes", bySource[TelemetryPrometheus])
		} else {
			log.Info("every node reads Prometheus telemetry", "nodes", bySource[TelemetryPrometheus])
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
