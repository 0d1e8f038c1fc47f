//go:build integration

package kubelet_test

import (
	"context"
	"fmt"
	"os"
	"strings"
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

// On containerd and runc, a pod runs from images imported from `make
// image`'s archives (nothing is pulled): the process sees the env kubelet
// computed, runs as the image's user, the gputopo binary runs in its image
// as nonroot, a kubelet restart leaves the container running, deleting the
// pod stops its process, and teardown (checked in cleanup) leaves no shim,
// mount, cgroup or bridge.
func TestKubeletRunsPodOnContainerd(t *testing.T) {
	gputopoImage, pauseImage := kubelet.Archives()
	gputopoRef, err := kubelet.ImageRef(gputopoImage)
	if err != nil {
		t.Fatal(err)
	}
	cp := harness.Start(t, harness.Options{})
	k := kubelet.Start(t, cp, kubelet.Options{NodeName: "runc-node", Containerd: &kubelet.ContainerdOptions{
		SandboxImage: pauseImage, Images: []string{gputopoImage},
		Aliases: map[string]string{"registry.example/hello:1": mustRef(t, pauseImage)},
	}})
	ctx := context.Background()
	if err := cp.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "default"}}); err != nil {
		t.Fatal(err)
	}
	no := false
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: corev1.PodSpec{
			NodeName:                      k.NodeName,
			AutomountServiceAccountToken:  &no,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{
				{Name: "main", Image: "registry.example/hello:1", ImagePullPolicy: corev1.PullNever,
					Env: []corev1.EnvVar{{Name: "GREETING", Value: "hi"}}},
				{Name: "version", Image: gputopoRef, ImagePullPolicy: corev1.PullNever, Args: []string{"version"}},
			},
		},
	}
	if err := cp.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	versionDone := func(p *corev1.Pod) bool {
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == "version" && s.State.Terminated != nil {
				return p.Status.Phase == corev1.PodRunning
			}
		}
		return false
	}
	got, err := cp.WaitForPod(ctx, "default", "hello", 90*time.Second, versionDone)
	if err != nil {
		t.Fatalf("%v\nkubelet:\n%s", err, k.Process.Tail(30))
	}
	for _, s := range got.Status.ContainerStatuses {
		if s.Name == "version" && s.State.Terminated.ExitCode != 0 {
			t.Errorf("gputopo version in its image exited %d (%s: %s)", s.State.Terminated.ExitCode, s.State.Terminated.Reason, s.State.Terminated.Message)
		}
	}
	pid, err := k.Containerd.PID(ctx, "default", "hello", "", "main")
	if err != nil {
		t.Fatal(err)
	}
	env, err := kubelet.Environ(pid)
	if err != nil {
		t.Fatal(err)
	}
	if g := kubelet.Lookup(env, "GREETING"); len(g) != 1 || g[0] != "hi" {
		t.Errorf("GREETING in the process's environment = %q, want [hi]; environment %q", g, env)
	}
	if uid := procUID(t, pid); uid != "65535" {
		t.Errorf("the pause process runs as uid %s, want the image's 65535", uid)
	}
	t.Logf("checked: pid %d runs from the imported image with GREETING=hi; gputopo version ran in its image", pid)

	k.Restart(t)
	if again, err := k.Containerd.PID(ctx, "default", "hello", "", "main"); err != nil || again != pid {
		t.Errorf("after a kubelet restart the container's pid is %d (%v), want the same %d", again, err, pid)
	}
	if err := cp.Client.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	harness.Poll(t, 60*time.Second, "the pod's process to exit once the pod is deleted", func() (bool, string) {
		_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
		return os.IsNotExist(err), fmt.Sprintf("pid %d still runs", pid)
	})
}

func mustRef(t *testing.T, archive string) string {
	t.Helper()
	r, err := kubelet.ImageRef(archive)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// procUID is the real uid of pid.
func procUID(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return ""
}
