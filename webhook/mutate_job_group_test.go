package webhook

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

const (
	annGroup     = v1alpha1.AnnotationGroup
	annSize      = v1alpha1.AnnotationGroupSize
	annRequired  = v1alpha1.AnnotationGroupRequiredTopology
	annPreferred = v1alpha1.AnnotationGroupPreferredTopology

	annSliceSize     = v1alpha1.AnnotationSliceSize
	annSliceRequired = v1alpha1.AnnotationSliceRequiredTopology
)

// nameOneGroupMsg is the denial of a group annotation at path next to the
// template's PodGroup pg.
func nameOneGroupMsg(path, value, key, pg string) string {
	return path + `: Invalid value: "` + value + `": name one group: spec.template.spec.schedulingGroup puts the pods in the Kubernetes PodGroup "` + pg +
		`", whose policy places them together, and ` + key + ` asks gputopo to place them as a group too; remove ` + key + `, or remove spec.template.spec.schedulingGroup`
}

func TestJobMutatorGroups(t *testing.T) {
	job := func() *JobWrapper { return MakeJob("train", nsOptedIn, 4) }
	long := "distributed-training-run-for-the-very-large-language-model-on-gb200-nvl72"
	tests := map[string]struct {
		job     *batchv1.Job
		want    *batchv1.Job
		verdict verdict
	}{
		"a model Job of 4 pods at once becomes a group of 4 named after it that prefers nvlink": {
			job:     job().Intent("model").Parallelism(4).Obj(),
			want:    job().Intent("model").Parallelism(4).TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("train", 4, "nvlink").Obj(),
			verdict: allowed,
		},
		"a data Job becomes a group with no preferred level": {
			job:     job().Intent("data").Parallelism(8).Obj(),
			want:    job().Intent("data").Parallelism(8).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("train", 8, "").Obj(),
			verdict: allowed,
		},
		"an intent in the template makes a group too": {
			job:     job().Parallelism(3).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Obj(),
			want:    job().Parallelism(3).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("train", 3, "").Obj(),
			verdict: allowed,
		},
		"the template's intent is the pods': model there prefers nvlink over the Job's data": {
			job:     job().Intent("data").Parallelism(2).TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Obj(),
			want:    job().Intent("data").Parallelism(2).TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("train", 2, "nvlink").Obj(),
			verdict: allowed,
		},
		"a Job of one pod at once gets no group": {
			job:     job().Intent("model").Parallelism(1).Completions(8).Obj(),
			want:    job().Intent("model").Parallelism(1).Completions(8).TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Obj(),
			verdict: allowed,
		},
		"a Job of no pods at once gets no group": {
			job:     job().Intent("model").Parallelism(0).Obj(),
			want:    job().Intent("model").Parallelism(0).TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Obj(),
			verdict: allowed,
		},
		"a Job without intent gets no group": {
			job:     job().Parallelism(4).Obj(),
			want:    job().Parallelism(4).Obj(),
			verdict: allowed,
		},
		"an Indexed Job with fewer completions than parallelism is a group of its completions": {
			job:     job().Intent("model").Indexed().Parallelism(4).Completions(2).Obj(),
			want:    job().Intent("model").Indexed().Parallelism(4).Completions(2).TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("train", 2, "nvlink").Obj(),
			verdict: allowed,
		},
		"so is a NonIndexed one: the Job controller runs no more pods than completions": {
			job:     job().Intent("data").Parallelism(4).Completions(3).Obj(),
			want:    job().Intent("data").Parallelism(4).Completions(3).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("train", 3, "").Obj(),
			verdict: allowed,
		},
		"more completions than parallelism: the group is parallelism": {
			job:     job().Intent("data").Parallelism(4).Completions(16).Obj(),
			want:    job().Intent("data").Parallelism(4).Completions(16).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("train", 4, "").Obj(),
			verdict: allowed,
		},
		"the Job's own group size is copied into the template": {
			job:     job().Intent("model").Parallelism(8).Annotation(annSize, "2").Obj(),
			want:    job().Intent("model").Parallelism(8).Annotation(annSize, "2").TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("train", 2, "nvlink").Obj(),
			verdict: allowed,
		},
		"a group size equal to the pods at once is fine": {
			job:     job().Intent("data").Parallelism(4).Annotation(annSize, "4").Obj(),
			want:    job().Intent("data").Parallelism(4).Annotation(annSize, "4").TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("train", 4, "").Obj(),
			verdict: allowed,
		},
		"the Job's levels are copied and its preferred level replaces nvlink": {
			job: job().Intent("model").Parallelism(4).Annotation(annRequired, "spine").Annotation(annPreferred, "leaf").Obj(),
			want: job().Intent("model").Parallelism(4).Annotation(annRequired, "spine").Annotation(annPreferred, "leaf").
				TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("train", 4, "leaf").TemplateAnnotation(annRequired, "spine").Obj(),
			verdict: allowed,
		},
		"a group the Job names is the template's group": {
			job:     job().Intent("data").Parallelism(4).Annotation(annGroup, "llm").Obj(),
			want:    job().Intent("data").Parallelism(4).Annotation(annGroup, "llm").TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("llm", 4, "").Obj(),
			verdict: allowed,
		},
		"a template that names a group keeps it, and may size it beyond this Job": {
			job:     job().Intent("model").Parallelism(4).TemplateAnnotation(annGroup, "llm").TemplateAnnotation(annSize, "8").Obj(),
			want:    job().Intent("model").Parallelism(4).TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("llm", 8, "nvlink").Obj(),
			verdict: allowed,
		},
		"a template that names a group without a size gets the pods at once": {
			job:     job().Intent("data").Parallelism(4).TemplateAnnotation(annGroup, "llm").Obj(),
			want:    job().Intent("data").Parallelism(4).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("llm", 4, "").Obj(),
			verdict: allowed,
		},
		"a template's own preferred level is kept": {
			job:     job().Intent("model").Parallelism(4).TemplateAnnotation(annPreferred, "leaf").Obj(),
			want:    job().Intent("model").Parallelism(4).TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("train", 4, "leaf").Obj(),
			verdict: allowed,
		},
		"a template's size without a name joins the Job's group": {
			job:     job().Intent("data").Parallelism(4).TemplateAnnotation(annSize, "3").Obj(),
			want:    job().Intent("data").Parallelism(4).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("train", 3, "").Obj(),
			verdict: allowed,
		},
		"a template that names a group without intent keeps it as written, with the Job's size": {
			job:     job().Parallelism(4).Annotation(annSize, "4").TemplateAnnotation(annGroup, "llm").Obj(),
			want:    job().Parallelism(4).Annotation(annSize, "4").Group("llm", 4, "").Obj(),
			verdict: allowed,
		},
		"the Job and the template may state the same size": {
			job:     job().Intent("data").Parallelism(4).Annotation(annSize, "4").TemplateAnnotation(annGroup, "llm").TemplateAnnotation(annSize, "4").Obj(),
			want:    job().Intent("data").Parallelism(4).Annotation(annSize, "4").TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("llm", 4, "").Obj(),
			verdict: allowed,
		},
		"a Job name longer than a DNS label is cut and hashed": {
			job:     MakeJob(long, nsOptedIn, 4).Intent("data").Parallelism(2).Obj(),
			want:    MakeJob(long, nsOptedIn, 4).Intent("data").Parallelism(2).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("distributed-training-run-for-the-very-large-language-m-5e77d3a1", 2, "").Obj(),
			verdict: allowed,
		},
		"a Job name with dots is made a DNS label and hashed": {
			job:     MakeJob("train.v2", nsOptedIn, 4).Intent("data").Parallelism(2).Obj(),
			want:    MakeJob("train.v2", nsOptedIn, 4).Intent("data").Parallelism(2).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("train-v2-fb5a1121", 2, "").Obj(),
			verdict: allowed,
		},
		"a Job named by generateName gets its stem and a hash of the request": {
			job:     job().GenerateName("train-").Intent("data").Parallelism(2).Obj(),
			want:    job().GenerateName("train-").Intent("data").Parallelism(2).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("train-db160f11", 2, "").Obj(),
			verdict: allowed,
		},
		"a native PodGroup in the template wins: no gputopo group": {
			job:     job().Intent("model").Parallelism(4).SchedulingGroup("pg").Obj(),
			want:    job().Intent("model").Parallelism(4).SchedulingGroup("pg").TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Obj(),
			verdict: allowed,
		},
		"a model Job of 32 pods in 2 slices of 16: the slice annotations reach the pods": {
			job: job().Intent("model").Parallelism(32).Annotation(annRequired, "spine").Annotation(annSliceSize, "16").Annotation(annSliceRequired, "nvlink").Obj(),
			want: job().Intent("model").Parallelism(32).Annotation(annRequired, "spine").Annotation(annSliceSize, "16").Annotation(annSliceRequired, "nvlink").
				TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("train", 32, "nvlink").
				TemplateAnnotation(annRequired, "spine").TemplateAnnotation(annSliceSize, "16").TemplateAnnotation(annSliceRequired, "nvlink").Obj(),
			verdict: allowed,
		},
		"a JobSet's Job: the JobSet is one group of all its Jobs' pods": {
			job: job().OfJobSet("llm", 4, 0).Intent("data").Parallelism(8).Obj(),
			want: job().OfJobSet("llm", 4, 0).Intent("data").Parallelism(8).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").
				Group("llm", 32, "").Obj(),
			verdict: allowed,
		},
		"a JobSet that names a slice level: each Job is a slice": {
			job: job().OfJobSet("llm", 2, 0).Intent("model").Parallelism(16).Annotation(annRequired, "spine").Annotation(annSliceRequired, "nvlink").Obj(),
			want: job().OfJobSet("llm", 2, 0).Intent("model").Parallelism(16).Annotation(annRequired, "spine").Annotation(annSliceRequired, "nvlink").
				TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Group("llm", 32, "nvlink").
				TemplateAnnotation(annRequired, "spine").TemplateAnnotation(annSliceRequired, "nvlink").TemplateAnnotation(annSliceSize, "16").Obj(),
			verdict: allowed,
		},
		"a restarted JobSet is a fresh group": {
			job: job().OfJobSet("llm", 2, 3).Intent("data").Parallelism(4).Obj(),
			want: job().OfJobSet("llm", 2, 3).Intent("data").Parallelism(4).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").
				Group("llm-r3", 8, "").Obj(),
			verdict: allowed,
		},
		"a JobSet of one-pod Jobs is a group too": {
			job:     job().OfJobSet("w", 3, 0).Intent("data").Parallelism(1).Obj(),
			want:    job().OfJobSet("w", 3, 0).Intent("data").Parallelism(1).TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Group("w", 3, "").Obj(),
			verdict: allowed,
		},
		"a JobSet without intent is left as it is": {
			job:     job().OfJobSet("llm", 4, 0).Parallelism(8).Obj(),
			want:    job().OfJobSet("llm", 4, 0).Parallelism(8).Obj(),
			verdict: allowed,
		},
		"a slice size that does not divide the group is denied with a divisor": {
			job:     job().Intent("model").Parallelism(32).Annotation(annSliceSize, "12").Annotation(annSliceRequired, "nvlink").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/slice-size]: Invalid value: "12": must divide the group's size 32 into whole slices: use a divisor of 32 (e.g. 8), or change gputopo.io/group-size`),
		},
		"a slice level wider than the group's is denied": {
			job:     job().Intent("model").Parallelism(8).Annotation(annRequired, "leaf").Annotation(annSliceSize, "4").Annotation(annSliceRequired, "spine").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/slice-required-topology]: Invalid value: "spine": is wider than gputopo.io/group-required-topology "leaf": a slice lies inside its group; use a level no wider than "leaf", or widen gputopo.io/group-required-topology`),
		},
		"slices on a group of one are denied": {
			job:     job().Intent("model").Parallelism(4).TemplateAnnotation(annGroup, "solo").TemplateAnnotation(annSize, "1").TemplateAnnotation(annSliceSize, "1").TemplateAnnotation(annSliceRequired, "nvlink").Obj(),
			verdict: invalid(`spec.template.metadata.annotations[gputopo.io/slice-size]: Invalid value: "1": slices on a group of one pod: set gputopo.io/group-size to the group's pods (a multiple of 1), or remove gputopo.io/slice-size`),
		},
		"a slice size without its level is denied": {
			job:     job().Intent("data").Parallelism(8).Annotation(annSliceSize, "4").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/slice-required-topology]: Required value: gputopo.io/slice-size cuts the group into slices; say the level each slice must lie in (e.g. nvlink or leaf), or remove gputopo.io/slice-size`),
		},
		"a slice level without a slice size is denied": {
			job:     job().Intent("data").Parallelism(8).Annotation(annSliceRequired, "leaf").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/slice-required-topology]: Invalid value: "leaf": a slice level without gputopo.io/slice-size: add gputopo.io/slice-size (the pods of one slice), or remove gputopo.io/slice-required-topology`),
		},

		"a group size above the pods at once is denied": {
			job: job().Intent("model").Parallelism(4).Annotation(annSize, "8").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "8": the group could never be complete: at most 4 pods of this Job run at once (spec.parallelism 4);` +
				` set gputopo.io/group-size to 4 or less, or raise spec.parallelism`),
		},
		"a group size above the completions is denied naming them": {
			job: job().Intent("model").Indexed().Parallelism(4).Completions(2).Annotation(annSize, "4").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "4": the group could never be complete: at most 2 pods of this Job run at once (spec.completions 2, spec.parallelism 4);` +
				` set gputopo.io/group-size to 2 or less, or raise spec.completions`),
		},
		"a group size on a Job of one pod at once is denied": {
			job: job().Intent("data").Annotation(annSize, "2").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "2": the group could never be complete: at most 1 pod of this Job runs at once (spec.parallelism 1);` +
				` set gputopo.io/group-size to 1 or less, or raise spec.parallelism`),
		},
		"a group size on a Job of no pods at once is denied": {
			job: job().Intent("data").Parallelism(0).Annotation(annSize, "2").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "2": the group could never be complete: at most 0 pods of this Job run at once (spec.parallelism 0);` +
				` raise spec.parallelism`),
		},
		"a template's size without a name above the pods at once is denied at the template": {
			job: job().Intent("data").Parallelism(4).TemplateAnnotation(annSize, "6").Obj(),
			verdict: invalid(`spec.template.metadata.annotations[gputopo.io/group-size]: Invalid value: "6": the group could never be complete: at most 4 pods of this Job run at once (spec.parallelism 4);` +
				` set gputopo.io/group-size to 4 or less, or raise spec.parallelism`),
		},
		"a Job size that contradicts the template's is denied": {
			job: job().Intent("data").Parallelism(4).Annotation(annSize, "4").TemplateAnnotation(annGroup, "llm").TemplateAnnotation(annSize, "8").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "4": contradicts spec.template.metadata.annotations[gputopo.io/group-size] ("8"), which the Job's pods would carry;` +
				` state it in one place, or give both the same value`),
		},
		"a Job group name that contradicts the template's is denied": {
			job: job().Intent("data").Parallelism(4).Annotation(annGroup, "a").TemplateAnnotation(annGroup, "b").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group]: Invalid value: "a": contradicts spec.template.metadata.annotations[gputopo.io/group] ("b"), which the Job's pods would carry;` +
				` state it in one place, or give both the same value`),
		},
		"a Job level that contradicts the template's is denied": {
			job: job().Intent("model").Parallelism(4).Annotation(annRequired, "leaf").TemplateAnnotation(annRequired, "spine").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group-required-topology]: Invalid value: "leaf": contradicts spec.template.metadata.annotations[gputopo.io/group-required-topology] ("spine"), which the Job's pods would carry;` +
				` state it in one place, or give both the same value`),
		},
		"a malformed group size on the Job is denied naming the Job's field": {
			job:     job().Intent("data").Parallelism(4).Annotation(annSize, "four").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "four": must be a whole number of pods, e.g. "4"`),
		},
		"a group name on the Job that is no DNS label is denied": {
			job: job().Intent("data").Parallelism(4).Annotation(annGroup, "LLM_1").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group]: Invalid value: "LLM_1": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-',` +
				` and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')`),
		},
		"a level on the Job that is no level or label key is denied": {
			job:     job().Intent("model").Parallelism(4).Annotation(annPreferred, "fast lane").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group-preferred-topology]: Invalid value: "fast lane": must be a fabric level name (nvlink, leaf, spine, block, zone) or a node label key`),
		},
		"a size out of range in the template is denied naming the template's field": {
			job:     job().Intent("data").Parallelism(4).TemplateAnnotation(annGroup, "llm").TemplateAnnotation(annSize, "0").Obj(),
			verdict: invalid(`spec.template.metadata.annotations[gputopo.io/group-size]: Invalid value: "0": must be between 1 and 10000 pods`),
		},
		"a size in a template of a Job that gets no group needs a name": {
			job: job().Parallelism(4).TemplateAnnotation(annSize, "4").Obj(),
			verdict: invalid(`spec.template.metadata.annotations[gputopo.io/group]: Required value: gputopo.io/group-size is set but the group is not named:` +
				` add gputopo.io/group (the job's name), or remove gputopo.io/group-size`),
		},
		"group annotations on a Job without intent are denied: they would reach no pod": {
			job: job().Parallelism(4).Annotation(annSize, "4").Annotation(annPreferred, "leaf").Obj(),
			verdict: invalid(`[metadata.annotations[gputopo.io/group-size]: Invalid value: "4": the Job states no gputopo.io/parallelism, so its pods get no group and this annotation would reach none of them;` +
				` add gputopo.io/parallelism (model or data) to the Job, or remove this annotation,` +
				` metadata.annotations[gputopo.io/group-preferred-topology]: Invalid value: "leaf": the Job states no gputopo.io/parallelism, so its pods get no group and this annotation would reach none of them;` +
				` add gputopo.io/parallelism (model or data) to the Job, or remove this annotation]`),
		},
		"group annotations on a Job of one pod at once are denied": {
			job: job().Intent("data").Parallelism(4).Completions(1).Annotation(annGroup, "llm").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/group]: Invalid value: "llm": at most 1 pod of this Job runs at once (spec.completions 1, spec.parallelism 4),` +
				` so its pods never form a group and this annotation would reach none of them; raise spec.completions, or remove this annotation`),
		},
		"a template with a PodGroup and a gputopo group is denied: name one group": {
			job:     job().Intent("model").Parallelism(4).SchedulingGroup("pg").TemplateAnnotation(annGroup, "llm").Obj(),
			verdict: invalid(nameOneGroupMsg("spec.template.metadata.annotations[gputopo.io/group]", "llm", annGroup, "pg")),
		},
		"a Job's group size next to a PodGroup in the template is denied too": {
			job:     job().Intent("model").Parallelism(4).SchedulingGroup("pg").Annotation(annSize, "4").Obj(),
			verdict: invalid(nameOneGroupMsg("metadata.annotations[gputopo.io/group-size]", "4", annSize, "pg")),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { checkJobMutator(t, tc.job, tc.want, tc.verdict) })
	}
}

func TestJobGroupName(t *testing.T) {
	for name, tc := range map[string]struct {
		job  *batchv1.Job
		want string
	}{
		"a DNS label is kept":               {MakeJob("train", nsOptedIn, 1).Obj(), "train"},
		"63 characters are kept":            {MakeJob(strings.Repeat("a", 63), nsOptedIn, 1).Obj(), strings.Repeat("a", 63)},
		"64 characters are cut and hashed":  {MakeJob(strings.Repeat("a", 64), nsOptedIn, 1).Obj(), strings.Repeat("a", 54) + hashSuffix(strings.Repeat("a", 64))},
		"a dash at the cut goes":            {MakeJob(strings.Repeat("a", 53)+"-"+strings.Repeat("b", 20), nsOptedIn, 1).Obj(), strings.Repeat("a", 53) + hashSuffix(strings.Repeat("a", 53)+"-"+strings.Repeat("b", 20))},
		"dots become dashes":                {MakeJob("a.b", nsOptedIn, 1).Obj(), "a-b" + hashSuffix("a.b")},
		"generateName gets the request's":   {MakeJob("", nsOptedIn, 1).GenerateName("w-").Obj(), "w" + hashSuffix("uid-7")},
		"a generateName of dots and dashes": {MakeJob("", nsOptedIn, 1).GenerateName("a.b.").Obj(), "a-b" + hashSuffix("uid-7")},
	} {
		t.Run(name, func(t *testing.T) {
			got := jobGroupName(tc.job, "uid-7")
			if got != tc.want {
				t.Errorf("jobGroupName = %q, want %q", got, tc.want)
			}
			if msgs := validation.IsDNS1123Label(got); len(msgs) > 0 {
				t.Errorf("%q is no DNS label: %v", got, msgs)
			}
		})
	}
	if a, b := jobGroupName(MakeJob(strings.Repeat("a", 70)+"1", nsOptedIn, 1).Obj(), ""), jobGroupName(MakeJob(strings.Repeat("a", 70)+"2", nsOptedIn, 1).Obj(), ""); a == b {
		t.Errorf("two long names that share a prefix got the same group %q", a)
	}
}
