package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/klog/v2"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// PodValidator judges pods on CREATE and UPDATE (including the status and
// ephemeralcontainers subresources) after all mutation:
//
//   - only SystemServiceAccounts may set, change or remove the system
//     annotations, in every namespace the webhook sees and whatever the
//     pod's schedulerName; NodeAgentServiceAccounts may write only
//     allocated-gpus, and only on pods bound to their own node;
//   - a requirement or intent annotation must be valid (on UPDATE, when it
//     changed, so pods admitted under older rules stay updatable), and so
//     must the pod's GPU counts (on CREATE);
//   - the group annotations must be valid (v1alpha1.ParseGroup) on CREATE,
//     and may not be set, changed or removed on UPDATE (including status),
//     except by SystemServiceAccounts and NodeAgentServiceAccounts: the
//     scheduler plans the group from them;
//   - in GPU pods, in every namespace, no container may choose its own
//     devices (DeviceEnvVars): GPU containers get them from the node agent,
//     the others may only hide every GPU with NVIDIA_VISIBLE_DEVICES=void;
//     GPU containers may not take envFrom sources that could set an
//     NVIDIA_ variable, and other containers (init, sidecar, ephemeral)
//     only together with NVIDIA_VISIBLE_DEVICES=void under env
//     (GPUContainerEnvFrom);
//   - in opted-in namespaces the same holds for pods without GPUs.
type PodValidator struct{ handler }

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

	errs := v.systemAnnotations(req.UserInfo, pod, old)
	errs = append(errs, validateUserAnnotations(pod, old)...)
	errs = append(errs, v.groupAnnotations(req.UserInfo.Username, pod, old)...)

	gpus, demandErr := v1alpha1.PodGPUDemand(&pod.Spec, v.cfg.GPUResource())
	if demandErr != nil && old == nil {
		// Container resources are immutable, so only a create can bring
		// a bad count.
		errs = append(errs, fieldErrors(demandErr, field.NewPath("spec"))...)
	}
	gpuPod := gpus > 0 || demandErr != nil

	var envErrs field.ErrorList
	switch {
	case old == nil:
		envErrs = v.envCreate(pod)
	case req.SubResource == "ephemeralcontainers":
		envErrs = v.envEphemeral(pod, old)
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	switch {
	case len(envErrs) == 0:
	case gpuPod:
		// The node agent is the device plugin of every GPU pod on its
		// node, opted in or not: a GPU pod never chooses its devices.
		errs = append(errs, envErrs...)
	case !v.cfg.IsExcluded(ns):
		// The namespace is read only when a container of a pod without
		// GPUs sets a device variable, so the common pod costs no lookup.
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
// differs between old (nil on CREATE) and pod, unless user may write it.
func (v *PodValidator) systemAnnotations(user authenticationv1.UserInfo, pod, old *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	nodeAgent := v.cfg.IsNodeAgent(user.Username)
	if !nodeAgent && v.cfg.IsSystem(user.Username) {
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
		path := annotationsPath.Key(key)
		switch {
		case nodeAgent && key == v1alpha1.AnnotationAllocatedGPUs:
			if ferr := nodeIdentity(path, user, pod, old); ferr != nil {
				errs = append(errs, ferr)
			}
		case nodeAgent:
			errs = append(errs, field.Forbidden(path, fmt.Sprintf(
				"node agent %q may not %s this annotation: a node agent records only %s, what kubelet allocated on its node; the extender writes the plan through the pod's Binding",
				user.Username, verb, v1alpha1.AnnotationAllocatedGPUs)))
		default:
			errs = append(errs, field.Forbidden(path, fmt.Sprintf(
				"user %q may not %s this annotation: it decides which GPUs the pod gets and only gputopo's system service accounts (%s) write it; remove it from the pod (and from any template that creates it)",
				user.Username, verb, strings.Join(v.cfg.Writers(), ", "))))
		}
	}
	return errs
}

// nodeIdentity checks that a node agent writes allocated-gpus only on a
// pod bound to its own node. kube-apiserver names the node in the user's
// extra authentication.kubernetes.io/node-name when the credential is a
// service account token bound to a pod that runs on a node (the projected
// token kubelet mounts into every pod); the pod's node is the stored one
// (old on UPDATE), since a write cannot move a pod.
func nodeIdentity(path *field.Path, user authenticationv1.UserInfo, pod, old *corev1.Pod) *field.Error {
	nodes := user.Extra[serviceaccount.NodeNameKey]
	if len(nodes) != 1 || nodes[0] == "" {
		return field.Forbidden(path, fmt.Sprintf(
			"node agent %q presented a credential that names no node (user extra %s is %v): a node agent may record allocated GPUs only of pods on its own node, so it must authenticate with a service account token bound to its pod, the projected token kubelet mounts into the pod by default, not with a long-lived Secret token or a client certificate",
			user.Username, serviceaccount.NodeNameKey, []string(nodes)))
	}
	node := nodes[0]
	bound := pod.Spec.NodeName
	if old != nil {
		bound = old.Spec.NodeName
	}
	switch {
	case bound == "":
		return field.Forbidden(path, fmt.Sprintf(
			"node agent %q runs on node %q and this pod is bound to no node yet: a node agent records allocated GPUs only of pods bound to its own node",
			user.Username, node))
	case bound != node:
		return field.Forbidden(path, fmt.Sprintf(
			"node agent %q runs on node %q but this pod is bound to node %q: a node agent records allocated GPUs only of pods bound to its own node",
			user.Username, node, bound))
	}
	return nil
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
			errs = append(errs, fieldErrors(err, annotationsPath.Key(v1alpha1.AnnotationRequirement))...)
		}
	}
	if val, ok := changed(v1alpha1.AnnotationParallelism); ok {
		if _, ferr := v1alpha1.ParseParallelism(intentPath, val); ferr != nil {
			errs = append(errs, ferr)
		}
	}
	return errs
}

// groupAnnotations checks the group annotations: on CREATE that they
// parse; on UPDATE that none was set, changed or removed, since the
// scheduler plans a pod's group from the annotations it was created with.
// gputopo's own service accounts are not held to that (they are validated
// like a create when they change one).
func (v *PodValidator) groupAnnotations(user string, pod, old *corev1.Pod) field.ErrorList {
	if old == nil {
		return podGroupErrors(pod)
	}
	system := v.cfg.IsSystem(user) || v.cfg.IsNodeAgent(user)
	var errs field.ErrorList
	changed := false
	for _, key := range v1alpha1.GroupAnnotations {
		nv, nok := pod.Annotations[key]
		ov, ook := old.Annotations[key]
		if nok == ook && nv == ov {
			continue
		}
		changed = true
		if system {
			continue
		}
		var what string
		switch {
		case !ook:
			what = fmt.Sprintf("may not be added once the pod exists (now %q)", nv)
		case !nok:
			what = fmt.Sprintf("may not be removed once the pod exists (was %q)", ov)
		default:
			what = fmt.Sprintf("may not be changed once the pod exists (was %q, now %q)", ov, nv)
		}
		errs = append(errs, field.Invalid(annotationsPath.Key(key), field.OmitValueType{}, what+
			": the scheduler plans the pod's group from the group annotations the pod was created with; to change its group, delete the pod and create it again (for a Job's pods: the Job, with the new annotations)"))
	}
	if system && changed {
		errs = podGroupErrors(pod)
	}
	return errs
}

// podGroupErrors checks a pod's group annotations (v1alpha1.ParseGroup),
// its slice levels against the default fabric levels, and the index that
// names its slice.
func podGroupErrors(pod *corev1.Pod) field.ErrorList {
	g, ok, errs := v1alpha1.ParseGroup(annotationsPath, pod.Annotations)
	if !ok || len(errs) > 0 {
		return errs
	}
	if ferr := checkSliceLevels(annotationsPath, g); ferr != nil {
		errs = append(errs, ferr)
	}
	if _, ferr := v1alpha1.SliceOf(annotationsPath, g, pod.Annotations, pod.Labels); ferr != nil {
		errs = append(errs, ferr)
	}
	return errs
}

// checkSliceLevels refuses a slice level wider than the group's when both
// are levels of the default fabric levels (the webhook does not read the
// scheduler's configuration; the scheduler judges the others, and refuses
// the pod with the same words).
func checkSliceLevels(path *field.Path, g v1alpha1.GroupSpec) *field.Error {
	levels := configv1alpha1.DefaultFabricLevels()
	return v1alpha1.CheckSliceLevels(path, g, func(name string) (int, bool) { return configv1alpha1.FabricLevelIndex(levels, name) })
}

// fieldErrors unpacks an aggregate of field errors (ParseRequirement's,
// PodGPUDemand's) so they merge with the others into one message; an
// error of another kind is reported at path.
func fieldErrors(err error, path *field.Path) field.ErrorList {
	var agg utilerrors.Aggregate
	if !errors.As(err, &agg) {
		return field.ErrorList{field.Invalid(path, nil, err.Error())}
	}
	var out field.ErrorList
	for _, e := range agg.Errors() {
		var fe *field.Error
		if errors.As(e, &fe) {
			out = append(out, fe)
			continue
		}
		out = append(out, field.Invalid(path, nil, e.Error()))
	}
	return out
}

// envCreate reports every container that chooses its own devices: by a
// device variable in env, or by an envFrom source that could set one.
func (v *PodValidator) envCreate(pod *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	res := v.cfg.GPUResource()
	spec := field.NewPath("spec")
	check := func(path *field.Path, c *corev1.Container) {
		gpu := requestsResource(&c.Resources, res)
		errs = append(errs, deviceEnv(path, c.Name, res, gpu, c.Env)...)
		errs = append(errs, v.envFrom(path, c.Name, res, gpu, c.Env, c.EnvFrom)...)
	}
	for i := range pod.Spec.InitContainers {
		check(spec.Child("initContainers").Index(i), &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		check(spec.Child("containers").Index(i), &pod.Spec.Containers[i])
	}
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		path := spec.Child("ephemeralContainers").Index(i)
		errs = append(errs, deviceEnv(path, c.Name, res, false, c.Env)...)
		errs = append(errs, v.envFrom(path, c.Name, res, false, c.Env, c.EnvFrom)...)
	}
	return errs
}

// envEphemeral checks the ephemeral containers being added; they cannot
// request resources, and existing ones cannot change.
func (v *PodValidator) envEphemeral(pod, old *corev1.Pod) field.ErrorList {
	existing := sets.New[string]()
	for i := range old.Spec.EphemeralContainers {
		existing.Insert(old.Spec.EphemeralContainers[i].Name)
	}
	var errs field.ErrorList
	res := v.cfg.GPUResource()
	path := field.NewPath("spec", "ephemeralContainers")
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		if !existing.Has(c.Name) {
			errs = append(errs, deviceEnv(path.Index(i), c.Name, res, false, c.Env)...)
			errs = append(errs, v.envFrom(path.Index(i), c.Name, res, false, c.Env, c.EnvFrom)...)
		}
	}
	return errs
}

// envFrom reports the envFrom sources of one container that could set a
// device variable, unless GPUContainerEnvFrom is Allow. A GPU container may
// take none (gpuEnvFrom). A container without GPUs may when it also sets
// NVIDIA_VISIBLE_DEVICES=void under env, which beats every envFrom source
// and hides every GPU; the mutating webhook adds it in opted-in
// namespaces.
func (v *PodValidator) envFrom(path *field.Path, container string, res corev1.ResourceName, gpu bool, env []corev1.EnvVar, sources []corev1.EnvFromSource) field.ErrorList {
	if v.cfg.GPUContainerEnvFrom == configv1alpha1.EnvFromAllow {
		return nil
	}
	if gpu {
		return gpuEnvFrom(path, container, res, sources)
	}
	if hidesGPUs(env) {
		return nil
	}
	return riskyEnvFrom(path, sources, func(src *corev1.EnvFromSource, j int) string {
		return fmt.Sprintf(
			"container %q requests no %s and takes every key of %s with %s, so it could set %s and see GPUs it was not given; add {name: %s, value: %s} under env (env beats envFrom), give envFrom[%d] a prefix that cannot begin %s (e.g. \"CFG_\"), or request %s",
			container, res, envFromSourceName(src), envFromPrefixName(src), v1alpha1.EnvVisibleDevices, v1alpha1.EnvVisibleDevices, envVoid, j, EnvPrefixNVIDIA, res)
	})
}

// riskyEnvFrom reports, with msg, each envFrom source whose keys could
// begin NVIDIA_ (envFromCanSetNVIDIA).
func riskyEnvFrom(path *field.Path, sources []corev1.EnvFromSource, msg func(src *corev1.EnvFromSource, j int) string) field.ErrorList {
	var errs field.ErrorList
	for j := range sources {
		if src := &sources[j]; envFromCanSetNVIDIA(src.Prefix) {
			errs = append(errs, field.Forbidden(path.Child("envFrom").Index(j), msg(src, j)))
		}
	}
	return errs
}

// hidesGPUs reports whether env sets NVIDIA_VISIBLE_DEVICES to void, by
// value, in its last entry for the variable (the one that wins).
func hidesGPUs(env []corev1.EnvVar) bool {
	for j := len(env) - 1; j >= 0; j-- {
		if env[j].Name == v1alpha1.EnvVisibleDevices {
			return env[j].Value == envVoid && env[j].ValueFrom == nil
		}
	}
	return false
}

// envFromSourceName says which object an envFrom source reads.
func envFromSourceName(src *corev1.EnvFromSource) string {
	switch {
	case src.ConfigMapRef != nil:
		return fmt.Sprintf("ConfigMap %q", src.ConfigMapRef.Name)
	case src.SecretRef != nil:
		return fmt.Sprintf("Secret %q", src.SecretRef.Name)
	}
	return "this source"
}

// envFromPrefixName says which prefix an envFrom source gives its keys.
func envFromPrefixName(src *corev1.EnvFromSource) string {
	if src.Prefix == "" {
		return "no prefix"
	}
	return fmt.Sprintf("prefix %q", src.Prefix)
}

// deviceEnv reports the env entries of one container that select devices
// (DeviceEnvVars), by value or valueFrom. A GPU container may set none; a
// container without GPUs may only hide them all.
func deviceEnv(path *field.Path, container string, res corev1.ResourceName, gpu bool, env []corev1.EnvVar) field.ErrorList {
	var errs field.ErrorList
	for j := range env {
		e := &env[j]
		if !isDeviceEnv(e.Name) {
			continue
		}
		p := path.Child("env").Index(j)
		switch {
		case gpu:
			errs = append(errs, field.Forbidden(p, fmt.Sprintf(
				"container %q requests %s, so %s must not be set there: the node agent gives the container exactly the devices kubelet allocated; remove this entry",
				container, res, e.Name)))
		case e.Name == v1alpha1.EnvVisibleDevices && e.Value == envVoid && e.ValueFrom == nil:
		case e.Name == v1alpha1.EnvVisibleDevices:
			errs = append(errs, field.Forbidden(p, fmt.Sprintf(
				"container %q requests no %s, so %s may only be %q (or absent) there, which hides every GPU; request %s to get one",
				container, res, e.Name, envVoid, res)))
		default:
			errs = append(errs, field.Forbidden(p, fmt.Sprintf(
				"container %q requests no %s, so it may not select devices with %s; remove this entry, or request %s to get GPUs",
				container, res, e.Name, res)))
		}
	}
	return errs
}

// gpuEnvFrom reports the envFrom sources of a GPU container that could set
// an NVIDIA_ variable. Their keys are unknown at admission (a ConfigMap or
// Secret read now may change before the container starts), and a variable
// from envFrom overrides the device plugin's: kubelet hands the runtime the
// plugin's variables first and the container's own after them.
func gpuEnvFrom(path *field.Path, container string, res corev1.ResourceName, sources []corev1.EnvFromSource) field.ErrorList {
	return riskyEnvFrom(path, sources, func(src *corev1.EnvFromSource, j int) string {
		return fmt.Sprintf(
			"container %q requests %s and takes every key of %s with %s, so it could set %s and override the devices kubelet allocated; give envFrom[%d] a prefix that cannot begin %s (e.g. \"CFG_\"), or name the variables you need under env",
			container, res, envFromSourceName(src), envFromPrefixName(src), v1alpha1.EnvVisibleDevices, j, EnvPrefixNVIDIA)
	})
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
