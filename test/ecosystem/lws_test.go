//go:build integration

package ecosystem

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

// LWSModule is the LeaderWorkerSet release whose controller make tools
// builds (hack/tools/controllers/go.mod pins the same version) and whose
// CRD and webhook configurations the tests install.
const LWSModule = "sigs.k8s.io/lws@v0.8.0"

const leafLabel = "network.topology.nvidia.com/leaf"

// dgxLeaves creates five DGX A100 nodes under three leaf switches: leaf
// a holds one node, leaves b and c two each, so that a replica of two
// 8-GPU pods fits whole only in b or c.
func dgxLeaves(t *testing.T, e *env) {
	t.Helper()
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	for i, leaf := range []string{"a", "b", "b", "c", "c"} {
		e.addNode(t, fmt.Sprintf("dgx-%s-%d", leaf, i), f, map[string]string{leafLabel: leaf, spineLabel: "s"})
	}
}

// startLWS runs LeaderWorkerSet's controller manager (bin/lws-controller)
// as a cluster admin: its CRD and its webhook configurations from the
// module's sources, pointed at its webhook server on a free local port
// with the harness's certificate (LWS's own pod webhook labels each
// replica's leader, which its controller needs, so unlike JobSet's its
// webhooks are registered). Its configuration turns off its internal
// certificate management, leader election, metrics and probes.
func (e *env) startLWS(t *testing.T) {
	t.Helper()
	ctx := harness.Context(t)
	dir := harness.ModuleDir(t, LWSModule)
	if _, err := envtest.InstallCRDs(e.cp.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "config", "crd", "bases")}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install LeaderWorkerSet's CRD: %v", err)
	}
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	wio := e.cp.Env.WebhookInstallOptions
	for _, obj := range webhooksAt(t, filepath.Join(dir, "config", "webhook", "manifests.yaml"), "lws-", fmt.Sprintf("https://127.0.0.1:%d", port), wio.LocalServingCAData) {
		if err := e.cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("register LeaderWorkerSet's webhook %s: %v", obj.GetName(), err)
		}
	}
	cfg := kubebuilderConfig("config.lws.x-k8s.io/v1alpha1", port, wio.LocalServingCertDir)
	e.startManager(t, "lws-controller", cfg, nil, func(p *localcluster.Process) (bool, string) {
		if !p.LogContains("Starting workers") {
			return false, p.Tail(3)
		}
		// The webhook answers: a dry-run LeaderWorkerSet is defaulted.
		if err := e.cp.Client.Create(ctx, leaderWorkerSet("probe", 1, 2, 1, nil), client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// webhooksAt reads a controller's webhook configurations (one mutating,
// one validating, kubebuilder's manifests.yaml) from path and points them
// at url, trusting ca, as a cluster with the controller installed
// registers them (names prefixed with prefix as its kustomization does).
// When keep is not nil, only the webhooks it names are kept.
func webhooksAt(t *testing.T, path, prefix, url string, ca []byte, keep ...string) []client.Object {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
	var out []client.Object
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if len(u.Object) == 0 {
			continue
		}
		point := func(cc *admissionregistrationv1.WebhookClientConfig) {
			to := url + *cc.Service.Path
			cc.Service, cc.URL, cc.CABundle = nil, &to, ca
		}
		switch u.GetKind() {
		case "MutatingWebhookConfiguration":
			m := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, m); err != nil {
				t.Fatal(err)
			}
			m.Name = prefix + m.Name
			if len(keep) > 0 {
				m.Webhooks = slices.DeleteFunc(m.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return !slices.Contains(keep, w.Name) })
			}
			for i := range m.Webhooks {
				point(&m.Webhooks[i].ClientConfig)
			}
			out = append(out, m)
		case "ValidatingWebhookConfiguration":
			v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, v); err != nil {
				t.Fatal(err)
			}
			v.Name = prefix + v.Name
			if len(keep) > 0 {
				v.Webhooks = slices.DeleteFunc(v.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return !slices.Contains(keep, w.Name) })
			}
			for i := range v.Webhooks {
				point(&v.Webhooks[i].ClientConfig)
			}
			out = append(out, v)
		}
	}
	if len(out) != 2 {
		t.Fatalf("%s: %d webhook configurations, want a mutating and a validating one", path, len(out))
	}
	return out
}

// leaderWorkerSet is a LeaderWorkerSet of replicas groups of size pods ×
// gpus GPUs each (leader and workers alike), its pod templates carrying
// annotations.
func leaderWorkerSet(name string, replicas, size, gpus int, annotations map[string]string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "leaderworkerset.x-k8s.io/v1",
		"kind":       "LeaderWorkerSet",
		"metadata":   map[string]any{"name": name, "namespace": nsTeam},
		"spec": map[string]any{
			"replicas": int64(replicas),
			"leaderWorkerTemplate": map[string]any{
				"size": int64(size),
				"workerTemplate": map[string]any{
					"metadata": map[string]any{"annotations": anyMap(annotations)},
					"spec": map[string]any{
						"containers": []any{map[string]any{
							"name": "server", "image": "server:v1",
							"resources": map[string]any{"limits": map[string]any{string(v1alpha1.ResourceGPU): fmt.Sprint(gpus)}},
						}},
					},
				},
			},
		},
	}}
}

// actAsKubelet does, until the test ends, what kubelets would for the
// pods of nsTeam: a bound pod is reported Running and Ready, a pod being
// deleted is confirmed gone (its containers stopped). LeaderWorkerSet's
// and StatefulSet's rollouts wait on both.
func (e *env) actAsKubelet(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			l, err := e.cp.Clientset.CoreV1().Pods(nsTeam).List(ctx, metav1.ListOptions{})
			if err != nil {
				continue
			}
			for i := range l.Items {
				p := &l.Items[i]
				switch {
				case p.DeletionTimestamp != nil:
					_ = e.cp.Clientset.CoreV1().Pods(nsTeam).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &p.UID}})
				case p.Spec.NodeName != "" && p.Status.Phase == corev1.PodPending:
					now := metav1.Now()
					p.Status.Phase = corev1.PodRunning
					p.Status.StartTime = &now
					p.Status.Conditions = append(p.Status.Conditions,
						corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
						corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
						corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now})
					for _, c := range p.Spec.Containers {
						p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
							Name: c.Name, Image: c.Image, Ready: true, Started: new(bool),
							State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
						})
					}
					if _, err := e.cp.Clientset.CoreV1().Pods(nsTeam).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
						t.Logf("report pod %s running: %v", p.Name, err)
					}
				}
			}
		}
	}()
}

// TestLeaderWorkerSetReplicasAreGroups: a LeaderWorkerSet of 2 replicas,
// each a leader and a worker of 8 GPUs, required inside one leaf, run by
// LeaderWorkerSet's real controller (and the StatefulSet controller) on
// five DGX A100 nodes under three leaves, one of which holds a single
// node. gputopo's pod webhook makes each replica one group of the set's
// size, so each replica's two pods land in one leaf (b or c, never a).
// A rolling update (a new image) recreates the replicas one by one as
// fresh groups; at the end every pod is of the new revision, each
// replica is again in one leaf, no GPU is held by two pods. A worker's
// container restart makes LeaderWorkerSet recreate its replica (same
// revision, same group), which is placed whole again; the ledger holds
// exactly the live pods' GPUs. Both modes.
func TestLeaderWorkerSetReplicasAreGroups(t *testing.T) {
	eachModeWith(t, envOptions{nodes: dgxLeaves, controllers: []string{"statefulset"}, start: (*env).startLWS}, testLeaderWorkerSetReplicasAreGroups)
}

func testLeaderWorkerSetReplicasAreGroups(t *testing.T, e *env) {
	ctx := harness.Context(t)
	e.actAsKubelet(t)
	lws := leaderWorkerSet("serve", 2, 2, 8, map[string]string{v1alpha1.AnnotationGroupRequiredTopology: "leaf"})
	if err := e.cp.Client.Create(ctx, lws); err != nil {
		t.Fatalf("create LeaderWorkerSet: %v", err)
	}
	first := e.waitReplicasPlaced(t, "")

	// A rolling update: a new image. LeaderWorkerSet recreates each
	// replica's leader, and the leader's workers, at the new revision.
	patch := []byte(`[{"op":"replace","path":"/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/image","value":"server:v2"}]`)
	if err := e.cp.Client.Patch(ctx, lws, client.RawPatch(types.JSONPatchType, patch)); err != nil {
		t.Fatalf("update LeaderWorkerSet: %v", err)
	}
	second := e.waitReplicasPlaced(t, first)
	t.Logf("revisions: %s, then %s", first, second)

	// A group restart: a worker's container restarts (kubelet counts it),
	// LeaderWorkerSet deletes the replica's leader and with it the
	// workers, and recreates the replica at the same revision: the same
	// group, placed whole again.
	leader := &corev1.Pod{}
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: nsTeam, Name: "serve-0"}, leader); err != nil {
		t.Fatal(err)
	}
	harness.Poll(t, time.Minute, "worker serve-0-1 running, then its container restarted", func() (bool, string) {
		worker := &corev1.Pod{}
		if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: nsTeam, Name: "serve-0-1"}, worker); err != nil {
			return false, err.Error()
		}
		if len(worker.Status.ContainerStatuses) == 0 {
			return false, "no container status yet"
		}
		worker.Status.ContainerStatuses[0].RestartCount = 1
		if err := e.cp.Client.Status().Update(ctx, worker); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	harness.Poll(t, 2*time.Minute, "replica 0 recreated", func() (bool, string) {
		p := &corev1.Pod{}
		if err := e.cp.Client.Get(ctx, client.ObjectKey{Namespace: nsTeam, Name: "serve-0"}, p); err != nil {
			return false, err.Error()
		}
		return p.UID != leader.UID, "leader serve-0 not recreated yet"
	})
	if third := e.waitReplicasPlaced(t, "-"); third != second {
		t.Errorf("revision %s after the group restart, want %s", third, second)
	}
	harness.Poll(t, time.Minute, "the ledger to hold the live pods' GPUs only", func() (bool, string) {
		h := e.held(t)
		return h == 32, fmt.Sprintf("%d GPUs held or reserved, want 32 (4 pods × 8)", h)
	})

	if err := e.cp.Client.Delete(ctx, lws, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete LeaderWorkerSet: %v", err)
	}
	e.waitAllFreed(t, "the LeaderWorkerSet", time.Minute)
}

// waitReplicasPlaced waits until the set's 4 pods are bound, all of one
// revision other than not, and checks each replica: one group of 2 (the
// set's replica group, at that revision), inside one leaf, on GPUs no
// other pod holds. It returns the revision.
func (e *env) waitReplicasPlaced(t *testing.T, not string) string {
	t.Helper()
	var rev string
	harness.Poll(t, 3*time.Minute, "the LeaderWorkerSet's 4 pods bound at one new revision", func() (bool, string) {
		revs := map[string]int{}
		bound := 0
		pods := listPods(t, e)
		for _, p := range pods {
			revs[p.Labels["leaderworkerset.sigs.k8s.io/template-revision-hash"]]++
			if p.Spec.NodeName != "" && p.DeletionTimestamp == nil {
				bound++
			}
		}
		for r := range revs {
			rev = r
		}
		var states []string
		for _, p := range pods {
			st := fmt.Sprintf("%s@%s %s sched=%s gates=%d del=%v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Spec.SchedulerName, len(p.Spec.SchedulingGates), p.DeletionTimestamp != nil)
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled {
					st += " " + c.Reason + ": " + c.Message
				}
			}
			states = append(states, st)
		}
		return len(pods) == 4 && bound == 4 && len(revs) == 1 && rev != not, fmt.Sprintf("%d pods, %d bound, revisions %v; %v", len(pods), bound, revs, states)
	})
	leaves := map[string]map[string]bool{} // group -> leaves
	gpus := map[string]string{}            // node/GPU -> pod
	for _, p := range listPods(t, e) {
		idx := p.Labels["leaderworkerset.sigs.k8s.io/group-index"]
		want := "serve-" + idx + "-" + rev
		if g := p.Annotations[v1alpha1.AnnotationGroup]; g != want || p.Annotations[v1alpha1.AnnotationGroupSize] != "2" {
			t.Errorf("pod %s: group %q of %s, want the replica's group %s of 2", p.Name, g, p.Annotations[v1alpha1.AnnotationGroupSize], want)
		}
		if leaves[want] == nil {
			leaves[want] = map[string]bool{}
		}
		leaves[want][strings.Split(p.Spec.NodeName, "-")[1]] = true
		pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement])
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		if len(pl.GPUIndices) != 8 {
			t.Errorf("pod %s: placed on GPUs %v, want 8", p.Name, pl.GPUIndices)
		}
		for _, g := range pl.GPUIndices {
			k := fmt.Sprintf("%s/%d", p.Spec.NodeName, g)
			if o, ok := gpus[k]; ok {
				t.Errorf("GPU %s held by pods %s and %s", k, o, p.Name)
			}
			gpus[k] = p.Name
		}
	}
	if len(leaves) != 2 {
		t.Errorf("replica groups %v, want 2", leaves)
	}
	for g, l := range leaves {
		if len(l) != 1 || l["a"] {
			t.Errorf("replica %s in leaves %v, want one leaf of two nodes (b or c)", g, l)
		}
	}
	return rev
}
