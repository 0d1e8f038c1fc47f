package webhook

import (
	"context"
	"errors"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// typicalGPUPod is a Job-created training pod: 4 GPUs, a logging sidecar,
// an init container, a dozen env entries, owned by a Job.
func typicalGPUPod() *corev1.Pod {
	p := MakePod("", nsOptedIn).GenerateName("train-").GPU(4).OwnedByJob("train").Intent("model").
		Container("logger", 0).InitContainer("fetch", 0).
		Label("app", "trainer").Label("batch.kubernetes.io/job-name", "train").
		Annotation("prometheus.io/scrape", "true")
	for _, e := range []string{"NCCL_DEBUG", "NCCL_IB_DISABLE", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "HF_HOME", "WANDB_MODE"} {
		p.Env("main", envVar(e, "1"))
	}
	return p.Obj()
}

// BenchmarkPodAdmission measures the in-process handlers on a typical GPU
// pod create, against a baseline that only decodes the pod, in the same
// run: ratio = handler ns/op / DecodeOnly ns/op.
//
//	go test ./webhook -run '^$' -bench BenchmarkPodAdmission -benchmem -count 5
func BenchmarkPodAdmission(b *testing.B) {
	cfg := configv1alpha1.DefaultWebhookConfiguration()
	reader := cacheLikeReader{
		{Name: nsOptedIn}:                     MakeNamespace(nsOptedIn, true, "").ObjectMeta,
		{Namespace: nsOptedIn, Name: "train"}: MakeJob("train", nsOptedIn, 4).Intent("model").ObjectMeta,
	}
	req := podCreate(b, typicalGPUPod(), userAlice)
	ctx := context.Background()

	b.Run("DecodeOnly", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := decodePod(req.Object); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Mutate", func(b *testing.B) {
		m := NewPodMutator(cfg, reader)
		b.ReportAllocs()
		for b.Loop() {
			if resp := m.Handle(ctx, req); !resp.Allowed || len(resp.Patches) == 0 {
				b.Fatalf("unexpected response %v", resp.Result)
			}
		}
	})
	mutated := req
	mutated.Object.Raw = applyPatch(b, req.Object.Raw, NewPodMutator(cfg, reader).Handle(ctx, req))
	b.Run("Validate", func(b *testing.B) {
		v := NewPodValidator(cfg, reader)
		b.ReportAllocs()
		for b.Loop() {
			if resp := v.Handle(ctx, mutated); !resp.Allowed {
				b.Fatalf("denied: %v", resp.Result)
			}
		}
	})
	// MutateAndValidate is what one pod create costs this webhook in
	// total, through controller-runtime's admission.Webhook (response
	// completion and patch encoding included).
	b.Run("MutateAndValidate", func(b *testing.B) {
		m := &admission.Webhook{Handler: NewPodMutator(cfg, reader)}
		v := &admission.Webhook{Handler: NewPodValidator(cfg, reader)}
		b.ReportAllocs()
		for b.Loop() {
			if resp := m.Handle(ctx, req); !resp.Allowed {
				b.Fatal(resp.Result)
			}
			if resp := v.Handle(ctx, mutated); !resp.Allowed {
				b.Fatal(resp.Result)
			}
		}
	})
}

// cacheLikeReader answers metadata reads the way the informer cache does in
// the server (a map lookup and a deep copy), so the benchmark measures the
// handlers rather than the fake client's conversions.
type cacheLikeReader map[client.ObjectKey]metav1.ObjectMeta

func (r cacheLikeReader) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	meta, ok := r[key]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
	}
	pom, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return fmt.Errorf("cacheLikeReader serves metadata only, not %T", obj)
	}
	meta.DeepCopyInto(&pom.ObjectMeta)
	return nil
}

func (r cacheLikeReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return errors.New("cacheLikeReader does not list")
}
