package v1alpha1

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Group annotations: a group is the pods of one job that are placed
// together, all or nothing, inside one fabric domain (docs/groups.md).
const (
	// AnnotationGroup names the pod's group within its namespace. Written
	// by the webhook on the pod template of a Job with
	// AnnotationParallelism and more than one pod (the Job's name), or by
	// the user on a Job or pod. Value: a DNS label (63 characters at
	// most).
	AnnotationGroup = "gputopo.io/group"

	// AnnotationGroupSize is how many pods of the group must be placed
	// together. Written with AnnotationGroup (by the webhook: the Job's
	// spec.parallelism, or the user's value on the Job). Value: a decimal
	// integer, 1 to MaxGroupSize.
	AnnotationGroupSize = "gputopo.io/group-size"

	// AnnotationGroupRequiredTopology is the loosest fabric level the
	// whole group may span: a level name of the configuration's
	// fabric.levels (nvlink, leaf, spine, block, zone with the defaults)
	// or a node label key. Written by the user. Unset: any.
	AnnotationGroupRequiredTopology = "gputopo.io/group-required-topology"

	// AnnotationGroupPreferredTopology is the level the group is tried at
	// first; tighter levels are not tried (a data-parallel group that
	// prefers leaf does not take an NVLink domain apart). Written by the
	// user, or by the webhook from the intent (model: nvlink). Unset: the
	// tightest level.
	AnnotationGroupPreferredTopology = "gputopo.io/group-preferred-topology"
)

// MaxGroupSize bounds AnnotationGroupSize: far more pods than any cluster
// places as one gang.
const MaxGroupSize = 10000

// GroupAnnotations are the group annotations, which the webhook guards
// the same way on a Job and on its pods.
var GroupAnnotations = []string{AnnotationGroup, AnnotationGroupSize, AnnotationGroupRequiredTopology, AnnotationGroupPreferredTopology}

// GroupSpec is a pod's group as its annotations state it.
type GroupSpec struct {
	// Name is the group's name within the pod's namespace.
	Name string
	// Size is how many pods are placed together (at least 1).
	Size int
	// Required and Preferred are fabric levels (level names or node label
	// keys); "" for none.
	Required, Preferred string
}

// ParseGroup reads the group annotations of a pod or a Job (path is the
// annotations' field path, for errors). ok is false when the object names
// no group. A size or level without a group, a malformed name or size, or
// a level that is not a level name or label key is an error naming the
// field and the fix.
func ParseGroup(path *field.Path, annotations map[string]string) (g GroupSpec, ok bool, errs field.ErrorList) {
	name, named := annotations[AnnotationGroup]
	if !named {
		for _, key := range GroupAnnotations[1:] {
			if _, set := annotations[key]; set {
				errs = append(errs, field.Required(path.Key(AnnotationGroup),
					fmt.Sprintf("%s is set but the group is not named: add %s (the job's name), or remove %s", key, AnnotationGroup, key)))
			}
		}
		return GroupSpec{}, false, errs
	}
	g.Name = name
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(path.Key(AnnotationGroup), name, msg))
	}
	g.Size = 1
	if v, set := annotations[AnnotationGroupSize]; set {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(path.Key(AnnotationGroupSize), v, "must be a whole number of pods, e.g. \"4\""))
		case n < 1 || n > MaxGroupSize:
			errs = append(errs, field.Invalid(path.Key(AnnotationGroupSize), v, fmt.Sprintf("must be between 1 and %d pods", MaxGroupSize)))
		default:
			g.Size = n
		}
	}
	for _, key := range []string{AnnotationGroupRequiredTopology, AnnotationGroupPreferredTopology} {
		v, set := annotations[key]
		if !set {
			continue
		}
		if msgs := validation.IsQualifiedName(v); v == "" || len(msgs) > 0 {
			errs = append(errs, field.Invalid(path.Key(key), v, "must be a fabric level name (nvlink, leaf, spine, block, zone) or a node label key"))
			continue
		}
		if key == AnnotationGroupRequiredTopology {
			g.Required = v
		} else {
			g.Preferred = v
		}
	}
	if len(errs) > 0 {
		return GroupSpec{}, true, errs
	}
	return g, true, nil
}
