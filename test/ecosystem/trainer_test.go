//go:build integration

package ecosystem

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

// TrainerModule is the Kubeflow Trainer release whose controller manager
// make tools builds (hack/tools/kueue/go.mod pins the same version, the
// one Kueue v0.17.0 requires) and whose CRDs and webhook configurations
// the tests install.
const TrainerModule = "github.com/kubeflow/trainer/v2@v2.2.0"

// startTrainer runs the Kubeflow Trainer controller manager
// (bin/trainer-controller-manager) as a cluster admin beside JobSet's:
// its CRDs and its webhook configurations from the module source, pointed
// at its webhook server on a free local port with the harness's
// certificate. Its configuration turns off its certificate management,
// leader election, metrics and probes. Trainer reads its serving
// certificate from controller-runtime's default directory under
// $TMPDIR, so its TMPDIR is a directory holding the harness's one.
func (e *env) startTrainer(t *testing.T) {
	t.Helper()
	ctx := harness.Context(t)
	dir := harness.ModuleDir(t, TrainerModule)
	if _, err := envtest.InstallCRDs(e.cp.Config, envtest.CRDInstallOptions{Paths: []string{filepath.Join(dir, "manifests", "base", "crds")}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install Trainer's CRDs: %v", err)
	}
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	wio := e.cp.Env.WebhookInstallOptions
	for _, obj := range webhooksAt(t, filepath.Join(dir, "manifests", "base", "webhook", "manifests.yaml"), "trainer-", fmt.Sprintf("https://127.0.0.1:%d", port), wio.LocalServingCAData) {
		if err := e.cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("register Trainer's webhook %s: %v", obj.GetName(), err)
		}
	}
	tmp := t.TempDir()
	certs := filepath.Join(tmp, "k8s-webhook-server", "serving-certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		b, err := os.ReadFile(filepath.Join(wio.LocalServingCertDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(certs, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fmt.Sprintf(`apiVersion: config.trainer.kubeflow.org/v1alpha1
kind: Configuration
health:
  healthProbeBindAddress: "0"
metrics:
  bindAddress: "0"
webhook:
  port: %d
  host: 127.0.0.1
leaderElection:
  leaderElect: false
certManagement:
  enable: false
`, port)
	e.startManager(t, "trainer-controller-manager", cfg, []string{"/usr/bin/env", "TMPDIR=" + tmp}, func(p *localcluster.Process) (bool, string) {
		if !p.LogContains("Starting workers") {
			return false, p.Tail(3)
		}
		// The webhook answers: a dry-run TrainingRuntime is validated.
		if err := e.cp.Client.Create(ctx, trainingRuntime(), client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// trainingRuntime is the TrainingRuntime a platform team writes for
// model-parallel GPU training with gputopo: a JobSet of one replicated
// Job (the trainer nodes), its pods model-parallel, the group required
// inside one NVLink domain.
func trainingRuntime() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "trainer.kubeflow.org/v1alpha1",
		"kind":       "TrainingRuntime",
		"metadata":   map[string]any{"name": "gpu-model-parallel", "namespace": nsTeam},
		"spec": map[string]any{
			"mlPolicy": map[string]any{"numNodes": int64(1)},
			"template": map[string]any{"spec": map[string]any{
				// What JobSet's defaulting webhook would set.
				"successPolicy": map[string]any{"operator": "All"},
				"network":       map[string]any{"enableDNSHostnames": false},
				"replicatedJobs": []any{map[string]any{
					"name": "node",
					"template": map[string]any{
						"metadata": map[string]any{
							"labels": map[string]any{"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"},
							"annotations": map[string]any{
								v1alpha1.AnnotationParallelism:           string(v1alpha1.ParallelismModel),
								v1alpha1.AnnotationGroupRequiredTopology: "nvlink",
							},
						},
						"spec": map[string]any{
							"template": map[string]any{"spec": map[string]any{
								"restartPolicy": "Never", // JobSet's webhook would default it
								"containers":    []any{map[string]any{"name": "node", "image": "trainer"}},
							}},
						},
					},
				}},
			}},
		},
	}}
}

// trainJob is a TrainJob of nodes nodes × 4 GPUs on trainingRuntime.
func trainJob(name string, nodes int) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "trainer.kubeflow.org/v1alpha1",
		"kind":       "TrainJob",
		"metadata":   map[string]any{"name": name, "namespace": nsTeam},
		"spec": map[string]any{
			"runtimeRef": map[string]any{"name": "gpu-model-parallel", "kind": "TrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
			"trainer": map[string]any{
				"numNodes":         int64(nodes),
				"resourcesPerNode": map[string]any{"limits": map[string]any{string(v1alpha1.ResourceGPU): "4"}},
			},
		},
	}}
}

// TestTrainJobIsOneGroup: a TrainJob of 4 nodes × 4 GPUs on a
// TrainingRuntime whose trainer Job is model-parallel and required in one
// NVLink domain, run by the Kubeflow Trainer controller manager (v2.2.0,
// with its webhooks) and JobSet's on two GB200 NVL72 racks. Trainer makes
// a JobSet; gputopo's Job webhook makes it one group of 4; all 4 pods are
// bound inside one rack, 4 exact GPUs each; deleting the TrainJob frees
// every GPU. Both modes.
func TestTrainJobIsOneGroup(t *testing.T) {
	eachModeWith(t, envOptions{start: func(e *env, t *testing.T) { e.startJobSet(t); e.startTrainer(t) }}, testTrainJobIsOneGroup)
}

func testTrainJobIsOneGroup(t *testing.T, e *env) {
	ctx := harness.Context(t)
	e.actAsKubelet(t)
	if err := e.cp.Client.Create(ctx, trainingRuntime()); err != nil {
		t.Fatalf("create TrainingRuntime: %v", err)
	}
	tj := trainJob("llm", 4)
	if err := e.cp.Client.Create(ctx, tj); err != nil {
		t.Fatalf("create TrainJob: %v", err)
	}
	harness.Poll(t, 2*time.Minute, "the TrainJob's 4 pods bound", func() (bool, string) {
		pods, bound := podsOf(t, e, "llm")
		return len(pods) == 4 && bound == 4, fmt.Sprintf("%d pods of group llm, %d bound; all pods: %s", len(pods), bound, podStates(listPods(t, e)))
	})
	pods, _ := podsOf(t, e, "llm")
	racks := map[string]bool{}
	for _, p := range pods {
		if p.Annotations[v1alpha1.AnnotationGroupSize] != "4" || p.Annotations[v1alpha1.AnnotationGroupRequiredTopology] != "nvlink" {
			t.Errorf("pod %s: group of %s required in %q, want 4 in nvlink", p.Name, p.Annotations[v1alpha1.AnnotationGroupSize], p.Annotations[v1alpha1.AnnotationGroupRequiredTopology])
		}
		racks[p.Spec.NodeName[:len("rack-0")]] = true
		pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement])
		if err != nil {
			t.Fatalf("pod %s: %v", p.Name, err)
		}
		if len(pl.GPUIndices) != 4 {
			t.Errorf("pod %s: GPUs %v, want 4", p.Name, pl.GPUIndices)
		}
	}
	if len(racks) != 1 {
		t.Errorf("TrainJob in racks %v, want one", racks)
	}
	if err := e.cp.Client.Delete(ctx, tj, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatalf("delete TrainJob: %v", err)
	}
	e.waitAllFreed(t, "the TrainJob", time.Minute)
}
