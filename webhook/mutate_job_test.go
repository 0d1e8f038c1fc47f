package webhook

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

func TestJobMutator(t *testing.T) {
	tests := map[string]struct {
		job     *batchv1.Job
		want    *batchv1.Job
		verdict verdict
	}{
		"a model Job's intent is copied into its pod template": {
			job:     MakeJob("train", nsOptedIn, 4).Intent("model").Obj(),
			want:    MakeJob("train", nsOptedIn, 4).Intent("model").TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Obj(),
			verdict: allowed,
		},
		"the copy joins annotations the template already has": {
			job:     MakeJob("train", nsOptedIn, 4).Intent("data").TemplateAnnotation("team", "vision").Obj(),
			want:    MakeJob("train", nsOptedIn, 4).Intent("data").TemplateAnnotation("team", "vision").TemplateAnnotation(v1alpha1.AnnotationParallelism, "data").Obj(),
			verdict: allowed,
		},
		"a template that states its own intent keeps it": {
			job:     MakeJob("train", nsOptedIn, 4).Intent("data").TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Obj(),
			want:    MakeJob("train", nsOptedIn, 4).Intent("data").TemplateAnnotation(v1alpha1.AnnotationParallelism, "model").Obj(),
			verdict: allowed,
		},
		"a Job without intent is untouched": {
			job:     MakeJob("train", nsOptedIn, 4).Obj(),
			want:    MakeJob("train", nsOptedIn, 4).Obj(),
			verdict: allowed,
		},
		"a Job in a namespace that did not opt in is untouched": {
			job:     MakeJob("train", nsPlain, 4).Intent("model").Obj(),
			want:    MakeJob("train", nsPlain, 4).Intent("model").Obj(),
			verdict: allowed,
		},
		"an unknown intent on the Job is denied naming the field": {
			job:     MakeJob("train", nsOptedIn, 4).Intent("Model").Obj(),
			verdict: invalid(`metadata.annotations[gputopo.io/parallelism]: Unsupported value: "Model": supported values: "data", "model"`),
		},
		"an unknown intent in the template is denied naming the field": {
			job:     MakeJob("train", nsOptedIn, 4).TemplateAnnotation(v1alpha1.AnnotationParallelism, "tensor").Obj(),
			verdict: invalid(`spec.template.metadata.annotations[gputopo.io/parallelism]: Unsupported value: "tensor": supported values: "data", "model"`),
		},
		"a malformed requirement in the template is denied naming the field": {
			job:     MakeJob("train", nsOptedIn, 4).TemplateAnnotation(v1alpha1.AnnotationRequirement, `{"minPairBandwidthGBps":-1}`).Obj(),
			verdict: invalid(`spec.template.metadata.annotations[gputopo.io/gpu-topology-requirement].minPairBandwidthGBps: Invalid value: -1: must be 0 (no minimum) or a positive bandwidth in GB/s, bidirectional`),
		},
		"assigned-gpus in the template is denied": {
			job:     MakeJob("train", nsOptedIn, 4).TemplateAnnotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			verdict: forbidden(`spec.template.metadata.annotations[gputopo.io/assigned-gpus]: Forbidden: only gputopo's system service accounts write this annotation, on each pod; every pod created from this template would be denied: remove it`),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { checkJobMutator(t, tc.job, tc.want, tc.verdict) })
	}
}

// checkJobMutator admits job and checks the verdict and, when allowed, the
// mutated Job and that the patch is idempotent.
func checkJobMutator(t *testing.T, in, want *batchv1.Job, wantVerdict verdict) {
	t.Helper()
	m := NewJobMutator(configv1alpha1.DefaultWebhookConfiguration(), fakeReader(t))
	req := request(t, admissionv1.Create, "jobs", "", in, nil, userAlice)
	resp := handle(m, req)
	got := verdict{Allowed: resp.Allowed}
	if resp.Result != nil {
		got.Code, got.Reason, got.Message = resp.Result.Code, resp.Result.Reason, resp.Result.Message
	}
	if got.Allowed {
		got.Message = "" // informational only
	}
	if diff := cmp.Diff(wantVerdict, got); diff != "" {
		t.Fatalf("verdict (-want +got):\n%s", diff)
	}
	if !resp.Allowed {
		return
	}
	job := &batchv1.Job{}
	if err := json.Unmarshal(applyPatch(t, req.Object.Raw, resp), job); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, job); diff != "" {
		t.Errorf("mutated Job (-want +got):\n%s", diff)
	}
	checkIdempotent(t, m, req, resp)
}

func TestJobMutatorTemplateWithoutMetadata(t *testing.T) {
	m := NewJobMutator(configv1alpha1.DefaultWebhookConfiguration(), fakeReader(t))
	req := request(t, admissionv1.Create, "jobs", "", MakeJob("train", nsOptedIn, 1).Obj(), nil, userAlice)
	req.Object.Raw = []byte(`{"metadata":{"name":"train","annotations":{"gputopo.io/parallelism":"model"}},"spec":{"template":{"spec":{"containers":[{"name":"c"}]}}}}`)
	resp := handle(m, req)
	var got, want any
	if err := json.Unmarshal(applyPatch(t, req.Object.Raw, resp), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"metadata":{"name":"train","annotations":{"gputopo.io/parallelism":"model"}},"spec":{"template":{"metadata":{"annotations":{"gputopo.io/parallelism":"model"}},"spec":{"containers":[{"name":"c"}]}}}}`), &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("patched Job (-want +got):\n%s", diff)
	}
}
