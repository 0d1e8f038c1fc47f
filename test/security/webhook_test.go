//go:build integration

package security

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/webhook"
)

// The webhook on a real kube-apiserver, registered exactly as
// webhook.Registration renders it (the chart renders the same objects):
// which pods wait on it, which device variables it refuses in every
// namespace, and how it holds the node agent to its own node with the
// node name kube-apiserver puts into a pod-bound service account token.
//
//	KUBEBUILDER_ASSETS=$PWD/bin go test -tags integration -count=1 ./test/security/ -run Webhook -v

const (
	whRelease    = "gputopo-system"
	whOptedIn    = "team-gpu"
	whPlain      = "team-web"
	whMonitoring = "monitoring"
	agentSA      = "gputopo-nodeagent"
	nodeA        = "gpu-node-a"
	nodeB        = "gpu-node-b"
	uuidOwn      = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
	uuidOther    = "GPU-bbbbbbbb-0000-0000-0000-000000000002"
)

// whEnv is a control plane with the webhook registered and (until
// stopped) served in-process.
type whEnv struct {
	cp  *harness.ControlPlane
	cfg configv1alpha1.WebhookConfiguration
	mut *admissionregistrationv1.MutatingWebhookConfiguration
	val *admissionregistrationv1.ValidatingWebhookConfiguration
	run *localcluster.Running
}

func startWebhookEnv(t *testing.T) *whEnv {
	t.Helper()
	cfg := configv1alpha1.DefaultWebhookConfiguration()
	mut, val, err := webhook.Registration(webhook.RegistrationOptions{ServiceName: "gputopo-webhook", ServiceNamespace: whRelease}.ForConfig(cfg))
	if err != nil {
		t.Fatal(err)
	}
	// envtest points the client configs at its local serving address and
	// CA and installs the objects; it fails here if kube-apiserver refuses
	// a match condition's CEL.
	cp := harness.Start(t, harness.Options{WebhookInstallOptions: &envtest.WebhookInstallOptions{
		MutatingWebhooks:   []*admissionregistrationv1.MutatingWebhookConfiguration{mut.DeepCopy()},
		ValidatingWebhooks: []*admissionregistrationv1.ValidatingWebhookConfiguration{val.DeepCopy()},
	}})
	e := &whEnv{cp: cp, cfg: cfg, mut: mut, val: val}
	ctx := context.Background()
	objs := []client.Object{
		namespace(whOptedIn, true), namespace(whPlain, false), namespace(configv1alpha1.DefaultCertManagerNamespace, false),
		namespace(whMonitoring, false), namespace(whRelease, false),
	}
	objs = append(objs, agentAccount()...)
	// No service account controller runs: pods need the account.
	for _, ns := range []string{whOptedIn, whPlain, configv1alpha1.DefaultCertManagerNamespace, whMonitoring, whRelease} {
		objs = append(objs, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}})
	}
	for _, obj := range objs {
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	e.serve(t)
	return e
}

// agentAccount is the node agent's service account and its ClusterRole
// (nodeagent.RBACRules), bound as the chart binds them.
func agentAccount() []client.Object {
	return []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: whRelease, Name: agentSA}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: agentSA}, Rules: nodeagent.RBACRules()},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: agentSA},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: agentSA},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: whRelease, Name: agentSA}},
		},
	}
}

func namespace(name string, optedIn bool) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if optedIn {
		ns.Labels = map[string]string{v1alpha1.LabelInjection: v1alpha1.InjectionEnabled}
	}
	return ns
}

// serve runs the webhook where envtest registered it and waits until it
// mutates GPU pods in the opted-in namespace (its cache has the label).
func (e *whEnv) serve(t *testing.T) {
	t.Helper()
	wio := e.cp.Env.WebhookInstallOptions
	mgr, err := webhook.NewManager(e.cfg, e.cp.Config, webhook.Options{
		Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
		CertName: "tls.crt", KeyName: "tls.key", MetricsBindAddress: "0", HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatalf("webhook manager: %v", err)
	}
	e.run = localcluster.Go(context.Background(), mgr.Start)
	t.Cleanup(func() { e.stop(t) })
	harness.Poll(t, time.Minute, "the webhook to mutate GPU pods in "+whOptedIn, func() (bool, string) {
		probe := gpuPod(whOptedIn, "probe")
		if err := e.cp.Client.Create(context.Background(), probe, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return probe.Spec.SchedulerName == v1alpha1.DefaultSchedulerName, "schedulerName " + probe.Spec.SchedulerName
	})
}

// stop ends the webhook server and waits until its port refuses
// connections; a second call does nothing.
func (e *whEnv) stop(t *testing.T) {
	t.Helper()
	if e.run == nil {
		return
	}
	run := e.run
	e.run = nil
	if err := run.Stop(); err != nil {
		t.Errorf("webhook manager: %v", err)
	}
	wio := e.cp.Env.WebhookInstallOptions
	addr := net.JoinHostPort(wio.LocalServingHost, strconv.Itoa(wio.LocalServingPort))
	harness.Poll(t, 30*time.Second, "the webhook port to close", func() (bool, string) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: time.Second}, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // probes the port only
		if err != nil {
			return true, ""
		}
		_ = conn.Close()
		return false, "still serving TLS on " + addr
	})
}

func gpuPod(ns, name string) *corev1.Pod {
	return harness.GPUPod(ns, name, 1)
}

func cpuPod(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
			Name: "web", Image: "registry.example/web:1",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}},
		}}},
	}
}

// refusedBy asserts err is kube-apiserver's refusal naming webhook: a
// denial, or a failed call when the webhook is down.
func refusedBy(t *testing.T, what string, err error, webhookName string, wantMsg ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: admitted; want it refused by %s", what, webhookName)
		return
	}
	msg := err.Error()
	if !strings.Contains(msg, `admission webhook "`+webhookName+`" denied the request`) && !strings.Contains(msg, `failed calling webhook "`+webhookName+`"`) {
		t.Errorf("%s: error %q does not name webhook %s", what, msg, webhookName)
	}
	for _, w := range wantMsg {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: error %q\ndoes not say %q", what, msg, w)
		}
	}
}

func TestWebhook(t *testing.T) {
	e := startWebhookEnv(t)
	ctx := context.Background()
	c := e.cp.Client

	t.Run("the apiserver holds the configurations Registration renders", func(t *testing.T) {
		var gotM admissionregistrationv1.MutatingWebhookConfiguration
		var gotV admissionregistrationv1.ValidatingWebhookConfiguration
		if err := c.Get(ctx, client.ObjectKey{Name: e.mut.Name}, &gotM); err != nil {
			t.Fatal(err)
		}
		if err := c.Get(ctx, client.ObjectKey{Name: e.val.Name}, &gotV); err != nil {
			t.Fatal(err)
		}
		type hook struct {
			Rules      []admissionregistrationv1.RuleWithOperations
			Selector   *metav1.LabelSelector
			Conditions []admissionregistrationv1.MatchCondition
			Failure    admissionregistrationv1.FailurePolicyType
		}
		summary := func(m *admissionregistrationv1.MutatingWebhookConfiguration, v *admissionregistrationv1.ValidatingWebhookConfiguration) map[string]hook {
			out := map[string]hook{}
			for _, w := range m.Webhooks {
				out[w.Name] = hook{w.Rules, w.NamespaceSelector, w.MatchConditions, *w.FailurePolicy}
			}
			for _, w := range v.Webhooks {
				out[w.Name] = hook{w.Rules, w.NamespaceSelector, w.MatchConditions, *w.FailurePolicy}
			}
			return out
		}
		if diff := cmp.Diff(summary(e.mut, e.val), summary(&gotM, &gotV)); diff != "" {
			t.Errorf("installed webhooks differ from webhook.Registration (-rendered +installed):\n%s", diff)
		}
	})

	t.Run("literal device variables and envFrom in GPU pods are refused in every namespace", func(t *testing.T) {
		for _, ns := range []string{whPlain, whOptedIn, whMonitoring} {
			p := gpuPod(ns, "see-other")
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: v1alpha1.EnvVisibleDevices, Value: uuidOther}}
			refusedBy(t, "NVIDIA_VISIBLE_DEVICES=<uuid> in "+ns, c.Create(ctx, p), webhook.WebhookValidatePod,
				`spec.containers[0].env[0]: Forbidden: container "main" requests nvidia.com/gpu, so NVIDIA_VISIBLE_DEVICES must not be set there`)

			p = gpuPod(ns, "mig-config")
			p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_MIG_CONFIG_DEVICES", Value: "all"}}
			refusedBy(t, "NVIDIA_MIG_CONFIG_DEVICES in "+ns, c.Create(ctx, p), webhook.WebhookValidatePod,
				"spec.containers[0].env[0]: Forbidden", "NVIDIA_MIG_CONFIG_DEVICES must not be set there")

			p = gpuPod(ns, "from-configmap")
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gpus"}}}}
			refusedBy(t, "envFrom a ConfigMap without a prefix in "+ns, c.Create(ctx, p), webhook.WebhookValidatePod,
				`spec.containers[0].envFrom[0]: Forbidden: container "main" requests nvidia.com/gpu and takes every key of ConfigMap "gpus" with no prefix`)

			p = gpuPod(ns, "sidecar-thief")
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "helper", Image: "registry.example/helper:1",
				Env: []corev1.EnvVar{{Name: v1alpha1.EnvVisibleDevices, Value: "all"}}})
			if ns != whOptedIn {
				refusedBy(t, "a container without GPUs in a GPU pod naming all GPUs in "+ns, c.Create(ctx, p), webhook.WebhookValidatePod,
					`spec.containers[1].env[0]: Forbidden: container "helper" requests no nvidia.com/gpu, so NVIDIA_VISIBLE_DEVICES may only be "void"`)
				continue
			}
			// Where the namespace opted in, the mutating webhook hides every
			// GPU from it instead.
			if err := c.Create(ctx, p, client.DryRunAll); err != nil {
				t.Errorf("a container without GPUs in a GPU pod in %s: %v", ns, err)
			} else if got := p.Spec.Containers[1].Env; len(got) != 1 || got[0].Value != "void" {
				t.Errorf("env of the container without GPUs in %s = %v, want NVIDIA_VISIBLE_DEVICES=void", ns, got)
			}
		}
		// envFrom in containers without GPUs: a sidecar, and every container
		// of a pod without GPUs in an opted-in namespace, must hide the GPUs
		// (env beats envFrom); the mutator does that where it serves.
		sidecar := gpuPod(whPlain, "envfrom-sidecar")
		sidecar.Spec.Containers = append(sidecar.Spec.Containers, corev1.Container{Name: "logger", Image: "registry.example/logger:1",
			EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gpus"}}}}})
		refusedBy(t, "envFrom in a sidecar without GPUs of a GPU pod in "+whPlain, c.Create(ctx, sidecar), webhook.WebhookValidatePod,
			`spec.containers[1].envFrom[0]: Forbidden: container "logger" requests no nvidia.com/gpu and takes every key of ConfigMap "gpus" with no prefix`,
			"add {name: NVIDIA_VISIBLE_DEVICES, value: void} under env")
		for name, p := range map[string]*corev1.Pod{"a sidecar of a GPU pod": sidecar, "a pod without GPUs": cpuPod(whOptedIn, "envfrom-cpu")} {
			p = p.DeepCopy()
			p.Namespace, p.Name = whOptedIn, "mutated-"+p.Name
			last := len(p.Spec.Containers) - 1
			p.Spec.Containers[last].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gpus"}}}}
			if err := c.Create(ctx, p); err != nil {
				t.Errorf("envFrom in %s in %s: %v", name, whOptedIn, err)
				continue
			}
			if got := p.Spec.Containers[last].Env; len(got) != 1 || got[0].Name != v1alpha1.EnvVisibleDevices || got[0].Value != "void" {
				t.Errorf("envFrom in %s in %s: env %v, want NVIDIA_VISIBLE_DEVICES=void added by the mutating webhook", name, whOptedIn, got)
			}
		}

		// An ephemeral container added to a running GPU pod.
		target := gpuPod(whPlain, "debug-target")
		if err := c.Create(ctx, target); err != nil {
			t.Fatal(err)
		}
		target.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debug", Image: "registry.example/debug:1",
			EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "gpus"}}}}}}}
		refusedBy(t, "an ephemeral container taking envFrom", c.SubResource("ephemeralcontainers").Update(ctx, target), webhook.WebhookValidatePod,
			`spec.ephemeralContainers[0].envFrom[0]: Forbidden: container "debug" requests no nvidia.com/gpu`)

		p := gpuPod(whPlain, "prefixed-config")
		p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "train"}}}}
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "compute,utility"}}
		if err := c.Create(ctx, p, client.DryRunAll); err != nil {
			t.Errorf("a GPU pod with a prefixed envFrom and driver capabilities: %v", err)
		}
	})

	t.Run("a node agent records allocated GPUs only on pods of its own node", func(t *testing.T) {
		e.cp.CreateGPUNode(t, nodeA, 8, nil)
		e.cp.CreateGPUNode(t, nodeB, 8, nil)
		agentPod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: whRelease, Name: "gputopo-nodeagent-a"},
			Spec: corev1.PodSpec{ServiceAccountName: agentSA, NodeName: nodeA, Containers: []corev1.Container{{
				Name: "agent", Image: "ghcr.io/gputopo/gputopo:0.2.0"}}},
		}
		if err := c.Create(ctx, agentPod); err != nil {
			t.Fatal(err)
		}
		onA, onB := gpuPod(whOptedIn, "worker-a"), gpuPod(whPlain, "worker-b")
		onA.Spec.NodeName, onB.Spec.NodeName = nodeA, nodeB
		for _, p := range []*corev1.Pod{onA, onB} {
			if err := c.Create(ctx, p); err != nil {
				t.Fatal(err)
			}
		}

		bound := e.agentClient(t, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPod.Name, UID: agentPod.UID})
		record := func(agent client.Client, p *corev1.Pod, uuid string) error {
			body := []byte(`{"metadata":{"annotations":{"` + v1alpha1.AnnotationAllocatedGPUs + `":"` + uuid + `"}}}`)
			return agent.Patch(ctx, p.DeepCopy(), client.RawPatch(types.MergePatchType, body))
		}

		refusedBy(t, "the agent of node A annotating a pod on node B", record(bound, onB, uuidOther), webhook.WebhookValidatePod,
			`metadata.annotations[gputopo.io/allocated-gpus]: Forbidden: node agent "`+configv1alpha1.DefaultNodeAgentServiceAccount+
				`" runs on node "`+nodeA+`" but this pod is bound to node "`+nodeB+`"`)
		if err := record(bound, onA, uuidOwn); err != nil {
			t.Fatalf("the agent of node A annotating a pod on node A: %v", err)
		}
		got := &corev1.Pod{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(onA), got); err != nil {
			t.Fatal(err)
		}
		if v := got.Annotations[v1alpha1.AnnotationAllocatedGPUs]; v != uuidOwn {
			t.Errorf("allocated-gpus on the pod of node A = %q, want %q", v, uuidOwn)
		}

		// The same service account with a token bound to nothing carries
		// no node name: refused, saying which credential to use.
		unbound := e.agentClient(t, nil)
		refusedBy(t, "a token bound to no pod", record(unbound, onA, uuidOther), webhook.WebhookValidatePod,
			"presented a credential that names no node", "service account token bound to its pod")
		// And the agent may not touch the plan, not even on its own node.
		body := []byte(`{"metadata":{"annotations":{"` + v1alpha1.AnnotationAssignedGPUs + `":"` + uuidOwn + `"}}}`)
		refusedBy(t, "the agent writing assigned-gpus", bound.Patch(ctx, onA.DeepCopy(), client.RawPatch(types.MergePatchType, body)),
			webhook.WebhookValidatePod, "metadata.annotations[gputopo.io/assigned-gpus]: Forbidden: node agent")
	})

	// Pods of every kind, created while the webhook serves, to be updated
	// while it is down.
	existing := map[string]*corev1.Pod{}
	for _, ns := range []string{whOptedIn, whPlain, configv1alpha1.DefaultCertManagerNamespace, whMonitoring} {
		p := cpuPod(ns, "web-before")
		if err := c.Create(ctx, p); err != nil {
			t.Fatalf("create %s/%s: %v", ns, p.Name, err)
		}
		existing[ns] = p
	}
	gpuBefore := gpuPod(whOptedIn, "train-before")
	if err := c.Create(ctx, gpuBefore); err != nil {
		t.Fatal(err)
	}
	// A Job's GPU pod, held by the Job controller's tracking finalizer.
	gpuTerminating := gpuPod(whOptedIn, "train-job-0")
	gpuTerminating.Finalizers = []string{batchv1.JobTrackingFinalizer}
	if err := c.Create(ctx, gpuTerminating); err != nil {
		t.Fatal(err)
	}

	t.Run("with the webhook down only what concerns GPUs waits", func(t *testing.T) {
		e.stop(t)
		for _, ns := range []string{whOptedIn, whPlain, configv1alpha1.DefaultCertManagerNamespace, whMonitoring} {
			p := cpuPod(ns, "web-during")
			p.Annotations = map[string]string{v1alpha1.AnnotationParallelism: "data", "team": "web"}
			if err := c.Create(ctx, p); err != nil {
				t.Errorf("create a pod without GPUs in %s: %v", ns, err)
			}
			for _, p := range []*corev1.Pod{existing[ns], p} {
				patch := []byte(`{"metadata":{"labels":{"rollout":"2"}}}`)
				if err := c.Patch(ctx, p.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil {
					t.Errorf("label patch of %s/%s (no GPUs): %v", ns, p.Name, err)
				}
			}
		}

		refusedBy(t, "a GPU pod in the opted-in namespace", c.Create(ctx, gpuPod(whOptedIn, "train-during")), webhook.WebhookMutatePod)
		// A GPU pod's labels, finalizers and status are never the webhook's
		// business: a Job controller or an operator keeps working.
		patch := []byte(`{"metadata":{"labels":{"rollout":"2"}}}`)
		if err := c.Patch(ctx, gpuBefore.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Errorf("a label patch of a GPU pod with the webhook down: %v", err)
		}
		if err := c.Delete(ctx, gpuTerminating); err != nil {
			t.Fatalf("delete %s: %v", gpuTerminating.Name, err)
		}
		if err := c.Patch(ctx, gpuTerminating.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))); err != nil {
			t.Errorf("the Job controller removing its tracking finalizer from a terminating GPU pod with the webhook down: %v", err)
		}
		harness.Poll(t, 30*time.Second, "the terminating GPU pod to go once its finalizer is removed", func() (bool, string) {
			err := c.Get(ctx, client.ObjectKeyFromObject(gpuTerminating), &corev1.Pod{})
			return apierrors.IsNotFound(err), errString(err)
		})
		// What does concern GPUs still waits: a system annotation.
		refusedBy(t, "a system annotation patch of a GPU pod", c.Patch(ctx, gpuBefore.DeepCopy(), client.RawPatch(types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+v1alpha1.AnnotationAssignedGPUs+`":"`+uuidOther+`"}}}`))), webhook.WebhookValidatePod)

		// What each clause of the pod match condition sends to the webhook,
		// in a namespace that did not opt in (only the validator sees it).
		gpuApp := cpuPod(whPlain, "gpu-app")
		gpuApp.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPU] = resource.MustParse("1")
		gpuInit := cpuPod(whPlain, "gpu-init")
		gpuInit.Spec.InitContainers = []corev1.Container{{Name: "warmup", Image: "registry.example/warmup:1",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{v1alpha1.ResourceGPU: resource.MustParse("1")}}}}
		nvidiaEnv := cpuPod(whPlain, "nvidia-env")
		nvidiaEnv.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "NVIDIA_DRIVER_CAPABILITIES", Value: "utility"}}
		nvidiaInitEnv := cpuPod(whPlain, "nvidia-init-env")
		nvidiaInitEnv.Spec.InitContainers = []corev1.Container{{Name: "probe", Image: "registry.example/smi:1",
			Env: []corev1.EnvVar{{Name: v1alpha1.EnvVisibleDevices, Value: "all"}}}}
		systemAnnotation := cpuPod(whPlain, "spoof")
		systemAnnotation.Annotations = map[string]string{v1alpha1.AnnotationPlacement: "{}"}
		for name, p := range map[string]*corev1.Pod{
			"a GPU request in an app container":     gpuApp,
			"a GPU request in an init container":    gpuInit,
			"an NVIDIA_ variable in a container":    nvidiaEnv,
			"an NVIDIA_ variable in an init one":    nvidiaInitEnv,
			"a system annotation on a CPU pod":      systemAnnotation,
			"a GPU pod in a namespace not opted in": gpuPod(whPlain, "train"),
		} {
			refusedBy(t, name, c.Create(ctx, p, client.DryRunAll), webhook.WebhookValidatePod)
		}
		envFromCPU := cpuPod(whPlain, "cpu-envfrom")
		envFromCPU.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "web"}}}}
		if err := c.Create(ctx, envFromCPU, client.DryRunAll); err != nil {
			t.Errorf("a pod without GPUs taking envFrom in a namespace that did not opt in (not matched): %v", err)
		}
		// Where gputopo serves, such a pod waits: its containers must be
		// given NVIDIA_VISIBLE_DEVICES=void.
		envFromCPU = envFromCPU.DeepCopy()
		envFromCPU.Namespace = whOptedIn
		refusedBy(t, "a pod without GPUs taking envFrom in the opted-in namespace", c.Create(ctx, envFromCPU, client.DryRunAll), webhook.WebhookMutatePod)

		// A pod that uses ResourceClaims may ask for GPUs through them:
		// where gputopo serves, it waits for the mutator, which counts
		// them; elsewhere the validator's condition leaves it alone.
		claimPod := cpuPod(whPlain, "claims")
		claimPod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("four-gpus")}}
		claimPod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpus"}}
		if err := c.Create(ctx, claimPod, client.DryRunAll); err != nil {
			t.Errorf("a pod using ResourceClaims in a namespace that did not opt in (not matched): %v", err)
		}
		claimPod = claimPod.DeepCopy()
		claimPod.Namespace = whOptedIn
		refusedBy(t, "a pod using ResourceClaims in the opted-in namespace", c.Create(ctx, claimPod, client.DryRunAll), webhook.WebhookMutatePod)

		// Jobs wait only when they state an intent or request GPUs.
		cpuJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: whOptedIn, Name: "etl"},
			Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: cpuPod(whOptedIn, "").Spec}}}
		if err := c.Create(ctx, cpuJob, client.DryRunAll); err != nil {
			t.Errorf("a Job without GPUs or intent: %v", err)
		}
		intentJob := cpuJob.DeepCopy()
		intentJob.Annotations = map[string]string{v1alpha1.AnnotationParallelism: "model"}
		refusedBy(t, "a Job stating an intent", c.Create(ctx, intentJob, client.DryRunAll), webhook.WebhookMutateJob)
		gpuJob := cpuJob.DeepCopy()
		gpuJob.Spec.Template.Spec = harness.GPUPod(whOptedIn, "", 2).Spec
		refusedBy(t, "a Job requesting GPUs", c.Create(ctx, gpuJob, client.DryRunAll), webhook.WebhookMutateJob)
	})

	t.Run("a webhook back up admits GPU pods again", func(t *testing.T) {
		e.serve(t)
		p := gpuPod(whOptedIn, "train-after")
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		if p.Spec.SchedulerName != v1alpha1.DefaultSchedulerName {
			t.Errorf("schedulerName = %q, want %q", p.Spec.SchedulerName, v1alpha1.DefaultSchedulerName)
		}
	})
}

// agentClient is agentClient on the webhook env's control plane.
func (e *whEnv) agentClient(t *testing.T, ref *authenticationv1.BoundObjectReference) client.Client {
	t.Helper()
	return agentClient(t, e.cp, ref)
}

// agentClient returns a client authenticated as the node agent's service
// account with a token from the TokenRequest API, bound to ref (a pod) or
// to nothing when ref is nil: what kubelet mounts into the agent's pod,
// and what a token copied out of a Secret would be.
func agentClient(t *testing.T, cp *harness.ControlPlane, ref *authenticationv1.BoundObjectReference) client.Client {
	t.Helper()
	tr, err := cp.Clientset.CoreV1().ServiceAccounts(whRelease).CreateToken(context.Background(), agentSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600), BoundObjectRef: ref},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token request for %s/%s: %v", whRelease, agentSA, err)
	}
	cfg := rest.AnonymousClientConfig(cp.Config)
	cfg.BearerToken = tr.Status.Token
	c, err := client.New(cfg, client.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// The token authenticates as the service account: prove it before
	// reading anything into a refusal.
	var p corev1.Pod
	err = c.Get(context.Background(), client.ObjectKey{Namespace: whRelease, Name: "gputopo-nodeagent-a"}, &p)
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("the node agent's token does not work: %v", errors.Join(err, fmt.Errorf("bound to %v", ref)))
	}
	return c
}
