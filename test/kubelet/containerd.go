package kubelet

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gputopo/gputopo/test/harness"
)

// Containerd-backed kubelets: a real container runtime (containerd from
// bin/, built by `make tools`, and Debian's runc) instead of the fake.
const (
	// CNIBinDir is where Debian's containernetworking-plugins installs the
	// bridge, host-local and loopback plugins.
	CNIBinDir = "/usr/lib/cni"
	// bridgeName is the Linux bridge the CNI bridge plugin creates for pods.
	bridgeName = "gputopo-cni0"
	// podSubnet is the pods' subnet on bridgeName.
	podSubnet = "10.244.77.0/24"
	// requireEnv makes a missing runc or CNI plugin a failure instead of a
	// skip; .ci/run sets it after installing them.
	requireEnv = "GPUTOPO_REQUIRE_RUNTIME"
	// CRINamespace is the containerd namespace of CRI's containers and
	// images.
	CRINamespace = "k8s.io"
)

// ContainerdOptions makes Start run kubelet on containerd.
type ContainerdOptions struct {
	// SandboxImage is the OCI archive of the pod sandbox image (`make
	// image` writes _out/pause-image.tar); containerd cannot pull here.
	SandboxImage string
	// Images are further OCI archives to import.
	Images []string
	// Aliases are extra names for imported images: alias → the name an
	// archive carries. Pods naming an alias run that image without a pull.
	Aliases map[string]string
}

// Containerd is a containerd serving kubelet's CRI on a private socket,
// with its root, state, CNI network and CDI spec directory under Dir.
type Containerd struct {
	Dir string
	// Endpoint is the CRI endpoint (unix://...).
	Endpoint string
	// CDIDir is the CDI spec directory containerd reads (enable_cdi).
	CDIDir  string
	Process *harness.Process

	socket string
	conn   *grpc.ClientConn
	rs     runtimeapi.RuntimeServiceClient
	// cgroups and runcState are what existed before containerd started.
	cgroups, runcState map[string]bool
}

// runcStateDir is runc's state directory for containerd's CRI namespace
// (the shim runs runc with --root there).
const runcStateDir = "/run/containerd/runc/" + CRINamespace

// dirNames is the set of entry names in dir (empty if it does not exist).
func dirNames(dir string) map[string]bool {
	out := map[string]bool{}
	es, _ := os.ReadDir(dir)
	for _, e := range es {
		out[e.Name()] = true
	}
	return out
}

// RuntimeMissing is why a containerd-backed kubelet cannot run on this
// machine ("" when it can): runc or the CNI plugins are not installed.
func RuntimeMissing() string {
	var missing []string
	if _, err := exec.LookPath("runc"); err != nil {
		missing = append(missing, "runc (apt-get install runc)")
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIBinDir, p)); err != nil {
			missing = append(missing, fmt.Sprintf("the CNI %s plugin in %s (apt-get install containernetworking-plugins)", p, CNIBinDir))
			break
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return "a real container runtime needs " + strings.Join(missing, " and ")
}

// StartContainerd starts containerd in dir with the CRI plugin, runc, a
// bridge CNI network and CDI enabled, and imports the images. Stop (in
// t.Cleanup) removes every pod, stops containerd and fails the test if a
// mount, shim, cgroup or the bridge is left behind.
func StartContainerd(t testing.TB, dir string, opts ContainerdOptions) *Containerd {
	t.Helper()
	if why := RuntimeMissing(); why != "" {
		if os.Getenv(requireEnv) != "" {
			t.Fatalf("%s (%s is set: the runtime tests must run)", why, requireEnv)
		}
		t.Skip(why)
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		if _, err := harness.Binary(b); err != nil {
			t.Fatal(err)
		}
	}
	if opts.SandboxImage == "" {
		t.Fatal("ContainerdOptions.SandboxImage is required: the pause image's OCI archive (make image)")
	}
	sandbox, err := ImageRef(opts.SandboxImage)
	if err != nil {
		t.Fatal(err)
	}
	runc, _ := exec.LookPath("runc")
	shim, _ := harness.Binary("containerd-shim-runc-v2")
	c := &Containerd{Dir: dir, CDIDir: filepath.Join(dir, "cdi"), socket: filepath.Join(dir, "containerd.sock")}
	c.Endpoint = "unix://" + c.socket
	for _, d := range []string{c.CDIDir, filepath.Join(dir, "cni")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
# No NRI, no /opt install plugin, no tracing: nothing outside dir.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %[5]q
  [plugins.'io.containerd.cri.v1.runtime']
    # Pods may not ask for a lower OOM score than containerd's own: a
    # root without CAP_SYS_RESOURCE (this machine's) cannot grant the
    # sandbox's -998.
    restrict_oom_score_adj = true
    enable_cdi = true
    cdi_spec_dirs = [%[6]q]
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        runtime_path = %[7]q
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %[8]q
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[9]q]
      conf_dir = %[10]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.socket, c.socket+".ttrpc", sandbox, c.CDIDir,
		shim, runc, CNIBinDir, filepath.Join(dir, "cni"))
	cni := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "gputopo-test", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}},
  {"type": "loopback"}]}
`, bridgeName, podSubnet, filepath.Join(dir, "ipam"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cni", "10-gputopo.conflist"), []byte(cni), 0o644); err != nil {
		t.Fatal(err)
	}
	c.cgroups, c.runcState = cgroupDirs(), dirNames(runcStateDir)
	bin, _ := harness.Binary("containerd")
	c.Process = harness.StartProcess(t, "containerd", bin, "--config", cfgPath)
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("containerd teardown: %v", err)
		}
	})
	if err := c.dial(); err != nil {
		t.Fatalf("%v\n%s", err, c.Process.Tail(30))
	}
	for _, a := range append([]string{opts.SandboxImage}, opts.Images...) {
		if out, err := c.ctr("images", "import", a); err != nil {
			t.Fatalf("import %s into containerd: %v\n%s", a, err, out)
		}
	}
	for alias, ref := range opts.Aliases {
		if out, err := c.ctr("images", "tag", "--force", ref, alias); err != nil {
			t.Fatalf("tag %s as %s: %v\n%s", ref, alias, err, out)
		}
	}
	return c
}

// dial waits until containerd answers CRI Version.
func (c *Containerd) dial() error {
	conn, err := grpc.NewClient(c.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", c.socket)
		}))
	if err != nil {
		return fmt.Errorf("dial containerd: %w", err)
	}
	c.conn, c.rs = conn, runtimeapi.NewRuntimeServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if exited, err := c.Process.Exited(); exited {
			return fmt.Errorf("containerd exited: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.rs.Version(ctx, &runtimeapi.VersionRequest{})
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd's CRI did not answer within 30s: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *Containerd) ctr(args ...string) ([]byte, error) {
	bin, err := harness.Binary("ctr")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"--address", c.socket, "--namespace", CRINamespace}, args...)...)
	return cmd.CombinedOutput()
}

// PID is the host PID of the running container name of pod
// namespace/podName (of the pod with UID podUID unless empty; the newest
// container if several), from containerd's verbose CRI status.
func (c *Containerd) PID(ctx context.Context, namespace, podName, podUID, name string) (int, error) {
	in, err := c.Inspect(ctx, namespace, podName, podUID, name)
	if err != nil {
		return 0, err
	}
	return in.PID, nil
}

// ContainerInspection is what containerd holds for a running container:
// its process, the CRI ContainerConfig kubelet sent, and the OCI runtime
// spec containerd made of it (CDI devices applied) for runc.
type ContainerInspection struct {
	ID  string
	PID int
	// Config is the ContainerConfig of kubelet's CreateContainer request.
	Config *runtimeapi.ContainerConfig
	// Spec is the part of the OCI runtime spec the tests read.
	Spec OCISpec
}

// OCISpec is the part of an OCI runtime spec (config.json) that says which
// devices a container gets.
type OCISpec struct {
	Annotations map[string]string `json:"annotations"`
	Process     *struct {
		Env []string `json:"env"`
	} `json:"process"`
	Mounts []struct {
		Destination string `json:"destination"`
		Source      string `json:"source"`
	} `json:"mounts"`
	Linux *struct {
		Devices []struct {
			Path  string `json:"path"`
			Major int64  `json:"major"`
			Minor int64  `json:"minor"`
		} `json:"devices"`
	} `json:"linux"`
}

// DevicePaths are the container paths of the spec's linux.devices.
func (s OCISpec) DevicePaths() []string {
	var out []string
	if s.Linux != nil {
		for _, d := range s.Linux.Devices {
			out = append(out, d.Path)
		}
	}
	sort.Strings(out)
	return out
}

// Inspect is containerd's view of the running container name of pod
// namespace/podName (of the pod with UID podUID unless empty; the newest
// container if several), from its verbose CRI status.
func (c *Containerd) Inspect(ctx context.Context, namespace, podName, podUID, name string) (*ContainerInspection, error) {
	labels := map[string]string{
		"io.kubernetes.pod.namespace":  namespace,
		"io.kubernetes.pod.name":       podName,
		"io.kubernetes.container.name": name,
	}
	if podUID != "" {
		labels["io.kubernetes.pod.uid"] = podUID
	}
	resp, err := c.rs.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: labels,
	}})
	if err != nil {
		return nil, fmt.Errorf("list containers of %s/%s: %w", namespace, podName, err)
	}
	cs := resp.GetContainers()
	if len(cs) == 0 {
		return nil, fmt.Errorf("no running container %s in pod %s/%s", name, namespace, podName)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].CreatedAt > cs[j].CreatedAt })
	st, err := c.rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: cs[0].Id, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("status of container %s: %w", cs[0].Id, err)
	}
	// containerd's CRI ContainerInfo (internal/cri/server/container_status.go).
	var info struct {
		PID         int                         `json:"pid"`
		Config      *runtimeapi.ContainerConfig `json:"config"`
		RuntimeSpec *OCISpec                    `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil || info.PID <= 0 {
		return nil, fmt.Errorf("container %s: no pid in the verbose status (%v)", cs[0].Id, err)
	}
	if info.Config == nil || info.RuntimeSpec == nil {
		return nil, fmt.Errorf("container %s: the verbose status has no config or runtime spec", cs[0].Id)
	}
	return &ContainerInspection{ID: cs[0].Id, PID: info.PID, Config: info.Config, Spec: *info.RuntimeSpec}, nil
}

// Environ is the environment of process pid as the kernel holds it
// (/proc/<pid>/environ), in order; a name set twice appears twice.
func Environ(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	if err != nil {
		return nil, fmt.Errorf("read the environment of pid %d: %w", pid, err)
	}
	var out []string
	for _, kv := range strings.Split(string(b), "\x00") {
		if kv != "" {
			out = append(out, kv)
		}
	}
	return out, nil
}

// Lookup is the values of name in env, in order.
func Lookup(env []string, name string) []string {
	var out []string
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			out = append(out, v)
		}
	}
	return out
}

// Stop removes every pod sandbox (stopping its containers, releasing its
// network), stops containerd, kills any shim left and unmounts what is left
// below Dir. It returns an error naming whatever was still left after
// that: shims, mounts, cgroups created since start, or the bridge. Safe to
// call more than once.
func (c *Containerd) Stop() error {
	if c.Process == nil {
		return nil
	}
	var errs []error
	if c.rs != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if resp, err := c.rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{}); err == nil {
			for _, s := range resp.GetItems() {
				if _, err := c.rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id}); err != nil {
					errs = append(errs, fmt.Errorf("stop pod sandbox %s: %w", s.Id, err))
				}
				if _, err := c.rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id}); err != nil {
					errs = append(errs, fmt.Errorf("remove pod sandbox %s: %w", s.Id, err))
				}
			}
		} else if exited, _ := c.Process.Exited(); !exited {
			errs = append(errs, fmt.Errorf("list pod sandboxes: %w", err))
		}
		cancel()
		_ = c.conn.Close()
	}
	c.Process.Stop()
	c.Process = nil
	// What a clean teardown leaves: nothing. Each check is made once more
	// after a forced cleanup, so that a failed test still leaves the
	// machine usable, but the first finding is the error.
	for name := range dirNames(runcStateDir) {
		if !c.runcState[name] {
			errs = append(errs, fmt.Errorf("runc state of container %s left in %s", name, runcStateDir))
			_ = os.RemoveAll(filepath.Join(runcStateDir, name))
		}
	}
	if shims := c.shims(); len(shims) > 0 {
		errs = append(errs, fmt.Errorf("containerd shims still running after every pod was removed: pids %v", shims))
		for _, pid := range shims {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if m := mountsBelow(c.Dir); len(m) > 0 {
		// containerd's own root and state bind mounts go away with it;
		// the sandboxes' network namespaces and rootfs must too.
		errs = append(errs, fmt.Errorf("mounts left below %s: %v", c.Dir, m))
		unmountBelow(c.Dir)
	}
	var left []string
	for d := range cgroupDirs() {
		// Only what containerd made for pods counts: every pod's cgroups
		// are below a parent named for its namespace. Other processes on
		// the machine come and go with cgroups of their own.
		if c.cgroups[d] || !slices.Contains(strings.Split(d, string(filepath.Separator)), CRINamespace) {
			continue
		}
		// containerd puts each pod's cgroups below a parent named for its
		// namespace and never removes that parent: empty, it is not a
		// pod's; remove it quietly.
		if filepath.Base(d) == CRINamespace && os.Remove(d) == nil {
			continue
		}
		left = append(left, d)
	}
	if len(left) > 0 {
		sort.Strings(left)
		errs = append(errs, fmt.Errorf("cgroups created by the pods and left behind: %v", left))
		for i := len(left) - 1; i >= 0; i-- {
			_ = os.Remove(left[i])
		}
	}
	if _, err := net.InterfaceByName(bridgeName); err == nil {
		// The bridge plugin creates the bridge and never deletes it
		// (CNI DEL removes only the pod's veth): removing it is ours.
		if out, err := exec.Command("ip", "link", "delete", bridgeName).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %v: %s", bridgeName, err, out))
		}
	}
	if err := os.RemoveAll(c.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", c.Dir, err))
	}
	return errors.Join(errs...)
}

// shims are the PIDs of containerd-shim-runc-v2 processes serving this
// containerd (their command line names its socket).
func (c *Containerd) shims() []int {
	var out []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && strings.HasSuffix(args[0], "containerd-shim-runc-v2") && strings.Contains(string(b), c.socket) {
			out = append(out, pid)
		}
	}
	return out
}

// mountsBelow lists the mount points at or below dir.
func mountsBelow(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// cgroupDirs is every cgroup directory of the pids and memory hierarchies
// (cgroup v1) or of the unified hierarchy (v2), to compare before and
// after.
func cgroupDirs() map[string]bool {
	out := map[string]bool{}
	for _, root := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified"} {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() && path != root {
				out[path] = true
			}
			return nil
		})
	}
	return out
}

// ImageRef is the image name an OCI archive carries (the
// io.containerd.image.name or org.opencontainers.image.ref.name
// annotation of its index's first manifest), as `make image` writes it.
func ImageRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", fmt.Errorf("open image archive %s (make image writes it): %w", archive, err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return "", fmt.Errorf("%s: no index.json: not an OCI archive", archive)
		}
		if err != nil {
			return "", fmt.Errorf("read %s: %w", archive, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			return "", fmt.Errorf("%s: index.json: %w", archive, err)
		}
		for _, m := range idx.Manifests {
			for _, k := range []string{"io.containerd.image.name", "org.opencontainers.image.ref.name"} {
				if r := m.Annotations[k]; r != "" {
					return r, nil
				}
			}
		}
		return "", fmt.Errorf("%s: its index names no image", archive)
	}
}

// Archives are the OCI archives `make image` writes: the gputopo image and
// the pause image.
func Archives() (gputopo, pause string) {
	out := filepath.Join(harness.RepoRoot(), "_out")
	return filepath.Join(out, "gputopo-image.tar"), filepath.Join(out, "pause-image.tar")
}
