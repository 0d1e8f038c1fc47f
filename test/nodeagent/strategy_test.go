//go:build integration

package nodeagent_test

import (
	"context"
	"path"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/test/kubelet"
	"github.com/gputopo/gputopo/topology/machine"
)

// setupWithStrategies starts a control plane, a real kubelet and the node
// agent on a simulated DGX A100 with the given device-list strategies (nil:
// the default, envvar), running with exactly the RBAC it documents. No
// webhook runs, so nothing stands between a pod's env and kubelet.
func setupWithStrategies(t *testing.T, strategies []string) *env {
	t.Helper()
	cp := harness.Start(t, harness.Options{})
	k := kubelet.Start(t, cp, kubelet.Options{NodeName: nodeName})
	ctx := harness.Context(t)
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "default"}},
		// The agent runs with exactly the rules it documents.
		rbacClusterRole.DeepCopy(), rbacBinding.DeepCopy(),
	} {
		if err := cp.Client.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	f, err := machine.FixtureByName("dgx-a100")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{cp: cp, k: k, sim: nvmlsim.New(f, nodeName)}
	ready := make(chan *nodeagent.Agent, 1)
	agentCtx := klog.NewContext(ctx, testr.NewWithOptions(t, testr.Options{Verbosity: 1}))
	run := localcluster.Go(agentCtx, func(ctx context.Context) error {
		return nodeagent.RunWithNVML(ctx, cp.UserConfig(t, agentUser), nodeagent.Options{
			NodeAgentConfiguration: configv1alpha1.NodeAgentConfiguration{
				NodeName: nodeName, ResourceName: v1alpha1.ResourceGPU,
				DevicePluginDir: kubelet.DevicePluginDir, PodResourcesSocket: k.PodResourcesSocket,
				TopologyInterval:     metav1.Duration{Duration: 5 * time.Minute},
				TelemetryInterval:    metav1.Duration{Duration: 30 * time.Second},
				ReconcileInterval:    metav1.Duration{Duration: 2 * time.Second},
				MetricsBindAddress:   "0",
				DeviceListStrategies: strategies,
			},
			Ready: func(a *nodeagent.Agent) { ready <- a },
		}, e.sim.NVML())
	})
	t.Cleanup(func() {
		if err := run.Stop(); err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	select {
	case e.agent = <-ready:
	case <-run.Done():
		_, err := run.Exited()
		t.Fatalf("agent stopped before it was ready: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("agent not ready after 60s")
	}
	e.pr, err = nodeagent.DialPodResources(k.PodResourcesSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.pr.Close() })
	e.waitAllocatable(t, 8)
	return e
}

// createGPUPodWithEnv creates a GPU pod whose container carries env and
// envFrom as given, and binds it with a plan.
func (e *env) createGPUPodWithEnv(t *testing.T, name string, plan []string, env []corev1.EnvVar, envFrom []corev1.EnvFromSource) {
	t.Helper()
	pod := harness.GPUPod(namespace, name, len(plan))
	no := false
	pod.Spec.AutomountServiceAccountToken = &no
	pod.Spec.Containers[0].Env = env
	pod.Spec.Containers[0].EnvFrom = envFrom
	if err := e.cp.Client.Create(context.Background(), pod); err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	e.bind(t, name, plan)
}

// runtimeConfig is the last container config kubelet sent the runtime for
// the pod.
func (e *env) runtimeConfig(t *testing.T, name string) kubelet.Container {
	t.Helper()
	cs := e.k.Runtime.ContainersOf(namespace, name)
	if len(cs) == 0 {
		t.Fatalf("runtime never created a container for %s/%s", namespace, name)
	}
	return cs[len(cs)-1]
}

// mountedGPUs are the GPU UUIDs a container config names the way the
// NVIDIA container toolkit reads volume-mounts: /dev/null mounted below
// nodeagent.DeviceListMountRoot. Sorted.
func mountedGPUs(c kubelet.Container) []string {
	var out []string
	for _, m := range c.Mounts {
		dir, id := path.Split(path.Clean(m.ContainerPath))
		if m.HostPath == "/dev/null" && path.Clean(dir) == nodeagent.DeviceListMountRoot {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// cdiGPUs are the GPU UUIDs among the container config's CDI devices of
// kind nvidia.com/gpu, and the devices of any other kind. Sorted.
func cdiGPUs(c kubelet.Container) (gpus, other []string) {
	for _, d := range c.CDIDevices {
		if id, ok := strings.CutPrefix(d, configv1alpha1.DefaultCDIKind+"="); ok {
			gpus = append(gpus, id)
		} else {
			other = append(other, d)
		}
	}
	slices.Sort(gpus)
	return gpus, other
}

// A pod that sets NVIDIA_VISIBLE_DEVICES to another pod's GPU through env
// or envFrom gets that value into the container's environment (kubelet puts
// the pod's own env after the device plugin's), but with volume-mounts or
// cdi-cri the GPUs the runtime is told to inject are exactly those kubelet
// allocated. With envvar the environment is all there is, so the value the
// pod chose is what the toolkit would read: the finding the other
// strategies fix.
func TestDeviceListStrategyWithRealKubelet(t *testing.T) {
	tests := []struct {
		name       string
		strategies []string
		// check asserts what the runtime is told, given the GPUs kubelet
		// allocated and the foreign GPU the pod's env names.
		check func(t *testing.T, c kubelet.Container, allocated []string, foreign string)
	}{
		{
			name:       "volume-mounts: the mounts name exactly the allocated GPUs whatever env says",
			strategies: []string{"volume-mounts"},
			check: func(t *testing.T, c kubelet.Container, allocated []string, _ string) {
				if got := mountedGPUs(c); !slices.Equal(allocated, got) {
					t.Errorf("device list mounts name %v, want exactly the allocated %v", got, allocated)
				}
				if len(c.CDIDevices) != 0 {
					t.Errorf("CDI devices %v, want none with volume-mounts", c.CDIDevices)
				}
			},
		},
		{
			name:       "cdi-cri: the CDI devices are exactly the allocated GPUs whatever env says",
			strategies: []string{"cdi-cri"},
			check: func(t *testing.T, c kubelet.Container, allocated []string, _ string) {
				gpus, other := cdiGPUs(c)
				if !slices.Equal(allocated, gpus) || len(other) != 0 {
					t.Errorf("CDI devices %v, want exactly %s=<UUID> for the allocated %v", c.CDIDevices, configv1alpha1.DefaultCDIKind, allocated)
				}
				if got := mountedGPUs(c); len(got) != 0 {
					t.Errorf("device list mounts %v, want none with cdi-cri", got)
				}
			},
		},
		{
			name:       "envvar: the environment is the only device list and the pod's value wins",
			strategies: nil, // the default
			// The pod's value winning is checked for every strategy below;
			// here nothing else names a GPU, so that value is what the
			// toolkit reads.
			check: func(t *testing.T, c kubelet.Container, _ []string, _ string) {
				if got := mountedGPUs(c); len(got) != 0 || len(c.CDIDevices) != 0 {
					t.Errorf("device list mounts %v and CDI devices %v, want none with envvar", got, c.CDIDevices)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := setupWithStrategies(t, tc.strategies)
			ctx := context.Background()

			e.bindPod(t, "victim", 1, uuids(e.sim, 0))
			e.waitRunning(t, "victim")
			victim := e.podResources(t, "victim")
			if len(victim) != 1 {
				t.Fatalf("victim holds %v, want 1 GPU", victim)
			}
			foreign := victim[0]

			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "take-a-gpu"},
				Data: map[string]string{v1alpha1.EnvVisibleDevices: foreign}}
			if err := e.cp.Client.Create(ctx, cm); err != nil {
				t.Fatalf("create ConfigMap: %v", err)
			}
			e.createGPUPodWithEnv(t, "via-env", uuids(e.sim, 2, 3),
				[]corev1.EnvVar{{Name: v1alpha1.EnvVisibleDevices, Value: foreign}}, nil)
			e.createGPUPodWithEnv(t, "via-envfrom", uuids(e.sim, 5), nil,
				[]corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm.Name}}}})

			for name, gpus := range map[string]int{"via-env": 2, "via-envfrom": 1} {
				e.waitRunning(t, name)
				allocated := e.podResources(t, name)
				if len(allocated) != gpus || slices.Contains(allocated, foreign) {
					t.Fatalf("%s: kubelet allocated %v, want %d GPUs without the victim's %s", name, allocated, gpus, foreign)
				}
				c := e.runtimeConfig(t, name)
				// The attempt reached the runtime: without this the
				// assertions below could pass for a pod that never tried.
				if got := c.Env[v1alpha1.EnvVisibleDevices]; got != foreign {
					t.Fatalf("%s: %s in the container config is %q, want the pod's own value %q (kubelet applies it after the device plugin's)", name, v1alpha1.EnvVisibleDevices, got, foreign)
				}
				t.Run(name, func(t *testing.T) { tc.check(t, c, allocated, foreign) })
			}
		})
	}
}
