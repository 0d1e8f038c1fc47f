package placement

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// A malformed pod is an error that names the field, never a request.
func TestParseRequestNamesTheBadField(t *testing.T) {
	bad := gpuPod("bad-req", 2, reqAnn(`{"requireNVLink":"yes"}`))
	if _, err := ParseRequest(bad, v1alpha1.ResourceGPU, groupEpoch); err == nil || !strings.Contains(err.Error(), "ml/bad-req") {
		t.Errorf("a malformed requirement: %v, want an error naming the pod", err)
	}
	neg := gpuPod("neg", 1, nil)
	neg.Spec.Containers[0].Resources.Limits[v1alpha1.ResourceGPU] = resource.MustParse("-2")
	if _, err := ParseRequest(neg, v1alpha1.ResourceGPU, groupEpoch); err == nil || !strings.Contains(err.Error(), "spec.containers[0].resources.limits[nvidia.com/gpu]") {
		t.Errorf("a negative count: %v, want an error naming the field", err)
	}
}

// A model-parallel pod keeps its NVLink requirement until fallbackAfter
// has passed since it was created; then it takes what is free and its
// placement says it was degraded, and why.
func TestFallbackAfterRelaxesTheRequirementAndSaysSo(t *testing.T) {
	x, names := fabricCore(t, "pcie-8x", 1, func(int) map[string]string { return nil })
	p := gpuPod("mp", 2, reqAnn(`{"requireNVLink":true,"fallbackAfter":"30m"}`))
	x.ledger.UpsertPod(p)

	early := request(t, x, p)
	ans, err := x.Filter(context.Background(), early, names)
	if err != nil || len(ans.Passed) != 0 || !strings.Contains(anyReason(ans), "NVLink") {
		t.Fatalf("before fallbackAfter: %+v, %v; want the PCIe node refused for NVLink", ans, err)
	}
	p.CreationTimestamp = metav1.NewTime(groupEpoch.Add(-time.Hour))
	late := request(t, x, p)
	ans, err = x.Filter(context.Background(), late, names)
	if err != nil || len(ans.Passed) != 1 {
		t.Fatalf("after fallbackAfter: %+v, %v; want the PCIe node to pass", ans, err)
	}
	res := x.Reserve(context.Background(), late, names[0])
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if !res.Placement.Degraded || !strings.Contains(res.Placement.DegradedReason, "fallbackAfter 30m0s with no free NVLink-connected set of 2 GPUs") {
		t.Errorf("placement %+v: want it degraded, saying fallbackAfter passed with no NVLink set", res.Placement)
	}
}
