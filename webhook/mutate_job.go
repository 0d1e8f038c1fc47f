package webhook

import (
	"context"
	"fmt"
	"strconv"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// JobMutator copies a Job's intent into its pod template on CREATE in
// opted-in namespaces, so every pod the Job controller creates carries it
// without a Job lookup, and makes the pods of a Job that runs more than one
// at once a group (jobGroup), placed all or nothing. It also denies, at the
// Job rather than at each of its pods, what PodValidator would refuse in the
// template: an unknown intent, a malformed requirement or group, or a
// system annotation; and group annotations that contradict each other or
// the Job.
type JobMutator struct{ handler }

var (
	templateAnnotationsPath = field.NewPath("spec", "template", "metadata", "annotations")
	schedulingGroupPath     = field.NewPath("spec", "template", "spec", "schedulingGroup")
)

// Handle implements admission.Handler.
func (m *JobMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.SubResource != "" {
		return admission.Allowed("")
	}
	job, shape, _, resp := mutated(ctx, m.handler, req, decodeJob)
	if resp != nil {
		return *resp
	}

	var errs field.ErrorList
	var intent v1alpha1.Parallelism
	hasIntent := false
	jobIntent, hasJobIntent := job.Annotations[v1alpha1.AnnotationParallelism]
	if hasJobIntent {
		if p, ferr := v1alpha1.ParseParallelism(intentPath, jobIntent); ferr != nil {
			errs = append(errs, ferr)
		} else {
			intent, hasIntent = p, true
		}
	}
	tmpl := job.Spec.Template.Annotations
	tmplIntent, hasTmplIntent := tmpl[v1alpha1.AnnotationParallelism]
	if hasTmplIntent {
		if p, ferr := v1alpha1.ParseParallelism(templateAnnotationsPath.Key(v1alpha1.AnnotationParallelism), tmplIntent); ferr != nil {
			errs = append(errs, ferr)
		} else {
			// The template's intent is the pods'.
			intent, hasIntent = p, true
		}
	}
	if val, ok := tmpl[v1alpha1.AnnotationRequirement]; ok {
		if _, err := v1alpha1.ParseRequirement(val); err != nil {
			for _, fe := range fieldErrors(err, annotationsPath.Key(v1alpha1.AnnotationRequirement)) {
				fe.Field = "spec.template." + fe.Field
				errs = append(errs, fe)
			}
		}
	}
	for _, key := range v1alpha1.SystemAnnotations {
		if _, ok := tmpl[key]; ok {
			errs = append(errs, field.Forbidden(templateAnnotationsPath.Key(key),
				"only gputopo's system service accounts write this annotation, on each pod; every pod created from this template would be denied: remove it"))
		}
	}
	group, groupErrs := jobGroup(job, req.UID, intent, hasIntent)
	errs = append(errs, groupErrs...)
	if len(errs) > 0 {
		logf.FromContext(ctx).V(1).Info("job denied", "job", klog.KObj(job), "user", req.UserInfo.Username, "errors", len(errs))
		return deny(errs)
	}
	if shape.Spec.Template == nil {
		// A Job without a template is invalid and the apiserver says so.
		return admission.Allowed("")
	}
	set := map[string]string{}
	if hasJobIntent && !hasTmplIntent {
		// A template that states its own intent is more specific than the
		// Job's, just as a pod's own annotation is.
		set[v1alpha1.AnnotationParallelism] = jobIntent
	}
	for k, v := range group {
		set[k] = v
	}
	if len(set) == 0 {
		return admission.Allowed("")
	}
	if len(group) > 0 {
		logf.FromContext(ctx).V(2).Info("derived pod group", "job", klog.KObj(job), "annotations", group)
	}
	ops := setMetadata(nil, "/spec/template/metadata", shape.Spec.Template.Metadata.shape(), set, nil)
	return admission.Patched("", ops...)
}

// jobGroup decides the group of a Job's pods (docs/webhook.md, "Groups"):
// the group annotations to add to its pod template, or the errors that
// deny the Job. uid is the admission request's, which names the group of
// a Job that has no name yet (generateName); intent is the pods' (the
// template's, else the Job's), hasIntent false when neither states a valid
// one.
//
//   - A template whose pod spec sets schedulingGroup (a Kubernetes
//     PodGroup) gets no gputopo group; a group annotation on the Job or the
//     template next to it is denied: name one group.
//   - A Job with an intent whose pods run more than one at once
//     (podsAtOnce) gets a group: the template's annotations, else the
//     Job's, else the Job's name (jobGroupName), the pods at once as its
//     size and, for the model intent, nvlink as its preferred level.
//   - A template that names a group keeps it, whatever the intent; the
//     Job's group annotations the template lacks are copied into it.
//   - The Job's group annotations must parse (the name may be left out),
//     agree with the template's, and reach a group: on a Job whose pods
//     get none they are denied, saying why. An explicit size on the Job,
//     or on a template that names no group, may not exceed the pods at
//     once: such a group could never be complete. A template that names
//     its own group may size it beyond this Job: its group may span Jobs.
func jobGroup(job *batchv1.Job, uid types.UID, intent v1alpha1.Parallelism, hasIntent bool) (map[string]string, field.ErrorList) {
	jobAnn := groupAnnotations(job.Annotations)
	tmplAnn := groupAnnotations(job.Spec.Template.Annotations)
	if len(jobAnn) == 0 && len(tmplAnn) == 0 && !hasIntent {
		return nil, nil
	}
	if job.Name == "" && job.GenerateName == "" {
		// The apiserver refuses a Job without a name.
		return nil, nil
	}
	if sg := job.Spec.Template.Spec.SchedulingGroup; sg != nil {
		return nil, nameOneGroup(sg.PodGroupName, jobAnn, tmplAnn)
	}

	atOnce, limit, raise := podsAtOnce(job)
	// A JobSet's Jobs are one group: its Jobs' pods at once (every
	// replicated Job is taken to run as many as this one), each Job a
	// slice when the JobSet names a slice level.
	setName, jobs, inSet := jobSetOf(job)
	groupPods := atOnce * jobs
	if inSet {
		limit = fmt.Sprintf("%s in each of the JobSet's %d Jobs", limit, jobs)
	}
	derive := hasIntent && groupPods > 1
	_, tmplNamed := tmplAnn[v1alpha1.AnnotationGroup]

	// Parse with a stand-in name where the group's name will be filled in,
	// so that a size or level without a name is no error there.
	const standIn = "group"
	var errs field.ErrorList
	var fromJob, fromTmpl v1alpha1.GroupSpec
	// The group's size, where neither states it, is the pods at once
	// (fill below): slices are judged against it.
	sliceOfSet := inSet && (hasKey(jobAnn, v1alpha1.AnnotationSliceRequiredTopology) || hasKey(tmplAnn, v1alpha1.AnnotationSliceRequiredTopology)) &&
		!hasKey(jobAnn, v1alpha1.AnnotationSliceSize) && !hasKey(tmplAnn, v1alpha1.AnnotationSliceSize)
	setSlice := strconv.Itoa(atOnce)
	for _, m := range []map[string]string{tmplAnn, jobAnn} {
		if v, ok := m[v1alpha1.AnnotationSliceSize]; ok {
			setSlice = v
		}
	}
	sizeOf := func(a map[string]string) map[string]string {
		if inSet && hasKey(a, v1alpha1.AnnotationSliceRequiredTopology) {
			a = withDefault(a, v1alpha1.AnnotationSliceSize, setSlice)
		}
		if _, ok := a[v1alpha1.AnnotationGroupSize]; ok || !derive {
			return a
		}
		if v, ok := jobAnn[v1alpha1.AnnotationGroupSize]; ok {
			return withDefault(a, v1alpha1.AnnotationGroupSize, v)
		}
		if v, ok := tmplAnn[v1alpha1.AnnotationGroupSize]; ok {
			return withDefault(a, v1alpha1.AnnotationGroupSize, v)
		}
		return withDefault(a, v1alpha1.AnnotationGroupSize, strconv.Itoa(groupPods))
	}
	if len(jobAnn) > 0 {
		a := sizeOf(withDefault(jobAnn, v1alpha1.AnnotationGroup, standIn))
		var perrs field.ErrorList
		fromJob, _, perrs = v1alpha1.ParseGroup(annotationsPath, a)
		errs = append(errs, perrs...)
		if ferr := checkSliceLevels(annotationsPath, fromJob); len(perrs) == 0 && ferr != nil {
			errs = append(errs, ferr)
		}
	}
	if len(tmplAnn) > 0 {
		a := tmplAnn
		if derive {
			a = sizeOf(withDefault(tmplAnn, v1alpha1.AnnotationGroup, standIn))
		}
		var perrs field.ErrorList
		fromTmpl, _, perrs = v1alpha1.ParseGroup(templateAnnotationsPath, a)
		errs = append(errs, perrs...)
		if ferr := checkSliceLevels(templateAnnotationsPath, fromTmpl); len(perrs) == 0 && ferr != nil {
			errs = append(errs, ferr)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}

	sizeKey := v1alpha1.AnnotationGroupSize
	_, jobSized := jobAnn[sizeKey]
	_, tmplSized := tmplAnn[sizeKey]
	if jobSized && fromJob.Size > groupPods {
		errs = append(errs, incomplete(annotationsPath.Key(sizeKey), jobAnn[sizeKey], groupPods, limit, raise))
	}
	if tmplSized && !tmplNamed && fromTmpl.Size > groupPods {
		errs = append(errs, incomplete(templateAnnotationsPath.Key(sizeKey), tmplAnn[sizeKey], groupPods, limit, raise))
	}

	if !tmplNamed && !derive {
		// The pods get no group: the Job's annotations would reach none.
		for _, key := range v1alpha1.GroupAnnotations {
			v, ok := jobAnn[key]
			if !ok || (key == sizeKey && fromJob.Size > groupPods) {
				continue
			}
			errs = append(errs, field.Invalid(annotationsPath.Key(key), v, noGroupReason(hasIntent, groupPods, limit, raise)))
		}
		return nil, errs
	}

	for _, key := range v1alpha1.GroupAnnotations {
		jv, inJob := jobAnn[key]
		tv, inTmpl := tmplAnn[key]
		if !inJob || !inTmpl {
			continue
		}
		same := jv == tv
		if key == sizeKey {
			same = fromJob.Size == fromTmpl.Size
		}
		if !same {
			errs = append(errs, field.Invalid(annotationsPath.Key(key), jv, fmt.Sprintf(
				"contradicts %s (%q), which the Job's pods would carry; state it in one place, or give both the same value",
				templateAnnotationsPath.Key(key), tv)))
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}

	set := map[string]string{}
	for key, v := range jobAnn {
		if _, ok := tmplAnn[key]; !ok {
			set[key] = v
		}
	}
	if derive {
		fill := func(key, v string) {
			_, inJob := jobAnn[key]
			_, inTmpl := tmplAnn[key]
			if !inJob && !inTmpl {
				set[key] = v
			}
		}
		if inSet {
			fill(v1alpha1.AnnotationGroup, setName)
		} else {
			fill(v1alpha1.AnnotationGroup, jobGroupName(job, uid))
		}
		fill(sizeKey, strconv.Itoa(groupPods))
		if sliceOfSet {
			fill(v1alpha1.AnnotationSliceSize, strconv.Itoa(atOnce))
		}
		if intent == v1alpha1.ParallelismModel {
			fill(v1alpha1.AnnotationGroupPreferredTopology, configv1alpha1.FabricNVLink)
		}
	}
	return set, nil
}

// groupAnnotations returns the group annotations among annotations.
func groupAnnotations(annotations map[string]string) map[string]string {
	out := map[string]string{}
	for _, key := range v1alpha1.GroupAnnotations {
		if v, ok := annotations[key]; ok {
			out[key] = v
		}
	}
	return out
}

// withDefault returns a copy of m with key set to v unless m has it.
func withDefault(m map[string]string, key, v string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for k, mv := range m {
		out[k] = mv
	}
	if _, ok := out[key]; !ok {
		out[key] = v
	}
	return out
}

// podsAtOnce is how many pods of the Job run at once: spec.parallelism
// (default 1), capped by spec.completions, since the Job controller never
// runs more pods than the completions left. For messages, limit names the
// fields that decide and raise the one to raise for more.
func podsAtOnce(job *batchv1.Job) (n int, limit, raise string) {
	p := 1
	if job.Spec.Parallelism != nil {
		p = int(*job.Spec.Parallelism)
	}
	if c := job.Spec.Completions; c != nil && int(*c) < p {
		return int(*c), fmt.Sprintf("spec.completions %d, spec.parallelism %d", *c, p), "spec.completions"
	}
	return p, fmt.Sprintf("spec.parallelism %d", p), "spec.parallelism"
}

// pods says "n pods of this Job run" or "1 pod of this Job runs".
func pods(n int) string {
	if n == 1 {
		return "1 pod of this Job runs"
	}
	return fmt.Sprintf("%d pods of this Job run", n)
}

// incomplete is the error of a group size v larger than the Job's pods at
// once.
func incomplete(path *field.Path, v string, atOnce int, limit, raise string) *field.Error {
	fix := fmt.Sprintf("set %s to %d or less, or raise %s", v1alpha1.AnnotationGroupSize, atOnce, raise)
	if atOnce < 1 {
		fix = "raise " + raise
	}
	return field.Invalid(path, v, fmt.Sprintf("the group could never be complete: at most %s at once (%s); %s", pods(atOnce), limit, fix))
}

// noGroupReason says why a Job's pods get no group.
func noGroupReason(hasIntent bool, atOnce int, limit, raise string) string {
	if !hasIntent {
		return fmt.Sprintf("the Job states no %s, so its pods get no group and this annotation would reach none of them; add %s (%s or %s) to the Job, or remove this annotation",
			v1alpha1.AnnotationParallelism, v1alpha1.AnnotationParallelism, v1alpha1.ParallelismModel, v1alpha1.ParallelismData)
	}
	return fmt.Sprintf("at most %s at once (%s), so its pods never form a group and this annotation would reach none of them; raise %s, or remove this annotation",
		pods(atOnce), limit, raise)
}

// nameOneGroup reports each group annotation of a Job (jobAnn) or its
// template (tmplAnn) whose template sets spec.schedulingGroup.
func nameOneGroup(podGroup *string, jobAnn, tmplAnn map[string]string) field.ErrorList {
	name := ""
	if podGroup != nil {
		name = *podGroup
	}
	var errs field.ErrorList
	for _, src := range []struct {
		path *field.Path
		ann  map[string]string
	}{{annotationsPath, jobAnn}, {templateAnnotationsPath, tmplAnn}} {
		for _, key := range v1alpha1.GroupAnnotations {
			v, ok := src.ann[key]
			if !ok {
				continue
			}
			errs = append(errs, field.Invalid(src.path.Key(key), v, fmt.Sprintf(
				"name one group: %s puts the pods in the Kubernetes PodGroup %q, whose policy places them together, and %s asks gputopo to place them as a group too; remove %s, or remove %s",
				schedulingGroupPath, name, key, key, schedulingGroupPath)))
		}
	}
	return errs
}

func hasKey(m map[string]string, key string) bool {
	_, ok := m[key]
	return ok
}
