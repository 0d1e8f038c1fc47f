package webhook

import (
	"context"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// JobMutator copies a Job's intent into its pod template on CREATE in
// opted-in namespaces, so every pod the Job controller creates carries it
// without a Job lookup. It also denies, at the Job rather than at each of
// its pods, what PodValidator would refuse in the template: an unknown
// intent, a malformed requirement, or a system annotation.
type JobMutator struct {
	cfg  configv1alpha1.WebhookConfiguration
	meta metadataReader
}

var _ admission.Handler = (*JobMutator)(nil)

// NewJobMutator returns a JobMutator reading Namespaces through reader.
func NewJobMutator(cfg configv1alpha1.WebhookConfiguration, reader client.Reader) *JobMutator {
	return &JobMutator{cfg: cfg, meta: metadataReader{reader: reader}}
}

var templateAnnotationsPath = field.NewPath("spec", "template", "metadata", "annotations")

// Handle implements admission.Handler.
func (m *JobMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || req.SubResource != "" {
		return admission.Allowed("")
	}
	job, shape, err := decodeJob(req.Object)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	_, resp := m.meta.mutatedNamespace(ctx, m.cfg, req.Namespace, job.Namespace)
	if resp != nil {
		return *resp
	}

	var errs field.ErrorList
	jobIntent, hasJobIntent := job.Annotations[v1alpha1.AnnotationParallelism]
	if hasJobIntent {
		if _, ferr := v1alpha1.ParseParallelism(intentPath, jobIntent); ferr != nil {
			errs = append(errs, ferr)
		}
	}
	tmpl := job.Spec.Template.Annotations
	tmplIntent, hasTmplIntent := tmpl[v1alpha1.AnnotationParallelism]
	if hasTmplIntent {
		if _, ferr := v1alpha1.ParseParallelism(templateAnnotationsPath.Key(v1alpha1.AnnotationParallelism), tmplIntent); ferr != nil {
			errs = append(errs, ferr)
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
	if len(errs) > 0 {
		logf.FromContext(ctx).V(1).Info("job denied", "job", klog.KObj(job), "user", req.UserInfo.Username, "errors", len(errs))
		return deny(errs)
	}
	if !hasJobIntent || hasTmplIntent || shape.Spec.Template == nil {
		// A template that states its own intent is more specific than the
		// Job's, just as a pod's own annotation is. A Job without a template
		// is invalid and the apiserver says so.
		return admission.Allowed("")
	}
	ops := setMetadata(nil, "/spec/template/metadata", shape.Spec.Template.Metadata.shape(),
		map[string]string{v1alpha1.AnnotationParallelism: jobIntent}, nil)
	return admission.Patched("", ops...)
}
