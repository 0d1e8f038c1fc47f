package webhook

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

const (
	uuidA = "GPU-11111111-2222-3333-4444-555555555555"
	uuidB = "GPU-66666666-7777-8888-9999-000000000000"
)

// verdict is what a test states about a response.
type verdict struct {
	Allowed bool
	Code    int32
	Reason  metav1.StatusReason
	Message string
}

func forbidden(msg string) verdict {
	return verdict{Code: 403, Reason: metav1.StatusReasonForbidden, Message: msg}
}

func invalid(msg string) verdict {
	return verdict{Code: 422, Reason: metav1.StatusReasonInvalid, Message: msg}
}

var allowed = verdict{Allowed: true, Code: 200}

const (
	sysAccounts  = `(system:serviceaccount:gputopo-system:gputopo-extender, system:serviceaccount:gputopo-system:gputopo-nodeagent)`
	protectedMsg = `: it decides which GPUs the pod gets and only gputopo's system service accounts ` + sysAccounts + ` write it; remove it from the pod (and from any template that creates it)`
)

func protectedBy(key, user, verb string) string {
	return "metadata.annotations[" + key + "]: Forbidden: user \"" + user + "\" may not " + verb + " this annotation" + protectedMsg
}

// gpuEnvMsg is the denial of a device variable in a container that
// requests GPUs.
func gpuEnvMsg(path, container, name string) string {
	return path + `: Forbidden: container "` + container + `" requests nvidia.com/gpu, so ` + name +
		` must not be set there: the node agent gives the container exactly the devices kubelet allocated; remove this entry`
}

// voidOnlyMsg is the denial of NVIDIA_VISIBLE_DEVICES other than void in a
// container without GPUs.
func voidOnlyMsg(path, container string) string {
	return path + `: Forbidden: container "` + container + `" requests no nvidia.com/gpu, so NVIDIA_VISIBLE_DEVICES may only be "void" (or absent) there, which hides every GPU; request nvidia.com/gpu to get one`
}

// envFromMsg is the denial of an envFrom source that could set NVIDIA_
// variables in a GPU container.
func envFromMsg(path, container, source, prefix string, j int) string {
	return fmt.Sprintf(`%s: Forbidden: container %q requests nvidia.com/gpu and takes every key of %s with %s, so it could set NVIDIA_VISIBLE_DEVICES and override the devices kubelet allocated; give envFrom[%d] a prefix that cannot begin NVIDIA_ (e.g. "CFG_"), or name the variables you need under env`,
		path, container, source, prefix, j)
}

// noGPUEnvFromMsg is the denial of an envFrom source that could set a
// device variable in a container without GPUs that does not hide them.
func noGPUEnvFromMsg(path, container, source, prefix string, j int) string {
	return fmt.Sprintf(`%s: Forbidden: container %q requests no nvidia.com/gpu and takes every key of %s with %s, so it could set NVIDIA_VISIBLE_DEVICES and see GPUs it was not given; add {name: NVIDIA_VISIBLE_DEVICES, value: void} under env (env beats envFrom), give envFrom[%d] a prefix that cannot begin NVIDIA_ (e.g. "CFG_"), or request nvidia.com/gpu`,
		path, container, source, prefix, j)
}

// groupImmutableMsg is the denial of an update that touches group
// annotation key; what says how.
func groupImmutableMsg(key, what string) string {
	return "metadata.annotations[" + key + "]: Invalid value: may not be " + what +
		": the scheduler plans the pod's group from the group annotations the pod was created with; to change its group, delete the pod and create it again (for a Job's pods: the Job, with the new annotations)"
}

// onNode is the user extra kube-apiserver sets for a service account token
// bound to a pod on node.
func onNode(node string) map[string]authenticationv1.ExtraValue {
	return map[string]authenticationv1.ExtraValue{
		"authentication.kubernetes.io/node-name": {node},
		"authentication.kubernetes.io/pod-name":  {"gputopo-nodeagent-x7k2p"},
	}
}

func configMapEnvFrom(name, prefix string) corev1.EnvFromSource {
	return corev1.EnvFromSource{Prefix: prefix, ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
}

func secretEnvFrom(name, prefix string) corev1.EnvFromSource {
	return corev1.EnvFromSource{Prefix: prefix, SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}
}

func TestPodValidator(t *testing.T) {
	nodeAgent := configv1alpha1.DefaultNodeAgentServiceAccount
	tests := map[string]struct {
		op          admissionv1.Operation
		subresource string
		user        string
		extra       map[string]authenticationv1.ExtraValue
		cfg         func(*configv1alpha1.WebhookConfiguration)
		objs        []client.Object
		pod, old    *corev1.Pod
		want        verdict
		// prefixOnly compares only the start of the message, where the
		// rest is the JSON decoder's own wording.
		prefixOnly bool
	}{
		"a plain GPU pod is allowed": {
			pod: MakePod("p", nsOptedIn).GPU(4).Requirement(reqModelNVLink).Obj(), want: allowed,
		},
		"create with assigned-gpus by a user is denied": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			want: forbidden(protectedBy(v1alpha1.AnnotationAssignedGPUs, userAlice, "set")),
		},
		"create with placement and allocated-gpus reports both": {
			pod: MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationPlacement, "{}").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: forbidden("[" + protectedBy(v1alpha1.AnnotationPlacement, userAlice, "set") + ", " +
				protectedBy(v1alpha1.AnnotationAllocatedGPUs, userAlice, "set") + "]"),
		},
		"create with assigned-gpus is denied with another schedulerName too": {
			pod:  MakePod("p", nsOptedIn).GPU(1).SchedulerName("my-scheduler").Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			want: forbidden(protectedBy(v1alpha1.AnnotationAssignedGPUs, userAlice, "set")),
		},
		"create with assigned-gpus is denied in a namespace that did not opt in": {
			pod:  MakePod("p", nsPlain).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			want: forbidden(protectedBy(v1alpha1.AnnotationAssignedGPUs, userAlice, "set")),
		},
		"create with assigned-gpus by a system service account is allowed": {
			user: configv1alpha1.DefaultExtenderServiceAccount,
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			want: allowed,
		},
		"update adding assigned-gpus is denied": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(1).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			want: forbidden(protectedBy(v1alpha1.AnnotationAssignedGPUs, userAlice, "set")),
		},
		"update changing assigned-gpus is denied": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidB).Obj(),
			want: forbidden(protectedBy(v1alpha1.AnnotationAssignedGPUs, userAlice, "change")),
		},
		"update removing allocated-gpus is denied": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Obj(),
			want: forbidden(protectedBy(v1alpha1.AnnotationAllocatedGPUs, userAlice, "remove")),
		},
		"update emptying placement counts as a change": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationPlacement, "{}").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationPlacement, "").Obj(),
			want: forbidden(protectedBy(v1alpha1.AnnotationPlacement, userAlice, "change")),
		},
		"update leaving system annotations as they are is allowed": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Label("team", "x").Obj(),
			want: allowed,
		},
		"the node agent may record allocated-gpus on a pod of its own node": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: allowed,
		},
		"the node agent may correct allocated-gpus on a pod of its own node": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsPlain).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsPlain).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidB).Obj(),
			want: allowed,
		},
		"the node agent may not record allocated-gpus on a pod of another node": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: forbidden(`metadata.annotations[gputopo.io/allocated-gpus]: Forbidden: node agent "` + nodeAgent + `" runs on node "gpu-node-a" but this pod is bound to node "gpu-node-b": a node agent records allocated GPUs only of pods bound to its own node`),
		},
		"the node agent may not remove allocated-gpus from a pod of another node": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Obj(),
			want: forbidden(`metadata.annotations[gputopo.io/allocated-gpus]: Forbidden: node agent "` + nodeAgent + `" runs on node "gpu-node-a" but this pod is bound to node "gpu-node-b": a node agent records allocated GPUs only of pods bound to its own node`),
		},
		"the node is the stored pod's, not the one the update claims": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: forbidden(`metadata.annotations[gputopo.io/allocated-gpus]: Forbidden: node agent "` + nodeAgent + `" runs on node "gpu-node-a" but this pod is bound to node "gpu-node-b": a node agent records allocated GPUs only of pods bound to its own node`),
		},
		"the node agent may not record allocated-gpus on a pod bound to no node": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsOptedIn).GPU(1).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: forbidden(`metadata.annotations[gputopo.io/allocated-gpus]: Forbidden: node agent "` + nodeAgent + `" runs on node "gpu-node-a" and this pod is bound to no node yet: a node agent records allocated GPUs only of pods bound to its own node`),
		},
		"a node agent credential without a node name may not write allocated-gpus": {
			op:   admissionv1.Update,
			user: nodeAgent,
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: forbidden(`metadata.annotations[gputopo.io/allocated-gpus]: Forbidden: node agent "` + nodeAgent + `" presented a credential that names no node (user extra authentication.kubernetes.io/node-name is []): a node agent may record allocated GPUs only of pods on its own node, so it must authenticate with a service account token bound to its pod, the projected token kubelet mounts into the pod by default, not with a long-lived Secret token or a client certificate`),
		},
		"a node agent credential naming two nodes may not write allocated-gpus": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/node-name": {"gpu-node-a", "gpu-node-b"}},
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: forbidden(`metadata.annotations[gputopo.io/allocated-gpus]: Forbidden: node agent "` + nodeAgent + `" presented a credential that names no node (user extra authentication.kubernetes.io/node-name is [gpu-node-a gpu-node-b]): a node agent may record allocated GPUs only of pods on its own node, so it must authenticate with a service account token bound to its pod, the projected token kubelet mounts into the pod by default, not with a long-lived Secret token or a client certificate`),
		},
		"the node agent may not write the plan, even on its own node": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-a").Annotation(v1alpha1.AnnotationAssignedGPUs, uuidB).Obj(),
			want: forbidden(`metadata.annotations[gputopo.io/assigned-gpus]: Forbidden: node agent "` + nodeAgent + `" may not change this annotation: a node agent records only gputopo.io/allocated-gpus, what kubelet allocated on its node; the extender writes the plan through the pod's Binding`),
		},
		"a node agent listed among the system accounts too is still held to its node": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			cfg: func(c *configv1alpha1.WebhookConfiguration) {
				c.SystemServiceAccounts = []string{configv1alpha1.DefaultExtenderServiceAccount, nodeAgent}
			},
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: forbidden(`metadata.annotations[gputopo.io/allocated-gpus]: Forbidden: node agent "` + nodeAgent + `" runs on node "gpu-node-a" but this pod is bound to node "gpu-node-b": a node agent records allocated GPUs only of pods bound to its own node`),
		},
		"the node agent's other updates are not judged by node": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Label("x", "y").Obj(),
			want: allowed,
		},
		"an extender system account is not held to a node": {
			op:   admissionv1.Update,
			user: configv1alpha1.DefaultExtenderServiceAccount,
			old:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Node("gpu-node-b").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: allowed,
		},
		"a status update adding assigned-gpus is denied": {
			op: admissionv1.Update, subresource: "status",
			old:  MakePod("p", nsOptedIn).GPU(1).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			want: forbidden(protectedBy(v1alpha1.AnnotationAssignedGPUs, userAlice, "set")),
		},
		"a malformed requirement is denied naming the annotation": {
			pod:        MakePod("p", nsOptedIn).GPU(2).Requirement(`{"strategy":`).Obj(),
			want:       invalid(`metadata.annotations[gputopo.io/gpu-topology-requirement]: Invalid value: "{\"strategy\":": must be a JSON object: `),
			prefixOnly: true,
		},
		"an unknown strategy is denied naming the field": {
			pod:  MakePod("p", nsOptedIn).GPU(2).Requirement(`{"strategy":"fastest"}`).Obj(),
			want: invalid(`metadata.annotations[gputopo.io/gpu-topology-requirement].strategy: Unsupported value: "fastest": supported values: "highest_bandwidth", "numa_local", "balanced_utilization", "lowest_fragmentation"`),
		},
		"a negative bandwidth is denied naming the field": {
			pod:  MakePod("p", nsOptedIn).GPU(2).Requirement(`{"minPairBandwidthGBps":-5}`).Obj(),
			want: invalid(`metadata.annotations[gputopo.io/gpu-topology-requirement].minPairBandwidthGBps: Invalid value: -5: must be 0 (no minimum) or a positive bandwidth in GB/s, bidirectional`),
		},
		"fallbackAfter without requireNVLink is denied naming the field": {
			pod:  MakePod("p", nsOptedIn).GPU(2).Requirement(`{"strategy":"highest_bandwidth","fallbackAfter":"30m"}`).Obj(),
			want: invalid(`metadata.annotations[gputopo.io/gpu-topology-requirement].fallbackAfter: Invalid value: "30m0s": applies only to a requirement with requireNVLink or minPairBandwidthGBps (there is nothing to fall back from); remove fallbackAfter or require NVLink`),
		},
		"a malformed requirement is denied in a namespace that did not opt in": {
			pod:  MakePod("p", nsPlain).GPU(2).Requirement(`{"strategy":"fastest"}`).Obj(),
			want: invalid(`metadata.annotations[gputopo.io/gpu-topology-requirement].strategy: Unsupported value: "fastest": supported values: "highest_bandwidth", "numa_local", "balanced_utilization", "lowest_fragmentation"`),
		},
		"an unchanged malformed requirement does not block an update": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(2).Requirement(`{"strategy":"fastest"}`).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(2).Requirement(`{"strategy":"fastest"}`).Label("x", "y").Obj(),
			want: allowed,
		},
		"an update writing a malformed requirement is denied": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(2).Requirement(reqNone).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(2).Requirement(`{"strategy":"fastest"}`).Obj(),
			want: invalid(`metadata.annotations[gputopo.io/gpu-topology-requirement].strategy: Unsupported value: "fastest": supported values: "highest_bandwidth", "numa_local", "balanced_utilization", "lowest_fragmentation"`),
		},
		"an unknown intent is denied naming the annotation": {
			pod:  MakePod("p", nsOptedIn).GPU(2).Intent("pipeline").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/parallelism]: Unsupported value: "pipeline": supported values: "data", "model"`),
		},
		"a pod of a valid group is allowed": {
			pod: MakePod("p", nsOptedIn).GPU(4).Group("llm", "8").Annotation(v1alpha1.AnnotationGroupRequiredTopology, "spine").
				Annotation(v1alpha1.AnnotationGroupPreferredTopology, "nvlink").Obj(),
			want: allowed,
		},
		"a group size that is no number is denied naming the annotation": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "eight").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "eight": must be a whole number of pods, e.g. "4"`),
		},
		"a group size out of range is denied in a namespace that did not opt in too": {
			pod:  MakePod("p", nsPlain).GPU(4).Group("llm", "10001").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "10001": must be between 1 and 10000 pods`),
		},
		"a group name that is no DNS label is denied": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Group("llm.v2", "2").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/group]: Invalid value: "llm.v2": must not contain dots`),
		},
		"a group level that is no level or label key is denied": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "2").Annotation(v1alpha1.AnnotationGroupRequiredTopology, "").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/group-required-topology]: Invalid value: "": must be a fabric level name (nvlink, leaf, spine, block, zone) or a node label key`),
		},
		"a pod of a sliced group with its rank is allowed": {
			pod: MakePod("p", nsOptedIn).GPU(4).Group("llm", "32").Annotation(v1alpha1.AnnotationSliceSize, "16").
				Annotation(v1alpha1.AnnotationSliceRequiredTopology, "nvlink").Annotation(v1alpha1.AnnotationRank, "17").Obj(),
			want: allowed,
		},
		"a rank beyond the group is denied naming the annotation": {
			pod: MakePod("p", nsOptedIn).GPU(4).Group("llm", "32").Annotation(v1alpha1.AnnotationSliceSize, "16").
				Annotation(v1alpha1.AnnotationSliceRequiredTopology, "nvlink").Annotation(v1alpha1.AnnotationRank, "32").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/rank]: Invalid value: "32": must be the pod's rank in its group, 0 to 31`),
		},
		"a pod whose slice is wider than its group is denied": {
			pod: MakePod("p", nsOptedIn).GPU(4).Group("llm", "32").Annotation(v1alpha1.AnnotationGroupRequiredTopology, "nvlink").
				Annotation(v1alpha1.AnnotationSliceSize, "16").Annotation(v1alpha1.AnnotationSliceRequiredTopology, "leaf").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/slice-required-topology]: Invalid value: "leaf": is wider than gputopo.io/group-required-topology "nvlink": a slice lies inside its group; use a level no wider than "nvlink", or widen gputopo.io/group-required-topology`),
		},
		"a group size without a group is denied": {
			pod: MakePod("p", nsOptedIn).GPU(4).Annotation(v1alpha1.AnnotationGroupSize, "2").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/group]: Required value: gputopo.io/group-size is set but the group is not named:` +
				` add gputopo.io/group (the job's name), or remove gputopo.io/group-size`),
		},
		"an update adding a pod to a group is denied": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(4).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(4).Annotation(v1alpha1.AnnotationGroup, "llm").Obj(),
			want: invalid(groupImmutableMsg(v1alpha1.AnnotationGroup, `added once the pod exists (now "llm")`)),
		},
		"an update changing the group size is denied": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "4").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "8").Obj(),
			want: invalid(groupImmutableMsg(v1alpha1.AnnotationGroupSize, `changed once the pod exists (was "4", now "8")`)),
		},
		"an update removing a group's pod from it reports each annotation": {
			op:  admissionv1.Update,
			old: MakePod("p", nsOptedIn).GPU(4).Group("llm", "4").Annotation(v1alpha1.AnnotationGroupPreferredTopology, "nvlink").Obj(),
			pod: MakePod("p", nsOptedIn).GPU(4).Obj(),
			want: invalid("[" + groupImmutableMsg(v1alpha1.AnnotationGroup, `removed once the pod exists (was "llm")`) + ", " +
				groupImmutableMsg(v1alpha1.AnnotationGroupSize, `removed once the pod exists (was "4")`) + ", " +
				groupImmutableMsg(v1alpha1.AnnotationGroupPreferredTopology, `removed once the pod exists (was "nvlink")`) + "]"),
		},
		"an update adding a level to a group is denied in a namespace that did not opt in too": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsPlain).GPU(4).Group("llm", "4").Obj(),
			pod:  MakePod("p", nsPlain).GPU(4).Group("llm", "4").Annotation(v1alpha1.AnnotationGroupRequiredTopology, "leaf").Obj(),
			want: invalid(groupImmutableMsg(v1alpha1.AnnotationGroupRequiredTopology, `added once the pod exists (now "leaf")`)),
		},
		"a status update changing the group is denied": {
			op: admissionv1.Update, subresource: "status",
			old:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "4").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(4).Group("other", "4").Obj(),
			want: invalid(groupImmutableMsg(v1alpha1.AnnotationGroup, `changed once the pod exists (was "llm", now "other")`)),
		},
		"an update leaving the group as it is is allowed, even a group admitted before the rules": {
			op:   admissionv1.Update,
			old:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "many").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "many").Label("x", "y").Obj(),
			want: allowed,
		},
		"a system service account may change a group": {
			op:   admissionv1.Update,
			user: configv1alpha1.DefaultExtenderServiceAccount,
			old:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "4").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "2").Obj(),
			want: allowed,
		},
		"a system service account's group must still parse": {
			op:   admissionv1.Update,
			user: configv1alpha1.DefaultExtenderServiceAccount,
			old:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "4").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(4).Group("llm", "0").Obj(),
			want: invalid(`metadata.annotations[gputopo.io/group-size]: Invalid value: "0": must be between 1 and 10000 pods`),
		},
		"the node agent's update of a group's pod is not held to the group rules": {
			op:   admissionv1.Update,
			user: nodeAgent, extra: onNode("gpu-node-a"),
			old:  MakePod("p", nsOptedIn).GPU(4).Node("gpu-node-a").Group("llm", "4").Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(4).Node("gpu-node-a").Group("llm", "4").Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
			want: allowed,
		},
		"NVIDIA_VISIBLE_DEVICES set in a GPU container is denied": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Env("main", envVar("A", "b"), envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden(gpuEnvMsg("spec.containers[0].env[1]", "main", "NVIDIA_VISIBLE_DEVICES")),
		},
		"NVIDIA_VISIBLE_DEVICES set in a GPU container is denied in a namespace that did not opt in": {
			pod:  MakePod("p", nsPlain).GPU(1).Env("main", envVar(v1alpha1.EnvVisibleDevices, uuidB)).Obj(),
			want: forbidden(gpuEnvMsg("spec.containers[0].env[0]", "main", "NVIDIA_VISIBLE_DEVICES")),
		},
		"a GPU requested without a limit makes a GPU container too": {
			pod:  MakePod("p", nsPlain).GPURequestOnly(1).Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden(gpuEnvMsg("spec.containers[0].env[0]", "main", "NVIDIA_VISIBLE_DEVICES")),
		},
		"every device-selecting variable is denied in a GPU container": {
			pod: MakePod("p", nsPlain).GPU(1).Env("main", envVar("NVIDIA_MIG_CONFIG_DEVICES", "all"), envVar("NVIDIA_MIG_MONITOR_DEVICES", "all"),
				envVar("NVIDIA_IMEX_CHANNELS", "0"), envVar("NVIDIA_DRIVER_CAPABILITIES", "compute,utility")).Obj(),
			want: forbidden("[" + gpuEnvMsg("spec.containers[0].env[0]", "main", "NVIDIA_MIG_CONFIG_DEVICES") + ", " +
				gpuEnvMsg("spec.containers[0].env[1]", "main", "NVIDIA_MIG_MONITOR_DEVICES") + ", " +
				gpuEnvMsg("spec.containers[0].env[2]", "main", "NVIDIA_IMEX_CHANNELS") + "]"),
		},
		"NVIDIA_VISIBLE_DEVICES from a Secret in a GPU container is denied": {
			pod: MakePod("p", nsOptedIn).GPU(1).Env("main", corev1.EnvVar{Name: v1alpha1.EnvVisibleDevices, ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}}).Obj(),
			want: forbidden(gpuEnvMsg("spec.containers[0].env[0]", "main", "NVIDIA_VISIBLE_DEVICES")),
		},
		"NVIDIA_VISIBLE_DEVICES=void in a GPU init container is denied too": {
			pod:  MakePod("p", nsOptedIn).InitContainer("warmup", 1).Env("warmup", envVar(v1alpha1.EnvVisibleDevices, envVoid)).Void("main").Obj(),
			want: forbidden(gpuEnvMsg("spec.initContainers[0].env[0]", "warmup", "NVIDIA_VISIBLE_DEVICES")),
		},
		"void in containers without GPUs is allowed": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Container("logger", 0).Void("logger").Obj(),
			want: allowed,
		},
		"other NVIDIA_ variables are allowed in every container": {
			pod: MakePod("p", nsOptedIn).GPU(1).Container("logger", 0).Env("main", envVar("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"), envVar("NVIDIA_REQUIRE_CUDA", "cuda>=12.4")).
				Env("logger", envVar("NVIDIA_DISABLE_REQUIRE", "true")).Obj(),
			want: allowed,
		},
		"a visible-devices value other than void in a container without GPUs is denied": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Container("logger", 0).Env("logger", envVar(v1alpha1.EnvVisibleDevices, "0,1")).Obj(),
			want: forbidden(voidOnlyMsg("spec.containers[1].env[0]", "logger")),
		},
		"a sidecar without GPUs in a GPU pod may not name a GPU in a namespace that did not opt in": {
			pod:  MakePod("p", nsPlain).GPU(1).Container("thief", 0).Env("thief", envVar(v1alpha1.EnvVisibleDevices, uuidB)).Obj(),
			want: forbidden(voidOnlyMsg("spec.containers[1].env[0]", "thief")),
		},
		"a container without GPUs may not take MIG configuration rights": {
			pod:  MakePod("p", nsOptedIn).Env("main", envVar("NVIDIA_MIG_CONFIG_DEVICES", "all")).Obj(),
			want: forbidden(`spec.containers[0].env[0]: Forbidden: container "main" requests no nvidia.com/gpu, so it may not select devices with NVIDIA_MIG_CONFIG_DEVICES; remove this entry, or request nvidia.com/gpu to get GPUs`),
		},
		"a pod without GPUs naming GPUs is denied in an opted-in namespace": {
			pod:  MakePod("p", nsOptedIn).Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden(voidOnlyMsg("spec.containers[0].env[0]", "main")),
		},
		"a pod without GPUs naming GPUs is the operator's business in a namespace that did not opt in": {
			pod:  MakePod("p", nsPlain).Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: allowed,
		},
		"a pod without GPUs naming GPUs is the operator's business in an excluded namespace": {
			pod:  MakePod("p", "kube-system").Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: allowed,
		},
		"envFrom without a prefix in a GPU container is denied": {
			pod:  MakePod("p", nsOptedIn).GPU(1).EnvFrom("main", configMapEnvFrom("train-config", "")).Obj(),
			want: forbidden(envFromMsg("spec.containers[0].envFrom[0]", "main", `ConfigMap "train-config"`, "no prefix", 0)),
		},
		"envFrom from a Secret in a GPU container is denied in a namespace that did not opt in": {
			pod:  MakePod("p", nsPlain).GPU(2).EnvFrom("main", configMapEnvFrom("ok", "CFG_"), secretEnvFrom("creds", "")).Obj(),
			want: forbidden(envFromMsg("spec.containers[0].envFrom[1]", "main", `Secret "creds"`, "no prefix", 1)),
		},
		"envFrom with a prefix that can begin NVIDIA_ is denied": {
			pod: MakePod("p", nsOptedIn).GPU(1).EnvFrom("main", configMapEnvFrom("a", "NV"), configMapEnvFrom("b", "NVIDIA_VISIBLE_")).Obj(),
			want: forbidden("[" + envFromMsg("spec.containers[0].envFrom[0]", "main", `ConfigMap "a"`, `prefix "NV"`, 0) + ", " +
				envFromMsg("spec.containers[0].envFrom[1]", "main", `ConfigMap "b"`, `prefix "NVIDIA_VISIBLE_"`, 1) + "]"),
		},
		"envFrom in a GPU init container is denied": {
			pod:  MakePod("p", nsOptedIn).Sidecar("loader", 1).EnvFrom("loader", configMapEnvFrom("c", "")).Obj(),
			want: forbidden(envFromMsg("spec.initContainers[0].envFrom[0]", "loader", `ConfigMap "c"`, "no prefix", 0)),
		},
		"a prefix such as CFG_ makes envFrom safe, one that can begin NVIDIA_ does not": {
			pod:  MakePod("p", nsOptedIn).GPU(1).EnvFrom("main", configMapEnvFrom("c", "CFG_"), secretEnvFrom("s", "NVI")).Obj(),
			want: forbidden(envFromMsg("spec.containers[0].envFrom[1]", "main", `Secret "s"`, `prefix "NVI"`, 1)),
		},
		"envFrom in a sidecar without GPUs of a GPU pod is denied unless it hides every GPU": {
			pod:  MakePod("p", nsPlain).GPU(1).Container("logger", 0).EnvFrom("logger", configMapEnvFrom("c", "")).Obj(),
			want: forbidden(noGPUEnvFromMsg("spec.containers[1].envFrom[0]", "logger", `ConfigMap "c"`, "no prefix", 0)),
		},
		"envFrom in an init container without GPUs of a GPU pod is denied unless it hides every GPU": {
			pod:  MakePod("p", nsPlain).GPU(1).InitContainer("fetch", 0).EnvFrom("fetch", secretEnvFrom("s", "NVIDIA_")).Obj(),
			want: forbidden(noGPUEnvFromMsg("spec.initContainers[0].envFrom[0]", "fetch", `Secret "s"`, `prefix "NVIDIA_"`, 0)),
		},
		"envFrom in a container without GPUs is allowed next to NVIDIA_VISIBLE_DEVICES=void, which beats it": {
			pod:  MakePod("p", nsPlain).GPU(1).Container("logger", 0).EnvFrom("logger", configMapEnvFrom("c", "")).Void("logger").Obj(),
			want: allowed,
		},
		"envFrom in a pod without GPUs is denied in an opted-in namespace unless it hides every GPU": {
			pod:  MakePod("p", nsOptedIn).EnvFrom("main", configMapEnvFrom("web", "")).Obj(),
			want: forbidden(noGPUEnvFromMsg("spec.containers[0].envFrom[0]", "main", `ConfigMap "web"`, "no prefix", 0)),
		},
		"envFrom in a pod without GPUs is the operator's business in a namespace that did not opt in": {
			pod:  MakePod("p", nsPlain).EnvFrom("main", configMapEnvFrom("web", "")).Obj(),
			want: allowed,
		},
		"a new ephemeral container taking envFrom is denied unless it hides every GPU": {
			op: admissionv1.Update, subresource: "ephemeralcontainers",
			old:  MakePod("p", nsPlain).GPU(1).Obj(),
			pod:  MakePod("p", nsPlain).GPU(1).Ephemeral("debug").EphemeralEnvFrom("debug", configMapEnvFrom("gpus", "")).Obj(),
			want: forbidden(noGPUEnvFromMsg("spec.ephemeralContainers[0].envFrom[0]", "debug", `ConfigMap "gpus"`, "no prefix", 0)),
		},
		"a new ephemeral container taking envFrom next to void is allowed": {
			op: admissionv1.Update, subresource: "ephemeralcontainers",
			old:  MakePod("p", nsPlain).GPU(1).Obj(),
			pod:  MakePod("p", nsPlain).GPU(1).Ephemeral("debug", envVar(v1alpha1.EnvVisibleDevices, envVoid)).EphemeralEnvFrom("debug", configMapEnvFrom("gpus", "")).Obj(),
			want: allowed,
		},
		"envFrom in containers without GPUs is allowed when the device list does not travel through env": {
			cfg:  func(c *configv1alpha1.WebhookConfiguration) { c.GPUContainerEnvFrom = configv1alpha1.EnvFromAllow },
			pod:  MakePod("p", nsOptedIn).GPU(1).Container("logger", 0).EnvFrom("logger", configMapEnvFrom("c", "")).Obj(),
			want: allowed,
		},
		"envFrom in a GPU container is allowed when the device list does not travel through env": {
			cfg:  func(c *configv1alpha1.WebhookConfiguration) { c.GPUContainerEnvFrom = configv1alpha1.EnvFromAllow },
			pod:  MakePod("p", nsOptedIn).GPU(1).EnvFrom("main", configMapEnvFrom("c", "")).Obj(),
			want: allowed,
		},
		"literal device variables stay denied when envFrom is allowed": {
			cfg:  func(c *configv1alpha1.WebhookConfiguration) { c.GPUContainerEnvFrom = configv1alpha1.EnvFromAllow },
			pod:  MakePod("p", nsPlain).GPU(1).Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden(gpuEnvMsg("spec.containers[0].env[0]", "main", "NVIDIA_VISIBLE_DEVICES")),
		},
		"a GPU count that is not whole is denied naming the field": {
			pod:  MakePod("p", nsPlain).Resources("main", corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("500m")}).Obj(),
			want: invalid(`spec.containers[0].resources.limits[nvidia.com/gpu]: Invalid value: "500m": must be a whole number of devices`),
		},
		"a negative GPU count is denied naming the field": {
			pod:  MakePod("p", nsPlain).InitContainer("warmup", 0).Resources("warmup", corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("-1")}).Obj(),
			want: invalid(`spec.initContainers[0].resources.limits[nvidia.com/gpu]: Invalid value: "-1": must not be negative`),
		},
		"the configured resource name decides what a GPU container is": {
			cfg: func(c *configv1alpha1.WebhookConfiguration) { c.ResourceName = "example.com/gpu" },
			pod: MakePod("p", nsPlain).Resources("main", corev1.ResourceList{"example.com/gpu": resource.MustParse("2")}).
				Container("logger", 1).Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden(`spec.containers[0].env[0]: Forbidden: container "main" requests example.com/gpu, so NVIDIA_VISIBLE_DEVICES must not be set there: the node agent gives the container exactly the devices kubelet allocated; remove this entry`),
		},
		"another resource name's count is not the pod's GPU count": {
			cfg:  func(c *configv1alpha1.WebhookConfiguration) { c.ResourceName = "example.com/gpu" },
			pod:  MakePod("p", nsPlain).GPU(1).Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: allowed,
		},
		"a new ephemeral container asking for all GPUs is denied": {
			op: admissionv1.Update, subresource: "ephemeralcontainers",
			old:  MakePod("p", nsOptedIn).GPU(1).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden(voidOnlyMsg("spec.ephemeralContainers[0].env[0]", "debug")),
		},
		"a new ephemeral container naming a GPU of a GPU pod is denied in a namespace that did not opt in": {
			op: admissionv1.Update, subresource: "ephemeralcontainers",
			old:  MakePod("p", nsPlain).GPU(1).Obj(),
			pod:  MakePod("p", nsPlain).GPU(1).Ephemeral("debug", envVar(v1alpha1.EnvVisibleDevices, uuidB)).Obj(),
			want: forbidden(voidOnlyMsg("spec.ephemeralContainers[0].env[0]", "debug")),
		},
		"an existing ephemeral container is not judged again": {
			op: admissionv1.Update, subresource: "ephemeralcontainers",
			old:  MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug", envVar(v1alpha1.EnvVisibleDevices, "all")).Ephemeral("debug-2", envVar(v1alpha1.EnvVisibleDevices, envVoid)).Obj(),
			want: allowed,
		},
		"every problem is reported at once": {
			pod: MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Intent("pipeline").
				Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).EnvFrom("main", configMapEnvFrom("c", "")).Obj(),
			want: forbidden("[" + protectedBy(v1alpha1.AnnotationAssignedGPUs, userAlice, "set") +
				`, metadata.annotations[gputopo.io/parallelism]: Unsupported value: "pipeline": supported values: "data", "model", ` +
				gpuEnvMsg("spec.containers[0].env[0]", "main", "NVIDIA_VISIBLE_DEVICES") + ", " +
				envFromMsg("spec.containers[0].envFrom[0]", "main", `ConfigMap "c"`, "no prefix", 0) + "]"),
		},
		"DELETE is allowed": {
			op:   admissionv1.Delete,
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			want: allowed,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := configv1alpha1.DefaultWebhookConfiguration()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			v := NewPodValidator(cfg, fakeReader(t, tc.objs...))
			op, user := tc.op, tc.user
			if op == "" {
				op = admissionv1.Create
			}
			if user == "" {
				user = userAlice
			}
			var old client.Object
			if tc.old != nil {
				old = tc.old
			}
			req := request(t, op, "pods", tc.subresource, tc.pod, old, user)
			req.UserInfo.Extra = tc.extra
			resp := handle(v, req)
			got := verdict{Allowed: resp.Allowed}
			if resp.Result != nil {
				got.Code, got.Reason, got.Message = resp.Result.Code, resp.Result.Reason, resp.Result.Message
			}
			if got.Allowed {
				got.Message = "" // informational only
			}
			if tc.prefixOnly && strings.HasPrefix(got.Message, tc.want.Message) {
				got.Message = tc.want.Message
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
			if len(resp.Patches) != 0 {
				t.Errorf("validator returned patches %s", mustJSON(t, resp.Patches))
			}
		})
	}
}

func TestPodValidatorConfiguredServiceAccounts(t *testing.T) {
	cfg := configv1alpha1.DefaultWebhookConfiguration()
	cfg.SystemServiceAccounts = []string{"system:serviceaccount:gpu:agent"}
	cfg.NodeAgentServiceAccounts = []string{"system:serviceaccount:gpu:nodeagent"}
	v := NewPodValidator(cfg, fakeReader(t))
	pod := MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj()
	for name, tc := range map[string]struct {
		user    string
		allowed bool
	}{
		"the configured account may write":               {"system:serviceaccount:gpu:agent", true},
		"a default account no longer configured may not": {configv1alpha1.DefaultNodeAgentServiceAccount, false},
		"a look-alike user name may not":                 {"system:serviceaccount:gpu:agent2", false},
	} {
		t.Run(name, func(t *testing.T) {
			resp := handle(v, podCreate(t, pod, tc.user))
			if resp.Allowed != tc.allowed {
				t.Errorf("allowed = %v, want %v (%v)", resp.Allowed, tc.allowed, resp.Result)
			}
		})
	}
}
