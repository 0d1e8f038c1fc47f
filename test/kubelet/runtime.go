package kubelet

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"strings"
	"sync"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

// Container is one container config kubelet asked the runtime to create.
type Container struct {
	Namespace, Pod, PodUID, Name string
	// Env is the container's environment as kubelet computed it, device
	// plugin answers included; for a name set twice, the last value (the
	// one a runtime applies).
	Env map[string]string
	// Mounts are the container's mounts as kubelet sent them, device plugin
	// answers included, in order.
	Mounts []Mount
	// CDIDevices are the fully qualified CDI device names kubelet asked the
	// runtime to inject (ContainerConfig.CDIDevices), in order.
	CDIDevices []string
}

// Mount is one mount of a container config.
type Mount struct {
	ContainerPath, HostPath string
	ReadOnly                bool
}

// Runtime is the fake CRI runtime kubelet talks to: upstream's fake
// (k8s.io/cri-client/pkg/fake) with CreateContainer recorded before it is
// delegated, since the fake keeps no env.
type Runtime struct {
	Fake     *fake.RemoteRuntime
	Endpoint string // unix://...

	server *grpc.Server
	path   string
	mu     sync.Mutex
	seen   []Container
}

// recorder serves the fake's RuntimeService with CreateContainer recorded.
type recorder struct {
	*fake.RemoteRuntime
	rt *Runtime
}

func (r recorder) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	cfg := req.GetConfig()
	labels := cfg.GetLabels()
	c := Container{
		Namespace: labels["io.kubernetes.pod.namespace"], Pod: labels["io.kubernetes.pod.name"],
		PodUID: labels["io.kubernetes.pod.uid"], Name: cfg.GetMetadata().GetName(), Env: map[string]string{},
	}
	for _, kv := range cfg.GetEnvs() {
		c.Env[kv.Key] = string(kv.Value)
	}
	for _, m := range cfg.GetMounts() {
		c.Mounts = append(c.Mounts, Mount{ContainerPath: m.GetContainerPath(), HostPath: m.GetHostPath(), ReadOnly: m.GetReadonly()})
	}
	for _, d := range cfg.GetCDIDevices() {
		c.CDIDevices = append(c.CDIDevices, d.GetName())
	}
	r.rt.mu.Lock()
	r.rt.seen = append(r.rt.seen, c)
	r.rt.mu.Unlock()
	return r.RemoteRuntime.CreateContainer(ctx, req)
}

// StartRuntime serves a fake runtime on a unix socket at path.
func StartRuntime(path string) (*Runtime, error) {
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen for fake runtime on %s: %w", path, err)
	}
	f := fake.NewFakeRemoteRuntime()
	f.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	// The fake reports images with no size unless told one, and kubelet
	// refuses to start containers from such images.
	f.ImageService.SetFakeImageSize(1 << 20)
	rt := &Runtime{Fake: f, Endpoint: "unix://" + path, server: grpc.NewServer(), path: path}
	runtimeapi.RegisterRuntimeServiceServer(rt.server, recorder{RemoteRuntime: f, rt: rt})
	runtimeapi.RegisterImageServiceServer(rt.server, f)
	go func() { _ = rt.server.Serve(lis) }()
	return rt, nil
}

// Stop stops serving.
func (r *Runtime) Stop() {
	r.server.Stop()
	_ = os.Remove(r.path)
}

// Containers returns the container configs created so far, in order.
func (r *Runtime) Containers() []Container {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Container(nil), r.seen...)
}

// ContainersOf returns the containers created for pod namespace/name.
func (r *Runtime) ContainersOf(namespace, pod string) []Container {
	var out []Container
	for _, c := range r.Containers() {
		if c.Namespace == namespace && c.Pod == pod {
			out = append(out, c)
		}
	}
	return out
}

// EnvList splits a comma-separated env value into sorted entries (empty
// for an unset or empty value).
func EnvList(v string) []string {
	if v == "" {
		return nil
	}
	out := strings.Split(v, ",")
	sort.Strings(out)
	return out
}
