//go:build integration

package e2e

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/test/kubelet"
)

// TestEndToEndContainerd runs the flow with kubelet on a real container
// runtime, containerd and runc: the GPU pods' containers run, and what is
// checked is the environment the kernel holds for their processes
// (/proc/<pid>/environ), not what kubelet asked for. Then the restarts that
// concern kubelet and the node agent, and the cdi-cri device list strategy
// with containerd applying a CDI spec.
func TestEndToEndContainerd(t *testing.T) {
	start := time.Now()
	e := setupEnv(t, v1alpha1.ResourceGPU, false, true)
	var train *corev1.Pod
	t.Run("full flow on containerd: the container process's environment names exactly its GPUs", func(t *testing.T) {
		train = e.fullFlow(t)
		e.audit(t)
	})
	if train == nil {
		t.Fatal("the full flow did not produce a running pod; the scenarios build on it")
	}
	scenarios := []struct {
		name string
		run  func(*testing.T, *corev1.Pod)
	}{
		{"kubelet restarted with a running container: the process keeps its GPUs", e.kubeletRestart},
		{"node agent restarted with a running container: the process keeps its GPUs, new pods are admitted", e.nodeAgentRestart},
		{"cdi-cri: containerd applies the node's CDI spec, the process sees exactly its GPUs' devices", e.cdiDevices},
	}
	for _, s := range scenarios {
		t.Run(s.name, func(t *testing.T) {
			s.run(t, train)
			e.audit(t)
		})
	}
	t.Logf("suite: %v in all", time.Since(start).Round(time.Second))
}

// cdiDevices writes a CDI spec for the node's GPUs (fake device nodes, one
// env variable each) where containerd reads it, as nvidia-ctk cdi generate
// would, restarts the node agent with the cdi-cri strategy, and checks that
// a GPU pod's process has exactly its assigned GPUs' device nodes and
// variables, and no NVIDIA_VISIBLE_DEVICES to choose others with.
func (e *env) cdiDevices(t *testing.T, train *corev1.Pod) {
	spec := kubelet.WriteCDISpec(t, e.k.Containerd, configv1alpha1.DefaultCDIKind, e.sim.UUIDs())
	t.Logf("injected: CDI spec %s with %d devices %s=<UUID>, each a fake /dev/nvidiaN and %sN=<UUID>", spec.Path, len(spec.UUIDs), spec.Kind, kubelet.CDIEnvPrefix)

	e.stopAgent(t)
	e.agentStrategies = []string{string(configv1alpha1.DeviceListCDICRI)}
	e.startAgent(t)
	t.Cleanup(func() {
		// The scenarios after this one expect the default strategy.
		e.stopAgent(t)
		e.agentStrategies = nil
		e.startAgent(t)
		e.waitKubeletGPUs(t, nodeGPUs)
	})
	e.waitKubeletGPUs(t, nodeGPUs)
	t.Logf("injected: node agent restarted with --device-list-strategy=cdi-cri")

	p := e.gpuPod(nsTeam, "cdi", 2)
	e.create(t, p)
	p = e.waitPod(t, p, 90*time.Second, "the CDI pod to run", isRunning)
	assigned := harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs)
	env, err := e.environ(p, "main")
	if err != nil {
		t.Fatal(err)
	}
	if got := kubelet.CDIEnvUUIDs(env); !slices.Equal(got, assigned) {
		t.Errorf("the CDI variables in the process's environment name %v, want assigned-gpus %v", got, assigned)
	}
	if v := kubelet.Lookup(env, v1alpha1.EnvVisibleDevices); len(v) != 0 {
		t.Errorf("%s=%v in the process's environment; cdi-cri sets none", v1alpha1.EnvVisibleDevices, v)
	}
	pid, err := e.pid(p, "main")
	if err != nil {
		t.Fatal(err)
	}
	gotDev, err := kubelet.GPUDeviceNodes(pid)
	if err != nil {
		t.Fatal(err)
	}
	if want := spec.DeviceNodes(assigned); !slices.Equal(gotDev, want) {
		t.Errorf("GPU device nodes in the container's /dev: %v, want %v (assigned-gpus %v)", gotDev, want, assigned)
	}
	t.Logf("checked: containerd applied the CDI devices of %v: /dev %v and their variables, no %s", assigned, gotDev, v1alpha1.EnvVisibleDevices)
	e.deletePods(t, nsTeam, p.Name)
}
