package harness

import (
	"strconv"
	"testing"
	"time"

	schedconfigv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/schedplugin"
)

// SchedulerUser is the identity the harness gives kube-scheduler.
const SchedulerUser = localcluster.SchedulerUser

// ParseSchedulerConfig strictly decodes a KubeSchedulerConfiguration
// (kubescheduler.config.k8s.io/v1) document.
func ParseSchedulerConfig(doc []byte) (*schedconfigv1.KubeSchedulerConfiguration, error) {
	return localcluster.ParseSchedulerConfig(doc)
}

// StartScheduler runs the real kube-scheduler binary with cfg (nil: the
// default profile only), pointed at this control plane with its own
// kubeconfig, and stops it at test cleanup. It returns once /healthz
// answers.
func (cp *ControlPlane) StartScheduler(t testing.TB, cfg *schedconfigv1.KubeSchedulerConfiguration) *Process {
	t.Helper()
	return cp.StartSchedulerBinary(t, "kube-scheduler", cfg)
}

// StartSchedulerBinary is StartScheduler with another kube-scheduler build
// from bin/: "gputopo-scheduler" is the plugin build (make
// gputopo-scheduler).
func (cp *ControlPlane) StartSchedulerBinary(t testing.TB, name string, cfg *schedconfigv1.KubeSchedulerConfiguration) *Process {
	t.Helper()
	p, err := localcluster.StartSchedulerBinary(name, cfg, cp.Kubeconfig(t, SchedulerUser), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		reportLog(t, name, p.LogPath, p.Tail)
	})
	return p
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort() (int, error) { return localcluster.FreePort() }

// Paths of the repository, the control-plane binaries and the CRDs.
var (
	RepoRoot = localcluster.RepoRoot
	BinDir   = localcluster.BinDir
	CRDDir   = localcluster.CRDDir
	Binary   = localcluster.Binary
)

// StartControllerManager runs the real kube-controller-manager with only
// the named controllers (e.g. "job") and stops it at test cleanup.
func (cp *ControlPlane) StartControllerManager(t testing.TB, controllers ...string) *Process {
	t.Helper()
	return cp.StartControllerManagerWith(t, nil, controllers...)
}

// StartControllerManagerWith is StartControllerManager with extra flags.
func (cp *ControlPlane) StartControllerManagerWith(t testing.TB, flags []string, controllers ...string) *Process {
	t.Helper()
	p, err := localcluster.StartControllerManagerWith(cp.Kubeconfig(t, "gputopo-test-controller-manager", "system:masters"), t.TempDir(), flags, controllers...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Stop()
		reportLog(t, "kube-controller-manager", p.LogPath, p.Tail)
	})
	return p
}

// ChartSchedulerConfig is the Helm chart's KubeSchedulerConfiguration with
// its extender pointed at extenderURL and leader election off (see
// localcluster.ChartSchedulerConfig).
func ChartSchedulerConfig(t testing.TB, extenderURL string) *schedconfigv1.KubeSchedulerConfiguration {
	t.Helper()
	cfg, err := localcluster.ChartSchedulerConfig(extenderURL)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// PluginSchedulerConfig is the chart's plugin-mode configuration
// (localcluster.PluginSchedulerConfig) with the GPUTopology plugin's args,
// its core's metrics on a free loopback port, which it returns as
// host:port.
func PluginSchedulerConfig(t testing.TB, args schedplugin.Args) (*schedconfigv1.KubeSchedulerConfiguration, string) {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	args.MetricsBindAddress = "127.0.0.1:" + strconv.Itoa(port)
	cfg, err := localcluster.PluginSchedulerConfig(args)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, args.MetricsBindAddress
}

// CAFile is the CA of kube-apiserver's serving certificate when it serves
// pods (Options.PodReachableIP); empty otherwise.
func (cp *ControlPlane) CAFile() string { return cp.local.CAFile() }

// Mode and the deciding scheduler: the one way every suite runs gputopo
// under a real scheduler in either mode (see localcluster.Decider).
type (
	Mode           = localcluster.Mode
	Decider        = localcluster.Decider
	DeciderOptions = localcluster.DeciderOptions
)

// The modes.
const (
	ModeExtender = localcluster.ModeExtender
	ModePlugin   = localcluster.ModePlugin
)

// Modes are both modes, extender first.
var Modes = localcluster.Modes

// StartDecider starts the deciding scheduler of o.Mode (see
// localcluster.StartDecider) and stops it at test cleanup. An empty
// Kubeconfig is the scheduler's own user on this control plane, an empty
// Dir a test directory. In plugin mode the scheduler's user needs the
// extender's ClusterRole (localcluster.GrantExtenderRole).
func (cp *ControlPlane) StartDecider(t testing.TB, o DeciderOptions) *Decider {
	t.Helper()
	if o.Kubeconfig == "" {
		o.Kubeconfig = cp.Kubeconfig(t, SchedulerUser)
	}
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	d, err := localcluster.StartDecider(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Stop()
		reportLog(t, d.Name, d.LogPath, d.Tail)
	})
	return d
}

// WaitCore waits up to a minute until d's core decides and holds cond's
// view of its ledger (see localcluster.Decider.WaitCore), failing the
// test otherwise.
func WaitCore(t testing.TB, d *Decider, cond func(map[string]float64) bool) {
	t.Helper()
	if err := d.WaitCore(Context(t), time.Minute, cond); err != nil {
		t.Fatal(err)
	}
}
