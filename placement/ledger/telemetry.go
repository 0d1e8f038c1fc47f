package ledger

import (
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// Telemetry sources: where prioritize reads a node's telemetry from (the
// configuration's telemetry.source values).
const (
	SourceNodeGPUTopology = configv1alpha1.TelemetryNodeGPUTopology
	SourcePrometheus      = configv1alpha1.TelemetryPrometheus
)

// Telemetry fallback reasons: why a node reads its NodeGPUTopology
// telemetry although the prometheus source is configured.
const (
	FallbackNone = ""
	// FallbackNoData: Prometheus has no series for the node (exporter not
	// scraped, node label not matching, or Prometheus unreachable since
	// the extender started).
	FallbackNoData = "no_data"
	// FallbackIncomplete: some healthy GPU of the node has no complete
	// sample (utilization, temperature and power).
	FallbackIncomplete = "incomplete"
	// FallbackStale: the newest sample of some GPU is older than maxAge
	// (Prometheus or the exporter is down).
	FallbackStale = "stale"
)

var fallbackReasons = []string{FallbackNoData, FallbackIncomplete, FallbackStale}

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
func (r Report) TelemetrySources() (bySource map[string]int, fallback map[string]int) {
	l := r.l
	bySource = map[string]int{SourceNodeGPUTopology: 0, SourcePrometheus: 0}
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
		if n.fallback != FallbackNone {
			fallback[n.fallback]++
		}
	}
	return bySource, fallback
}

// NodeTelemetrySource says which source prioritize reads for node, and
// why it fell back, if it did.
func (r Report) NodeTelemetrySource(node string) (source, fallback string) {
	l := r.l
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
func (l *Ledger) applyTelemetryLocked(n *Node) {
	tel, at := n.statusTel, n.statusTelTime
	n.telSource, n.fallback = SourceNodeGPUTopology, FallbackNone
	if l.extMaxAge > 0 && n.graph != nil {
		if ext, extAt, reason := l.externalLocked(n); reason == FallbackNone {
			tel, at, n.telSource = ext, extAt, SourcePrometheus
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
			n.telInline = [len(n.telInline)]GPUTelemetry{}
			n.tel = n.telInline[:size]
		} else {
			n.tel = make([]GPUTelemetry, size)
		}
		for _, t := range tel {
			if t.Index < 0 || t.Index >= size {
				continue
			}
			n.util[t.Index] = min(max(t.UtilizationPercent, 0), 100)
			n.tel[t.Index] = GPUTelemetry{Util: n.util[t.Index], TempC: t.TemperatureC, PowerW: max(t.PowerWatts, 0), LimitW: max(t.PowerLimitWatts, 0)}
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
func (l *Ledger) externalLocked(n *Node) ([]v1alpha1.Telemetry, time.Time, string) {
	ext := l.extData[n.name]
	if len(ext) == 0 {
		return nil, time.Time{}, FallbackNoData
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
			return nil, time.Time{}, FallbackStale
		}
		return nil, time.Time{}, FallbackIncomplete
	}
	return out, at, FallbackNone
}
