package v1alpha1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// Strategy names how the exact GPUs are chosen among those that satisfy a
// requirement.
type Strategy string

const (
	// StrategyHighestBandwidth maximizes the bottleneck bandwidth of the
	// chosen set (minimum pair, then best ring): model parallelism.
	StrategyHighestBandwidth Strategy = "highest_bandwidth"
	// StrategyNUMALocal crosses the fewest PCIe-switch, NUMA and socket
	// boundaries ("min cut"): data parallelism.
	StrategyNUMALocal Strategy = "numa_local"
	// StrategyBalancedUtilization prefers the least-utilized GPUs.
	StrategyBalancedUtilization Strategy = "balanced_utilization"
	// StrategyLowestFragmentation keeps the largest free NVLink islands
	// intact; a 1-GPU pod takes the worst-connected free GPU.
	StrategyLowestFragmentation Strategy = "lowest_fragmentation"
)

// Strategies lists every known strategy, in documentation order.
var Strategies = []Strategy{StrategyHighestBandwidth, StrategyNUMALocal, StrategyBalancedUtilization, StrategyLowestFragmentation}

// Limits on requirement fields; values beyond them are certainly mistakes.
const (
	// MaxPairBandwidthGBps bounds minPairBandwidthGBps (NVLink 5 NVSwitch
	// pairs are 1,800 GB/s bidirectional).
	MaxPairBandwidthGBps = 100000
	// MaxGPUMemoryMiB bounds gpuMemoryMiB (16 TiB).
	MaxGPUMemoryMiB = 16 << 20
)

// Requirement is the value of AnnotationRequirement. The GPU count is not
// part of it: it is the pod's nvidia.com/gpu request. Bandwidths are GB/s
// bidirectional, the way NVIDIA quotes them (an NVLink4 link is 50 GB/s,
// 18 of them through NVSwitch give 900 GB/s between any two H100s).
type Requirement struct {
	// RequireNVLink: every pair of chosen GPUs is joined by NVLink, directly
	// or through NVSwitch. Ignored for 1-GPU pods. Default false.
	RequireNVLink bool `json:"requireNVLink,omitempty"`
	// MinPairBandwidthGBps: every pair of chosen GPUs has at least this
	// bandwidth. 0 (default) means no minimum.
	MinPairBandwidthGBps int `json:"minPairBandwidthGBps,omitempty"`
	// Strategy chooses among the GPU sets that qualify. Default
	// lowest_fragmentation.
	Strategy Strategy `json:"strategy,omitempty"`
	// GPUMemoryMiB: each chosen GPU has at least this much memory. 0
	// (default) means any.
	GPUMemoryMiB int64 `json:"gpuMemoryMiB,omitempty"`
	// FallbackAfter lets a pod that requires NVLink (or a minimum pair
	// bandwidth) accept the best set without it once it has been Pending
	// this long since its creation, instead of waiting for an NVLink set
	// forever. The placement record then says it was degraded and why.
	// Only valid with requireNVLink or minPairBandwidthGBps. Unset
	// (default): never fall back.
	FallbackAfter *metav1.Duration `json:"fallbackAfter,omitempty"`
}

// MaxFallbackAfter bounds fallbackAfter; a longer wait is a mistake (and
// kube-scheduler retries a Pending pod at least every 5 minutes anyway).
const MaxFallbackAfter = 7 * 24 * time.Hour

// FallbackDue says whether a pod created at created, under requirement r,
// may fall back at now, and how long it still has to wait if not (0 when
// r has no fallbackAfter).
func (r Requirement) FallbackDue(created, now time.Time) (due bool, wait time.Duration) {
	if r.FallbackAfter == nil || !r.Strict() {
		return false, 0
	}
	wait = created.Add(r.FallbackAfter.Duration).Sub(now)
	if wait <= 0 {
		return true, 0
	}
	return false, wait
}

// Strict says whether r constrains the links between the chosen GPUs
// (requireNVLink or minPairBandwidthGBps): what fallbackAfter relaxes.
func (r Requirement) Strict() bool { return r.RequireNVLink || r.MinPairBandwidthGBps > 0 }

// Relaxed is r without its link constraints (and so without
// fallbackAfter), as a pod that falls back is placed: the strategy and
// memory still choose among every set.
func (r Requirement) Relaxed() Requirement {
	out := r
	out.RequireNVLink, out.MinPairBandwidthGBps, out.FallbackAfter = false, 0, nil
	return out
}

// DefaultStrategy applies when a requirement names none.
const DefaultStrategy = StrategyLowestFragmentation

// EffectiveStrategy returns the strategy, defaulted.
func (r Requirement) EffectiveStrategy() Strategy {
	if r.Strategy == "" {
		return DefaultStrategy
	}
	return r.Strategy
}

// AsksBandwidth says whether a pod of gpus GPUs with this requirement
// asks for bandwidth between its GPUs: NVLink required, a minimum pair
// bandwidth, or highest_bandwidth with more than one GPU (the policy
// table's model-parallel intent).
func (r Requirement) AsksBandwidth(gpus int) bool {
	return gpus > 1 && (r.RequireNVLink || r.MinPairBandwidthGBps > 0 || r.EffectiveStrategy() == StrategyHighestBandwidth)
}

// RequirementPath is the field path of the requirement annotation, used in
// every validation message about it.
var RequirementPath = field.NewPath("metadata", "annotations").Key(AnnotationRequirement)

// ParseRequirement decodes and validates a requirement annotation value.
// Unknown fields, trailing data and every invalid field are reported, with
// field paths under RequirementPath; the error lists all problems at once.
func ParseRequirement(value string) (Requirement, error) {
	var r Requirement
	if strings.TrimSpace(value) == "" {
		return r, field.ErrorList{field.Required(RequirementPath, `must be a JSON object such as {"requireNVLink":true,"strategy":"highest_bandwidth"}`)}.ToAggregate()
	}
	// sigs.k8s.io/json matches field names case-sensitively (encoding/json
	// would take "requirenvlink" for "requireNVLink") and reports unknown
	// and duplicate fields by path.
	strictErrs, err := kjson.UnmarshalStrict([]byte(value), &r)
	if err != nil {
		// Decode again with encoding/json, whose type errors are public,
		// to name the field and the expected type.
		if stdErr := json.Unmarshal([]byte(value), &Requirement{}); stdErr != nil {
			err = stdErr
		}
		return Requirement{}, field.ErrorList{decodeError(value, err)}.ToAggregate()
	}
	if len(strictErrs) > 0 {
		errs := make(field.ErrorList, 0, len(strictErrs))
		for _, e := range strictErrs {
			errs = append(errs, strictError(e))
		}
		return Requirement{}, errs.ToAggregate()
	}
	if errs := r.Validate(RequirementPath); len(errs) > 0 {
		return Requirement{}, errs.ToAggregate()
	}
	return r, nil
}

// decodeError turns a JSON decoding failure into a field error that names
// the offending field and says what is accepted.
func decodeError(value string, err error) *field.Error {
	var typeErr *json.UnmarshalTypeError
	// metav1.Duration decodes itself, so its errors carry no field name.
	if strings.Contains(err.Error(), "time: ") || errors.As(err, &typeErr) && typeErr.Field == "" && strings.Contains(value, `"fallbackAfter"`) {
		return field.Invalid(RequirementPath.Child("fallbackAfter"), value, `must be a duration string such as "30m"`)
	}
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return field.Invalid(RequirementPath.Child(typeErr.Field), value,
			fmt.Sprintf("must be a JSON %s, not %s", jsonKind(typeErr.Type.Kind().String()), typeErr.Value))
	}
	return field.Invalid(RequirementPath, value, "must be a JSON object: "+strings.TrimPrefix(err.Error(), "json: "))
}

// strictError maps an unknown or duplicate field reported by
// sigs.k8s.io/json to a field error on that field.
func strictError(err error) *field.Error {
	name := ""
	var fe kjson.FieldError
	if errors.As(err, &fe) {
		name = fe.FieldPath()
	}
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "duplicate field"):
		return field.Duplicate(RequirementPath.Child(name), name)
	case strings.HasPrefix(msg, "unknown field"):
		return field.NotSupported(RequirementPath.Child(name), name, knownFields)
	}
	return field.Invalid(RequirementPath, name, msg)
}

var knownFields = []string{"requireNVLink", "minPairBandwidthGBps", "strategy", "gpuMemoryMiB", "fallbackAfter"}

func jsonKind(goKind string) string {
	switch goKind {
	case "bool":
		return "boolean"
	case "string":
		return "string"
	case "int", "int64":
		return "integer"
	}
	return goKind
}

// Validate reports every invalid field of r under path.
func (r Requirement) Validate(path *field.Path) field.ErrorList {
	var errs field.ErrorList
	if r.MinPairBandwidthGBps < 0 {
		errs = append(errs, field.Invalid(path.Child("minPairBandwidthGBps"), r.MinPairBandwidthGBps, "must be 0 (no minimum) or a positive bandwidth in GB/s, bidirectional"))
	} else if r.MinPairBandwidthGBps > MaxPairBandwidthGBps {
		errs = append(errs, field.Invalid(path.Child("minPairBandwidthGBps"), r.MinPairBandwidthGBps, fmt.Sprintf("must be at most %d GB/s", MaxPairBandwidthGBps)))
	}
	if r.GPUMemoryMiB < 0 {
		errs = append(errs, field.Invalid(path.Child("gpuMemoryMiB"), r.GPUMemoryMiB, "must be 0 (any) or a positive amount of memory per GPU in MiB"))
	} else if r.GPUMemoryMiB > MaxGPUMemoryMiB {
		errs = append(errs, field.Invalid(path.Child("gpuMemoryMiB"), r.GPUMemoryMiB, fmt.Sprintf("must be at most %d MiB", MaxGPUMemoryMiB)))
	}
	if r.Strategy != "" && !ValidStrategy(r.Strategy) {
		errs = append(errs, field.NotSupported(path.Child("strategy"), r.Strategy, strategyNames()))
	}
	if f := r.FallbackAfter; f != nil {
		switch {
		case f.Duration <= 0:
			errs = append(errs, field.Invalid(path.Child("fallbackAfter"), f.Duration.String(), "must be a positive duration such as \"30m\"; leave it out to never fall back"))
		case f.Duration > MaxFallbackAfter:
			errs = append(errs, field.Invalid(path.Child("fallbackAfter"), f.Duration.String(), fmt.Sprintf("must be at most %s", MaxFallbackAfter)))
		case !r.Strict():
			errs = append(errs, field.Invalid(path.Child("fallbackAfter"), f.Duration.String(), "applies only to a requirement with requireNVLink or minPairBandwidthGBps (there is nothing to fall back from); remove fallbackAfter or require NVLink"))
		}
	}
	return errs
}

// ValidStrategy reports whether s names a known strategy.
func ValidStrategy(s Strategy) bool {
	for _, k := range Strategies {
		if s == k {
			return true
		}
	}
	return false
}

func strategyNames() []string {
	out := make([]string, len(Strategies))
	for i, s := range Strategies {
		out[i] = string(s)
	}
	return out
}

// String encodes r as the compact JSON stored in AnnotationRequirement.
func (r Requirement) String() string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	_ = enc.Encode(r) // a struct of plain fields always encodes
	return strings.TrimSpace(buf.String())
}

// ParseParallelism validates an intent value.
func ParseParallelism(path *field.Path, value string) (Parallelism, *field.Error) {
	switch p := Parallelism(strings.TrimSpace(value)); p {
	case ParallelismData, ParallelismModel:
		return p, nil
	}
	return "", field.NotSupported(path, value, []string{string(ParallelismData), string(ParallelismModel)})
}
