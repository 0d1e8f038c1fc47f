package webhook

import (
	"context"
	"net/http"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// handler is what every admission handler here holds: the webhook's
// configuration and the reader of the Namespace and Job metadata it
// consults.
type handler struct {
	cfg  configv1alpha1.WebhookConfiguration
	meta metadataReader
}

func newHandler(cfg configv1alpha1.WebhookConfiguration, reader client.Reader) handler {
	return handler{cfg: cfg, meta: metadataReader{reader: reader}}
}

// NewPodMutator returns a PodMutator that reads Namespaces and Jobs through
// reader (a cache in the server; the reader is asked for
// PartialObjectMetadata only).
func NewPodMutator(cfg configv1alpha1.WebhookConfiguration, reader client.Reader) *PodMutator {
	return &PodMutator{handler: newHandler(cfg, reader)}
}

// NewJobMutator returns a JobMutator reading Namespaces through reader.
func NewJobMutator(cfg configv1alpha1.WebhookConfiguration, reader client.Reader) *JobMutator {
	return &JobMutator{newHandler(cfg, reader)}
}

// NewPodValidator returns a PodValidator reading Namespaces through reader.
func NewPodValidator(cfg configv1alpha1.WebhookConfiguration, reader client.Reader) *PodValidator {
	return &PodValidator{newHandler(cfg, reader)}
}

var (
	_ admission.Handler = (*PodMutator)(nil)
	_ admission.Handler = (*JobMutator)(nil)
	_ admission.Handler = (*PodValidator)(nil)
)

// mutated decodes the object of a mutator's request with decode and
// decides whether the mutators act in its namespace (mutatedNamespace).
// It returns the object, its raw shape and the namespace's info, or the
// response to give instead: an error when the object does not decode,
// else what mutatedNamespace says.
func mutated[T metav1.Object, S any](ctx context.Context, h handler, req admission.Request, decode func(runtime.RawExtension) (T, S, error)) (T, S, namespaceInfo, *admission.Response) {
	obj, shape, err := decode(req.Object)
	if err != nil {
		resp := admission.Errored(http.StatusBadRequest, err)
		return obj, shape, namespaceInfo{}, &resp
	}
	info, resp := h.meta.mutatedNamespace(ctx, h.cfg, req.Namespace, obj.GetNamespace())
	return obj, shape, info, resp
}
