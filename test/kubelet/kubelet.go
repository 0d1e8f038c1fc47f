package kubelet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/test/harness"
)

// DevicePluginDir is kubelet's fixed device plugin directory.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// LockPath is the lock file that keeps two real kubelets from sharing
// DevicePluginDir.
const LockPath = "/tmp/gputopo-kubelet.lock"

// Options tune Start.
type Options struct {
	// NodeName is the Node kubelet registers. Default "gpu-node-1".
	NodeName string
	// Verbosity is kubelet's -v. Default 2.
	Verbosity int
	// NodeLabels are set on the Node at registration (--node-labels).
	NodeLabels map[string]string
	// ClusterDNS is the DNS server pods with dnsPolicy ClusterFirst use
	// (kubelet's clusterDNS; domain cluster.local); see StartDNS.
	ClusterDNS string
	// Containerd, when set, runs kubelet on a real containerd (and runc)
	// instead of the fake runtime; Kubelet.Runtime is then nil.
	Containerd *ContainerdOptions
}

// Kubelet is a running kubelet and its fake runtime.
type Kubelet struct {
	NodeName string
	// Dir holds everything of this kubelet except DevicePluginDir.
	Dir     string
	RootDir string
	// PodResourcesSocket is kubelet's PodResources API socket.
	PodResourcesSocket string
	// Runtime records the containers kubelet created (fake runtime).
	Runtime *Runtime
	// Containerd is the real runtime, when Options.Containerd was set.
	Containerd *Containerd
	Process    *harness.Process

	cp   *harness.ControlPlane
	args []string
	// owner is the test that started the kubelet: processes started by a
	// Restart from a subtest must live as long as it, not the subtest.
	owner  testing.TB
	starts int
}

// Start takes the machine-wide kubelet lock, clears DevicePluginDir, starts
// a fake runtime and kubelet registered as opts.NodeName, waits until the
// Node is Ready and clears the taints a bare control plane leaves on it.
// Everything is stopped, unmounted and removed in t.Cleanup.
func Start(t testing.TB, cp *harness.ControlPlane, opts Options) *Kubelet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("a real kubelet needs root (it mounts its root directory)")
	}
	if opts.NodeName == "" {
		opts.NodeName = "gpu-node-1"
	}
	if opts.Verbosity == 0 {
		opts.Verbosity = 2
	}
	if _, err := harness.Binary("kubelet"); err != nil {
		t.Fatal(err)
	}
	lock(t)
	if err := clearDir(DevicePluginDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = clearDir(DevicePluginDir) })

	dir, err := os.MkdirTemp("", "gputopo-kubelet-")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	k := &Kubelet{NodeName: opts.NodeName, Dir: dir, RootDir: filepath.Join(dir, "root"), cp: cp, owner: t}
	k.PodResourcesSocket = filepath.Join(k.RootDir, "pod-resources", "kubelet.sock")
	t.Cleanup(func() {
		// kubelet bind-mounts its root dir onto itself (and may mount pod
		// volumes below it); unmount before removing.
		unmountBelow(k.RootDir)
		if err := os.RemoveAll(dir); err != nil {
			t.Logf("remove kubelet dir %s: %v", dir, err)
		}
	})
	for _, d := range []string{k.RootDir, filepath.Join(dir, "logs"), filepath.Join(dir, "manifests")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatalf("create %s: %v", d, err)
		}
	}
	endpoint := ""
	if opts.Containerd != nil {
		k.Containerd = StartContainerd(t, filepath.Join(dir, "containerd"), *opts.Containerd)
		endpoint = k.Containerd.Endpoint
	} else {
		rt, err := StartRuntime(filepath.Join(dir, "cri.sock"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rt.Stop)
		k.Runtime = rt
		endpoint = rt.Endpoint
	}

	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	healthz, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "kubelet.yaml")
	cfg := config(endpoint, port, healthz, dir)
	if opts.ClusterDNS != "" {
		cfg += fmt.Sprintf("clusterDNS: [%q]\nclusterDomain: cluster.local\n", opts.ClusterDNS)
	}
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatalf("write kubelet config: %v", err)
	}
	kubeconfig := cp.Kubeconfig(t, "system:node:"+opts.NodeName, "system:nodes", "system:masters")
	k.args = []string{
		"--kubeconfig=" + kubeconfig,
		"--config=" + cfgPath,
		"--root-dir=" + k.RootDir,
		"--cert-dir=" + filepath.Join(dir, "pki"),
		"--hostname-override=" + opts.NodeName,
		fmt.Sprintf("--v=%d", opts.Verbosity),
	}
	if len(opts.NodeLabels) > 0 {
		var kv []string
		for k, v := range opts.NodeLabels {
			kv = append(kv, k+"="+v)
		}
		sort.Strings(kv)
		k.args = append(k.args, "--node-labels="+strings.Join(kv, ","))
	}
	k.start()
	k.waitReady(t, time.Time{})
	return k
}

// config is the KubeletConfiguration for a kubelet on the fake runtime or
// containerd, with no cgroup management of its own: QoS cgroups and node allocatable
// enforcement off, cgroup v1 tolerated, swap tolerated, no static pods,
// eviction thresholds that a busy test machine cannot trip.
func config(endpoint string, port, healthz int, dir string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: %[1]s
imageServiceEndpoint: %[1]s
address: 127.0.0.1
port: %[2]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[3]d
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
failCgroupV1: false
cgroupsPerQOS: false
cgroupDriver: cgroupfs
enforceNodeAllocatable: []
failSwapOn: false
staticPodPath: %[4]s/manifests
podLogsDir: %[4]s/logs
resolvConf: ""
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
localStorageCapacityIsolation: false
evictionHard:
  memory.available: "1Ki"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, endpoint, port, healthz, dir)
}

func (k *Kubelet) start() {
	k.starts++
	bin, _ := harness.Binary("kubelet") // checked in Start
	k.Process = harness.StartProcess(k.owner, fmt.Sprintf("kubelet-%s-%d", k.NodeName, k.starts), bin, k.args...)
}

// Restart stops kubelet and starts it again with the same root directory
// and runtime, as a kubelet upgrade or crash would; running pods stay in the
// runtime. It waits until the new kubelet reports the Node Ready.
func (k *Kubelet) Restart(t testing.TB) {
	t.Helper()
	k.Stop()
	k.StartAgain(t)
}

// Stop stops kubelet (SIGTERM) and leaves its pods in the runtime; pods
// bound meanwhile wait for StartAgain, which delivers them to kubelet in
// one batch.
func (k *Kubelet) Stop() {
	k.Process.Stop()
	unmountBelow(k.RootDir)
}

// StartAgain starts a stopped kubelet with the same root directory and
// runtime and waits until it reports the Node Ready.
func (k *Kubelet) StartAgain(t testing.TB) {
	t.Helper()
	since := time.Now().Truncate(time.Second)
	k.start()
	k.waitReady(t, since)
}

// WaitReady waits until the Node exists and is Ready, then clears its
// taints (no node lifecycle controller runs to do it).
func (k *Kubelet) WaitReady(t testing.TB) {
	t.Helper()
	k.waitReady(t, time.Time{})
}

// waitReady waits for a Ready condition heartbeat at or after since, so
// that after a restart it is the new kubelet that reported.
func (k *Kubelet) waitReady(t testing.TB, since time.Time) {
	t.Helper()
	ctx := context.Background()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		if exited, err := k.Process.Exited(); exited {
			return false, fmt.Errorf("kubelet exited: %v", err)
		}
		node := &corev1.Node{}
		if err := k.cp.Client.Get(ctx, client.ObjectKey{Name: k.NodeName}, node); err != nil {
			return false, nil
		}
		ready := false
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since) {
				ready = true
			}
		}
		if !ready {
			return false, nil
		}
		if len(node.Spec.Taints) > 0 {
			node.Spec.Taints = nil
			if err := k.cp.Client.Update(ctx, node); err != nil {
				return false, nil // conflict with kubelet's own update: retry
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("kubelet %s did not become Ready: %v\n%s", k.NodeName, err, k.Process.Tail(30))
	}
}

// lock takes LockPath exclusively for the rest of the test.
func lock(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatalf("open kubelet lock %s: %v", LockPath, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("take kubelet lock %s: %v", LockPath, err)
	}
	t.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}

// clearDir empties dir (creating it if needed).
func clearDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unmountBelow detaches every mount at or below dir, deepest first.
func unmountBelow(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			mounts = append(mounts, f[4])
		}
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		_ = syscall.Unmount(mounts[i], syscall.MNT_DETACH)
	}
}
