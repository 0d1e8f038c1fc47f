package extender

import (
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// ConfigAPIVersion and ConfigKind identify the extender's configuration
// file. The version moves when a field changes meaning, so a file written
// for one release is never silently read with another's semantics.
const (
	ConfigAPIVersion = "gputopo.io/v1alpha1"
	ConfigKind       = "ExtenderConfiguration"
)

// Configuration is the extender's versioned configuration file. Every field
// is optional; the comment of each says its default. Flags cover what
// differs per deployment (ports, TLS, leader election); this file covers
// what shapes decisions.
type Configuration struct {
	metav1.TypeMeta `json:",inline"`

	// Weights of the prioritize components. Defaults 40/30/20/10, the
	// design's split; only their ratios matter.
	Weights Weights `json:"weights"`

	// TopologyMaxAge is how old a NodeGPUTopology's observedTime may be
	// before filter treats the node as stale. The node agent refreshes
	// every 5 minutes, so the default 15m tolerates two missed refreshes.
	// 0 turns the age check off (status.stale is still honoured).
	TopologyMaxAge metav1.Duration `json:"topologyMaxAge"`

	// TelemetryMaxAge is how old telemetry may be and still count in
	// prioritize. Older telemetry scores neutrally instead of steering
	// pods on numbers that no longer hold. Default 2m (four 30 s rounds).
	TelemetryMaxAge metav1.Duration `json:"telemetryMaxAge"`

	// Thermal shapes the thermal headroom component.
	Thermal Thermal `json:"thermal"`

	// BindTimeout bounds the Binding call. Keep it below the scheduler's
	// extender httpTimeout (5s in the shipped scheduler config) so that a
	// slow API server is settled here, by reading the pod, rather than
	// abandoned by kube-scheduler. Default 4s.
	BindTimeout metav1.Duration `json:"bindTimeout"`

	// ReservationTTL is how long GPUs reserved by a bind whose outcome is
	// unknown stay reserved without the pod showing up bound. The retry
	// kube-scheduler makes for the same pod reuses them; after the TTL
	// they return to the pool. Default 2m.
	ReservationTTL metav1.Duration `json:"reservationTTL"`

	// MaxRequestBytes caps a request body. 10,000 node names are about
	// 400 KB; full Node lists (nodeCacheCapable false) run to several KB
	// per node. Larger bodies get 413. Default 33554432 (32 MiB).
	MaxRequestBytes int64 `json:"maxRequestBytes"`

	// AllocatorMemoSize is how many allocation answers are remembered per
	// (topology, free GPUs, request): identical nodes share them. Default
	// 16384.
	AllocatorMemoSize int `json:"allocatorMemoSize"`
}

// Weights of the prioritize components (see docs/extender.md for the
// formula). Each is a non-negative integer; at least one must be positive.
type Weights struct {
	// UtilizationBalance favours nodes whose GPUs stay least busy after the
	// placement (held GPUs count as busy; free ones by their telemetry).
	// Default 40.
	UtilizationBalance *int32 `json:"utilizationBalance"`
	// TaskAffinity favours nodes already running pods of the same
	// gputopo.io/job (1.0), or in the same NVLink fabric clique (0.5).
	// Default 30.
	TaskAffinity *int32 `json:"taskAffinity"`
	// ThermalPowerHeadroom favours GPUs that run cool and below their power
	// limit. Default 20.
	ThermalPowerHeadroom *int32 `json:"thermalPowerHeadroom"`
	// Fragmentation favours placements that leave the node's largest free
	// NVLink island intact. Default 10.
	Fragmentation *int32 `json:"fragmentation"`
}

// Thermal fixes the temperature scale of the thermal headroom component.
type Thermal struct {
	// IdleTemperatureC scores full headroom at or below it. Default 30.
	IdleTemperatureC *int32 `json:"idleTemperatureC"`
	// LimitTemperatureC scores no headroom at or above it; data-centre GPUs
	// start to slow down near 85 °C. Default 85.
	LimitTemperatureC *int32 `json:"limitTemperatureC"`
}

// DefaultConfiguration returns the configuration with every default set.
func DefaultConfiguration() *Configuration {
	c := &Configuration{}
	SetDefaults(c)
	return c
}

// SetDefaults fills the fields left unset. Weights are pointers so that an
// explicit 0 (switch a component off) differs from "not set".
func SetDefaults(c *Configuration) {
	c.APIVersion, c.Kind = ConfigAPIVersion, ConfigKind
	setInt32 := func(p **int32, v int32) {
		if *p == nil {
			*p = &v
		}
	}
	setInt32(&c.Weights.UtilizationBalance, 40)
	setInt32(&c.Weights.TaskAffinity, 30)
	setInt32(&c.Weights.ThermalPowerHeadroom, 20)
	setInt32(&c.Weights.Fragmentation, 10)
	setInt32(&c.Thermal.IdleTemperatureC, 30)
	setInt32(&c.Thermal.LimitTemperatureC, 85)
	setDuration := func(d *metav1.Duration, v time.Duration) {
		if d.Duration == 0 {
			d.Duration = v
		}
	}
	// TopologyMaxAge 0 means "off" only when written explicitly, which a
	// plain Duration cannot tell apart; negative is the documented way to
	// switch it off in the file, and 0 here takes the default.
	setDuration(&c.TopologyMaxAge, 15*time.Minute)
	setDuration(&c.TelemetryMaxAge, 2*time.Minute)
	setDuration(&c.BindTimeout, 4*time.Second)
	setDuration(&c.ReservationTTL, 2*time.Minute)
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 32 << 20
	}
	if c.AllocatorMemoSize == 0 {
		c.AllocatorMemoSize = 16384
	}
}

// Validate reports every invalid field at once, with its path.
func (c *Configuration) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.APIVersion != ConfigAPIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{ConfigAPIVersion}))
	}
	if c.Kind != ConfigKind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{ConfigKind}))
	}
	wp := field.NewPath("weights")
	var sum int64
	for _, w := range []struct {
		name string
		v    *int32
	}{
		{"utilizationBalance", c.Weights.UtilizationBalance},
		{"taskAffinity", c.Weights.TaskAffinity},
		{"thermalPowerHeadroom", c.Weights.ThermalPowerHeadroom},
		{"fragmentation", c.Weights.Fragmentation},
	} {
		switch {
		case w.v == nil:
			errs = append(errs, field.Required(wp.Child(w.name), "set by defaulting; must not be null"))
		case *w.v < 0 || *w.v > 1000:
			errs = append(errs, field.Invalid(wp.Child(w.name), *w.v, "must be between 0 and 1000"))
		default:
			sum += int64(*w.v)
		}
	}
	if sum == 0 && len(errs) == 0 {
		errs = append(errs, field.Invalid(wp, "all 0", "at least one weight must be positive"))
	}
	tp := field.NewPath("thermal")
	if c.Thermal.IdleTemperatureC == nil || c.Thermal.LimitTemperatureC == nil {
		errs = append(errs, field.Required(tp, "idleTemperatureC and limitTemperatureC are set by defaulting; must not be null"))
	} else if *c.Thermal.LimitTemperatureC <= *c.Thermal.IdleTemperatureC {
		errs = append(errs, field.Invalid(tp.Child("limitTemperatureC"), *c.Thermal.LimitTemperatureC,
			fmt.Sprintf("must be above idleTemperatureC (%d)", *c.Thermal.IdleTemperatureC)))
	}
	if c.TelemetryMaxAge.Duration <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("telemetryMaxAge"), c.TelemetryMaxAge.String(), "must be positive, e.g. 2m"))
	}
	if c.BindTimeout.Duration <= 0 || c.BindTimeout.Duration > time.Minute {
		errs = append(errs, field.Invalid(field.NewPath("bindTimeout"), c.BindTimeout.String(), "must be between 0 and 1m, and below the scheduler's extender httpTimeout"))
	}
	if c.ReservationTTL.Duration < c.BindTimeout.Duration {
		errs = append(errs, field.Invalid(field.NewPath("reservationTTL"), c.ReservationTTL.String(),
			fmt.Sprintf("must be at least bindTimeout (%s) so that a reservation outlives the bind that made it", c.BindTimeout.Duration)))
	}
	if c.MaxRequestBytes < 1<<20 {
		errs = append(errs, field.Invalid(field.NewPath("maxRequestBytes"), c.MaxRequestBytes, "must be at least 1048576 (1 MiB): 10,000 node names take about 400 KB"))
	}
	if c.AllocatorMemoSize < 0 {
		errs = append(errs, field.Invalid(field.NewPath("allocatorMemoSize"), c.AllocatorMemoSize, "must be 0 (no memo) or positive"))
	}
	return errs
}

// topologyMaxAge is the age limit in force; negative in the file turns it
// off.
func (c *Configuration) topologyMaxAge() time.Duration {
	if c.TopologyMaxAge.Duration < 0 {
		return 0
	}
	return c.TopologyMaxAge.Duration
}

// ParseConfiguration strictly decodes a YAML or JSON ExtenderConfiguration,
// applies defaults and validates it. Unknown fields are errors: a typo must
// not silently fall back to a default.
func ParseConfiguration(doc []byte) (*Configuration, error) {
	c := &Configuration{}
	if err := yaml.UnmarshalStrict(doc, c); err != nil {
		return nil, fmt.Errorf("decode %s: %w", ConfigKind, err)
	}
	if c.APIVersion == "" || c.Kind == "" {
		return nil, fmt.Errorf("decode %s: apiVersion and kind are required (want %s, %s)", ConfigKind, ConfigAPIVersion, ConfigKind)
	}
	apiVersion, kind := c.APIVersion, c.Kind
	SetDefaults(c)
	c.APIVersion, c.Kind = apiVersion, kind
	if errs := c.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("invalid %s: %w", ConfigKind, errs.ToAggregate())
	}
	return c, nil
}

// LoadConfiguration reads path; an empty path gives the defaults.
func LoadConfiguration(path string) (*Configuration, error) {
	if path == "" {
		return DefaultConfiguration(), nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read extender config: %w", err)
	}
	c, err := ParseConfiguration(b)
	if err != nil {
		return nil, fmt.Errorf("extender config %s: %w", path, err)
	}
	return c, nil
}
