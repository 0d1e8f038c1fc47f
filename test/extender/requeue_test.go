//go:build integration

package extender_test

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/test/harness"
)

// A node joins whose agent has not published its GPU topology yet: a pod
// only that node can hold waits, saying so. When the agent publishes, the
// plugin build tries the pod again and binds it within seconds (at most
// 5 s after its previous such retry, plus the cycle), although
// nothing kube-scheduler watches changed (the topology is gputopo's own
// object) and no other event comes. (In extender mode kube-scheduler
// retries it on its next cluster event: docs/extender.md.)
func TestPodWaitingForATopologyIsBoundWhenItIsPublished(t *testing.T) {
	e := newEnv(t, 1)
	s := startPluginSystem(t, e)
	ctx := harness.Context(t)
	createNode(t, e.cp, "late")
	get := func(name string) *corev1.Pod {
		t.Helper()
		p, err := e.cp.Clientset.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	createAll(t, e, []*corev1.Pod{gpuPod("first", 8, "")})
	harness.Poll(t, time.Minute, "the first 8-GPU pod to be bound", func() (bool, string) {
		return get("first").Spec.NodeName != "", "pending"
	})
	createAll(t, e, []*corev1.Pod{gpuPod("second", 8, "")})
	harness.Poll(t, time.Minute, "the second pod to wait for the late node's topology", func() (bool, string) {
		p := get("second")
		if p.Spec.NodeName != "" {
			t.Fatalf("second pod bound to %s before the late node had a topology", p.Spec.NodeName)
		}
		msg := scheduledFalseMessage(p)
		return strings.Contains(msg, "topology is missing"), msg
	})
	published := time.Now()
	e.cp.PublishTopology(t, "late", mustFixture(t))
	harness.Poll(t, 20*time.Second, "the second pod to be bound on the late node once its topology is published", func() (bool, string) {
		p := get("second")
		if p.Spec.NodeName != "" && p.Spec.NodeName != "late" {
			t.Fatalf("second pod bound to %s, want late", p.Spec.NodeName)
		}
		return p.Spec.NodeName == "late", scheduledFalseMessage(p) + "\n" + s.tail()
	})
	t.Logf("bound %s after the topology was published", time.Since(published).Round(time.Millisecond))
}
