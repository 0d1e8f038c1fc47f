package extender

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// TestFallbackAfterRelaxesNVLinkOncePendingLongEnough walks one
// model-parallel pod on a PCIe-only node through its wait: refused with a
// reason that says when it falls back, then admitted once fallbackAfter has
// passed since its creation, and bound with a placement that says it was
// degraded and why.
func TestFallbackAfterRelaxesNVLinkOncePendingLongEnough(t *testing.T) {
	pod := makePod("mp").gpus(2).req(`{"requireNVLink":true,"strategy":"highest_bandwidth","fallbackAfter":"30m"}`).obj()
	pod.CreationTimestamp = metav1.NewTime(testNow.Add(-20 * time.Minute))
	x, cs := newTestExtender(t, nil, pod)
	x.core.Feed().UpsertTopology(topo(t, "pcie-8x", "pcie"))
	x.core.Feed().UpsertPod(pod)
	args := &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"pcie"}}

	fr := x.Filter(context.Background(), args)
	reason := fr.FailedAndUnresolvableNodes["pcie"] + fr.FailedNodes["pcie"]
	for _, want := range []string{"NVLink", "falls back to the best set without it in 10m0s", "fallbackAfter 30m0s"} {
		if !strings.Contains(reason, want) {
			t.Errorf("filter reason %q lacks %q", reason, want)
		}
	}
	if res := x.Bind(context.Background(), bindArgs(pod, "pcie")); res.Error == "" {
		t.Fatal("bind before fallbackAfter passed: want a refusal")
	}

	later := testNow.Add(11 * time.Minute)
	setClock(x, func() time.Time { return later })
	if fr := x.Filter(context.Background(), args); fr.NodeNames == nil || len(*fr.NodeNames) != 1 {
		t.Fatalf("filter after fallbackAfter: passed %v, failed %v %v; want the node", fr.NodeNames, fr.FailedNodes, fr.FailedAndUnresolvableNodes)
	}
	if res := x.Bind(context.Background(), bindArgs(pod, "pcie")); res.Error != "" {
		t.Fatalf("bind after fallbackAfter: %s", res.Error)
	}
	pl, err := v1alpha1.ParsePlacement(getPod(t, cs, "mp").Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		t.Fatal(err)
	}
	if !pl.Degraded || !strings.Contains(pl.DegradedReason, "fallbackAfter 30m0s") || !strings.Contains(pl.DegradedReason, "no free NVLink-connected set of 2 GPUs") {
		t.Errorf("placement %+v: want degraded with a reason naming fallbackAfter and the missing NVLink set", pl)
	}
	if pl.Tier == v1alpha1.TierNVLink || pl.Tier == v1alpha1.TierNVSwitch {
		t.Errorf("placement tier %s on a PCIe node", pl.Tier)
	}
}

// TestFallbackKeepsNVLinkWhenOneIsFree: a pod past its fallbackAfter still
// gets an NVLink set where one is free, and its placement is not marked
// degraded.
func TestFallbackKeepsNVLinkWhenOneIsFree(t *testing.T) {
	pod := makePod("mp").gpus(2).req(`{"requireNVLink":true,"strategy":"highest_bandwidth","fallbackAfter":"1m"}`).obj()
	pod.CreationTimestamp = metav1.NewTime(testNow.Add(-time.Hour))
	x, cs := newTestExtender(t, nil, pod)
	x.core.Feed().UpsertTopology(topo(t, "dgx-a100", "a100"))
	x.core.Feed().UpsertTopology(topo(t, "pcie-8x", "pcie"))
	x.core.Feed().UpsertPod(pod)
	list, err := x.Prioritize(context.Background(), &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"pcie", "a100"}})
	if err != nil {
		t.Fatal(err)
	}
	if list[1].Score != 10 || list[0].Score >= list[1].Score {
		t.Errorf("scores %v: want the NVSwitch node on top", list)
	}
	if res := x.Bind(context.Background(), bindArgs(pod, "a100")); res.Error != "" {
		t.Fatalf("bind: %s", res.Error)
	}
	pl, err := v1alpha1.ParsePlacement(getPod(t, cs, "mp").Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		t.Fatal(err)
	}
	if pl.Degraded || pl.Tier != v1alpha1.TierNVSwitch {
		t.Errorf("placement %+v: want an nvswitch set, not degraded", pl)
	}
}
