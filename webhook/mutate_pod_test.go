package webhook

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

const (
	reqModelNVLink = `{"requireNVLink":true,"strategy":"highest_bandwidth"}`
	reqModelSingle = `{"strategy":"highest_bandwidth"}`
	reqData        = `{"strategy":"numa_local"}`
	reqNone        = `{"strategy":"lowest_fragmentation"}`
	sched          = v1alpha1.DefaultSchedulerName
)

func decodePodBytes(t *testing.T, raw []byte) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{}
	if err := json.Unmarshal(raw, pod); err != nil {
		t.Fatalf("decode patched pod: %v", err)
	}
	return pod
}

// checkIdempotent asserts what reinvocation relies on: the patch applied
// twice equals the patch applied once, and the handler asks for no change
// to an object it already mutated.
func checkIdempotent(t *testing.T, h admission.Handler, req admission.Request, resp admission.Response) {
	t.Helper()
	once := applyPatch(t, req.Object.Raw, resp)
	twice := applyPatch(t, once, resp)
	var a, b any
	if err := json.Unmarshal(once, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(twice, &b); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("patch applied twice differs from once (-once +twice):\n%s", diff)
	}
	again := req
	again.Object.Raw = once
	if resp2 := handle(h, again); len(resp2.Patches) != 0 || !resp2.Allowed {
		t.Errorf("reinvocation on the mutated object: allowed=%v patches=%s, want allowed with no patches", resp2.Allowed, mustJSON(t, resp2.Patches))
	}
}

func TestPodMutator(t *testing.T) {
	long := strings.Repeat("very-long-job-name-", 5) + "x"
	tests := map[string]struct {
		objs []client.Object
		pod  *corev1.Pod
		want *corev1.Pod
	}{
		"model intent on a 4-GPU pod requires NVLink with highest_bandwidth, routes and labels it": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Intent("model").Obj(),
			want: MakePod("p", nsOptedIn).GPU(4).Intent("model").Requirement(reqModelNVLink).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"model intent on a 1-GPU pod does not require NVLink": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Intent("model").Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Intent("model").Requirement(reqModelSingle).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"data intent gets numa_local": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Intent("data").Obj(),
			want: MakePod("p", nsOptedIn).GPU(4).Intent("data").Requirement(reqData).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"no intent anywhere gets lowest_fragmentation": {
			pod:  MakePod("p", nsOptedIn).GPU(2).Obj(),
			want: MakePod("p", nsOptedIn).GPU(2).Requirement(reqNone).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"intent comes from the controlling Job, whose name is the job label": {
			objs: []client.Object{MakeJob("train", nsOptedIn, 4).Intent("model").Obj()},
			pod:  MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Obj(),
			want: MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Requirement(reqModelNVLink).JobLabel("train").SchedulerName(sched).Obj(),
		},
		"intent comes from the namespace default when pod and Job state none": {
			objs: []client.Object{MakeNamespace(nsOptedIn, true, "data"), MakeJob("train", nsOptedIn, 4).Obj()},
			pod:  MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Obj(),
			want: MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Requirement(reqData).JobLabel("train").SchedulerName(sched).Obj(),
		},
		"pod intent beats the Job's and the namespace's": {
			objs: []client.Object{MakeNamespace(nsOptedIn, true, "data"), MakeJob("train", nsOptedIn, 4).Intent("data").Obj()},
			pod:  MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Intent("model").Obj(),
			want: MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Intent("model").Requirement(reqModelNVLink).JobLabel("train").SchedulerName(sched).Obj(),
		},
		"Job intent beats the namespace's": {
			objs: []client.Object{MakeNamespace(nsOptedIn, true, "data"), MakeJob("train", nsOptedIn, 4).Intent("model").Obj()},
			pod:  MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Obj(),
			want: MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Requirement(reqModelNVLink).JobLabel("train").SchedulerName(sched).Obj(),
		},
		"controlling Job missing from the cache falls back to the namespace default": {
			objs: []client.Object{MakeNamespace(nsOptedIn, true, "model")},
			pod:  MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Obj(),
			want: MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Requirement(reqModelNVLink).JobLabel("train").SchedulerName(sched).Obj(),
		},
		"invalid Job intent is skipped for the namespace default": {
			objs: []client.Object{MakeNamespace(nsOptedIn, true, "data"), MakeJob("train", nsOptedIn, 4).Intent("pipeline").Obj()},
			pod:  MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Obj(),
			want: MakePod("train-abcde", nsOptedIn).GPU(4).OwnedByJob("train").Requirement(reqData).JobLabel("train").SchedulerName(sched).Obj(),
		},
		"invalid namespace default is skipped for none": {
			objs: []client.Object{MakeNamespace(nsOptedIn, true, "pipeline")},
			pod:  MakePod("p", nsOptedIn).GPU(2).Obj(),
			want: MakePod("p", nsOptedIn).GPU(2).Requirement(reqNone).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"a valid requirement the user wrote is kept": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Intent("model").Requirement(`{"strategy":"numa_local","gpuMemoryMiB":80000}`).Obj(),
			want: MakePod("p", nsOptedIn).GPU(4).Intent("model").Requirement(`{"strategy":"numa_local","gpuMemoryMiB":80000}`).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"a malformed requirement is left for the validator to deny": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Requirement(`{"strategy":"fastest"}`).Obj(),
			want: MakePod("p", nsOptedIn).GPU(4).Requirement(`{"strategy":"fastest"}`).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"an invalid pod intent derives no requirement": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Intent("pipeline").Obj(),
			want: MakePod("p", nsOptedIn).GPU(4).Intent("pipeline").JobLabel("p").SchedulerName(sched).Obj(),
		},
		"a LeaderWorkerSet leader is its replica's group, by its StatefulSet pod index, preferred in NVLink": {
			pod: MakePod("serve-1", nsOptedIn).GPU(8).LWS("serve", 2, 1, 0, "abc12").Obj(),
			want: MakePod("serve-1", nsOptedIn).GPU(8).LWS("serve", 2, 1, 0, "abc12").Requirement(reqNone).JobLabel("serve").SchedulerName(sched).
				Group("serve-1-abc12", "2").Annotation(v1alpha1.AnnotationGroupPreferredTopology, "nvlink").Obj(),
		},
		"a LeaderWorkerSet worker joins its leader's group; the set's exclusive topology is the group's requirement": {
			pod: MakePod("serve-1-1", nsOptedIn).GPU(8).LWS("serve", 2, 1, 1, "abc12").Annotation(annotationLWSExclusive, "leaf").Obj(),
			want: MakePod("serve-1-1", nsOptedIn).GPU(8).LWS("serve", 2, 1, 1, "abc12").Annotation(annotationLWSExclusive, "leaf").Requirement(reqNone).JobLabel("serve").SchedulerName(sched).
				Group("serve-1-abc12", "2").Annotation(v1alpha1.AnnotationGroupPreferredTopology, "nvlink").Annotation(v1alpha1.AnnotationGroupRequiredTopology, "leaf").Obj(),
		},
		"a LeaderWorkerSet pod keeps the group keys its template states": {
			pod: MakePod("serve-0-1", nsOptedIn).GPU(8).LWS("serve", 3, 0, 1, "abc12").Annotation(v1alpha1.AnnotationGroupSize, "2").Annotation(v1alpha1.AnnotationGroupPreferredTopology, "leaf").Obj(),
			want: MakePod("serve-0-1", nsOptedIn).GPU(8).LWS("serve", 3, 0, 1, "abc12").Requirement(reqNone).JobLabel("serve").SchedulerName(sched).
				Group("serve-0-abc12", "2").Annotation(v1alpha1.AnnotationGroupPreferredTopology, "leaf").Obj(),
		},
		"a LeaderWorkerSet pod that names its own group is left as it is": {
			pod:  MakePod("serve-0-1", nsOptedIn).GPU(8).LWS("serve", 2, 0, 1, "abc12").Group("mine", "4").Obj(),
			want: MakePod("serve-0-1", nsOptedIn).GPU(8).LWS("serve", 2, 0, 1, "abc12").Group("mine", "4").Requirement(reqNone).JobLabel("serve").SchedulerName(sched).Obj(),
		},
		"a LeaderWorkerSet of size 1 is no group": {
			pod:  MakePod("serve-0", nsOptedIn).GPU(8).LWS("serve", 1, 0, 0, "abc12").Obj(),
			want: MakePod("serve-0", nsOptedIn).GPU(8).LWS("serve", 1, 0, 0, "abc12").Requirement(reqNone).JobLabel("serve-0").SchedulerName(sched).Obj(),
		},
		"a LeaderWorkerSet pod without GPUs gets no group": {
			pod:  MakePod("serve-0", nsOptedIn).LWS("serve", 2, 0, 0, "abc12").Obj(),
			want: MakePod("serve-0", nsOptedIn).LWS("serve", 2, 0, 0, "abc12").Void("main").Obj(),
		},
		"default-scheduler is replaced": {
			pod:  MakePod("p", nsOptedIn).GPU(1).SchedulerName(corev1.DefaultSchedulerName).Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Requirement(reqNone).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"another scheduler the user chose is kept": {
			pod:  MakePod("p", nsOptedIn).GPU(1).SchedulerName("volcano").Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Requirement(reqNone).JobLabel("p").SchedulerName("volcano").Obj(),
		},
		"a job label the user set is kept": {
			pod:  MakePod("p", nsOptedIn).GPU(1).JobLabel("mpi-run-7").Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).JobLabel("mpi-run-7").Requirement(reqNone).SchedulerName(sched).Obj(),
		},
		"a pod with only generateName is labelled with its stem": {
			pod:  MakePod("", nsOptedIn).GenerateName("worker-").GPU(1).Obj(),
			want: MakePod("", nsOptedIn).GenerateName("worker-").GPU(1).Requirement(reqNone).JobLabel("worker").SchedulerName(sched).Obj(),
		},
		"a Job name longer than a label value is shortened with a hash": {
			pod:  MakePod("p", nsOptedIn).GPU(1).OwnedByJob(long).Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).OwnedByJob(long).Requirement(reqNone).JobLabel(labelValue(long)).SchedulerName(sched).Obj(),
		},
		"GPUs requested without a limit count": {
			pod:  MakePod("p", nsOptedIn).GPURequestOnly(4).Intent("model").Obj(),
			want: MakePod("p", nsOptedIn).GPURequestOnly(4).Intent("model").Requirement(reqModelNVLink).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"GPUs requested only by an init container count, and the app container gets void": {
			pod: MakePod("p", nsOptedIn).InitContainer("warmup", 2).Intent("model").Obj(),
			want: MakePod("p", nsOptedIn).InitContainer("warmup", 2).Void("main").Intent("model").
				Requirement(reqModelNVLink).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"a GPU sidecar adds to the app containers' count": {
			pod: MakePod("p", nsOptedIn).GPU(1).Sidecar("encoder", 1).Intent("model").Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Sidecar("encoder", 1).Intent("model").
				Requirement(reqModelNVLink).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"containers without GPUs get void, GPU containers are untouched": {
			pod: MakePod("p", nsOptedIn).GPU(2).Container("logger", 0).InitContainer("fetch", 0).
				Env("logger", envVar("LEVEL", "info")).Obj(),
			want: MakePod("p", nsOptedIn).GPU(2).Container("logger", 0).InitContainer("fetch", 0).
				Env("logger", envVar("LEVEL", "info")).Void("logger", "fetch").
				Requirement(reqNone).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"NVIDIA_VISIBLE_DEVICES=all in a container without GPUs becomes void in place": {
			pod: MakePod("p", nsOptedIn).GPU(1).Container("logger", 0).
				Env("logger", envVar(v1alpha1.EnvVisibleDevices, "all"), envVar("A", "b")).Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Container("logger", 0).
				Env("logger", envVar(v1alpha1.EnvVisibleDevices, envVoid), envVar("A", "b")).
				Requirement(reqNone).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"NVIDIA_VISIBLE_DEVICES from a ConfigMap in a container without GPUs becomes void": {
			pod: MakePod("p", nsOptedIn).Env("main", corev1.EnvVar{Name: v1alpha1.EnvVisibleDevices, ValueFrom: &corev1.EnvVarSource{
				ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "gpus"}}}).Obj(),
			want: MakePod("p", nsOptedIn).Void("main").Obj(),
		},
		"a pod without GPUs in an opted-in namespace only gets void": {
			pod:  MakePod("web", nsOptedIn).Obj(),
			want: MakePod("web", nsOptedIn).Void("main").Obj(),
		},
		"a namespace that did not opt in is untouched": {
			pod:  MakePod("p", nsPlain).GPU(4).Intent("model").Container("logger", 0).Obj(),
			want: MakePod("p", nsPlain).GPU(4).Intent("model").Container("logger", 0).Obj(),
		},
		"an excluded namespace is untouched even when labelled": {
			pod:  MakePod("p", "kube-system").GPU(4).Obj(),
			want: MakePod("p", "kube-system").GPU(4).Obj(),
		},
		"a namespace that does not exist is untouched": {
			pod:  MakePod("p", "ghost").GPU(4).Obj(),
			want: MakePod("p", "ghost").GPU(4).Obj(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := NewPodMutator(configv1alpha1.DefaultWebhookConfiguration(), fakeReader(t, tc.objs...))
			req := podCreate(t, tc.pod, userAlice)
			resp := handle(m, req)
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			got := decodePodBytes(t, applyPatch(t, req.Object.Raw, resp))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mutated pod (-want +got):\n%s", diff)
			}
			checkIdempotent(t, m, req, resp)
		})
	}
}

func TestPodMutatorEphemeralContainers(t *testing.T) {
	old := MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug-1", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj()
	tests := map[string]struct {
		ns   string
		pod  *corev1.Pod
		want *corev1.Pod
	}{
		"a new ephemeral container gets void; an existing one is left as the apiserver requires": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug-1", envVar(v1alpha1.EnvVisibleDevices, "all")).Ephemeral("debug-2").Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug-1", envVar(v1alpha1.EnvVisibleDevices, "all")).Ephemeral("debug-2", envVar(v1alpha1.EnvVisibleDevices, envVoid)).Obj(),
		},
		"a new ephemeral container asking for all GPUs gets void": {
			pod: MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug-1", envVar(v1alpha1.EnvVisibleDevices, "all")).
				Ephemeral("debug-2", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Ephemeral("debug-1", envVar(v1alpha1.EnvVisibleDevices, "all")).
				Ephemeral("debug-2", envVar(v1alpha1.EnvVisibleDevices, envVoid)).Obj(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := NewPodMutator(configv1alpha1.DefaultWebhookConfiguration(), fakeReader(t))
			req := request(t, admissionv1.Update, "pods", "ephemeralcontainers", tc.pod, old, userAlice)
			resp := handle(m, req)
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			got := decodePodBytes(t, applyPatch(t, req.Object.Raw, resp))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mutated pod (-want +got):\n%s", diff)
			}
			checkIdempotent(t, m, req, resp)
		})
	}
}

func TestPodMutatorLeavesOtherOperationsAlone(t *testing.T) {
	m := NewPodMutator(configv1alpha1.DefaultWebhookConfiguration(), fakeReader(t))
	pod := MakePod("p", nsOptedIn).GPU(4).Obj()
	for name, req := range map[string]admission.Request{
		"UPDATE":        request(t, admissionv1.Update, "pods", "", pod, pod, userAlice),
		"status UPDATE": request(t, admissionv1.Update, "pods", "status", pod, pod, userAlice),
		"DELETE":        request(t, admissionv1.Delete, "pods", "", pod, nil, userAlice),
	} {
		t.Run(name, func(t *testing.T) {
			resp := handle(m, req)
			if !resp.Allowed || len(resp.Patches) != 0 {
				t.Errorf("got allowed=%v patches=%s, want allowed without patches", resp.Allowed, mustJSON(t, resp.Patches))
			}
		})
	}
}

// Raw documents the typed API would round-trip differently: the patch must
// address only members that exist and keep what the types do not know.
func TestPodMutatorRawDocuments(t *testing.T) {
	tests := map[string]struct {
		raw  string
		want string
	}{
		"no metadata member": {
			raw:  `{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
			want: `{"apiVersion":"v1","kind":"Pod","metadata":{"annotations":{"gputopo.io/gpu-topology-requirement":"{\"strategy\":\"lowest_fragmentation\"}"}},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"nvidia.com/gpu":"1"}}}],"schedulerName":"gputopo-scheduler"}}`,
		},
		"null annotations and labels": {
			raw:  `{"metadata":{"name":"p","annotations":null,"labels":null},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}`,
			want: `{"metadata":{"name":"p","annotations":{"gputopo.io/gpu-topology-requirement":"{\"strategy\":\"lowest_fragmentation\"}"},"labels":{"gputopo.io/job":"p"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"nvidia.com/gpu":"1"}}}],"schedulerName":"gputopo-scheduler"}}`,
		},
		"unknown fields in env entries survive": {
			raw:  `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","env":[{"name":"A","value":"b","futureField":{"x":1}}]}]}}`,
			want: `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","env":[{"name":"A","value":"b","futureField":{"x":1}},{"name":"NVIDIA_VISIBLE_DEVICES","value":"void"}]}]}}`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := NewPodMutator(configv1alpha1.DefaultWebhookConfiguration(), fakeReader(t))
			req := podCreate(t, MakePod("p", nsOptedIn).Obj(), userAlice)
			req.Object.Raw = []byte(tc.raw)
			resp := handle(m, req)
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			var got, want any
			if err := json.Unmarshal(applyPatch(t, req.Object.Raw, resp), &got); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tc.want), &want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("patched document (-want +got):\n%s", diff)
			}
			checkIdempotent(t, m, req, resp)
		})
	}
}

func TestPodMutatorBadObject(t *testing.T) {
	m := NewPodMutator(configv1alpha1.DefaultWebhookConfiguration(), fakeReader(t))
	req := podCreate(t, MakePod("p", nsOptedIn).Obj(), userAlice)
	req.Object.Raw = []byte(`{"spec":{"containers":"not a list"}}`)
	resp := handle(m, req)
	if resp.Allowed || resp.Result == nil || resp.Result.Code != 400 {
		t.Errorf("got allowed=%v result=%v, want a 400 error", resp.Allowed, resp.Result)
	}
}

func TestPodMutatorConfiguredPolicy(t *testing.T) {
	cfg := configv1alpha1.DefaultWebhookConfiguration()
	cfg.SchedulerName = "gpu-sched"
	cfg.PolicyTable.Data = configv1alpha1.Policy{Strategy: v1alpha1.StrategyBalancedUtilization, RequireNVLinkFromGPUs: 8, MinPairBandwidthGBps: 100}
	m := NewPodMutator(cfg, fakeReader(t))
	tests := map[string]struct {
		pod  *corev1.Pod
		want *corev1.Pod
	}{
		"below the NVLink threshold only the bandwidth floor applies": {
			pod:  MakePod("p", nsOptedIn).GPU(4).Intent("data").Obj(),
			want: MakePod("p", nsOptedIn).GPU(4).Intent("data").Requirement(`{"minPairBandwidthGBps":100,"strategy":"balanced_utilization"}`).JobLabel("p").SchedulerName("gpu-sched").Obj(),
		},
		"at the NVLink threshold NVLink is required": {
			pod:  MakePod("p", nsOptedIn).GPU(8).Intent("data").Obj(),
			want: MakePod("p", nsOptedIn).GPU(8).Intent("data").Requirement(`{"requireNVLink":true,"minPairBandwidthGBps":100,"strategy":"balanced_utilization"}`).JobLabel("p").SchedulerName("gpu-sched").Obj(),
		},
		"a single GPU gets no bandwidth floor": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Intent("data").Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Intent("data").Requirement(`{"strategy":"balanced_utilization"}`).JobLabel("p").SchedulerName("gpu-sched").Obj(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := podCreate(t, tc.pod, userAlice)
			resp := handle(m, req)
			got := decodePodBytes(t, applyPatch(t, req.Object.Raw, resp))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mutated pod (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodMutatorResourceName(t *testing.T) {
	cfg := configv1alpha1.DefaultWebhookConfiguration()
	cfg.ResourceName = "example.com/gpu"
	m := NewPodMutator(cfg, fakeReader(t))
	other := corev1.ResourceList{"example.com/gpu": resource.MustParse("4")}
	tests := map[string]struct {
		pod  *corev1.Pod
		want *corev1.Pod
	}{
		"a pod requesting the configured resource is routed with its count": {
			pod:  MakePod("p", nsOptedIn).Resources("main", other).Intent("model").Container("logger", 0).Obj(),
			want: MakePod("p", nsOptedIn).Resources("main", other).Intent("model").Container("logger", 0).Void("logger").Requirement(reqModelNVLink).JobLabel("p").SchedulerName(sched).Obj(),
		},
		"nvidia.com/gpu is just another resource then: its container gets void": {
			pod:  MakePod("p", nsOptedIn).GPU(1).Obj(),
			want: MakePod("p", nsOptedIn).GPU(1).Void("main").Obj(),
		},
		"a pod whose count is not whole is not routed; the validator denies it": {
			pod:  MakePod("p", nsOptedIn).Resources("main", corev1.ResourceList{"example.com/gpu": resource.MustParse("1500m")}).Intent("model").Obj(),
			want: MakePod("p", nsOptedIn).Resources("main", corev1.ResourceList{"example.com/gpu": resource.MustParse("1500m")}).Intent("model").Obj(),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := podCreate(t, tc.pod, userAlice)
			resp := handle(m, req)
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			got := decodePodBytes(t, applyPatch(t, req.Object.Raw, resp))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mutated pod (-want +got):\n%s", diff)
			}
			checkIdempotent(t, m, req, resp)
		})
	}
}

func TestLabelValue(t *testing.T) {
	long := strings.Repeat("a", 80)
	tests := map[string]struct{ in, want string }{
		"short name kept":                    {"train", "train"},
		"generateName stem trimmed":          {"worker-", "worker"},
		"63 characters kept":                 {strings.Repeat("b", 63), strings.Repeat("b", 63)},
		"long name shortened with its hash":  {long, strings.Repeat("a", 54) + "-" + labelValue(long)[55:]},
		"empty stays empty":                  {"", ""},
		"dots and dashes at the end trimmed": {"job.-", "job"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := labelValue(tc.in)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("labelValue(%q) (-want +got):\n%s", tc.in, diff)
			}
			if len(got) > 63 {
				t.Errorf("labelValue(%q) = %q, longer than 63", tc.in, got)
			}
		})
	}
	if labelValue(long) == labelValue(long+"b") {
		t.Errorf("two long names sharing a prefix got the same label %q", labelValue(long))
	}
}

// gpuClaimTemplate is a ResourceClaimTemplate in the opted-in namespace
// asking for count devices of class.
func gpuClaimTemplate(name, class string, count int64, mode resourcev1.DeviceAllocationMode) *resourcev1.ResourceClaimTemplate {
	return &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nsOptedIn},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpus", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class, Count: count, AllocationMode: mode}}}}}}}
}

// A pod that asks for GPUs through a ResourceClaimTemplate or a
// ResourceClaim of a served class is a GPU pod to the mutator: its
// requirement is derived from its intent and its claims' count, and it is
// routed to the gputopo scheduler. A claim of another class, a template
// that does not exist yet, an all-devices request, or a mutator that
// reads no claims leave it as it is.
func TestPodMutatorCountsGPUsThroughClaims(t *testing.T) {
	cfg := configv1alpha1.DefaultWebhookConfiguration()
	objs := []client.Object{
		gpuClaimTemplate("four-gpus", "gpu.nvidia.com", 4, resourcev1.DeviceAllocationModeExactCount),
		gpuClaimTemplate("nics", "nic.example.com", 2, resourcev1.DeviceAllocationModeExactCount),
		gpuClaimTemplate("every-gpu", "gpu.nvidia.com", 0, resourcev1.DeviceAllocationModeAll),
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: nsOptedIn}, Spec: gpuClaimTemplate("", "gpu.nvidia.com", 2, "").Spec.Spec},
	}
	claimPod := func(name string, claims ...corev1.PodResourceClaim) *corev1.Pod {
		p := MakePod(name, nsOptedIn).Annotation(v1alpha1.AnnotationParallelism, "model").Obj()
		p.Spec.ResourceClaims = claims
		for _, c := range claims {
			p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: c.Name})
		}
		return p
	}
	tmpl := func(name string) corev1.PodResourceClaim {
		return corev1.PodResourceClaim{Name: name, ResourceClaimTemplateName: ptr.To(name)}
	}
	for name, tc := range map[string]struct {
		pod       *corev1.Pod
		noClaims  bool
		wantGPUs  int
		wantRoute bool
	}{
		"a template of 4 GPUs":              {pod: claimPod("t", tmpl("four-gpus")), wantGPUs: 4, wantRoute: true},
		"a template and a shared claim":     {pod: claimPod("ts", tmpl("four-gpus"), corev1.PodResourceClaim{Name: "s", ResourceClaimName: ptr.To("shared")}), wantGPUs: 6, wantRoute: true},
		"GPUs beside another class's claim": {pod: claimPod("tn", tmpl("four-gpus"), tmpl("nics")), wantGPUs: 4, wantRoute: true},
		"another class only":                {pod: claimPod("n", tmpl("nics"))},
		"a template not created yet":        {pod: claimPod("m", tmpl("missing"))},
		"all devices of a served class":     {pod: claimPod("a", tmpl("every-gpu"))},
		"a mutator that reads no claims":    {pod: claimPod("x", tmpl("four-gpus")), noClaims: true},
	} {
		t.Run(name, func(t *testing.T) {
			m := NewPodMutator(cfg, fakeReader(t))
			if !tc.noClaims {
				m.ReadClaimsWith(fakeReader(t, objs...))
			}
			req := request(t, admissionv1.Create, "pods", "", tc.pod, nil, userAlice)
			resp := handle(m, req)
			if !resp.Allowed {
				t.Fatalf("denied: %v", resp.Result)
			}
			got := decodePodBytes(t, applyPatch(t, req.Object.Raw, resp))
			routed := got.Spec.SchedulerName == cfg.SchedulerName
			if routed != tc.wantRoute {
				t.Errorf("schedulerName %q; routed %v, want %v", got.Spec.SchedulerName, routed, tc.wantRoute)
			}
			wantReq := ""
			if tc.wantGPUs > 0 {
				wantReq = cfg.PolicyTable.For(v1alpha1.ParallelismModel).Requirement(int64(tc.wantGPUs)).String()
			}
			if r := got.Annotations[v1alpha1.AnnotationRequirement]; r != wantReq {
				t.Errorf("requirement %q, want %q", r, wantReq)
			}
		})
	}
}
