package webhook

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

func init() {
	// Handlers log through controller-runtime's logger; tests keep quiet.
	logf.SetLogger(logr.Discard())
}

const (
	nsOptedIn = "team-a"
	nsPlain   = "team-b"
	userAlice = "alice"
)

// PodWrapper builds pods for tests: MakePod("p", ns).GPU(4).Obj().
type PodWrapper struct{ corev1.Pod }

// MakePod returns a pod with one container, "main", that requests nothing.
func MakePod(name, ns string) *PodWrapper {
	return &PodWrapper{corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "trainer"}}},
	}}
}

func gpuResources(n int64) corev1.ResourceRequirements {
	if n == 0 {
		return corev1.ResourceRequirements{}
	}
	q := *resource.NewQuantity(n, resource.DecimalSI)
	return corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: q}}
}

// GPU sets the first container's nvidia.com/gpu limit.
func (p *PodWrapper) GPU(n int64) *PodWrapper {
	p.Spec.Containers[0].Resources = gpuResources(n)
	return p
}

// GPURequestOnly sets the first container's nvidia.com/gpu request, no limit.
func (p *PodWrapper) GPURequestOnly(n int64) *PodWrapper {
	q := *resource.NewQuantity(n, resource.DecimalSI)
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: corev1.ResourceList{v1alpha1.ResourceGPU: q}}
	return p
}

// Container appends an app container requesting gpus GPUs.
func (p *PodWrapper) Container(name string, gpus int64) *PodWrapper {
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: name, Image: "tool", Resources: gpuResources(gpus)})
	return p
}

// InitContainer appends a one-shot init container requesting gpus GPUs.
func (p *PodWrapper) InitContainer(name string, gpus int64) *PodWrapper {
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: name, Image: "init", Resources: gpuResources(gpus)})
	return p
}

// Sidecar appends a restartable init container requesting gpus GPUs.
func (p *PodWrapper) Sidecar(name string, gpus int64) *PodWrapper {
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: name, Image: "sidecar", Resources: gpuResources(gpus),
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)})
	return p
}

// Ephemeral appends an ephemeral container with the given env.
func (p *PodWrapper) Ephemeral(name string, env ...corev1.EnvVar) *PodWrapper {
	p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: name, Image: "debug", Env: env}})
	return p
}

// EphemeralEnvFrom appends envFrom sources to the named ephemeral
// container.
func (p *PodWrapper) EphemeralEnvFrom(name string, src ...corev1.EnvFromSource) *PodWrapper {
	for i := range p.Spec.EphemeralContainers {
		if c := &p.Spec.EphemeralContainers[i]; c.Name == name {
			c.EnvFrom = append(c.EnvFrom, src...)
			return p
		}
	}
	panic("no ephemeral container " + name)
}

// Env appends env entries to the named container (app or init).
func (p *PodWrapper) Env(container string, env ...corev1.EnvVar) *PodWrapper {
	c := p.container(container)
	c.Env = append(c.Env, env...)
	return p
}

// EnvFrom appends envFrom sources to the named container (app or init).
func (p *PodWrapper) EnvFrom(container string, src ...corev1.EnvFromSource) *PodWrapper {
	p.container(container).EnvFrom = append(p.container(container).EnvFrom, src...)
	return p
}

// Resources sets the limits of the named container (app or init).
func (p *PodWrapper) Resources(container string, limits corev1.ResourceList) *PodWrapper {
	p.container(container).Resources = corev1.ResourceRequirements{Limits: limits}
	return p
}

// Node binds the pod to node, as a Binding would.
func (p *PodWrapper) Node(node string) *PodWrapper {
	p.Spec.NodeName = node
	return p
}

func (p *PodWrapper) container(name string) *corev1.Container {
	for _, list := range [][]corev1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	panic("test pod has no container " + name)
}

// Void appends NVIDIA_VISIBLE_DEVICES=void to the named containers.
func (p *PodWrapper) Void(containers ...string) *PodWrapper {
	for _, c := range containers {
		p.Env(c, envVar(v1alpha1.EnvVisibleDevices, envVoid))
	}
	return p
}

func envVar(name, value string) corev1.EnvVar { return corev1.EnvVar{Name: name, Value: value} }

func (p *PodWrapper) Annotation(k, v string) *PodWrapper {
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations[k] = v
	return p
}

// Group sets the pod's group name and size annotations.
func (p *PodWrapper) Group(name, size string) *PodWrapper {
	return p.Annotation(v1alpha1.AnnotationGroup, name).Annotation(v1alpha1.AnnotationGroupSize, size)
}

func (p *PodWrapper) Label(k, v string) *PodWrapper {
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[k] = v
	return p
}

func (p *PodWrapper) Intent(v string) *PodWrapper {
	return p.Annotation(v1alpha1.AnnotationParallelism, v)
}

func (p *PodWrapper) Requirement(v string) *PodWrapper {
	return p.Annotation(v1alpha1.AnnotationRequirement, v)
}

func (p *PodWrapper) JobLabel(v string) *PodWrapper { return p.Label(v1alpha1.LabelJob, v) }

func (p *PodWrapper) SchedulerName(s string) *PodWrapper {
	p.Spec.SchedulerName = s
	return p
}

func (p *PodWrapper) GenerateName(s string) *PodWrapper {
	p.ObjectMeta.Name, p.ObjectMeta.GenerateName = "", s
	return p
}

// OwnedByJob adds a controller reference to the named Job, as the Job
// controller writes it.
func (p *PodWrapper) OwnedByJob(name string) *PodWrapper {
	p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{
		APIVersion: "batch/v1", Kind: "Job", Name: name, UID: types.UID("uid-" + name),
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	})
	return p
}

// LWS labels the pod as LeaderWorkerSet v0.8.0's controller creates
// it: a replica of set of size pods, as the leader (worker 0, its group
// index only in the StatefulSet pod index, as before LWS's own webhook
// runs) or a worker of replica group at revision rev.
func (p *PodWrapper) LWS(set string, size, group, worker int, rev string) *PodWrapper {
	p.Label(labelLWSName, set).Label(labelLWSRevision, rev).Annotation(annotationLWSSize, strconv.Itoa(size))
	if worker == 0 {
		return p.Label(labelLWSWorkerIndex, "0").Label(labelStatefulSetIndex, strconv.Itoa(group))
	}
	return p.Label(labelLWSGroupIndex, strconv.Itoa(group)).Label(labelStatefulSetIndex, strconv.Itoa(worker-1))
}

func (p *PodWrapper) Obj() *corev1.Pod { return p.Pod.DeepCopy() }

// JobWrapper builds Jobs for tests.
type JobWrapper struct{ batchv1.Job }

// MakeJob returns a Job whose template has one container requesting gpus.
func MakeJob(name, ns string, gpus int64) *JobWrapper {
	return &JobWrapper{batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "main", Image: "trainer", Resources: gpuResources(gpus)}},
		}}},
	}}
}

func (j *JobWrapper) Annotation(k, v string) *JobWrapper {
	if j.Annotations == nil {
		j.Annotations = map[string]string{}
	}
	j.Annotations[k] = v
	return j
}

func (j *JobWrapper) Intent(v string) *JobWrapper {
	return j.Annotation(v1alpha1.AnnotationParallelism, v)
}

func (j *JobWrapper) TemplateAnnotation(k, v string) *JobWrapper {
	if j.Spec.Template.Annotations == nil {
		j.Spec.Template.Annotations = map[string]string{}
	}
	j.Spec.Template.Annotations[k] = v
	return j
}

// Parallelism sets spec.parallelism.
func (j *JobWrapper) Parallelism(n int32) *JobWrapper {
	j.Spec.Parallelism = ptr.To(n)
	return j
}

// Completions sets spec.completions.
func (j *JobWrapper) Completions(n int32) *JobWrapper {
	j.Spec.Completions = ptr.To(n)
	return j
}

// Indexed makes the Job an Indexed Job.
func (j *JobWrapper) Indexed() *JobWrapper {
	j.Spec.CompletionMode = ptr.To(batchv1.IndexedCompletion)
	return j
}

// SchedulingGroup puts the template's pods in the Kubernetes PodGroup
// name.
func (j *JobWrapper) SchedulingGroup(name string) *JobWrapper {
	j.Spec.Template.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To(name)}
	return j
}

// GenerateName leaves the Job's name to the apiserver, as it is at
// admission.
func (j *JobWrapper) GenerateName(s string) *JobWrapper {
	j.ObjectMeta.Name, j.ObjectMeta.GenerateName = "", s
	return j
}

// Group sets the group annotations on the template as the webhook derives
// them: name and size, and preferred unless empty.
func (j *JobWrapper) Group(name string, size int, preferred string) *JobWrapper {
	j.TemplateAnnotation(v1alpha1.AnnotationGroup, name)
	j.TemplateAnnotation(v1alpha1.AnnotationGroupSize, strconv.Itoa(size))
	if preferred != "" {
		j.TemplateAnnotation(v1alpha1.AnnotationGroupPreferredTopology, preferred)
	}
	return j
}

func (j *JobWrapper) Obj() *batchv1.Job { return j.Job.DeepCopy() }

// Label sets a label on the Job.
func (j *JobWrapper) Label(k, v string) *JobWrapper {
	if j.Labels == nil {
		j.Labels = map[string]string{}
	}
	j.Labels[k] = v
	return j
}

// OfJobSet labels the Job as the JobSet controller labels the Jobs of
// JobSet name, which runs jobs Jobs, at restart attempt restarts.
func (j *JobWrapper) OfJobSet(name string, jobs, restarts int) *JobWrapper {
	return j.Label(labelJobSetName, name).Label(labelJobSetGlobalReplicas, strconv.Itoa(jobs)).Label(labelJobSetRestarts, strconv.Itoa(restarts))
}

// MakeNamespace returns a namespace, opted in when optedIn.
func MakeNamespace(name string, optedIn bool, intent string) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelMetadataName: name}}}
	if optedIn {
		ns.Labels[v1alpha1.LabelInjection] = v1alpha1.InjectionEnabled
	}
	if intent != "" {
		ns.Annotations = map[string]string{v1alpha1.AnnotationParallelism: intent}
	}
	return ns
}

// fakeReader returns a reader over the default namespaces plus objs.
func fakeReader(t testing.TB, objs ...client.Object) client.Reader {
	t.Helper()
	base := []client.Object{MakeNamespace(nsOptedIn, true, ""), MakeNamespace(nsPlain, false, ""), MakeNamespace("kube-system", true, "")}
	have := map[string]bool{}
	for _, o := range objs {
		if _, ok := o.(*corev1.Namespace); ok {
			have[o.GetName()] = true
		}
	}
	var all []client.Object
	for _, o := range base {
		if !have[o.GetName()] {
			all = append(all, o)
		}
	}
	all = append(all, objs...)
	return fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(all...).Build()
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

// request builds an admission request for obj (and old, on UPDATE).
func request(t testing.TB, op admissionv1.Operation, resource, subresource string, obj, old client.Object, user string) admission.Request {
	t.Helper()
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID:         "req-1",
		Operation:   op,
		Namespace:   obj.GetNamespace(),
		Name:        obj.GetName(),
		Resource:    metav1.GroupVersionResource{Version: "v1", Resource: resource},
		SubResource: subresource,
		UserInfo:    authenticationv1.UserInfo{Username: user},
		Object:      runtime.RawExtension{Raw: mustJSON(t, obj)},
	}}
	if old != nil {
		req.OldObject = runtime.RawExtension{Raw: mustJSON(t, old)}
	}
	return req
}

func podCreate(t testing.TB, pod *corev1.Pod, user string) admission.Request {
	return request(t, admissionv1.Create, "pods", "", pod, nil, user)
}

// applyPatch applies the response's patch to raw; a response without one
// leaves raw as it is.
func applyPatch(t testing.TB, raw []byte, resp admission.Response) []byte {
	t.Helper()
	if len(resp.Patches) == 0 {
		return raw
	}
	patch, err := jsonpatch.DecodePatch(mustJSON(t, resp.Patches))
	if err != nil {
		t.Fatalf("decode patch %s: %v", mustJSON(t, resp.Patches), err)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("apply patch %s: %v", mustJSON(t, resp.Patches), err)
	}
	return out
}

func handle(h admission.Handler, req admission.Request) admission.Response {
	return h.Handle(context.Background(), req)
}
