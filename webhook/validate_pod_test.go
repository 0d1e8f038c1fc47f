package webhook

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

func TestPodValidator(t *testing.T) {
	nodeAgent := DefaultNodeAgentServiceAccount
	tests := map[string]struct {
		op          admissionv1.Operation
		subresource string
		user        string
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
			user: DefaultExtenderServiceAccount,
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
		"the node agent may record allocated-gpus": {
			op:   admissionv1.Update,
			user: nodeAgent,
			old:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj(),
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
		"NVIDIA_VISIBLE_DEVICES set in a GPU container is denied": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Env("main", envVar("A", "b"), envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden(`spec.containers[0].env[1]: Forbidden: must not be set in a container that requests nvidia.com/gpu: the node agent sets it to exactly the GPUs kubelet allocated; remove this entry`),
		},
		"NVIDIA_VISIBLE_DEVICES from a Secret in a GPU container is denied": {
			pod: MakePod("p", nsOptedIn).GPU(1).Env("main", corev1.EnvVar{Name: v1alpha1.EnvVisibleDevices, ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}}).Obj(),
			want: forbidden(`spec.containers[0].env[0]: Forbidden: must not be set in a container that requests nvidia.com/gpu: the node agent sets it to exactly the GPUs kubelet allocated; remove this entry`),
		},
		"NVIDIA_VISIBLE_DEVICES=void in a GPU init container is denied too": {
			pod:  MakePod("p", nsOptedIn).InitContainer("warmup", 1).Env("warmup", envVar(v1alpha1.EnvVisibleDevices, envVoid)).Void("main").Obj(),
			want: forbidden(`spec.initContainers[0].env[0]: Forbidden: must not be set in a container that requests nvidia.com/gpu: the node agent sets it to exactly the GPUs kubelet allocated; remove this entry`),
		},
		"void in containers without GPUs is allowed": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Container("logger", 0).Void("logger").Obj(),
			want: allowed,
		},
		"a visible-devices value other than void in a container without GPUs is denied": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Container("logger", 0).Env("logger", envVar(v1alpha1.EnvVisibleDevices, "0,1")).Obj(),
			want: forbidden(`spec.containers[1].env[0]: Forbidden: must be "void" (or absent) in a container that requests no nvidia.com/gpu, so it sees no GPU; request nvidia.com/gpu to get one`),
		},
		"NVIDIA_VISIBLE_DEVICES in a namespace that did not opt in is not gputopo's business": {
			pod:  MakePod("p", nsPlain).GPU(1).Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: allowed,
		},
		"a new ephemeral container asking for all GPUs is denied": {
			op: admissionv1.Update, subresource: "ephemeralcontainers",
			old:  MakePod("p", nsOptedIn).GPU(1).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden(`spec.ephemeralContainers[0].env[0]: Forbidden: must be "void" (or absent) in a container that requests no nvidia.com/gpu, so it sees no GPU; request nvidia.com/gpu to get one`),
		},
		"an existing ephemeral container is not judged again": {
			op: admissionv1.Update, subresource: "ephemeralcontainers",
			old:  MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			pod:  MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug", envVar(v1alpha1.EnvVisibleDevices, "all")).Ephemeral("debug-2", envVar(v1alpha1.EnvVisibleDevices, envVoid)).Obj(),
			want: allowed,
		},
		"every problem is reported at once": {
			pod: MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Intent("pipeline").
				Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: forbidden("[" + protectedBy(v1alpha1.AnnotationAssignedGPUs, userAlice, "set") +
				`, metadata.annotations[gputopo.io/parallelism]: Unsupported value: "pipeline": supported values: "data", "model"` +
				`, spec.containers[0].env[0]: Forbidden: must not be set in a container that requests nvidia.com/gpu: the node agent sets it to exactly the GPUs kubelet allocated; remove this entry]`),
		},
		"DELETE is allowed": {
			op:   admissionv1.Delete,
			pod:  MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj(),
			want: allowed,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			v := NewPodValidator(DefaultConfig(), fakeReader(t, tc.objs...))
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
			resp := handle(v, request(t, op, "pods", tc.subresource, tc.pod, old, user))
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
	cfg := DefaultConfig()
	cfg.SystemServiceAccounts = []string{"system:serviceaccount:gpu:agent"}
	v := NewPodValidator(cfg, fakeReader(t))
	pod := MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAllocatedGPUs, uuidA).Obj()
	for name, tc := range map[string]struct {
		user    string
		allowed bool
	}{
		"the configured account may write":               {"system:serviceaccount:gpu:agent", true},
		"a default account no longer configured may not": {DefaultNodeAgentServiceAccount, false},
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
