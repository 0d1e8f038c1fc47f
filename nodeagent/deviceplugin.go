package nodeagent

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
)

// Plan is the extender's assignment for one pod bound to this node that
// kubelet has not admitted yet.
type Plan struct {
	// Pod is namespace/name, UID its UID.
	Pod string
	UID types.UID
	// GPUs are the assigned UUIDs in allocation order.
	GPUs []string
	// BoundAt is when the pod was bound (its PodScheduled condition), zero
	// when unknown; Created its creation time. Together with Pod they give
	// kubelet's admission order.
	BoundAt, Created time.Time
}

// admittedBefore is kubelet's admission order, given when the current
// kubelet started: whether kubelet admits a before b. Pods bound before
// that reach kubelet in its first batch, which kubelet admits in creation
// order (HandlePodAdditions sorts by creation time); pods bound after
// reach it one by one as they are bound, so they come after the batch,
// in bind order. Remaining ties go by creation time, then name.
func admittedBefore(a, b Plan, kubeletStart time.Time) bool {
	batchEnd := kubeletStart.Truncate(time.Second) // BoundAt has second precision
	inBatch := func(p Plan) bool { return !p.BoundAt.After(batchEnd) }
	if ba, bb := inBatch(a), inBatch(b); ba != bb {
		return ba
	} else if !ba && !a.BoundAt.Equal(b.BoundAt) {
		return a.BoundAt.Before(b.BoundAt)
	}
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.Pod < b.Pod
}

// DevicePluginOptions configure the device plugin.
type DevicePluginOptions struct {
	// ResourceName is the extended resource served. Default nvidia.com/gpu.
	ResourceName string
	// PluginDir is kubelet's device plugin directory, holding kubelet.sock.
	// Default /var/lib/kubelet/device-plugins.
	PluginDir string
	// WatchInterval is how often kubelet.sock is checked for a kubelet
	// restart. Default 1s.
	WatchInterval time.Duration
	// DeviceListStrategies say how Allocate names a container's GPUs to
	// the runtime; several combine as in NVIDIA's plugin. Default
	// [envvar]. An unknown one makes every Allocate fail (the flag is
	// checked by Options.Validate first).
	DeviceListStrategies []configv1alpha1.DeviceListStrategy
	// CDIKind is the CDI kind of the GPUs for the cdi-cri strategy.
	// Default nvidia.com/gpu.
	CDIKind string
}

func (o *DevicePluginOptions) defaults() {
	if o.ResourceName == "" {
		o.ResourceName = v1alpha1.ResourceGPU
	}
	if o.PluginDir == "" {
		o.PluginDir = strings.TrimSuffix(pluginapi.DevicePluginPath, "/")
	}
	if o.WatchInterval <= 0 {
		o.WatchInterval = time.Second
	}
	if len(o.DeviceListStrategies) == 0 {
		o.DeviceListStrategies = []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListEnvvar}
	}
	if o.CDIKind == "" {
		o.CDIKind = configv1alpha1.DefaultCDIKind
	}
}

// DevicePlugin is the kubelet device plugin for the node's GPUs. Device IDs
// are GPU UUIDs. It never decides which GPUs a container sees: Allocate
// answers with exactly the IDs kubelet passed. It steers kubelet's choice
// through GetPreferredAllocation with the extender's plan, or, with no plan
// at all, the topology-best local set.
type DevicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer

	opts    DevicePluginOptions
	pods    PodSource
	metrics *Metrics
	logger  klog.Logger
	alloc   *allocator.Allocator
	// allocs records which pod each Allocate was for (PodResources does
	// not report one-shot init containers' devices) and how far kubelet
	// got through each pod's GPU containers.
	allocs *AllocationLog
	// matchMu serialises matching kubelet's calls to pods: each call
	// reads and moves the log's progress.
	matchMu sync.Mutex

	// devList builds Allocate's answers; devListErr, when set, is why the
	// options name no usable device list strategy, and Allocate then
	// refuses rather than answer without GPUs.
	devList    deviceList
	devListErr error

	mu          sync.Mutex
	graph       *topology.Graph
	devices     []*pluginapi.Device
	changed     chan struct{} // closed and replaced on every device change
	onAllocate  []func()
	registered  int
	server      *grpc.Server
	socketInfo  os.FileInfo
	kubeletInfo os.FileInfo
	// kubeletStart is when the kubelet we registered with created its
	// registration socket, i.e. started.
	kubeletStart time.Time
}

var _ pluginapi.DevicePluginServer = (*DevicePlugin)(nil)

// NewDevicePlugin builds the plugin over the pods bound to the node;
// metrics may be nil.
func NewDevicePlugin(opts DevicePluginOptions, pods PodSource, metrics *Metrics, logger klog.Logger) *DevicePlugin {
	opts.defaults()
	devList, devListErr := opts.deviceList()
	return &DevicePlugin{opts: opts, devList: devList, devListErr: devListErr, pods: pods, metrics: metrics, logger: logger,
		alloc: allocator.New(64), changed: make(chan struct{}), allocs: newAllocationLog(logger)}
}

// SocketPath is where the plugin serves, inside the plugin directory.
func (p *DevicePlugin) SocketPath() string {
	name := strings.NewReplacer("/", "-", ".", "-").Replace(p.opts.ResourceName)
	return filepath.Join(p.opts.PluginDir, "gputopo-"+name+".sock")
}

// OnAllocate registers fn to run after every Allocate (the reconciler
// uses it to read PodResources soon after).
func (p *DevicePlugin) OnAllocate(fn func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onAllocate = append(p.onAllocate, fn)
}

// Registrations counts successful registrations with kubelet.
func (p *DevicePlugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registered
}

// SetTopology takes the node's GPUs and health from a topology read and
// pushes them to kubelet through ListAndWatch when they changed. A stale
// status keeps its GPUs (marked as the publisher marked them).
func (p *DevicePlugin) SetTopology(st v1alpha1.NodeGPUTopologyStatus) {
	devs := make([]*pluginapi.Device, 0, len(st.GPUs))
	for _, g := range st.GPUs {
		d := &pluginapi.Device{ID: g.UUID, Health: pluginapi.Healthy}
		if g.Health == v1alpha1.GPUUnhealthy {
			d.Health = pluginapi.Unhealthy
		}
		if g.NUMANode >= 0 {
			d.Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(g.NUMANode)}}}
		}
		devs = append(devs, d)
	}
	var graph *topology.Graph
	if len(st.GPUs) > 0 {
		g, err := topology.FromStatus(&st)
		if err != nil {
			p.logger.Error(err, "Topology not usable for local allocation; preferring by plan only")
		} else {
			graph = g
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if graph != nil || len(st.GPUs) == 0 {
		p.graph = graph
	}
	if sameDevices(p.devices, devs) {
		return
	}
	p.devices = devs
	close(p.changed)
	p.changed = make(chan struct{})
}

func sameDevices(a, b []*pluginapi.Device) bool {
	return slices.EqualFunc(a, b, func(x, y *pluginapi.Device) bool {
		return x.ID == y.ID && x.Health == y.Health
	})
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (p *DevicePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// ListAndWatch implements pluginapi.DevicePluginServer: the device list
// now, then again at every change of GPUs or health.
func (p *DevicePlugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		p.mu.Lock()
		devs, changed := slices.Clone(p.devices), p.changed
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return fmt.Errorf("send device list: %w", err)
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer. Each
// container's request is matched to the pending pod kubelet is allocating
// and that pod's next GPU container (resolve); the answer is that pod's
// plan, else the topology-best set.
func (p *DevicePlugin) GetPreferredAllocation(ctx context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	p.matchMu.Lock()
	defer p.matchMu.Unlock()
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.ContainerRequests {
		ids, source, chosen, how := p.prefer(ctx, cr)
		p.notePreference(cr, chosen, how)
		p.metrics.preferredFrom(source)
		pod := ""
		if chosen != nil {
			pod = chosen.Pod
		}
		p.logger.V(2).Info("Preferred allocation", "available", cr.AvailableDeviceIDs, "mustInclude", cr.MustIncludeDeviceIDs,
			"size", cr.AllocationSize, "preferred", ids, "source", source, "pod", pod, "matchedBy", how)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// prefer picks the devices for one container: the must-include devices,
// then the plan of the pod the request is for, in plan order; when that
// pod has no plan, or its plan no longer has enough GPUs free, the rest is
// the topology-best set of the free GPUs, leaving out those planned for
// the other pending pods while enough remain. The pod the request was
// matched to (nil: none) and how are returned too.
func (p *DevicePlugin) prefer(ctx context.Context, cr *pluginapi.ContainerPreferredAllocationRequest) ([]string, string, *candidate, string) {
	size := int(cr.AllocationSize)
	c, how, others := p.resolve(ctx, kubeletCall{preferred: true, size: size, available: cr.AvailableDeviceIDs, mustInclude: cr.MustIncludeDeviceIDs})
	planned := map[string]bool{}
	for _, o := range others {
		for _, g := range o.GPUs {
			planned[g] = true
		}
	}
	free := make([]string, 0, len(cr.AvailableDeviceIDs))
	for _, id := range cr.AvailableDeviceIDs {
		if !planned[id] || slices.Contains(cr.MustIncludeDeviceIDs, id) {
			free = append(free, id)
		}
	}
	if len(free) < size {
		free = cr.AvailableDeviceIDs
	}
	if c != nil && len(c.GPUs) > 0 {
		ids := fromPlan(c.GPUs, cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, size)
		if len(ids) == size {
			return ids, "plan", c, how
		}
		if ids := p.localBest(free, ids, size); ids != nil {
			return ids, "topology", c, how
		}
	}
	if ids := p.localBest(free, cr.MustIncludeDeviceIDs, size); ids != nil {
		return ids, "topology", c, how
	}
	return nil, "none", c, how
}

// fromPlan is the must-include devices, then the plan's GPUs that are
// available, in plan order, up to size; fewer when the plan has not
// enough left.
func fromPlan(plan, available, mustInclude []string, size int) []string {
	avail := setOf(available)
	out := slices.Clone(mustInclude)
	for _, g := range plan {
		if len(out) >= size {
			break
		}
		if avail[g] && !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	return out
}

// localBest asks the allocator for the best set among the available GPUs
// (default strategy); must-include devices are kept and the rest filled in
// the allocator's order.
func (p *DevicePlugin) localBest(available, mustInclude []string, size int) []string {
	p.mu.Lock()
	g := p.graph
	p.mu.Unlock()
	if g == nil || size <= 0 {
		return nil
	}
	var free topology.Mask
	for _, id := range available {
		if i, ok := g.IndexOf(id); ok {
			free = free.With(i)
		}
	}
	res, err := p.alloc.Allocate(g, free, topology.Request{Count: size})
	if err != nil {
		return nil
	}
	out := slices.Clone(mustInclude)
	for _, i := range res.GPUs {
		if len(out) >= size {
			break
		}
		if id := g.GPUs()[i].UUID; !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// Allocate implements pluginapi.DevicePluginServer. Each container's answer
// names exactly the device IDs kubelet passed, in kubelet's order, in the
// form of the configured device list strategies (NVIDIA_VISIBLE_DEVICES,
// /dev/null mounts, CDI devices); kubelet's own accounting then guarantees
// that no GPU is in two containers. An ID that is not a GPU of this node is
// refused.
func (p *DevicePlugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	defer p.metrics.allocateTimer()()
	if p.devListErr != nil {
		p.metrics.allocation(false)
		p.allocs.forgetPreference()
		return nil, fmt.Errorf("allocate: %w", p.devListErr)
	}
	p.mu.Lock()
	known := map[string]bool{}
	for _, d := range p.devices {
		known[d.ID] = true
	}
	hooks := slices.Clone(p.onAllocate)
	p.mu.Unlock()
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		for _, id := range cr.DevicesIds {
			if !known[id] {
				p.metrics.allocation(false)
				p.allocs.forgetPreference()
				return nil, fmt.Errorf("allocate: device %q is not a GPU of this node; known devices are the GPU UUIDs in ListAndWatch", id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, p.devList.response(cr.DevicesIds))
		p.metrics.allocation(true)
		p.logger.V(1).Info("Allocated", "devices", cr.DevicesIds)
	}
	p.matchMu.Lock()
	for _, cr := range req.ContainerRequests {
		p.noteAllocation(ctx, cr.DevicesIds)
	}
	p.matchMu.Unlock()
	for _, fn := range hooks {
		fn()
	}
	return resp, nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; nothing to do.
func (p *DevicePlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Run serves the plugin and registers it with kubelet, and does both again
// whenever kubelet restarts (kubelet.sock is recreated, and kubelet removes
// every plugin socket when it starts). The directory is watched with
// inotify so that re-registration follows a kubelet start within
// milliseconds: kubelet fails the admission of pods it finds pending at
// start (UnexpectedAdmissionError) when their device plugin has not
// registered yet. A failed attempt is retried after a short backoff (50 ms,
// doubling up to WatchInterval), and a periodic check backs the watch up.
// It returns when ctx ends.
func (p *DevicePlugin) Run(ctx context.Context) error {
	defer p.stopServer()
	var events chan fsnotify.Event
	if w, err := fsnotify.NewWatcher(); err != nil {
		p.logger.Info("Cannot watch the device plugin directory; checking it periodically only", "err", err.Error())
	} else {
		defer w.Close()
		if err := w.Add(p.opts.PluginDir); err != nil {
			p.logger.Info("Cannot watch the device plugin directory; checking it periodically only", "dir", p.opts.PluginDir, "err", err.Error())
		} else {
			events = w.Events
		}
	}
	tick := time.NewTicker(p.opts.WatchInterval)
	defer tick.Stop()
	// retry fires after a failed attempt: kubelet creates kubelet.sock
	// (the event we wake on) before it listens on it, so the first
	// attempt can be refused, and no further event comes.
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	backoff := registerRetryMin
	for {
		var err error
		switch p.needsRestart() {
		case restartServer:
			if err = p.serveAndRegister(ctx); err != nil {
				p.logger.Info("Device plugin not registered yet; retrying", "in", backoff.String(), "err", err.Error())
			}
		case reregister:
			if err = p.reregister(ctx); err != nil {
				p.logger.Info("Device plugin not registered with the new kubelet yet; retrying", "in", backoff.String(), "err", err.Error())
			}
		}
		if err != nil {
			retry.Reset(backoff)
			backoff = min(2*backoff, p.opts.WatchInterval)
		} else {
			retry.Stop()
			backoff = registerRetryMin
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-events:
		case <-retry.C:
		}
	}
}

// registerRetryMin is the first wait after a failed registration; it
// doubles on each failure up to WatchInterval.
const registerRetryMin = 50 * time.Millisecond

// restart says what the watch loop must do to stay registered.
type restart uint8

const (
	upToDate restart = iota
	// restartServer: serve a new socket and register it (our socket is
	// gone: kubelet removes plugin sockets when it starts).
	restartServer
	// reregister: kubelet.sock is not the file we last registered
	// through, but our socket is intact: register the running server
	// again, without stopping it (stopping it would cut a kubelet that
	// is connected to it).
	reregister
)

// needsRestart: our socket is gone, or kubelet.sock is not the file we
// registered through.
func (p *DevicePlugin) needsRestart() restart {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.server == nil {
		return restartServer
	}
	sock, err := os.Stat(p.SocketPath())
	if err != nil || !os.SameFile(sock, p.socketInfo) {
		return restartServer
	}
	if p.kubeletInfo == nil {
		return reregister
	}
	kubelet, err := os.Stat(filepath.Join(p.opts.PluginDir, "kubelet.sock"))
	if err != nil || !os.SameFile(kubelet, p.kubeletInfo) {
		return reregister
	}
	return upToDate
}

// reregister registers the running server with kubelet again.
func (p *DevicePlugin) reregister(ctx context.Context) error {
	kubeletSock := filepath.Join(p.opts.PluginDir, "kubelet.sock")
	if _, err := os.Stat(kubeletSock); err != nil {
		return fmt.Errorf("kubelet registration socket %s: %w", kubeletSock, err)
	}
	if err := p.register(ctx, kubeletSock); err != nil {
		return err
	}
	return p.recordRegistration(kubeletSock)
}

// recordRegistration records a registration through kubeletSock, with the file
// as it is after the registration: a kubelet that replaced its socket
// while we registered was the one that answered.
func (p *DevicePlugin) recordRegistration(kubeletSock string) error {
	kubeletInfo, err := os.Stat(kubeletSock)
	if err != nil {
		return fmt.Errorf("kubelet registration socket %s: %w", kubeletSock, err)
	}
	p.mu.Lock()
	p.kubeletInfo = kubeletInfo
	p.kubeletStart = kubeletInfo.ModTime()
	p.registered++
	p.mu.Unlock()
	p.logger.Info("Registered with kubelet", "resource", p.opts.ResourceName, "socket", p.SocketPath())
	return nil
}

func (p *DevicePlugin) serveAndRegister(ctx context.Context) error {
	p.stopServer()
	kubeletSock := filepath.Join(p.opts.PluginDir, "kubelet.sock")
	if _, err := os.Stat(kubeletSock); err != nil {
		return fmt.Errorf("kubelet registration socket %s: %w", kubeletSock, err)
	}
	sockPath := p.SocketPath()
	if err := os.Remove(sockPath); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("remove old plugin socket %s: %w", sockPath, err)
	}
	lis, err := net.Listen("unix", sockPath)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sockPath, err)
	}
	sockInfo, err := os.Stat(sockPath)
	if err != nil {
		lis.Close()
		return fmt.Errorf("stat %s: %w", sockPath, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()
	p.mu.Lock()
	p.server, p.socketInfo = srv, sockInfo
	p.mu.Unlock()

	if err := p.register(ctx, kubeletSock); err != nil {
		return err
	}
	return p.recordRegistration(kubeletSock)
}

func (p *DevicePlugin) register(ctx context.Context, kubeletSock string) error {
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to kubelet at %s: %w", kubeletSock, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.SocketPath()),
		ResourceName: p.opts.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	if err != nil {
		return fmt.Errorf("register %s with kubelet: %w", p.opts.ResourceName, err)
	}
	return nil
}

func (p *DevicePlugin) stopServer() {
	p.mu.Lock()
	srv := p.server
	p.server, p.socketInfo, p.kubeletInfo = nil, nil, nil
	p.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}
