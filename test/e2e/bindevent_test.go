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

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	core "github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/cluster"
	"github.com/gputopo/gputopo/test/harness"
)

// TestBindEventNamesTheGPUs: by default (events.gpusBound off) a bound
// pod's GPUs are in its annotations, which `kubectl describe pod` shows,
// and no GPUsBound Event is written; with events.gpusBound on, a pod the
// extender binds gets a Normal GPUsBound Event from gputopo-extender
// naming its node, GPU indices and UUIDs, tier and ring bandwidth, found
// the way `kubectl describe pod` finds a pod's Events (involvedObject
// name, namespace and UID).
func TestBindEventNamesTheGPUs(t *testing.T) {
	e := setup(t)
	quiet := e.gpuPod(nsTeam, "bound-quiet", 2)
	e.create(t, quiet)
	gotQuiet := e.waitPod(t, quiet, 2*time.Minute, "the pod to be bound with its GPUs", func(p *corev1.Pod) bool {
		return p.Spec.NodeName != "" && p.Annotations[v1alpha1.AnnotationAssignedGPUs] != "" && p.Annotations[v1alpha1.AnnotationPlacement] != ""
	})

	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.Events.GPUsBound = new(true)
	e.stopExtender(t)
	e.ext, _ = e.newExtender(t, extender.Options{Port: e.extPort, Config: cfg})
	e.waitExtenderReady(t, e.ext)

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
	if ev.Type != corev1.EventTypeNormal || ev.Source.Component != cluster.EventComponent {
		t.Errorf("event type %s from %q; want Normal from %s", ev.Type, ev.Source.Component, cluster.EventComponent)
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

	// The pod bound while the event was off has none, and kept its GPUs
	// in its annotations.
	quietSel := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": gotQuiet.Name,
		"involvedObject.namespace": gotQuiet.Namespace, "involvedObject.uid": string(gotQuiet.UID)}.AsSelector()
	list, err := e.cp.Clientset.CoreV1().Events(gotQuiet.Namespace).List(context.Background(), metav1.ListOptions{FieldSelector: quietSel.String()})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if ev.Reason == core.ReasonGPUsBound {
			t.Errorf("%s got a GPUsBound Event with events.gpusBound off: %s", gotQuiet.Name, ev.Message)
		}
	}
	if n := len(harness.PodGPUs(t, gotQuiet, v1alpha1.AnnotationAssignedGPUs)); n != 2 {
		t.Errorf("%s: %d GPUs in %s, want 2", gotQuiet.Name, n, v1alpha1.AnnotationAssignedGPUs)
	}
}
