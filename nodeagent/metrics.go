package nodeagent

import (
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Metrics are the node agent's Prometheus series. Per-GPU series carry the
// node and the GPU index only: a DaemonSet's series are per node already,
// and a UUID label would add nothing a join with NodeGPUTopology cannot.
// A nil *Metrics records nothing, so tests need not build one.
type Metrics struct {
	node        string
	utilization *prometheus.GaugeVec
	memoryUsed  *prometheus.GaugeVec
	temperature *prometheus.GaugeVec
	power       *prometheus.GaugeVec
	powerLimit  *prometheus.GaugeVec
	nvmlErrors  *prometheus.CounterVec
	xids        *prometheus.CounterVec
	allocations *prometheus.CounterVec
	// allocateDuration times kubelet's Allocate calls.
	allocateDuration prometheus.Histogram
	preferred        *prometheus.CounterVec
	drift            prometheus.Counter
	apiWrites        *prometheus.CounterVec
	// inconsistencies counts, per topology read, each disagreement in
	// NVML's answers by kind (see inconsistencyKinds).
	inconsistencies *prometheus.CounterVec
	// envIsolation is the start-up check of whether a container's
	// environment can select GPUs (CheckEnvIsolation): one series, the
	// check's reason.
	envIsolation *prometheus.GaugeVec
}

// inconsistencyKinds are the label values of
// gputopo_nodeagent_topology_inconsistencies_total, one per reason of the
// TopologyConsistent condition.
var inconsistencyKinds = map[string]string{
	v1alpha1.ReasonAsymmetricLink:     "asymmetric_link",
	v1alpha1.ReasonUnknownRemoteBusID: "unknown_remote_bus_id",
	v1alpha1.ReasonDuplicateBusID:     "duplicate_bus_id",
}

// NewMetrics registers the agent's series with reg.
func NewMetrics(reg prometheus.Registerer, node string) *Metrics {
	gpu := []string{"node", "gpu"}
	m := &Metrics{
		node: node,
		utilization: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gputopo_nodeagent_gpu_utilization_percent",
			Help: "GPU compute utilization, 0..100."}, gpu),
		memoryUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gputopo_nodeagent_gpu_memory_used_bytes",
			Help: "GPU framebuffer memory in use."}, gpu),
		temperature: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gputopo_nodeagent_gpu_temperature_celsius",
			Help: "GPU core temperature."}, gpu),
		power: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gputopo_nodeagent_gpu_power_watts",
			Help: "GPU power draw."}, gpu),
		powerLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gputopo_nodeagent_gpu_power_limit_watts",
			Help: "GPU enforced power limit."}, gpu),
		nvmlErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gputopo_nodeagent_nvml_errors_total",
			Help: "NVML calls that did not succeed, by call and return code (ERROR_NOT_SUPPORTED included)."}, []string{"call", "return"}),
		xids: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gputopo_nodeagent_xid_events_total",
			Help: "XID events seen, by XID and class (critical marks the GPU unhealthy)."}, []string{"xid", "class"}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gputopo_nodeagent_allocations_total",
			Help: "Device plugin Allocate answers, per container; result ok or error."}, []string{"result"}),
		allocateDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "gputopo_nodeagent_allocate_duration_seconds",
			Help:    "Time to answer kubelet's Allocate call (all containers of the request), from request to answer.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}),
		preferred: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gputopo_nodeagent_preferred_allocations_total",
			Help: "GetPreferredAllocation answers by source: plan (the extender's assigned-gpus), topology (local allocator, no plan) or none."}, []string{"source"}),
		drift: prometheus.NewCounter(prometheus.CounterOpts{Name: "gputopo_nodeagent_assignment_drift_total",
			Help: "Pods whose allocated GPUs (kubelet's truth) differ from the extender's assigned GPUs (the plan)."}),
		apiWrites: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gputopo_nodeagent_api_writes_total",
			Help: "Writes to the API server, by kind (topology, telemetry, pod, event) and result."}, []string{"kind", "result"}),
		inconsistencies: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "gputopo_nodeagent_topology_inconsistencies_total",
			Help: "Disagreements in NVML's topology answers, counted at every topology read, by kind (asymmetric_link, unknown_remote_bus_id, duplicate_bus_id); a lasting one keeps rising."}, []string{"kind"}),
		envIsolation: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "gputopo_nodeagent_env_isolation",
			Help: "1 when a container's environment (env, envFrom) cannot select GPUs on this node as far as the NVIDIA container toolkit's configuration says, else 0; checked at start. reason: envvar_ignored (1), envvar_accepted, envvar_strategy, unknown (no configuration read), config_error."}, []string{"reason"}),
	}
	reg.MustRegister(m.utilization, m.memoryUsed, m.temperature, m.power, m.powerLimit,
		m.nvmlErrors, m.xids, m.allocations, m.allocateDuration, m.preferred, m.drift, m.apiWrites, m.inconsistencies, m.envIsolation)
	return m
}

func (m *Metrics) nvmlError(call string, ret nvml.Return) {
	if m == nil {
		return
	}
	m.nvmlErrors.WithLabelValues(call, ret.Error()).Inc()
}

func (m *Metrics) xid(xid uint64, class XIDClass) {
	if m == nil {
		return
	}
	m.xids.WithLabelValues(strconv.FormatUint(xid, 10), string(class)).Inc()
}

func (m *Metrics) observeTelemetry(t v1alpha1.Telemetry) {
	if m == nil {
		return
	}
	l := []string{m.node, strconv.Itoa(t.Index)}
	m.utilization.WithLabelValues(l...).Set(float64(t.UtilizationPercent))
	m.memoryUsed.WithLabelValues(l...).Set(float64(t.MemoryUsedMiB) * (1 << 20))
	m.temperature.WithLabelValues(l...).Set(float64(t.TemperatureC))
	m.power.WithLabelValues(l...).Set(float64(t.PowerWatts))
	m.powerLimit.WithLabelValues(l...).Set(float64(t.PowerLimitWatts))
}

func (m *Metrics) allocation(ok bool) {
	if m == nil {
		return
	}
	r := "ok"
	if !ok {
		r = "error"
	}
	m.allocations.WithLabelValues(r).Inc()
}

// allocateTimer starts timing an Allocate call; the returned function
// records it.
func (m *Metrics) allocateTimer() func() {
	if m == nil {
		return func() {}
	}
	t := prometheus.NewTimer(m.allocateDuration)
	return func() { t.ObserveDuration() }
}

func (m *Metrics) preferredFrom(source string) {
	if m == nil {
		return
	}
	m.preferred.WithLabelValues(source).Inc()
}

func (m *Metrics) driftSeen() {
	if m == nil {
		return
	}
	m.drift.Inc()
}

func (m *Metrics) apiWrite(kind string, err error) {
	if m == nil {
		return
	}
	r := "ok"
	if err != nil {
		r = "error"
	}
	m.apiWrites.WithLabelValues(kind, r).Inc()
}

func (m *Metrics) inconsistency(reason string) {
	if m == nil {
		return
	}
	m.inconsistencies.WithLabelValues(inconsistencyKinds[reason]).Inc()
}

// setEnvIsolation records the environment isolation check: the one series
// of its reason.
func (m *Metrics) setEnvIsolation(r EnvIsolation) {
	if m == nil {
		return
	}
	m.envIsolation.Reset()
	v := 0.0
	if r.Isolated {
		v = 1
	}
	m.envIsolation.WithLabelValues(r.Reason).Set(v)
}
