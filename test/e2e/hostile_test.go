//go:build integration

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/webhook"
)

// denied asserts err is an admission or validation denial whose message
// names every one of wants.
func denied(t *testing.T, what string, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: allowed; want a denial naming %q", what, wants)
		return
	}
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%s: error %v (reason %s) is neither Forbidden nor Invalid", what, short(err.Error()), apierrors.ReasonForError(err))
	}
	msg := err.Error()
	for _, w := range wants {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: denial %q\nlacks %q", what, short(msg), w)
		}
	}
	t.Logf("checked: %s denied: %s", what, short(msg))
}

func short(s string) string {
	if len(s) > 300 {
		return s[:300] + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return s
}

const (
	protectedAssigned = "metadata.annotations[gputopo.io/assigned-gpus]: Forbidden"
	requirementField  = "metadata.annotations[gputopo.io/gpu-topology-requirement]"
)

// hostileInput sends what a user must not be able to do through the real
// apiserver and webhook. train is running and must be left as it was.
func (e *env) hostileInput(t *testing.T, train *corev1.Pod) {
	ctx := context.Background()
	other := e.sim.UUIDs()[7]
	if slices.Contains(harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs), other) {
		other = e.sim.UUIDs()[0]
	}

	t.Run("assigned-gpus on create", func(t *testing.T) {
		p := gpuPod(nsTeam, "spoof-create", 1)
		p.Annotations = map[string]string{v1alpha1.AnnotationAssignedGPUs: other}
		t.Logf("injected: create a GPU pod with %s=%s", v1alpha1.AnnotationAssignedGPUs, other)
		denied(t, "create with assigned-gpus", e.cp.Client.Create(ctx, p), protectedAssigned, webhook.WebhookValidatePod)
	})
	t.Run("assigned-gpus and allocated-gpus on update of a running pod", func(t *testing.T) {
		for _, key := range []string{v1alpha1.AnnotationAssignedGPUs, v1alpha1.AnnotationAllocatedGPUs} {
			p := e.getPod(t, train.Namespace, train.Name)
			patch := client.MergeFrom(p.DeepCopy())
			p.Annotations[key] = other
			t.Logf("injected: patch running pod %s %s=%s", p.Name, key, other)
			denied(t, "update of "+key, e.cp.Client.Patch(ctx, p, patch), "metadata.annotations["+key+"]: Forbidden")
		}
		p := e.getPod(t, train.Namespace, train.Name)
		if diff := cmp.Diff(train.Annotations[v1alpha1.AnnotationAssignedGPUs], p.Annotations[v1alpha1.AnnotationAssignedGPUs]); diff != "" {
			t.Errorf("assigned-gpus of %s changed (-before +after):\n%s", p.Name, diff)
		}
	})
	t.Run("assigned-gpus on a pod with another schedulerName", func(t *testing.T) {
		for _, ns := range []string{nsTeam, nsPlain} {
			p := gpuPod(ns, "spoof-sched", 1)
			p.Spec.SchedulerName = "my-scheduler"
			p.Annotations = map[string]string{v1alpha1.AnnotationAssignedGPUs: other}
			t.Logf("injected: create in %s a pod for my-scheduler with %s=%s", ns, v1alpha1.AnnotationAssignedGPUs, other)
			denied(t, "another schedulerName in "+ns, e.cp.Client.Create(ctx, p), protectedAssigned)
		}
	})
	t.Run("NVIDIA_VISIBLE_DEVICES=all in a GPU container", func(t *testing.T) {
		p := gpuPod(nsTeam, "see-all", 1)
		p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: v1alpha1.EnvVisibleDevices, Value: "all"}}
		t.Logf("injected: GPU container with %s=all in %s", v1alpha1.EnvVisibleDevices, nsTeam)
		denied(t, "NVIDIA_VISIBLE_DEVICES=all", e.cp.Client.Create(ctx, p), "spec.containers[0].env[0]: Forbidden")
	})
	t.Run("a 1 MiB annotation", func(t *testing.T) {
		p := gpuPod(nsTeam, "huge", 1)
		p.Annotations = map[string]string{v1alpha1.AnnotationRequirement: `{"strategy":"` + strings.Repeat("a", 1<<20) + `"}`}
		t.Logf("injected: a 1 MiB %s annotation", v1alpha1.AnnotationRequirement)
		denied(t, "1 MiB annotation", e.cp.Client.Create(ctx, p), "metadata.annotations: Too long")
		// Below the apiserver's 256 KiB limit the webhook judges it.
		p = gpuPod(nsTeam, "large", 1)
		p.Annotations = map[string]string{v1alpha1.AnnotationRequirement: `{"strategy":"` + strings.Repeat("a", 200<<10) + `"}`}
		t.Logf("injected: a 200 KiB %s annotation", v1alpha1.AnnotationRequirement)
		denied(t, "200 KiB requirement", e.cp.Client.Create(ctx, p), requirementField+".strategy")
	})
	t.Run("malformed requirements", func(t *testing.T) {
		for name, value := range map[string]string{
			"not JSON":          `requireNVLink`,
			"a JSON array":      `[true]`,
			"wrong type":        `{"requireNVLink":"yes"}`,
			"unknown strategy":  `{"strategy":"fastest"}`,
			"unknown field":     `{"requireNVLink":true,"gpus":4}`,
			"negative memory":   `{"gpuMemoryMiB":-1}`,
			"number overflow":   `{"minPairBandwidthGBps":1e400}`,
			"trailing data":     `{"requireNVLink":true}{}`,
			"duplicate field":   `{"strategy":"numa_local","strategy":"highest_bandwidth"}`,
			"control character": "{\"strategy\":\"highest\x00bandwidth\"}",
		} {
			p := gpuPod(nsTeam, "bad-req", 2)
			p.Annotations = map[string]string{v1alpha1.AnnotationRequirement: value}
			t.Logf("injected: requirement %q (%s)", value, name)
			denied(t, name, e.cp.Client.Create(ctx, p, client.DryRunAll), requirementField)
		}
	})
	t.Run("fuzzed requirements: the apiserver agrees with ParseRequirement", func(t *testing.T) {
		// Byte-level mutations of a valid requirement, from a fixed seed:
		// whatever ParseRequirement refuses the apiserver must deny naming
		// the field; whatever it accepts must be admitted.
		r := rand.New(rand.NewPCG(9, 9))
		seed := []byte(`{"requireNVLink":true,"minPairBandwidthGBps":300,"strategy":"highest_bandwidth","gpuMemoryMiB":40000}`)
		alphabet := []byte(`{}[]":,0123456789-.eE truefalsnul\` + "\x00\xff")
		accepted, refused := 0, 0
		for i := range 40 {
			b := slices.Clone(seed)
			for range 1 + r.IntN(4) {
				pos := r.IntN(len(b))
				switch r.IntN(3) {
				case 0:
					b[pos] = alphabet[r.IntN(len(alphabet))]
				case 1:
					b = slices.Delete(b, pos, pos+1)
				default:
					b = slices.Insert(b, pos, alphabet[r.IntN(len(alphabet))])
				}
			}
			value := string(b)
			p := gpuPod(nsTeam, "fuzz-"+strconv.Itoa(i), 2)
			p.Annotations = map[string]string{v1alpha1.AnnotationRequirement: value}
			err := e.cp.Client.Create(ctx, p, client.DryRunAll)
			if _, perr := v1alpha1.ParseRequirement(value); perr != nil {
				refused++
				if err == nil || !strings.Contains(err.Error(), requirementField) {
					t.Errorf("requirement %q: ParseRequirement says %v, apiserver said %v; want a denial naming %s", value, perr, err, requirementField)
				}
				continue
			}
			accepted++
			if err != nil {
				t.Errorf("valid requirement %q was refused: %v", value, err)
			}
		}
		t.Logf("injected: 40 fuzzed requirements; checked: %d refused naming %s, %d valid ones admitted", refused, requirementField, accepted)
	})
}
