package webhook

import (
	"context"
	"fmt"
	"hash/fnv"
	"net/http"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// envVoid is the NVIDIA_VISIBLE_DEVICES value that makes the NVIDIA
// container runtime expose no GPU at all, whatever the image says.
const envVoid = "void"

// DeviceEnvVars are the environment variables through which the NVIDIA
// container toolkit (nvidia-container-runtime and its hook, with the
// envvar device-list strategy) chooses the devices a container gets:
//
//   - NVIDIA_VISIBLE_DEVICES: the GPUs (index, UUID, MIG device, "all");
//   - NVIDIA_MIG_CONFIG_DEVICES and NVIDIA_MIG_MONITOR_DEVICES: the GPUs
//     whose MIG configuration, or MIG monitoring, the container gets;
//   - NVIDIA_IMEX_CHANNELS: the IMEX channels (multi-node NVLink memory
//     sharing) the container gets.
//
// In a container that requests the GPU resource only the node agent's
// answer to kubelet may set them; a container that does not may only hide
// every GPU (NVIDIA_VISIBLE_DEVICES=void). The toolkit's feature switches
// NVIDIA_GDS, NVIDIA_MOFED, NVIDIA_NVSWITCH and NVIDIA_GDRCOPY add device
// nodes of other kinds (storage, network, fabric) to a container that
// already has GPUs; they select no GPU and are not listed.
var DeviceEnvVars = []string{
	v1alpha1.EnvVisibleDevices,
	"NVIDIA_MIG_CONFIG_DEVICES",
	"NVIDIA_MIG_MONITOR_DEVICES",
	"NVIDIA_IMEX_CHANNELS",
}

// EnvPrefixNVIDIA begins every variable the NVIDIA container toolkit reads.
// A pod that sets one in any container is sent to the webhooks.
const EnvPrefixNVIDIA = "NVIDIA_"

// isDeviceEnv reports whether name is one of DeviceEnvVars.
func isDeviceEnv(name string) bool { return slices.Contains(DeviceEnvVars, name) }

// envFromCanSetNVIDIA reports whether an envFrom source with this prefix
// can produce a variable whose name starts with NVIDIA_: it can when the
// prefix is itself the start of "NVIDIA_" (the empty prefix included), or
// starts with it.
func envFromCanSetNVIDIA(prefix string) bool {
	return strings.HasPrefix(EnvPrefixNVIDIA, prefix) || strings.HasPrefix(prefix, EnvPrefixNVIDIA)
}

// requestsResource reports whether a container asks for a positive count
// of resource: its limit, else its request (for extended resources
// requests default to limits and must equal them). A count that is not a
// positive number gets no device; v1alpha1.PodGPUDemand reports it.
func requestsResource(r *corev1.ResourceRequirements, resource corev1.ResourceName) bool {
	q, ok := r.Limits[resource]
	if !ok {
		q, ok = r.Requests[resource]
	}
	return ok && q.Sign() > 0
}

// labelValue turns a name into a valid label value. Object names may be
// longer than the 63 characters a label value allows; a long name keeps a
// readable prefix and gains a hash of the whole, so two long names that
// share a prefix stay distinct.
func labelValue(name string) string {
	name = strings.Trim(name, "-._")
	if len(name) > validation.LabelValueMaxLength {
		suffix := hashSuffix(name)
		name = strings.TrimRight(name[:validation.LabelValueMaxLength-len(suffix)], "-._") + suffix
	}
	if len(validation.IsValidLabelValue(name)) > 0 {
		return ""
	}
	return name
}

// hashSuffix is "-" and 8 hex digits of a hash of s.
func hashSuffix(s string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s)) // hash.Hash writes never fail
	return fmt.Sprintf("-%08x", h.Sum32())
}

// dnsLabelPrefix turns an object name (a DNS subdomain: lowercase
// alphanumerics, '-' and '.') into the start of a DNS label at most max
// characters long: dots become dashes, and dashes at either end go.
func dnsLabelPrefix(name string, max int) string {
	name = strings.ReplaceAll(name, ".", "-")
	if len(name) > max {
		name = name[:max]
	}
	return strings.Trim(name, "-")
}

// jobGroupName is the group a Job's pods get when nothing names one: the
// Job's name when it is a DNS label. A longer name, or one with dots,
// keeps a readable prefix (dots made dashes) and gains a hash of the whole
// name, so two names that share a prefix stay distinct groups. A Job named
// by generateName has no name yet when it is admitted (the apiserver
// generates it after the mutating webhooks): its group is the
// generateName stem with a hash of the admission request's UID, unique to
// this Job.
func jobGroupName(job *batchv1.Job, uid types.UID) string {
	if job.Name != "" {
		return groupNameOf(job.Name)
	}
	suffix := hashSuffix(string(uid))
	return strings.TrimPrefix(dnsLabelPrefix(job.GenerateName, validation.DNS1123LabelMaxLength-len(suffix))+suffix, "-")
}

// jobIdentity is the gputopo.io/job value for a pod: its controlling Job's
// name, else its own name, else its generateName stem (the apiserver may
// not have generated the name yet when admission runs).
func jobIdentity(pod *corev1.Pod) string {
	if ref := controllingJob(pod); ref != nil {
		return labelValue(ref.Name)
	}
	if pod.Name != "" {
		return labelValue(pod.Name)
	}
	return labelValue(pod.GenerateName)
}

// controllingJob returns the pod's controller reference when it is a
// batch Job.
func controllingJob(pod *corev1.Pod) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil || ref.Kind != "Job" || !strings.HasPrefix(ref.APIVersion, batchv1.GroupName+"/") || ref.Name == "" {
		return nil
	}
	return ref
}

// namespaceInfo is what admission needs from a Namespace.
type namespaceInfo struct {
	optedIn bool
	// intent is the namespace's default intent, raw (validated by the
	// caller, which knows whether a bad value should be reported).
	intent string
}

// metadataReader reads object metadata through a client.Reader: in the
// server a metadata-only informer cache, so admission never calls the
// apiserver and the cache holds no pod specs or Job templates.
type metadataReader struct {
	reader client.Reader
}

var (
	namespaceGVK = corev1.SchemeGroupVersion.WithKind("Namespace")
	jobGVK       = batchv1.SchemeGroupVersion.WithKind("Job")
)

func (m metadataReader) get(ctx context.Context, gvk metav1.GroupVersionKind, key client.ObjectKey) (*metav1.PartialObjectMetadata, error) {
	obj := &metav1.PartialObjectMetadata{}
	obj.APIVersion, obj.Kind = metav1.GroupVersion{Group: gvk.Group, Version: gvk.Version}.String(), gvk.Kind
	if err := m.reader.Get(ctx, key, obj); err != nil {
		return nil, err
	}
	return obj, nil
}

// namespace reads a namespace's opt-in label and default intent. A
// namespace that does not exist has not opted in (the create that asked
// will fail on its own).
func (m metadataReader) namespace(ctx context.Context, name, defaultAnnotation string) (namespaceInfo, error) {
	ns, err := m.get(ctx, metav1.GroupVersionKind(namespaceGVK), client.ObjectKey{Name: name})
	if apierrors.IsNotFound(err) {
		return namespaceInfo{}, nil
	}
	if err != nil {
		return namespaceInfo{}, fmt.Errorf("get namespace %s: %w", name, err)
	}
	return namespaceInfo{
		optedIn: ns.Labels[v1alpha1.LabelInjection] == v1alpha1.InjectionEnabled,
		intent:  ns.Annotations[defaultAnnotation],
	}, nil
}

// mutatedNamespace resolves a request's namespace (the object's when the
// request carries none) and decides whether the mutators act there. It
// returns the namespace's info, or the response to give instead: allowed
// unchanged when the namespace is excluded or has not opted in, an error
// when it cannot be read.
func (m metadataReader) mutatedNamespace(ctx context.Context, cfg configv1alpha1.WebhookConfiguration, reqNS, objNS string) (namespaceInfo, *admission.Response) {
	ns := reqNS
	if ns == "" {
		ns = objNS
	}
	var resp admission.Response
	if cfg.IsExcluded(ns) {
		resp = admission.Allowed("namespace is excluded from gputopo")
		return namespaceInfo{}, &resp
	}
	info, err := m.namespace(ctx, ns, cfg.NamespaceDefaultAnnotation)
	switch {
	case err != nil:
		resp = admission.Errored(http.StatusInternalServerError, err)
	case !info.optedIn:
		resp = admission.Allowed("namespace has not opted in to gputopo")
	default:
		return info, nil
	}
	return namespaceInfo{}, &resp
}

// jobIntent reads the intent annotation of a Job; found is false when the
// Job is not (or no longer, or not yet) in the cache.
func (m metadataReader) jobIntent(ctx context.Context, namespace, name string) (intent string, found bool, err error) {
	job, err := m.get(ctx, metav1.GroupVersionKind(jobGVK), client.ObjectKey{Namespace: namespace, Name: name})
	if apierrors.IsNotFound(err) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("get job %s/%s: %w", namespace, name, err)
	}
	v, ok := job.Annotations[v1alpha1.AnnotationParallelism]
	return v, ok, nil
}

// groupNameOf is name as a group name: itself when it is a DNS label, else
// its DNS-label prefix and a hash of it.
func groupNameOf(name string) string {
	if len(validation.IsDNS1123Label(name)) == 0 {
		return name
	}
	suffix := hashSuffix(name)
	return strings.TrimPrefix(dnsLabelPrefix(name, validation.DNS1123LabelMaxLength-len(suffix))+suffix, "-")
}

// The labels the JobSet controller puts on each Job it creates
// (sigs.k8s.io/jobset, api/jobset/v1alpha2 and pkg/constants).
const (
	labelJobSetName           = "jobset.sigs.k8s.io/jobset-name"
	labelJobSetGlobalReplicas = "jobset.sigs.k8s.io/global-replicas"
	labelJobSetRestarts       = "jobset.sigs.k8s.io/restart-attempt"
)

// jobSetOf says whether job was created by a JobSet, and if so the
// group its pods form (the JobSet's name, with the restart attempt from
// the first restart on, so that a restarted JobSet is a fresh group) and
// how many Jobs the JobSet runs (its replicated Jobs' replicas, summed).
func jobSetOf(job *batchv1.Job) (group string, jobs int, ok bool) {
	name := job.Labels[labelJobSetName]
	n, err := strconv.Atoi(job.Labels[labelJobSetGlobalReplicas])
	if name == "" || err != nil || n < 1 {
		return "", 1, false
	}
	if a := job.Labels[labelJobSetRestarts]; a != "" && a != "0" {
		name += "-r" + a
	}
	return groupNameOf(name), n, true
}

// The labels and annotations LeaderWorkerSet's controller and webhook put
// on the pods of each replica group (sigs.k8s.io/lws,
// api/leaderworkerset/v1), and the pod index the StatefulSet controller
// labels every pod with.
const (
	labelLWSName           = "leaderworkerset.sigs.k8s.io/name"
	labelLWSGroupIndex     = "leaderworkerset.sigs.k8s.io/group-index"
	labelLWSWorkerIndex    = "leaderworkerset.sigs.k8s.io/worker-index"
	labelLWSRevision       = "leaderworkerset.sigs.k8s.io/template-revision-hash"
	annotationLWSSize      = "leaderworkerset.sigs.k8s.io/size"
	annotationLWSExclusive = "leaderworkerset.sigs.k8s.io/exclusive-topology"
	labelStatefulSetIndex  = "apps.kubernetes.io/pod-index"
)

// lwsGroup is a LeaderWorkerSet replica group as its pods carry it.
type lwsGroup struct {
	// set is the LeaderWorkerSet's name.
	set string
	// group is the gputopo group of the replica: the set's name, the
	// replica's index and the template revision, so that a rolling update
	// makes each replica a fresh group.
	group string
	// size is the replica's pods (the leader and its workers).
	size int
	// exclusive is the node label key the set asks each replica to have
	// to itself (its exclusive-topology annotation), or "".
	exclusive string
}

// lwsGroupOf says whether pod belongs to a LeaderWorkerSet replica of
// more than one pod, and if so which. Workers carry their replica's
// index from their StatefulSet's template; a leader gets it from
// LeaderWorkerSet's own pod webhook, which may run after gputopo's, so a
// leader (worker index 0) without it is read from the StatefulSet pod
// index, which is the replica's index for the leaders' StatefulSet.
func lwsGroupOf(pod *corev1.Pod) (lwsGroup, bool) {
	set := pod.Labels[labelLWSName]
	size, err := strconv.Atoi(pod.Annotations[annotationLWSSize])
	if set == "" || err != nil || size < 2 {
		return lwsGroup{}, false
	}
	idx, ok := pod.Labels[labelLWSGroupIndex]
	if !ok && pod.Labels[labelLWSWorkerIndex] == "0" {
		idx, ok = pod.Labels[labelStatefulSetIndex]
	}
	if n, err := strconv.Atoi(idx); !ok || err != nil || n < 0 {
		return lwsGroup{}, false
	}
	name := set + "-" + idx
	if rev := pod.Labels[labelLWSRevision]; rev != "" {
		name += "-" + rev
	}
	return lwsGroup{set: set, group: groupNameOf(name), size: size, exclusive: pod.Annotations[annotationLWSExclusive]}, true
}

// lwsGroupAnnotations are the group annotations a LeaderWorkerSet pod
// without a group of its own gets: its replica as one group of the set's
// size, preferred inside one NVLink domain, required inside the set's
// exclusive topology when it names one. Keys the pod states are kept (a
// set whose leader asks for no GPUs states group-size on its worker
// template, since a pod without GPUs is not gputopo's to place). A pod
// that names its own group gets nothing.
func lwsGroupAnnotations(pod *corev1.Pod, g lwsGroup) map[string]string {
	if _, named := pod.Annotations[v1alpha1.AnnotationGroup]; named {
		return nil
	}
	out := map[string]string{v1alpha1.AnnotationGroup: g.group}
	fill := func(key, v string) {
		if _, ok := pod.Annotations[key]; !ok && v != "" {
			out[key] = v
		}
	}
	fill(v1alpha1.AnnotationGroupSize, strconv.Itoa(g.size))
	fill(v1alpha1.AnnotationGroupPreferredTopology, configv1alpha1.FabricNVLink)
	fill(v1alpha1.AnnotationGroupRequiredTopology, g.exclusive)
	return out
}
