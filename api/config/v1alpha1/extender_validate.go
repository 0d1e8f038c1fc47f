package v1alpha1

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Validate reports every invalid field at once, with its path.
func (c *ExtenderConfiguration) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.APIVersion != ExtenderAPIVersion && c.APIVersion != ExtenderLegacyAPIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{ExtenderAPIVersion, ExtenderLegacyAPIVersion}))
	}
	if c.Kind != ExtenderKind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{ExtenderKind}))
	}
	wp := field.NewPath("weights")
	if _, ok := weightProfiles[c.Weights.Profile]; !ok {
		errs = append(errs, field.NotSupported(wp.Child("profile"), c.Weights.Profile, []string{WeightsPlacement, WeightsDesign}))
	}
	var sum int64
	for _, w := range c.Weights.fields() {
		switch v := *w.p; {
		case v == nil:
			errs = append(errs, field.Required(wp.Child(w.name), "set by defaulting; must not be null"))
		case *v < 0 || *v > 1000:
			errs = append(errs, field.Invalid(wp.Child(w.name), *v, "must be between 0 and 1000"))
		default:
			sum += int64(*v)
		}
	}
	if sum == 0 && len(errs) == 0 {
		errs = append(errs, field.Invalid(wp, "all 0", "at least one weight must be positive"))
	}
	if sum > 0 && len(errs) == 0 {
		// Task affinity counts only for pods of a job with pods placed,
		// bandwidth fit only for pods that ask for bandwidth: the other
		// terms must leave every other pod something to score by.
		w := c.Weights
		always := int64(*w.UtilizationBalance) + int64(*w.ThermalPowerHeadroom) + int64(*w.Fragmentation) + int64(*w.IslandBestFit) + int64(*w.CapabilityConservation)
		if always == 0 {
			errs = append(errs, field.Invalid(wp, "only taskAffinity and bandwidthFit", "most pods would score 0 on every node: make one of utilizationBalance, thermalPowerHeadroom, fragmentation, capabilityConservation, islandBestFit positive"))
		}
	}
	tp := field.NewPath("thermal")
	if c.Thermal.IdleTemperatureC == nil || c.Thermal.LimitTemperatureC == nil {
		errs = append(errs, field.Required(tp, "idleTemperatureC and limitTemperatureC are set by defaulting; must not be null"))
	} else if *c.Thermal.LimitTemperatureC <= *c.Thermal.IdleTemperatureC {
		errs = append(errs, field.Invalid(tp.Child("limitTemperatureC"), *c.Thermal.LimitTemperatureC,
			fmt.Sprintf("must be above idleTemperatureC (%d)", *c.Thermal.IdleTemperatureC)))
	}
	if c.TelemetryMaxAge.Duration <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("telemetryMaxAge"), c.TelemetryMaxAge.Duration.String(), "must be positive, e.g. 2m"))
	}
	if c.BindTimeout.Duration <= 0 || c.BindTimeout.Duration > time.Minute {
		errs = append(errs, field.Invalid(field.NewPath("bindTimeout"), c.BindTimeout.Duration.String(), "must be between 0 and 1m, and below the scheduler's extender httpTimeout"))
	}
	if c.ReservationTTL.Duration < c.BindTimeout.Duration {
		errs = append(errs, field.Invalid(field.NewPath("reservationTTL"), c.ReservationTTL.Duration.String(),
			fmt.Sprintf("must be at least bindTimeout (%s) so that a reservation outlives the bind that made it", c.BindTimeout.Duration)))
	}
	if c.MaxRequestBytes < 1<<20 {
		errs = append(errs, field.Invalid(field.NewPath("maxRequestBytes"), c.MaxRequestBytes, "must be at least 1048576 (1 MiB): 10,000 node names take about 400 KB"))
	}
	if c.AllocatorMemoSize < 0 {
		errs = append(errs, field.Invalid(field.NewPath("allocatorMemoSize"), c.AllocatorMemoSize, "must be 0 (no memo) or positive"))
	}
	errs = append(errs, validateExtendedResourceName(field.NewPath("resourceName"), c.ResourceName)...)
	errs = append(errs, c.Fabric.validate(field.NewPath("fabric"))...)
	errs = append(errs, c.DRA.validate(field.NewPath("dra"))...)
	errs = append(errs, c.Patience.validate(field.NewPath("patience"))...)
	return append(errs, c.Telemetry.validate(field.NewPath("telemetry"))...)
}

func (f *Fabric) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if f.GroupReservationTTL.Duration <= 0 {
		errs = append(errs, field.Invalid(path.Child("groupReservationTTL"), f.GroupReservationTTL.Duration.String(), "must be positive, e.g. 2m"))
	}
	if f.ReserveAfter.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("reserveAfter"), f.ReserveAfter.Duration.String(), "must be 0 (reservations off) or positive, e.g. 10m"))
	}
	if p := f.ReserveMaxPercent; p != nil && (*p < 1 || *p > 100) {
		errs = append(errs, field.Invalid(path.Child("reserveMaxPercent"), *p, "must be between 1 and 100 (percent of the cluster's GPUs); reservations are off while reserveAfter is 0"))
	}
	if f.ReserveMaxDuration.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("reserveMaxDuration"), f.ReserveMaxDuration.Duration.String(), "must be positive, e.g. 30m"))
	}
	names := map[string]bool{}
	labels := map[string]string{}
	for i, l := range f.Levels {
		lp := path.Child("levels").Index(i)
		switch {
		case l.Name == "":
			errs = append(errs, field.Required(lp.Child("name"), "name the level (e.g. leaf): group annotations refer to it"))
		case names[l.Name]:
			errs = append(errs, field.Duplicate(lp.Child("name"), l.Name))
		}
		names[l.Name] = true
		if len(l.Labels) == 0 {
			errs = append(errs, field.Required(lp.Child("labels"), "list the node label keys that name a node's domain at this level"))
		}
		for j, k := range l.Labels {
			if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
				errs = append(errs, field.Invalid(lp.Child("labels").Index(j), k, strings.Join(msgs, "; ")))
			} else if prev, dup := labels[k]; dup {
				errs = append(errs, field.Invalid(lp.Child("labels").Index(j), k, "already names level "+prev+": a label belongs to one level"))
			}
			labels[k] = l.Name
		}
		if l.BandwidthGBps < 0 || l.BandwidthGBps > v1alpha1.MaxPairBandwidthGBps {
			errs = append(errs, field.Invalid(lp.Child("bandwidthGBps"), l.BandwidthGBps, fmt.Sprintf("must be between 0 and %d", v1alpha1.MaxPairBandwidthGBps)))
		}
	}
	return errs
}

func (t *Telemetry) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch t.Source {
	case TelemetryNodeGPUTopology:
		if t.Prometheus != nil {
			errs = append(errs, field.Forbidden(path.Child("prometheus"), "only with source: prometheus; set source: prometheus or remove the prometheus block"))
		}
	case TelemetryPrometheus:
		if t.Prometheus == nil {
			errs = append(errs, field.Required(path.Child("prometheus"), "source: prometheus needs prometheus.url, e.g. http://prometheus.monitoring:9090"))
			break
		}
		errs = append(errs, t.Prometheus.validate(path.Child("prometheus"))...)
	default:
		errs = append(errs, field.NotSupported(path.Child("source"), t.Source, []string{TelemetryNodeGPUTopology, TelemetryPrometheus}))
	}
	return errs
}

func (p *PrometheusTelemetry) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if u, err := url.Parse(p.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, field.Invalid(path.Child("url"), p.URL, "must be an http:// or https:// URL of the Prometheus server, e.g. http://prometheus.monitoring:9090"))
	}
	if p.Interval.Duration < time.Second {
		errs = append(errs, field.Invalid(path.Child("interval"), p.Interval.Duration.String(), "must be at least 1s"))
	}
	if p.Timeout.Duration <= 0 || p.Timeout.Duration > p.Interval.Duration {
		errs = append(errs, field.Invalid(path.Child("timeout"), p.Timeout.Duration.String(), fmt.Sprintf("must be positive and at most interval (%s)", p.Interval.Duration)))
	}
	if p.MaxAge.Duration < p.Interval.Duration {
		errs = append(errs, field.Invalid(path.Child("maxAge"), p.MaxAge.Duration.String(), fmt.Sprintf("must be at least interval (%s), or every node falls back between rounds", p.Interval.Duration)))
	}
	for _, l := range []struct{ name, v string }{{"nodeLabel", p.NodeLabel}, {"uuidLabel", p.UUIDLabel}} {
		if !model.LabelName(l.v).IsValidLegacy() {
			errs = append(errs, field.Invalid(path.Child(l.name), l.v, "must be a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"))
		}
	}
	mp := path.Child("metrics")
	for _, m := range []struct{ name, v string }{
		{"utilization", p.Metrics.Utilization}, {"framebufferUsed", p.Metrics.FramebufferUsed},
		{"temperature", p.Metrics.Temperature}, {"power", p.Metrics.Power}, {"powerLimit", p.Metrics.PowerLimit},
	} {
		if !model.IsValidLegacyMetricName(m.v) {
			errs = append(errs, field.Invalid(mp.Child(m.name), m.v, "must be a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"))
		}
	}
	if strings.ContainsAny(p.Selector, "{}") {
		errs = append(errs, field.Invalid(path.Child("selector"), p.Selector, `label matchers without braces, e.g. job="dcgm-exporter"`))
	}
	return errs
}

// validateExtendedResourceName applies kube-apiserver's rule for extended
// resource names (k8s.io/kubernetes pkg/apis/core/v1/helper
// IsExtendedResourceName, which no published module exports): a
// domain-prefixed name outside the kubernetes.io namespaces that stays a
// qualified name under a quota's "requests." prefix.
func validateExtendedResourceName(path *field.Path, name string) field.ErrorList {
	const hint = "must be an extended resource name such as nvidia.com/gpu, the node agent's --resource-name"
	switch {
	case name == "":
		return field.ErrorList{field.Required(path, hint)}
	case !strings.Contains(name, "/"):
		return field.ErrorList{field.Invalid(path, name, hint+": a domain prefix (vendor.example/) is required")}
	case strings.Contains(name, corev1.ResourceDefaultNamespacePrefix):
		return field.ErrorList{field.Invalid(path, name, hint+": the kubernetes.io namespaces are Kubernetes' own resources")}
	case strings.HasPrefix(name, corev1.DefaultResourceRequestsPrefix):
		return field.ErrorList{field.Invalid(path, name, hint+`: the "requests." prefix is reserved for quotas`)}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsQualifiedName(corev1.DefaultResourceRequestsPrefix + name) {
		errs = append(errs, field.Invalid(path, name, hint+": "+msg))
	}
	return errs
}

func (d *DRA) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(d.Driver) {
		errs = append(errs, field.Invalid(path.Child("driver"), d.Driver, msg+" (the DRA driver's name, as its ResourceSlices' spec.driver says, e.g. gpu.nvidia.com)"))
	}
	// A device attribute's name: a C identifier, optionally after a
	// domain and a slash (resource.k8s.io's QualifiedName).
	domain, name, qualified := strings.Cut(d.UUIDAttribute, "/")
	if !qualified {
		domain, name = "", d.UUIDAttribute
	}
	bad := len(validation.IsCIdentifier(name)) > 0 || qualified && len(validation.IsDNS1123Subdomain(domain)) > 0
	if bad {
		errs = append(errs, field.Invalid(path.Child("uuidAttribute"), d.UUIDAttribute, "name the device attribute that carries the GPU's UUID: an identifier, optionally after a domain and a slash, e.g. uuid or gpu.nvidia.com/uuid"))
	}
	return append(errs, validateDeviceClasses(path.Child("deviceClasses"), d.DeviceClasses)...)
}

// validateDeviceClasses checks a list of DeviceClass names.
func validateDeviceClasses(path *field.Path, classes []string) field.ErrorList {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, c := range classes {
		p := path.Index(i)
		for _, msg := range validation.IsDNS1123Subdomain(c) {
			errs = append(errs, field.Invalid(p, c, msg+" (a DeviceClass name)"))
		}
		if seen[c] {
			errs = append(errs, field.Duplicate(p, c))
		}
		seen[c] = true
	}
	return errs
}

func (p *Patience) validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if w := p.BandwidthWait; w == nil {
		errs = append(errs, field.Required(path.Child("bandwidthWait"), "set by defaulting; must not be null (0 turns patience off)"))
	} else if w.Duration < 0 || w.Duration > 24*time.Hour {
		errs = append(errs, field.Invalid(path.Child("bandwidthWait"), w.Duration.String(), "must be 0 (patience off) or a duration up to 24h, e.g. 10m"))
	}
	if pc := p.BandwidthPercent; pc == nil {
		errs = append(errs, field.Required(path.Child("bandwidthPercent"), "set by defaulting; must not be null"))
	} else if *pc < 1 || *pc > 100 {
		errs = append(errs, field.Invalid(path.Child("bandwidthPercent"), *pc, "must be between 1 and 100 (percent of the best ring the cluster's machines could give the pod)"))
	}
	return errs
}
