package metrics

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/topology"
)

// Metrics are a gputopo scheduler's Prometheus metrics (both front ends
// export the same names), on a registry of their own so that tests and
// several in-process cores never collide. It is the core's Observer. Every
// name is gputopo_extender_*; five are also exported under their earlier
// gpu_extender_* names, deprecated (withDeprecatedName).
type Metrics struct {
	Registry *prometheus.Registry
	// collectors are everything registered, for Describe.
	collectors []prometheus.Collector
	// Leader reports whether this replica serves; the per-GPU gauges are
	// exported only then, so that standbys do not repeat every GPU's
	// series. nil: always.
	Leader func() bool
	// TopologyClock gives the time and topologyMaxAge the topology
	// states are judged at (nil: no age check).
	TopologyClock func() (time.Time, time.Duration)

	latency       *prometheus.HistogramVec
	filterResults *prometheus.CounterVec
	// filterCounters are filterResults' children, resolved once each:
	// the plugin build counts node by node. Index 0 is passed, 1+code
	// failed with that reason.
	filterCounters [placement.NumReasons]atomic.Pointer[prometheus.Counter]
	scores         *scoreHistogram
	utilization    *prometheus.GaugeVec
	temperature    *prometheus.GaugeVec
	errors         *prometheus.CounterVec
	placements     *prometheus.CounterVec
	// heuristic counts bound placements whose GPUs the allocator chose
	// heuristically (its exact search's work budget ran out).
	heuristic prometheus.Counter
	// patience counts decisions for pods inside their patience window
	// with evidence of faster GPUs freeing, by outcome.
	patience *prometheus.CounterVec

	promQueries     *prometheus.CounterVec
	promLastSuccess prometheus.Gauge

	// doubleHeldDetections counts GPUs found held by more than one pod
	// (each new pair or group once); the gauge of those held now is read
	// from the ledger at scrape time.
	doubleHeldDetections prometheus.Counter

	// Shadow mode: mirrors sent by a serving extender, and decisions
	// compared by a shadow one.
	shadowMirrors     *prometheus.CounterVec
	shadowDecisions   *prometheus.CounterVec
	shadowDifferences *prometheus.CounterVec
	shadowFilterNodes *prometheus.CounterVec

	telMu     sync.Mutex
	published map[string][][2]string // node -> (gpu_index, metric) series set
}

// Label values of the HTTP front end's phases and errors (the core's are
// placement.Phase and placement.ErrorKind).
const (
	PhaseShadow = "shadow"

	ErrDecode   = "decode"
	ErrTooLarge = "request_too_large"
	// ErrUnauthorized: a verb call without a client certificate for
	// client authentication (401); ErrForbidden: one whose CN
	// --client-allowed-names does not name (403).
	ErrUnauthorized = "unauthorized"
	ErrForbidden    = "forbidden"
	ErrNotReady     = "not_ready"
)

// New registers the metrics of a core whose ledger reports l on a fresh
// registry, with the Go and process collectors, and mirrors l's telemetry
// into the per-GPU gauges.
func New(l placement.Report) *Metrics {
	// The five metrics also exported under a deprecated name
	// (deprecated.go): their options are needed twice.
	var (
		latency = prometheus.HistogramOpts{
			Name:    "gputopo_extender_scheduling_latency_seconds",
			Help:    "Time to answer a scheduler extender call, by phase (filter, prioritize, bind, preempt), including decoding.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}
		latencyLabels = []string{"phase"}
		filterResults = prometheus.CounterOpts{
			Name: "gputopo_extender_filter_results_total",
			Help: "Nodes passed or failed by filter; reason is a bounded code (the pod sees the full text).",
		}
		filterLabels = []string{"result", "reason"}
		scores       = prometheus.Opts{
			Name: "gputopo_extender_prioritize_scores",
			Help: "Distribution of prioritize scores 0..10. No node label: thousands of nodes would explode cardinality.",
		}
		utilization = prometheus.GaugeOpts{
			Name: "gputopo_extender_gpu_utilization_percent",
			Help: "GPU telemetry as the extender sees it, in percent: metric=compute, memory (of the GPU's memory), power (of its enforced limit). Exported by the serving replica (the leader) only.",
		}
		utilizationLabels = []string{"node", "gpu_index", "metric"}
		errorsOpts        = prometheus.CounterOpts{
			Name: "gputopo_extender_errors_total",
			Help: "Errors by phase and type.",
		}
		errorsLabels = []string{"phase", "error_type"}
	)
	m := &Metrics{
		Registry:      prometheus.NewRegistry(),
		latency:       prometheus.NewHistogramVec(latency, latencyLabels),
		filterResults: prometheus.NewCounterVec(filterResults, filterLabels),
		scores:        newScoreHistogram(prometheus.NewDesc(scores.Name, scores.Help, nil, nil)),
		utilization:   prometheus.NewGaugeVec(utilization, utilizationLabels),
		temperature: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gputopo_extender_gpu_temperature_celsius",
			Help: "GPU core temperature as the extender sees it (prioritize's thermal headroom), degrees Celsius. Exported by the serving replica (the leader) only.",
		}, []string{"node", "gpu_index"}),
		errors: prometheus.NewCounterVec(errorsOpts, errorsLabels),
		placements: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gputopo_extender_placements_total",
			Help: "Bound placements by the link tier the requirement asked for and the tier achieved.",
		}, []string{"requested_tier", "achieved_tier"}),
		heuristic: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gputopo_extender_heuristic_placements_total",
			Help: "Bound placements whose GPUs were chosen by the allocator's documented heuristic: its exact search ran out of work budget, or the node has more than 64 free GPUs and was searched through a window of them (placement record heuristic=true).",
		}),
		patience: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gputopo_extender_patience_decisions_total",
			Help: "Decisions for a model-parallel pod inside its patience window (patience.bandwidthWait) with evidence that faster GPUs free in time, by outcome: waited (slower sets refused) or placed (the GPUs expected to free did not cover the pod and the pods waiting ahead of it, so it took the best free set).",
		}, []string{"outcome"}),
		promQueries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gputopo_extender_prometheus_query_rounds_total",
			Help: "Telemetry query rounds against Prometheus (telemetry.source: prometheus) by result (success, error).",
		}, []string{"result"}),
		promLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gputopo_extender_prometheus_last_success_timestamp_seconds",
			Help: "Unix time of the last successful telemetry query round against Prometheus; 0 before the first.",
		}),
		doubleHeldDetections: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gputopo_extender_ledger_double_held_detections_total",
			Help: "Times the ledger found a GPU held by more than one live pod (each new group of pods on a GPU once). Both holdings are kept; see gputopo_extender_ledger_double_held_gpus and the pods' GPUDoubleHeld Events.",
		}),
		shadowMirrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gputopo_extender_shadow_mirrored_requests_total",
			Help: "Filter and prioritize requests mirrored to the shadow extender (--shadow-url), by verb and result: sent, error (shadow unreachable or refused), dropped (mirror queue full).",
		}, []string{"verb", "result"}),
		shadowDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gputopo_extender_shadow_decisions_total",
			Help: "Mirrored decisions this shadow extender (--shadow) compared, by verb and result (same, different).",
		}, []string{"verb", "result"}),
		shadowDifferences: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gputopo_extender_shadow_differences_total",
			Help: "Differing decisions by kind: filter (some node filtered differently), top_node (a different node ranked first), gpus (different GPUs on the serving extender's top node).",
		}, []string{"kind"}),
		shadowFilterNodes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gputopo_extender_shadow_filter_node_differences_total",
			Help: "Nodes filtered differently: shadow_rejects (the serving extender passed the node, the shadow would not), shadow_accepts (the reverse).",
		}, []string{"direction"}),
	}
	perGPU := func() bool { return m.Leader == nil || m.Leader() }
	m.collectors = []prometheus.Collector{
		withDeprecatedName(m.latency, latency.Name, latency.Help, latencyLabels),
		withDeprecatedName(m.filterResults, filterResults.Name, filterResults.Help, filterLabels),
		withDeprecatedName(m.scores, scores.Name, scores.Help, nil),
		withDeprecatedName(m.errors, errorsOpts.Name, errorsOpts.Help, errorsLabels),
		m.placements, m.heuristic, m.patience,
		withDeprecatedName(&gated{c: m.utilization, on: perGPU}, utilization.Name, utilization.Help, utilizationLabels),
		&gated{c: m.temperature, on: perGPU},
		m.promQueries, m.promLastSuccess, m.doubleHeldDetections, m.shadowMirrors, m.shadowDecisions, m.shadowDifferences, m.shadowFilterNodes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		ledgerCollector(l), topologyStateCollector(l, m), telemetrySourceCollector(l)}
	m.Registry.MustRegister(m.collectors...)
	l.OnTelemetry(m.setTelemetry)
	return m
}

// scrape is a collector that reads its values at scrape time, so that a
// gauge is never out of step and costs nothing between scrapes.
type scrape struct {
	descs   []*prometheus.Desc
	collect func(ch chan<- prometheus.Metric, descs []*prometheus.Desc)
}

func (c *scrape) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *scrape) Collect(ch chan<- prometheus.Metric) { c.collect(ch, c.descs) }

// gauge sends one gauge sample.
func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v int, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
}

// ledgerCollector reads the ledger's GPU counts.
func ledgerCollector(l placement.Report) *scrape {
	return &scrape{descs: []*prometheus.Desc{prometheus.NewDesc("gputopo_extender_ledger_gpus",
		"GPUs in the extender's ledger by state (free, held, reserved, unhealthy, total).", []string{"state"}, nil),
		prometheus.NewDesc("gputopo_extender_ledger_double_held_gpus",
			"GPUs held by more than one live pod now (each counted once in gputopo_extender_ledger_gpus). 0 in a healthy cluster.", nil, nil),
		prometheus.NewDesc("gputopo_extender_group_reservations",
			"Waiting groups whose GPUs are kept from later pods of their priority or lower now (fabric.reserveAfter).", nil, nil),
		prometheus.NewDesc("gputopo_extender_group_reserved_gpus",
			"GPUs kept for waiting groups, by whether they are free now (free) or still held by the pods the group waits for (held).", []string{"state"}, nil),
		prometheus.NewDesc("gputopo_extender_group_reservation_oldest_seconds",
			"How long the oldest reservation for a waiting group has lasted; 0 when none.", nil, nil)},
		collect: func(ch chan<- prometheus.Metric, d []*prometheus.Desc) {
			n := l.Counts()
			for state, v := range map[string]int{"total": n.Total, "free": n.Free, "held": n.Held, "reserved": n.Reserved, "unhealthy": n.Unhealthy} {
				gauge(ch, d[0], v, state)
			}
			gauge(ch, d[1], n.DoubleHeld)
			rs := l.GroupReservations()
			var free, kept int
			oldest := time.Duration(0)
			for _, r := range rs {
				free += r.Free
				kept += r.GPUs
				oldest = max(oldest, r.Age)
			}
			gauge(ch, d[2], len(rs))
			gauge(ch, d[3], free, "free")
			gauge(ch, d[3], kept-free, "held")
			ch <- prometheus.MustNewConstMetric(d[4], prometheus.GaugeValue, oldest.Seconds())
		}}
}

// topologyStateCollector counts nodes by topology state.
func topologyStateCollector(l placement.Report, m *Metrics) *scrape {
	return &scrape{descs: []*prometheus.Desc{prometheus.NewDesc("gputopo_extender_topology_nodes",
		"Nodes by the state of their NodeGPUTopology as filter judges it: fresh, missing (the Node advertises GPUs, no topology), invalid, agent_stale (the node agent marked it stale), old (observedTime missing, older than topologyMaxAge or ahead of the clock), untrusted (its GPU count disagrees with the Node's capacity or allocatable, it lists a GPU UUID another node listed first, or a DRA driver's ResourceSlices list a GPU it does not or serve a node the device plugin also serves). Nodes in any state but fresh are refused.", []string{"state"}, nil),
		prometheus.NewDesc("gputopo_extender_topology_duplicate_gpus",
			"GPU UUIDs that more than one node's NodeGPUTopology lists now (one GPU is in one machine); 0 in a healthy cluster. The node that listed one later is refused as untrusted.", nil, nil)},
		collect: func(ch chan<- prometheus.Metric, d []*prometheus.Desc) {
			now, maxAge := time.Now(), time.Duration(0)
			if m.TopologyClock != nil {
				now, maxAge = m.TopologyClock()
			}
			for state, n := range l.TopologyStates(now, maxAge) {
				gauge(ch, d[0], n, state)
			}
			gauge(ch, d[1], l.DuplicateGPUs())
		}}
}

// telemetrySourceCollector counts nodes by telemetry source.
func telemetrySourceCollector(l placement.Report) *scrape {
	return &scrape{descs: []*prometheus.Desc{prometheus.NewDesc("gputopo_extender_telemetry_source_nodes",
		"Nodes by the telemetry source prioritize reads (nodeGPUTopology, prometheus).", []string{"source"}, nil),
		prometheus.NewDesc("gputopo_extender_telemetry_fallback_nodes",
			"Warning: nodes reading NodeGPUTopology telemetry although telemetry.source is prometheus, by reason (no_data, incomplete, stale). Always 0 with source nodeGPUTopology.", []string{"reason"}, nil)},
		collect: func(ch chan<- prometheus.Metric, d []*prometheus.Desc) {
			bySource, fallback := l.TelemetrySources()
			for s, n := range bySource {
				gauge(ch, d[0], n, s)
			}
			for r, n := range fallback {
				gauge(ch, d[1], n, r)
			}
		}}
}

// Describe sends the description of every metric the extender exports
// (the dashboard's test checks its queries against them).
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors {
		c.Describe(ch)
	}
}

// gated exports c's series only while on says so.
type gated struct {
	c  prometheus.Collector
	on func() bool
}

func (g *gated) Describe(ch chan<- *prometheus.Desc) { g.c.Describe(ch) }

func (g *gated) Collect(ch chan<- prometheus.Metric) {
	if g.on() {
		g.c.Collect(ch)
	}
}

// seriesTemperature marks a published temperature series (its own gauge).
const seriesTemperature = "temperature"

// setTelemetry mirrors a node's telemetry into the utilization gauge; a nil
// graph removes the node's series. It deletes exactly the series it made
// before (DeletePartialMatch scans every series: quadratic over a cluster).
func (m *Metrics) setTelemetry(node string, g *topology.Graph, tel []v1alpha1.Telemetry) {
	m.telMu.Lock()
	defer m.telMu.Unlock()
	if m.published == nil {
		m.published = make(map[string][][2]string)
	}
	var now [][2]string
	if g != nil {
		gpus := g.GPUs()
		for _, t := range tel {
			idx := strconv.Itoa(t.Index)
			set := func(metric string, v float64) {
				if metric == seriesTemperature {
					m.temperature.WithLabelValues(node, idx).Set(v)
				} else {
					m.utilization.WithLabelValues(node, idx, metric).Set(v)
				}
				now = append(now, [2]string{idx, metric})
			}
			set("compute", float64(t.UtilizationPercent))
			set(seriesTemperature, float64(t.TemperatureC))
			if t.Index >= 0 && t.Index < len(gpus) && gpus[t.Index].MemoryMiB > 0 {
				set("memory", 100*float64(t.MemoryUsedMiB)/float64(gpus[t.Index].MemoryMiB))
			}
			if t.PowerLimitWatts > 0 {
				set("power", 100*float64(t.PowerWatts)/float64(t.PowerLimitWatts))
			}
		}
	}
	keep := make(map[[2]string]bool, len(now))
	for _, k := range now {
		keep[k] = true
	}
	for _, k := range m.published[node] {
		switch {
		case keep[k]:
		case k[1] == seriesTemperature:
			m.temperature.DeleteLabelValues(node, k[0])
		default:
			m.utilization.DeleteLabelValues(node, k[0], k[1])
		}
	}
	if len(now) == 0 {
		delete(m.published, node)
	} else {
		m.published[node] = now
	}
}

// scoreHistogram is the distribution of prioritize scores, buckets 0..10.
// Scores are integers, so a request counts them per value and adds its
// counts once: one lock per request instead of one observation per node.
type scoreHistogram struct {
	desc   *prometheus.Desc
	mu     sync.Mutex
	counts [placement.MaxScore + 1]uint64
	sum    float64
}

var _ prometheus.Collector = (*scoreHistogram)(nil)

func newScoreHistogram(desc *prometheus.Desc) *scoreHistogram { return &scoreHistogram{desc: desc} }

// add records a request's scores: counts[s] nodes scored s.
func (h *scoreHistogram) add(counts *[placement.MaxScore + 1]uint64) {
	var sum float64
	for s, n := range counts {
		sum += float64(s) * float64(n)
	}
	h.mu.Lock()
	for s, n := range counts {
		h.counts[s] += n
	}
	h.sum += sum
	h.mu.Unlock()
}

func (h *scoreHistogram) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

func (h *scoreHistogram) Collect(ch chan<- prometheus.Metric) {
	h.mu.Lock()
	buckets := make(map[float64]uint64, len(h.counts))
	var cum uint64
	for s, n := range h.counts {
		cum += n
		buckets[float64(s)] = cum
	}
	sum := h.sum
	h.mu.Unlock()
	ch <- prometheus.MustNewConstHistogram(h.desc, cum, sum, buckets)
}

// Filtered implements placement.Observer: filterResults by reason, each
// counter resolved once (the plugin build counts node by node).
func (m *Metrics) Filtered(reason placement.Reason, n int) {
	if reason >= placement.NumReasons {
		reason = placement.ReasonInfeasible
	}
	c := m.filterCounters[reason].Load()
	if c == nil {
		var ctr prometheus.Counter
		if reason == placement.ReasonNone {
			ctr = m.filterResults.WithLabelValues("passed", "")
		} else {
			ctr = m.filterResults.WithLabelValues("failed", reason.String())
		}
		m.filterCounters[reason].Store(&ctr)
		c = &ctr
	}
	(*c).Add(float64(n))
}

// Scored implements placement.Observer.
func (m *Metrics) Scored(counts *[placement.MaxScore + 1]uint64) { m.scores.add(counts) }

// Failed implements placement.Observer.
func (m *Metrics) Failed(phase placement.Phase, kind placement.ErrorKind) {
	m.Error(string(phase), string(kind))
}

// Error counts an error of a front end's phase and kind.
func (m *Metrics) Error(phase, kind string) { m.errors.WithLabelValues(phase, kind).Inc() }

// Bound implements placement.Observer.
func (m *Metrics) Bound(requested string, p v1alpha1.Placement) {
	m.placements.WithLabelValues(requested, string(p.Tier)).Inc()
	if p.Heuristic {
		m.heuristic.Inc()
	}
}

// DoubleHeld implements placement.Observer.
func (m *Metrics) DoubleHeld(n int) { m.doubleHeldDetections.Add(float64(n)) }

// TelemetryRound implements placement.Observer.
func (m *Metrics) TelemetryRound(ok bool, at time.Time) {
	if !ok {
		m.promQueries.WithLabelValues("error").Inc()
		return
	}
	m.promQueries.WithLabelValues("success").Inc()
	m.promLastSuccess.Set(float64(at.UnixNano()) / 1e9)
}

// Patience implements placement.Observer.
func (m *Metrics) Patience(waited bool) {
	if waited {
		m.patience.WithLabelValues("waited").Inc()
		return
	}
	m.patience.WithLabelValues("placed").Inc()
}

// Latency records how long a front end took to answer a phase.
func (m *Metrics) Latency(phase string, d time.Duration) {
	m.latency.WithLabelValues(phase).Observe(d.Seconds())
}

// ShadowMirrored counts a request mirrored to the shadow, by result.
func (m *Metrics) ShadowMirrored(verb, result string) {
	m.shadowMirrors.WithLabelValues(verb, result).Inc()
}

// ShadowCompared counts a decision the shadow compared: its result, the
// kinds of differences and the nodes filtered differently by direction.
func (m *Metrics) ShadowCompared(verb, result string, kinds []string, directions []string) {
	for _, k := range kinds {
		m.shadowDifferences.WithLabelValues(k).Inc()
	}
	for _, d := range directions {
		m.shadowFilterNodes.WithLabelValues(d).Inc()
	}
	m.shadowDecisions.WithLabelValues(verb, result).Inc()
}

var _ placement.Observer = (*Metrics)(nil)
