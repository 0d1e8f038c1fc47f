//go:build integration

package kubelet_test

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/test/kubelet"
)

// A plain pod bound to the kubelet runs, and the runtime records the env
// kubelet computed for its container; a restart keeps the pod running.
func TestKubeletRunsPodAgainstFakeRuntime(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	k := kubelet.Start(t, cp, kubelet.Options{NodeName: "plain-node"})
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "default"}}); err != nil {
		t.Fatal(err)
	}
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: corev1.PodSpec{
			NodeName:                     k.NodeName,
			AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "main", Image: "registry.example/hello:1",
				Env: []corev1.EnvVar{{Name: "GREETING", Value: "hi"}}}},
		},
	}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	running := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }
	if _, err := cp.WaitForPod(ctx, "default", "hello", 60*time.Second, running); err != nil {
		t.Fatal(err)
	}
	cs := k.Runtime.ContainersOf("default", "hello")
	if len(cs) != 1 || cs[0].Env["GREETING"] != "hi" {
		t.Fatalf("recorded containers of default/hello: %+v, want one with GREETING=hi", cs)
	}
	k.Restart(t)
	if _, err := cp.WaitForPod(ctx, "default", "hello", 30*time.Second, running); err != nil {
		t.Fatal(err)
	}
}
