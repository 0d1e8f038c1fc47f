package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Paths the handlers are served under; Registration points the
// configurations at them.
const (
	PathMutatePod   = "/mutate-pod"
	PathMutateJob   = "/mutate-job"
	PathValidatePod = "/validate-pod"
)

// intentNone names the policy of pods that state no intent anywhere.
const intentNone = "none"

// voidEnvEntry is the env entry that hides every GPU from a container.
var voidEnvEntry = json.RawMessage(`{"name":"` + v1alpha1.EnvVisibleDevices + `","value":"` + envVoid + `"}`)

// PodMutator mutates pods on CREATE in opted-in namespaces: it derives the
// topology requirement, routes GPU pods (pods that request
// Config.ResourceName) to the gputopo scheduler, labels them with their
// job, and hides GPUs from containers that requested none. The
// registration's match conditions send it only pods that concern GPUs
// (mutatingPodMatchExpression), so a pod without GPUs is left alone unless
// it sets an NVIDIA_ variable or takes an envFrom source that could: then
// its containers get NVIDIA_VISIBLE_DEVICES=void, which beats envFrom.
// It never denies on content: that is PodValidator's job, which sees the
// object after every mutating webhook has run. On UPDATE of the
// ephemeralcontainers subresource it hides GPUs from the new ephemeral
// containers.
//
// A pod that asks for GPUs through ResourceClaims of the configured
// classes (ClaimDeviceClasses) instead of the resource is a GPU pod here
// too: its count is its claims' (ReadClaimsWith), its requirement is
// derived and it is routed the same way.
type PodMutator struct {
	handler
	// claims reads ResourceClaims and ResourceClaimTemplates whole (the
	// API server, not a cache); nil: claim pods are left alone.
	claims client.Reader
}

// ReadClaimsWith makes m count the GPUs of pods that ask for them through
// ResourceClaims, read through r, and returns m.
func (m *PodMutator) ReadClaimsWith(r client.Reader) *PodMutator {
	m.claims = r
	return m
}

// Handle implements admission.Handler.
func (m *PodMutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	ephemeral := req.Operation == admissionv1.Update && req.SubResource == "ephemeralcontainers"
	if !(req.Operation == admissionv1.Create && req.SubResource == "") && !ephemeral {
		return admission.Allowed("")
	}
	pod, shape, info, resp := mutated(ctx, m.handler, req, decodePod)
	if resp != nil {
		return *resp
	}

	var ops []jsonpatch.JsonPatchOperation
	if ephemeral {
		old := &corev1.Pod{}
		if err := decodeInto(req.OldObject, "old pod", old, nil); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		ops = m.mutateEphemeral(pod, shape, old)
	} else {
		ops = m.mutateCreate(ctx, pod, shape, info)
	}
	if len(ops) == 0 {
		return admission.Allowed("")
	}
	return admission.Patched("", ops...)
}

func (m *PodMutator) mutateCreate(ctx context.Context, pod *corev1.Pod, shape *rawPod, info namespaceInfo) []jsonpatch.JsonPatchOperation {
	var ops []jsonpatch.JsonPatchOperation
	res := m.cfg.GPUResource()
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if !requestsResource(&c.Resources, res) {
			ops = voidEnv(ops, indexPath("/spec/initContainers", i), c.Env, shape.Spec.InitContainers[i].Env)
		}
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if !requestsResource(&c.Resources, res) {
			ops = voidEnv(ops, indexPath("/spec/containers", i), c.Env, shape.Spec.Containers[i].Env)
		}
	}

	log := logf.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	gpus, err := v1alpha1.PodGPUDemand(&pod.Spec, res)
	if err != nil {
		// PodValidator denies the pod naming the field; nothing is derived
		// from a count that means nothing.
		log.V(1).Info("not routing a pod whose GPU counts are invalid", "error", err.Error())
		return ops
	}
	if gpus == 0 {
		n, why := m.claimGPUs(ctx, pod)
		if why != "" {
			log.V(1).Info("not routing a pod whose GPU claims cannot be counted", "reason", why)
		}
		if n == 0 {
			return ops
		}
		gpus = int64(n)
		log = log.WithValues("throughClaims", true)
	}
	log = log.WithValues("gpus", gpus)

	annotations := map[string]string{}
	if _, ok := pod.Annotations[v1alpha1.AnnotationRequirement]; !ok {
		// A requirement the user wrote is kept; a malformed one is left
		// for PodValidator to deny with its field path.
		if intent, source, ok := m.intent(ctx, pod, info); ok {
			req := m.cfg.PolicyTable.For(intent).Requirement(gpus)
			annotations[v1alpha1.AnnotationRequirement] = req.String()
			log.V(2).Info("derived topology requirement", "intent", intentName(intent), "source", source, "requirement", req.String())
		}
	}
	labels := map[string]string{}
	job := jobIdentity(pod)
	if g, ok := lwsGroupOf(pod); ok {
		// A LeaderWorkerSet replica is placed whole: its group comes from
		// the set's labels, the set is the job.
		job = labelValue(g.set)
		for k, v := range lwsGroupAnnotations(pod, g) {
			annotations[k] = v
		}
		log.V(2).Info("derived a LeaderWorkerSet replica's group", "group", g.group, "size", g.size)
	}
	if _, ok := pod.Labels[v1alpha1.LabelJob]; !ok && job != "" {
		labels[v1alpha1.LabelJob] = job
	}
	ops = setMetadata(ops, "/metadata", shape.Metadata.shape(), annotations, labels)

	if pod.Spec.SchedulerName == "" || pod.Spec.SchedulerName == corev1.DefaultSchedulerName {
		ops = append(ops, opSet("/spec/schedulerName", m.cfg.SchedulerName))
	}
	return ops
}

// claimGPUs is how many GPUs pod asks through its ResourceClaims of the
// configured classes (configv1alpha1.ServedGPUs over each claim's, or
// its template's, requests); 0 with the reason when a claim or template
// cannot be read or asks in a way gputopo cannot choose for (the
// scheduler refuses such a pod with the claim and the fix). A claim pod
// that is not counted is left as it is: not routed, no requirement.
func (m *PodMutator) claimGPUs(ctx context.Context, pod *corev1.Pod) (int, string) {
	if m.claims == nil || len(m.cfg.ClaimDeviceClasses) == 0 || len(pod.Spec.ResourceClaims) == 0 {
		return 0, ""
	}
	total := 0
	for _, pc := range pod.Spec.ResourceClaims {
		var reqs []resourcev1.DeviceRequest
		var what string
		switch {
		case pc.ResourceClaimTemplateName != nil:
			what = "ResourceClaimTemplate " + pod.Namespace + "/" + *pc.ResourceClaimTemplateName
			var t resourcev1.ResourceClaimTemplate
			if err := m.claims.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: *pc.ResourceClaimTemplateName}, &t); err != nil {
				return 0, fmt.Sprintf("read %s: %v", what, err)
			}
			reqs = t.Spec.Spec.Devices.Requests
		case pc.ResourceClaimName != nil:
			what = "ResourceClaim " + pod.Namespace + "/" + *pc.ResourceClaimName
			var c resourcev1.ResourceClaim
			if err := m.claims.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: *pc.ResourceClaimName}, &c); err != nil {
				return 0, fmt.Sprintf("read %s: %v", what, err)
			}
			reqs = c.Spec.Devices.Requests
		default:
			continue
		}
		n, err := configv1alpha1.ServedGPUs(reqs, m.cfg.ClaimDeviceClasses)
		if err != nil {
			return 0, fmt.Sprintf("%s %v", what, err)
		}
		total += n
	}
	return total, ""
}

// intent finds the pod's intent: its own annotation, else its controlling
// Job's, else the namespace default. ok is false only when the pod's own
// annotation is invalid: then nothing is derived and PodValidator denies.
// A bad Job or namespace value is logged and skipped, since the pod's
// author may not own either.
func (m *PodMutator) intent(ctx context.Context, pod *corev1.Pod, info namespaceInfo) (intent v1alpha1.Parallelism, source string, ok bool) {
	log := logf.FromContext(ctx)
	if v, has := pod.Annotations[v1alpha1.AnnotationParallelism]; has {
		p, ferr := v1alpha1.ParseParallelism(intentPath, v)
		return p, "pod", ferr == nil
	}
	if ref := controllingJob(pod); ref != nil {
		v, found, err := m.meta.jobIntent(ctx, pod.Namespace, ref.Name)
		switch {
		case err != nil:
			log.Error(err, "reading the controlling Job failed; using the namespace default", "job", ref.Name)
		case found:
			if p, ferr := v1alpha1.ParseParallelism(intentPath, v); ferr == nil {
				return p, "job", true
			}
			log.Info("ignoring invalid intent on the controlling Job", "job", ref.Name, "value", v)
		}
	}
	if info.intent != "" {
		if p, ferr := v1alpha1.ParseParallelism(intentPath, info.intent); ferr == nil {
			return p, "namespace", true
		}
		log.Info("ignoring invalid default intent on the namespace", "namespace", pod.Namespace, "value", info.intent)
	}
	return "", intentNone, true
}

func intentName(p v1alpha1.Parallelism) string {
	if p == "" {
		return intentNone
	}
	return string(p)
}

// mutateEphemeral hides GPUs from ephemeral containers being added. They
// cannot request GPUs, and existing ones cannot be changed, so only the new
// ones are touched.
func (m *PodMutator) mutateEphemeral(pod *corev1.Pod, shape *rawPod, old *corev1.Pod) []jsonpatch.JsonPatchOperation {
	existing := sets.New[string]()
	for i := range old.Spec.EphemeralContainers {
		existing.Insert(old.Spec.EphemeralContainers[i].Name)
	}
	var ops []jsonpatch.JsonPatchOperation
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		if existing.Has(c.Name) {
			continue
		}
		ops = voidEnv(ops, indexPath("/spec/ephemeralContainers", i), c.Env, shape.Spec.EphemeralContainers[i].Env)
	}
	return ops
}

// voidEnv makes NVIDIA_VISIBLE_DEVICES=void the container's only setting
// of the variable: every entry for it becomes void (whatever its value or
// valueFrom), or one is appended. Appending rewrites the whole env list
// from its raw entries, because inserting into an array is not idempotent.
func voidEnv(ops []jsonpatch.JsonPatchOperation, containerPath string, env []corev1.EnvVar, raw []json.RawMessage) []jsonpatch.JsonPatchOperation {
	found := false
	for j := range env {
		if env[j].Name != v1alpha1.EnvVisibleDevices {
			continue
		}
		found = true
		if env[j].Value != envVoid || env[j].ValueFrom != nil {
			ops = append(ops, opReplace(indexPath(containerPath+"/env", j), voidEnvEntry))
		}
	}
	if found {
		return ops
	}
	entries := make([]json.RawMessage, 0, len(raw)+1)
	entries = append(entries, raw...)
	entries = append(entries, voidEnvEntry)
	return append(ops, opSet(containerPath+"/env", entries))
}

var (
	annotationsPath = field.NewPath("metadata", "annotations")
	intentPath      = annotationsPath.Key(v1alpha1.AnnotationParallelism)
)
