//go:build integration

package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/gputopo/gputopo/api/v1alpha1"
	core "github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/test/harness"
)

// TestBindEventNamesTheGPUs: a pod the extender binds gets a Normal
// GPUsBound Event from gputopo-extender naming its node, GPU indices and
// UUIDs, tier and ring bandwidth, found the way `kubectl describe pod`
// finds a pod's Events (involvedObject name, namespace and UID).
func TestBindEventNamesTheGPUs(t *testing.T) {
	e := setup(t)
	p := e.gpuPod(nsTeam, "bound-event", 2)
	p.Annotations = map[string]string{v1alpha1.AnnotationParallelism: string(v1alpha1.ParallelismModel)}
	e.create(t, p)
	got := e.waitPod(t, p, 2*time.Minute, "the pod to be bound with its GPUs", func(p *corev1.Pod) bool {
		return p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationAssignedGPUs] != ""
	})
	placement, err := v1alpha1.ParsePlacement(got.Annotations[v1alpha1.AnnotationPlacement])
	if err != nil {
		t.Fatal(err)
	}
	sel := fields.Set{
		"involvedObject.kind": "Pod", "involvedObject.name": got.Name,
		"involvedObject.namespace": got.Namespace, "involvedObject.uid": string(got.UID),
	}.AsSelector()
	var ev *corev1.Event
	harness.Poll(t, time.Minute, "the GPUsBound event", func() (bool, string) {
		list, err := e.cp.Clientset.CoreV1().Events(got.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: sel.String()})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for i := range list.Items {
			if list.Items[i].Reason == core.ReasonGPUsBound {
				ev = &list.Items[i]
				return true, ""
			}
			seen = append(seen, list.Items[i].Reason)
		}
		return false, "events: " + strings.Join(seen, ", ")
	})
	if ev.Type != corev1.EventTypeNormal || ev.Source.Component != core.EventComponent {
		t.Errorf("event type %s from %q; want Normal from %s", ev.Type, ev.Source.Component, core.EventComponent)
	}
	want := []string{"node " + got.Spec.NodeName + ":", "tier " + string(placement.Tier), "strategy " + string(placement.Strategy)}
	want = append(want, harness.PodGPUs(t, got, v1alpha1.AnnotationAssignedGPUs)...)
	if len(placement.GPUIndices) > 1 {
		want = append(want, "ring "+strconv.Itoa(placement.RingBandwidthGBps)+" GB/s")
	}
	for _, w := range want {
		if !strings.Contains(ev.Message, w) {
			t.Errorf("event message %q does not contain %q", ev.Message, w)
		}
	}
	t.Logf("%s %s: %s", ev.Type, ev.Reason, ev.Message)
}
