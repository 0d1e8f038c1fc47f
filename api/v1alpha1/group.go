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

	// AnnotationSliceSize cuts the group into slices of this many pods
	// (docs/groups.md, "Slices"): each slice is placed inside one domain
	// at its slice level, the whole group inside its group level, all or
	// nothing. Value: a decimal integer that divides the group's size.
	// Written by the user on a Job or pod; requires
	// AnnotationSliceRequiredTopology.
	AnnotationSliceSize = "gputopo.io/slice-size"

	// AnnotationSliceRequiredTopology is the loosest fabric level one
	// slice may span (a level name or node label key, as
	// AnnotationGroupRequiredTopology); no wider than the group's.
	AnnotationSliceRequiredTopology = "gputopo.io/slice-required-topology"

	// AnnotationSlicePreferredTopology is the level each slice is tried
	// at first (tighter levels are not tried). Unset: the tightest.
	AnnotationSlicePreferredTopology = "gputopo.io/slice-preferred-topology"
)

// AnnotationRank is a pod's rank in its sliced group, 0 to size-1: the
// pod belongs to slice rank / slice-size. Written by the user on each pod
// (a Job's pods carry their completion index instead, see SliceOf).
const AnnotationRank = "gputopo.io/rank"

// The indexes other controllers write on the pods they create, which
// SliceOf reads.
const (
	// AnnotationCompletionIndex is an Indexed Job's pod's index.
	AnnotationCompletionIndex = "batch.kubernetes.io/job-completion-index"
	// LabelJobSetJobIndex is the index of a JobSet's Job among all the
	// JobSet's Jobs (JobSet v0.5 and later).
	LabelJobSetJobIndex = "jobset.sigs.k8s.io/job-global-index"
)

// MaxGroupSize bounds AnnotationGroupSize: far more pods than any cluster
// places as one gang.
const MaxGroupSize = 10000

// GroupAnnotations are the group annotations, which the webhook guards
// the same way on a Job and on its pods.
var GroupAnnotations = []string{AnnotationGroup, AnnotationGroupSize, AnnotationGroupRequiredTopology, AnnotationGroupPreferredTopology,
	AnnotationSliceSize, AnnotationSliceRequiredTopology, AnnotationSlicePreferredTopology}

// GroupSpec is a pod's group as its annotations state it.
type GroupSpec struct {
	// Name is the group's name within the pod's namespace.
	Name string
	// Size is how many pods are placed together (at least 1).
	Size int
	// Required and Preferred are fabric levels (level names or node label
	// keys); "" for none.
	Required, Preferred string
	// SliceSize cuts the group into slices of that many pods (0: no
	// slices); each lies inside one domain at SliceRequired, tried first
	// at SlicePreferred.
	SliceSize                     int
	SliceRequired, SlicePreferred string
}

// Slices is how many slices the group is cut into (0: none).
func (g GroupSpec) Slices() int {
	if g.SliceSize < 1 {
		return 0
	}
	return g.Size / g.SliceSize
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
	levels := map[string]*string{
		AnnotationGroupRequiredTopology: &g.Required, AnnotationGroupPreferredTopology: &g.Preferred,
		AnnotationSliceRequiredTopology: &g.SliceRequired, AnnotationSlicePreferredTopology: &g.SlicePreferred,
	}
	for _, key := range GroupAnnotations {
		dst := levels[key]
		v, set := annotations[key]
		if dst == nil || !set {
			continue
		}
		if msgs := validation.IsQualifiedName(v); v == "" || len(msgs) > 0 {
			errs = append(errs, field.Invalid(path.Key(key), v, "must be a fabric level name (nvlink, leaf, spine, block, zone) or a node label key"))
			continue
		}
		*dst = v
	}
	errs = append(errs, parseSlices(path, annotations, &g)...)
	if len(errs) > 0 {
		return GroupSpec{}, true, errs
	}
	return g, true, nil
}

// parseSlices reads the slice annotations into g (its size read already).
func parseSlices(path *field.Path, annotations map[string]string, g *GroupSpec) (errs field.ErrorList) {
	v, sized := annotations[AnnotationSliceSize]
	_, leveled := annotations[AnnotationSliceRequiredTopology]
	if !sized {
		for _, key := range []string{AnnotationSliceRequiredTopology, AnnotationSlicePreferredTopology} {
			if lv, set := annotations[key]; set {
				errs = append(errs, field.Invalid(path.Key(key), lv, fmt.Sprintf("a slice level without %s: add %s (the pods of one slice), or remove %s", AnnotationSliceSize, AnnotationSliceSize, key)))
			}
		}
		return errs
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	switch {
	case err != nil || n < 1:
		return append(errs, field.Invalid(path.Key(AnnotationSliceSize), v, "must be a whole number of pods, e.g. \"16\""))
	case g.Size < 2:
		return append(errs, field.Invalid(path.Key(AnnotationSliceSize), v, fmt.Sprintf("slices on a group of one pod: set %s to the group's pods (a multiple of %d), or remove %s", AnnotationGroupSize, n, AnnotationSliceSize)))
	case g.Size%n != 0:
		return append(errs, field.Invalid(path.Key(AnnotationSliceSize), v, fmt.Sprintf("must divide the group's size %d into whole slices: use a divisor of %d (e.g. %d), or change %s", g.Size, g.Size, largestDivisor(g.Size, n), AnnotationGroupSize)))
	case !leveled:
		return append(errs, field.Required(path.Key(AnnotationSliceRequiredTopology), fmt.Sprintf("%s cuts the group into slices; say the level each slice must lie in (e.g. nvlink or leaf), or remove %s", AnnotationSliceSize, AnnotationSliceSize)))
	}
	g.SliceSize = n
	return nil
}

// largestDivisor is the largest divisor of n not above k (at least 1).
func largestDivisor(n, k int) int {
	for d := min(k, n); d > 1; d-- {
		if n%d == 0 {
			return d
		}
	}
	return 1
}

// CheckSliceLevels refuses a slice level wider than the group's, by
// index, which gives a level's place (0 the tightest) in the fabric levels
// of whoever checks (the scheduler's configuration; the webhook, the
// default levels). A level index does not know is not judged here: the
// scheduler judges it.
func CheckSliceLevels(path *field.Path, g GroupSpec, index func(string) (int, bool)) *field.Error {
	if g.SliceSize == 0 || g.Required == "" {
		return nil
	}
	s, sok := index(g.SliceRequired)
	r, rok := index(g.Required)
	if sok && rok && s > r {
		return field.Invalid(path.Key(AnnotationSliceRequiredTopology), g.SliceRequired, fmt.Sprintf(
			"is wider than %s %q: a slice lies inside its group; use a level no wider than %q, or widen %s", AnnotationGroupRequiredTopology, g.Required, g.Required, AnnotationGroupRequiredTopology))
	}
	return nil
}

// SliceOf is the slice of group g that a pod with these annotations and
// labels belongs to, -1 when g has no slices or the pod names no index
// (then the planner assigns it a slice). The index is, first found:
// AnnotationRank (rank / slice-size); a JobSet's Job index
// (LabelJobSetJobIndex: each Job of the JobSet is one slice); an Indexed
// Job's completion index (index / slice-size; an index beyond the group's
// size, of a Job with more completions than pods at once, names none). A
// rank or Job index that names no slice of g is an error naming the
// field.
func SliceOf(path *field.Path, g GroupSpec, annotations, labels map[string]string) (int, *field.Error) {
	k := g.Slices()
	if k == 0 {
		return -1, nil
	}
	if v, ok := annotations[AnnotationRank]; ok {
		r, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || r < 0 || r >= g.Size {
			return -1, field.Invalid(path.Key(AnnotationRank), v, fmt.Sprintf("must be the pod's rank in its group, 0 to %d", g.Size-1))
		}
		return r / g.SliceSize, nil
	}
	if v, ok := labels[LabelJobSetJobIndex]; ok {
		j, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || j < 0 || j >= k {
			return -1, field.Invalid(field.NewPath("metadata", "labels").Key(LabelJobSetJobIndex), v, fmt.Sprintf(
				"each Job of the JobSet is one slice of group %s, which has %d slices of %d pods: make %s the pods of one Job and %s the pods of the whole JobSet", g.Name, k, g.SliceSize, AnnotationSliceSize, AnnotationGroupSize))
		}
		return j, nil
	}
	if v, ok := annotations[AnnotationCompletionIndex]; ok {
		c, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || c < 0 {
			return -1, nil // not a Job's index gputopo reads
		}
		if c >= g.Size {
			// A Job that runs more completions than its group's pods
			// at once: the index says nothing of the slice.
			return -1, nil
		}
		return c / g.SliceSize, nil
	}
	return -1, nil
}
