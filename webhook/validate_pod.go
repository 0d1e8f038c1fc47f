package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// PodValidator judges pods on CREATE and UPDATE (including the status and
// ephemeralcontainers subresources) after all mutation:
//
//   - only SystemServiceAccounts may set, change or remove the system
//     annotations, in every namespace the webhook sees and whatever the
//     pod's schedulerName;
//   - a requirement or intent annotation must be valid (on UPDATE, when it
//     changed, so pods admitted under older rules stay updatable);
//   - in opted-in namespaces, no container may choose its own
//     NVIDIA_VISIBLE_DEVICES: GPU containers get theirs from the node
//     agent, the others must have "void".
type PodValidator struct {
	cfg  Config
	meta metadataReader
}

var _ admission.Handler = (*PodValidator)(nil)

// NewPodValidator returns a PodValidator reading Namespaces through reader.
func NewPodValidator(cfg Config, reader client.Reader) *PodValidator {
	return &PodValidator{cfg: cfg, meta: metadataReader{reader: reader}}
}

// Handle implements admission.Handler.
func (v *PodValidator) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return admission.Allowed("")
	}
	pod := &corev1.Pod{}
	if err := decodeInto(req.Object, "pod", pod, nil); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	var old *corev1.Pod
	if req.Operation == admissionv1.Update {
		old = &corev1.Pod{}
		if err := decodeInto(req.OldObject, "old pod", old, nil); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
	}

	errs := v.systemAnnotations(req.UserInfo.Username, pod, old)
	errs = append(errs, validateUserAnnotations(pod, old)...)

	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	var envErrs field.ErrorList
	switch {
	case old == nil:
		envErrs = visibleDevicesCreate(pod)
	case req.SubResource == "ephemeralcontainers":
		envErrs = visibleDevicesEphemeral(pod, old)
	}
	// The namespace is read only when a container sets the variable, so
	// the common pod costs no lookup.
	if len(envErrs) > 0 && !v.cfg.isExcluded(ns) {
		info, err := v.meta.namespace(ctx, ns, v.cfg.NamespaceDefaultAnnotation)
		if err != nil {
			return admission.Errored(http.StatusInternalServerError, err)
		}
		if info.optedIn {
			errs = append(errs, envErrs...)
		}
	}

	if len(errs) == 0 {
		return admission.Allowed("")
	}
	logf.FromContext(ctx).V(1).Info("pod denied", "pod", klog.KObj(pod), "user", req.UserInfo.Username, "errors", len(errs))
	return deny(errs)
}

// systemAnnotations reports each system annotation whose presence or value
// differs between old (nil on CREATE) and pod, unless user may write them.
func (v *PodValidator) systemAnnotations(user string, pod, old *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	if v.cfg.isSystem(user) {
		return nil
	}
	for _, key := range v1alpha1.SystemAnnotations {
		nv, nok := pod.Annotations[key]
		var ov string
		var ook bool
		if old != nil {
			ov, ook = old.Annotations[key]
		}
		if nok == ook && nv == ov {
			continue
		}
		verb := "set"
		switch {
		case ook && !nok:
			verb = "remove"
		case ook:
			verb = "change"
		}
		errs = append(errs, field.Forbidden(annotationsPath.Key(key), fmt.Sprintf(
			"user %q may not %s this annotation: it decides which GPUs the pod gets and only gputopo's system service accounts (%s) write it; remove it from the pod (and from any template that creates it)",
			user, verb, strings.Join(v.cfg.SystemServiceAccounts, ", "))))
	}
	return errs
}

// validateUserAnnotations checks the requirement and intent annotations; on
// UPDATE only those that changed.
func validateUserAnnotations(pod, old *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	changed := func(key string) (string, bool) {
		nv, nok := pod.Annotations[key]
		if !nok {
			return "", false
		}
		if old != nil {
			if ov, ook := old.Annotations[key]; ook && ov == nv {
				return "", false
			}
		}
		return nv, true
	}
	if val, ok := changed(v1alpha1.AnnotationRequirement); ok {
		if _, err := v1alpha1.ParseRequirement(val); err != nil {
			errs = append(errs, fieldErrors(err)...)
		}
	}
	if val, ok := changed(v1alpha1.AnnotationParallelism); ok {
		if _, ferr := v1alpha1.ParseParallelism(intentPath, val); ferr != nil {
			errs = append(errs, ferr)
		}
	}
	return errs
}

// fieldErrors unpacks the aggregate ParseRequirement returns into its field
// errors, so they merge with the others into one message.
func fieldErrors(err error) field.ErrorList {
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		return field.ErrorList{field.Invalid(annotationsPath.Key(v1alpha1.AnnotationRequirement), nil, err.Error())}
	}
	var out field.ErrorList
	for _, e := range agg.Errors() {
		var fe *field.Error
		if errors.As(e, &fe) {
			out = append(out, fe)
			continue
		}
		out = append(out, field.Invalid(annotationsPath.Key(v1alpha1.AnnotationRequirement), nil, e.Error()))
	}
	return out
}

const (
	msgGPUContainerEnv = "must not be set in a container that requests " + v1alpha1.ResourceGPU +
		": the node agent sets it to exactly the GPUs kubelet allocated; remove this entry"
	msgOtherContainerEnv = "must be \"" + envVoid + "\" (or absent) in a container that requests no " + v1alpha1.ResourceGPU +
		", so it sees no GPU; request " + v1alpha1.ResourceGPU + " to get one"
)

// visibleDevicesCreate reports containers that set NVIDIA_VISIBLE_DEVICES
// themselves.
func visibleDevicesCreate(pod *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	check := func(path *field.Path, gpu bool, env []corev1.EnvVar) {
		for j := range env {
			e := &env[j]
			if e.Name != v1alpha1.EnvVisibleDevices {
				continue
			}
			switch {
			case gpu:
				errs = append(errs, field.Forbidden(path.Child("env").Index(j), msgGPUContainerEnv))
			case e.Value != envVoid || e.ValueFrom != nil:
				errs = append(errs, field.Forbidden(path.Child("env").Index(j), msgOtherContainerEnv))
			}
		}
	}
	spec := field.NewPath("spec")
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		check(spec.Child("initContainers").Index(i), containerGPUs(c.Resources) > 0, c.Env)
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		check(spec.Child("containers").Index(i), containerGPUs(c.Resources) > 0, c.Env)
	}
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		check(spec.Child("ephemeralContainers").Index(i), false, c.Env)
	}
	return errs
}

// visibleDevicesEphemeral checks ephemeral containers being added.
func visibleDevicesEphemeral(pod, old *corev1.Pod) field.ErrorList {
	existing := sets.New[string]()
	for i := range old.Spec.EphemeralContainers {
		existing.Insert(old.Spec.EphemeralContainers[i].Name)
	}
	var errs field.ErrorList
	path := field.NewPath("spec", "ephemeralContainers")
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		if existing.Has(c.Name) {
			continue
		}
		for j := range c.Env {
			e := &c.Env[j]
			if e.Name == v1alpha1.EnvVisibleDevices && (e.Value != envVoid || e.ValueFrom != nil) {
				errs = append(errs, field.Forbidden(path.Index(i).Child("env").Index(j), msgOtherContainerEnv))
			}
		}
	}
	return errs
}

// deny turns field errors into a denial: 403 Forbidden when any error is a
// permission problem, else 422 Invalid. The message lists every error.
func deny(errs field.ErrorList) admission.Response {
	code, reason := int32(http.StatusUnprocessableEntity), metav1.StatusReasonInvalid
	for _, e := range errs {
		if e.Type == field.ErrorTypeForbidden {
			code, reason = http.StatusForbidden, metav1.StatusReasonForbidden
			break
		}
	}
	resp := admission.Denied(errs.ToAggregate().Error())
	resp.Result.Code = code
	resp.Result.Reason = reason
	return resp
}
