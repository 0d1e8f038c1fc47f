//go:build integration

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent"
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

// cdiEnv is the variable the test's CDI spec sets for each GPU: the
// device's name (its UUID), under cdiEnv + its index.
const cdiEnv = "GPUTOPO_TEST_CDI_GPU_"

// cdiDevices writes a CDI spec for the node's GPUs (fake device nodes, one
// env variable each) where containerd reads it, as nvidia-ctk cdi generate
// would, restarts the node agent with the cdi-cri strategy, and checks that
// a GPU pod's process has exactly its assigned GPUs' device nodes and
// variables, and no NVIDIA_VISIBLE_DEVICES to choose others with.
func (e *env) cdiDevices(t *testing.T, train *corev1.Pod) {
	devDir := filepath.Join(e.dir, "cdi-dev")
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		t.Fatal(err)
	}
	type node struct {
		Path     string `json:"path"`
		HostPath string `json:"hostPath"`
	}
	type edits struct {
		Env         []string `json:"env"`
		DeviceNodes []node   `json:"deviceNodes"`
	}
	type device struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	spec := struct {
		CDIVersion string   `json:"cdiVersion"`
		Kind       string   `json:"kind"`
		Devices    []device `json:"devices"`
	}{CDIVersion: "0.6.0", Kind: nodeagent.DefaultCDIKind}
	for i, u := range e.sim.UUIDs() {
		// A character device with /dev/null's numbers stands in for
		// /dev/nvidiaN: runc creates it in the container and allows it in
		// the device cgroup, as it would the real one.
		host := filepath.Join(devDir, fmt.Sprintf("nvidia%d", i))
		if err := unix.Mknod(host, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("create fake device node %s: %v", host, err)
		}
		spec.Devices = append(spec.Devices, device{Name: u, ContainerEdits: edits{
			Env:         []string{fmt.Sprintf("%s%d=%s", cdiEnv, i, u)},
			DeviceNodes: []node{{Path: fmt.Sprintf("/dev/nvidia%d", i), HostPath: host}},
		}})
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	specPath := filepath.Join(e.k.Containerd.CDIDir, "gputopo-test.json")
	if err := os.WriteFile(specPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("injected: CDI spec %s with %d devices %s=<UUID>, each a fake /dev/nvidiaN and %sN=<UUID>", specPath, len(spec.Devices), nodeagent.DefaultCDIKind, cdiEnv)

	e.stopAgent(t)
	e.agentStrategies = []string{string(nodeagent.DeviceListCDICRI)}
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
	var gotEnv []string
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, cdiEnv) {
			gotEnv = append(gotEnv, v)
		}
	}
	sort.Strings(gotEnv)
	if !slices.Equal(gotEnv, assigned) {
		t.Errorf("the CDI variables in the process's environment name %v, want assigned-gpus %v", gotEnv, assigned)
	}
	if v := kubelet.Lookup(env, v1alpha1.EnvVisibleDevices); len(v) != 0 {
		t.Errorf("%s=%v in the process's environment; cdi-cri sets none", v1alpha1.EnvVisibleDevices, v)
	}
	var wantDev []string
	for _, u := range assigned {
		wantDev = append(wantDev, fmt.Sprintf("nvidia%d", slices.Index(e.sim.UUIDs(), u)))
	}
	sort.Strings(wantDev)
	gotDev, err := e.containerDevices(p)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gotDev, wantDev) {
		t.Errorf("GPU device nodes in the container's /dev: %v, want %v (assigned-gpus %v)", gotDev, wantDev, assigned)
	}
	t.Logf("checked: containerd applied the CDI devices of %v: /dev %v and their variables, no %s", assigned, gotDev, v1alpha1.EnvVisibleDevices)
	e.deletePods(t, nsTeam, p.Name)
}

// containerDevices lists the nvidia* device nodes in the /dev of pod p's
// container "main", through its process's root.
func (e *env) containerDevices(p *corev1.Pod) ([]string, error) {
	pid, err := e.pid(p, "main")
	if err != nil {
		return nil, err
	}
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/root/dev", pid))
	if err != nil {
		return nil, fmt.Errorf("read the container's /dev: %w", err)
	}
	var out []string
	for _, d := range es {
		if strings.HasPrefix(d.Name(), "nvidia") {
			out = append(out, d.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}
