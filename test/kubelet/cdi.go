package kubelet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// CDIEnvPrefix is the variable WriteCDISpec's devices set: GPU N's device
// sets <CDIEnvPrefix>N=<its UUID>, so a container's environment says which
// CDI devices the runtime applied.
const CDIEnvPrefix = "GPUTOPO_TEST_CDI_GPU_"

// CDISpec is a CDI spec for a node's GPUs, written where containerd reads
// it (Containerd.CDIDir), as `nvidia-ctk cdi generate` writes one on a real
// node: one device per GPU named by its UUID (<kind>=<UUID>), whose edits
// create a device node /dev/nvidiaN in the container and set
// <CDIEnvPrefix>N=<UUID>.
type CDISpec struct {
	// Path is the spec file.
	Path string
	// Kind is the CDI kind of its devices, e.g. nvidia.com/gpu.
	Kind string
	// UUIDs are the GPUs, GPU N at index N.
	UUIDs []string
}

// WriteCDISpec writes the spec for the GPUs uuids (GPU N at index N) of
// kind into c's CDI directory. Each device node stands in for /dev/nvidiaN
// with a character device of /dev/null's numbers, made below c.Dir: runc
// creates it in the container and allows it in the device cgroup as it
// would the real one. containerd reads the directory at every container
// creation, so the spec applies from the next container on.
func WriteCDISpec(t testing.TB, c *Containerd, kind string, uuids []string) *CDISpec {
	t.Helper()
	devDir := filepath.Join(c.Dir, "cdi-dev")
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
	}{CDIVersion: "0.6.0", Kind: kind}
	for i, u := range uuids {
		host := filepath.Join(devDir, fmt.Sprintf("nvidia%d", i))
		if err := unix.Mknod(host, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatalf("create fake device node %s: %v", host, err)
		}
		spec.Devices = append(spec.Devices, device{Name: u, ContainerEdits: edits{
			Env:         []string{fmt.Sprintf("%s%d=%s", CDIEnvPrefix, i, u)},
			DeviceNodes: []node{{Path: fmt.Sprintf("/dev/nvidia%d", i), HostPath: host}},
		}})
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	s := &CDISpec{Path: filepath.Join(c.CDIDir, "gputopo-test.json"), Kind: kind, UUIDs: slices.Clone(uuids)}
	if err := os.WriteFile(s.Path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return s
}

// DeviceNodes are the container paths of the device nodes of the GPUs
// uuids (/dev/nvidiaN), sorted; a UUID not in the spec is named as such.
func (s *CDISpec) DeviceNodes(uuids []string) []string {
	var out []string
	for _, u := range uuids {
		if i := slices.Index(s.UUIDs, u); i >= 0 {
			out = append(out, fmt.Sprintf("/dev/nvidia%d", i))
		} else {
			out = append(out, "not in the CDI spec: "+u)
		}
	}
	sort.Strings(out)
	return out
}

// DeviceNames are the fully qualified CDI names of the GPUs uuids
// (<kind>=<UUID>), sorted.
func (s *CDISpec) DeviceNames(uuids []string) []string {
	var out []string
	for _, u := range uuids {
		out = append(out, s.Kind+"="+u)
	}
	sort.Strings(out)
	return out
}

// CDIEnvUUIDs are the UUIDs the spec's variables name in env, sorted: the
// GPUs whose CDI devices the runtime applied to the process.
func CDIEnvUUIDs(env []string) []string {
	var out []string
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, CDIEnvPrefix) {
			out = append(out, v)
		}
	}
	sort.Strings(out)
	return out
}

// GPUDeviceNodes lists the nvidia* entries of the /dev that process pid
// sees (through /proc/<pid>/root), as /dev/<name>, sorted.
func GPUDeviceNodes(pid int) ([]string, error) {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/root/dev", pid))
	if err != nil {
		return nil, fmt.Errorf("read the /dev of pid %d: %w", pid, err)
	}
	var out []string
	for _, d := range es {
		if strings.HasPrefix(d.Name(), "nvidia") {
			out = append(out, "/dev/"+d.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}
