//go:build integration

package webhook

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// The integration tests run a real kube-apiserver and etcd (envtest,
// KUBEBUILDER_ASSETS) that call this webhook over TLS, registered with the
// objects Registration returns:
//
//	KUBEBUILDER_ASSETS=$PWD/bin go test -tags integration ./webhook -run Integration -v

const releaseNS = "gputopo-system"

type testEnv struct {
	cfg    *rest.Config
	client client.Client
}

func startEnv(t *testing.T) *testEnv {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set: it must name a directory holding kube-apiserver and etcd")
	}
	mut, val, err := Registration(RegistrationOptions{ServiceName: "gputopo-webhook", ServiceNamespace: releaseNS})
	if err != nil {
		t.Fatal(err)
	}
	env := &envtest.Environment{WebhookInstallOptions: envtest.WebhookInstallOptions{
		MutatingWebhooks:   []*admissionregistrationv1.MutatingWebhookConfiguration{mut},
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{val},
	}}
	restCfg, err := env.Start()
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})

	wio := env.WebhookInstallOptions
	mgr, err := NewManager(configv1alpha1.DefaultWebhookConfiguration(), restCfg, Options{
		Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		CertName: "tls.crt", KeyName: "tls.key", MetricsBindAddress: "0", HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook manager: %v", err)
		}
	})
	addr := net.JoinHostPort(wio.LocalServingHost, strconv.Itoa(wio.LocalServingPort))
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // readiness probe only
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		return true, nil
	}); err != nil {
		t.Fatalf("waiting for the webhook server to serve TLS: %v", err)
	}
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		t.Fatal("webhook caches did not sync")
	}

	c, err := client.New(restCfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{cfg: restCfg, client: c}
	for _, ns := range []*corev1.Namespace{MakeNamespace(nsOptedIn, true, ""), MakeNamespace(nsPlain, false, ""), MakeNamespace(releaseNS, false, "")} {
		e.create(t, ns)
	}
	// The webhook reads namespaces from its cache: wait until it has seen
	// the opt-in label.
	reader := metadataReader{reader: mgr.GetCache()}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		info, err := reader.namespace(ctx, nsOptedIn, v1alpha1.AnnotationParallelism)
		return err == nil && info.optedIn, nil
	}); err != nil {
		t.Fatalf("waiting for the webhook cache to see the opted-in namespace: %v", err)
	}
	return e
}

func (e *testEnv) create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := e.client.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// podFromTemplate builds the pod the Job controller would create.
func podFromTemplate(job *batchv1.Job) *corev1.Pod {
	tmpl := job.Spec.Template.DeepCopy()
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: job.Name + "-", Namespace: job.Namespace,
			Labels: tmpl.Labels, Annotations: tmpl.Annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(job, batchv1.SchemeGroupVersion.WithKind("Job"))},
		},
		Spec: tmpl.Spec,
	}
}

// denial asserts err is the webhook's denial, naming the webhook and
// carrying wantMsg.
func denial(t *testing.T, err error, webhook, wantMsg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("allowed; want a denial by %s saying %q", webhook, wantMsg)
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("error %v is neither Forbidden nor Invalid", err)
	}
	if !strings.Contains(err.Error(), `admission webhook "`+webhook+`" denied the request`) || !strings.Contains(err.Error(), wantMsg) {
		t.Errorf("error %q\nwant a denial by %s containing %q", err, webhook, wantMsg)
	}
}

func TestIntegration(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()

	job := MakeJob("train", nsOptedIn, 4).Intent("model").Obj()
	job.Spec.Template.Spec.Containers = append(job.Spec.Template.Spec.Containers, corev1.Container{Name: "logger", Image: "fluentbit"})
	e.create(t, job)

	t.Run("a model Job's template carries the intent", func(t *testing.T) {
		if got := job.Spec.Template.Annotations[v1alpha1.AnnotationParallelism]; got != "model" {
			t.Errorf("template intent = %q, want model", got)
		}
	})

	t.Run("pods the Job controller would create carry requirement, scheduler and job label", func(t *testing.T) {
		for i := range 2 {
			pod := podFromTemplate(job)
			e.create(t, pod)
			got := map[string]string{
				"requirement": pod.Annotations[v1alpha1.AnnotationRequirement],
				"scheduler":   pod.Spec.SchedulerName,
				"job":         pod.Labels[v1alpha1.LabelJob],
				"main env":    fmt.Sprint(pod.Spec.Containers[0].Env),
				"logger env":  fmt.Sprint(pod.Spec.Containers[1].Env),
			}
			want := map[string]string{
				"requirement": reqModelNVLink, "scheduler": v1alpha1.DefaultSchedulerName, "job": "train",
				"main env": "[]", "logger env": "[{NVIDIA_VISIBLE_DEVICES void nil}]",
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("pod %d (-want +got):\n%s", i, diff)
			}
		}
	})

	t.Run("a Job pod without the copied intent gets it from the Job through the cache", func(t *testing.T) {
		pod := podFromTemplate(job)
		delete(pod.Annotations, v1alpha1.AnnotationParallelism)
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			probe := pod.DeepCopy()
			probe.GenerateName = "probe-"
			if err := e.client.Create(ctx, probe, client.DryRunAll); err != nil {
				return false, err
			}
			return probe.Annotations[v1alpha1.AnnotationRequirement] == reqModelNVLink, nil
		}); err != nil {
			t.Fatalf("waiting for the Job in the webhook cache: %v", err)
		}
		e.create(t, pod)
		if got := pod.Annotations[v1alpha1.AnnotationRequirement]; got != reqModelNVLink {
			t.Errorf("requirement = %q, want %q", got, reqModelNVLink)
		}
	})

	protected := "metadata.annotations[gputopo.io/assigned-gpus]: Forbidden: user \"" // + the envtest admin's name
	t.Run("create with assigned-gpus is denied", func(t *testing.T) {
		err := e.client.Create(ctx, MakePod("spoof-create", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj())
		denial(t, err, WebhookValidatePod, protected)
	})
	t.Run("create with assigned-gpus and another schedulerName is denied", func(t *testing.T) {
		for _, ns := range []string{nsOptedIn, nsPlain} {
			err := e.client.Create(ctx, MakePod("spoof-sched", ns).GPU(1).SchedulerName("my-scheduler").Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj())
			denial(t, err, WebhookValidatePod, protected)
		}
	})
	t.Run("an update adding assigned-gpus is denied", func(t *testing.T) {
		pod := MakePod("spoof-update", nsOptedIn).GPU(1).Obj()
		e.create(t, pod)
		patch := client.MergeFrom(pod.DeepCopy())
		pod.Annotations[v1alpha1.AnnotationAssignedGPUs] = uuidA
		denial(t, e.client.Patch(ctx, pod, patch), WebhookValidatePod, protected)
	})
	t.Run("a status update adding assigned-gpus is denied", func(t *testing.T) {
		pod := MakePod("spoof-status", nsPlain).GPU(1).Obj()
		e.create(t, pod)
		patch := client.MergeFrom(pod.DeepCopy())
		pod.Status.Message = "progress"
		if err := e.client.Status().Patch(ctx, pod, patch); err != nil {
			t.Fatalf("a status update leaving system annotations alone: %v", err)
		}
		patch = client.MergeFrom(pod.DeepCopy())
		pod.Annotations = map[string]string{v1alpha1.AnnotationAssignedGPUs: uuidA}
		denial(t, e.client.Status().Patch(ctx, pod, patch), WebhookValidatePodStat, protected)
	})
	t.Run("a Job with assigned-gpus in its template is denied", func(t *testing.T) {
		err := e.client.Create(ctx, MakeJob("spoof-job", nsOptedIn, 1).TemplateAnnotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Obj())
		denial(t, err, WebhookMutateJob, "spec.template.metadata.annotations[gputopo.io/assigned-gpus]: Forbidden")
	})
	t.Run("an unknown strategy is denied naming the field", func(t *testing.T) {
		err := e.client.Create(ctx, MakePod("bad-req", nsOptedIn).GPU(2).Requirement(`{"strategy":"fastest"}`).Obj())
		denial(t, err, WebhookValidatePod, `metadata.annotations[gputopo.io/gpu-topology-requirement].strategy: Unsupported value: "fastest"`)
	})
	t.Run("a user-set NVIDIA_VISIBLE_DEVICES in a GPU container is denied", func(t *testing.T) {
		err := e.client.Create(ctx, MakePod("see-all", nsOptedIn).GPU(1).Env("main", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj())
		denial(t, err, WebhookValidatePod, `spec.containers[0].env[0]: Forbidden: container "main" requests nvidia.com/gpu, so NVIDIA_VISIBLE_DEVICES must not be set there`)
	})
	t.Run("a user-set NVIDIA_VISIBLE_DEVICES in a GPU container is denied where the namespace did not opt in", func(t *testing.T) {
		err := e.client.Create(ctx, MakePod("see-all", nsPlain).GPU(1).Env("main", envVar(v1alpha1.EnvVisibleDevices, uuidB)).Obj())
		denial(t, err, WebhookValidatePod, `spec.containers[0].env[0]: Forbidden: container "main" requests nvidia.com/gpu, so NVIDIA_VISIBLE_DEVICES must not be set there`)
	})

	t.Run("pods in a namespace that did not opt in are untouched", func(t *testing.T) {
		pod := MakePod("plain", nsPlain).GPU(4).Intent("model").Container("logger", 0).Obj()
		e.create(t, pod)
		if _, ok := pod.Annotations[v1alpha1.AnnotationRequirement]; ok || pod.Spec.SchedulerName != corev1.DefaultSchedulerName ||
			pod.Labels[v1alpha1.LabelJob] != "" || len(pod.Spec.Containers[1].Env) != 0 {
			t.Errorf("pod was mutated: annotations %v, labels %v, scheduler %q, logger env %v",
				pod.Annotations, pod.Labels, pod.Spec.SchedulerName, pod.Spec.Containers[1].Env)
		}
	})

	t.Run("the node agent's service account may record allocated-gpus; an admin may not change it", func(t *testing.T) {
		e.create(t, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gputopo-nodeagent"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "patch", "update"}}}})
		e.create(t, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "gputopo-nodeagent"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "gputopo-nodeagent"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: releaseNS, Name: "gputopo-nodeagent"}}})
		pod := MakePod("allocated", nsOptedIn).GPU(1).Node("gpu-node-1").Obj()
		e.create(t, pod)

		// A node agent authenticates with a token bound to its pod, for which
		// kube-apiserver adds the node's name to the user's extra;
		// impersonation stands in for it here (test/security uses real
		// tokens).
		agentCfg := rest.CopyConfig(e.cfg)
		agentCfg.Impersonate = rest.ImpersonationConfig{UserName: configv1alpha1.DefaultNodeAgentServiceAccount,
			Extra: map[string][]string{serviceaccount.NodeNameKey: {"gpu-node-1"}}}
		agent, err := client.New(agentCfg, client.Options{})
		if err != nil {
			t.Fatal(err)
		}
		body := []byte(`{"metadata":{"annotations":{"` + v1alpha1.AnnotationAllocatedGPUs + `":"` + uuidA + `"}}}`)
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			return agent.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body)) == nil, nil
		}); err != nil {
			t.Fatalf("waiting for RBAC for the node agent: %v", err)
		}
		if got := pod.Annotations[v1alpha1.AnnotationAllocatedGPUs]; got != uuidA {
			t.Errorf("allocated-gpus = %q, want %q", got, uuidA)
		}
		body = []byte(`{"metadata":{"annotations":{"` + v1alpha1.AnnotationAllocatedGPUs + `":"` + uuidB + `"}}}`)
		err = e.client.Patch(ctx, pod, client.RawPatch(types.MergePatchType, body))
		denial(t, err, WebhookValidatePod, "metadata.annotations[gputopo.io/allocated-gpus]: Forbidden")
	})

	t.Run("a Binding carries assigned-gpus past the webhook, as the extender writes it", func(t *testing.T) {
		pod := MakePod("bound", nsOptedIn).GPU(1).Obj()
		e.create(t, pod)
		binding := &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, Annotations: map[string]string{v1alpha1.AnnotationAssignedGPUs: uuidA}},
			Target:     corev1.ObjectReference{Kind: "Node", Name: "gpu-node-1"},
		}
		if err := e.client.SubResource("binding").Create(ctx, pod, binding); err != nil {
			t.Fatalf("bind: %v", err)
		}
		if err := e.client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			t.Fatal(err)
		}
		if pod.Spec.NodeName != "gpu-node-1" || pod.Annotations[v1alpha1.AnnotationAssignedGPUs] != uuidA {
			t.Errorf("after binding: node %q, assigned-gpus %q", pod.Spec.NodeName, pod.Annotations[v1alpha1.AnnotationAssignedGPUs])
		}
	})
}

// TestIntegrationAdmissionLatency creates 1,000 GPU pods through the
// apiserver in an opted-in namespace (mutating and validating webhooks
// called over TLS) and 1,000 in the release namespace, which no webhook
// sees, as the baseline measured in the same run; it logs p50/p90/p99 and
// the ratio. It asserts nothing about time.
//
//	KUBEBUILDER_ASSETS=$PWD/bin go test -tags integration ./webhook -run AdmissionLatency -v
func TestIntegrationAdmissionLatency(t *testing.T) {
	e := startEnv(t)
	const n = 1000
	measure := func(ns string) []time.Duration {
		out := make([]time.Duration, 0, n)
		for i := range n {
			pod := typicalGPUPod()
			pod.Namespace = ns
			pod.OwnerReferences = nil
			pod.GenerateName, pod.Name = "", fmt.Sprintf("lat-%d", i)
			start := time.Now()
			if err := e.client.Create(context.Background(), pod); err != nil {
				t.Fatalf("create %s/%s: %v", ns, pod.Name, err)
			}
			out = append(out, time.Since(start))
			if ns == nsOptedIn && pod.Spec.SchedulerName != v1alpha1.DefaultSchedulerName {
				t.Fatalf("pod %s was not mutated", pod.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	q := func(d []time.Duration, p float64) time.Duration { return d[int(float64(len(d)-1)*p)] }
	base := measure(releaseNS)
	hooked := measure(nsOptedIn)
	for _, r := range []struct {
		name string
		d    []time.Duration
	}{{"no webhook (baseline)", base}, {"mutate+validate", hooked}} {
		t.Logf("%-22s n=%d p50=%v p90=%v p99=%v max=%v", r.name, len(r.d), q(r.d, .5), q(r.d, .9), q(r.d, .99), r.d[len(r.d)-1])
	}
	t.Logf("p99 ratio webhook/baseline = %.2f, p50 ratio = %.2f",
		float64(q(hooked, .99))/float64(q(base, .99)), float64(q(hooked, .5))/float64(q(base, .5)))
}
