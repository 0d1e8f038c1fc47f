package localcluster

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/schedplugin"
)

// SchedulerUser is the identity kube-scheduler gets; the apiserver's
// bootstrap RBAC grants it exactly what a real scheduler has.
const SchedulerUser = "system:kube-scheduler"

// ParseSchedulerConfig strictly decodes a KubeSchedulerConfiguration
// (kubescheduler.config.k8s.io/v1) document.
func ParseSchedulerConfig(doc []byte) (*schedconfigv1.KubeSchedulerConfiguration, error) {
	var cfg schedconfigv1.KubeSchedulerConfiguration
	if err := yaml.UnmarshalStrict(doc, &cfg); err != nil {
		return nil, fmt.Errorf("decode KubeSchedulerConfiguration: %w", err)
	}
	if cfg.APIVersion != "kubescheduler.config.k8s.io/v1" || cfg.Kind != "KubeSchedulerConfiguration" {
		return nil, fmt.Errorf("want apiVersion kubescheduler.config.k8s.io/v1, kind KubeSchedulerConfiguration; got %q %q", cfg.APIVersion, cfg.Kind)
	}
	return &cfg, nil
}

// StartScheduler runs the real kube-scheduler binary with cfg (nil: the
// default profile only) against the cluster that kubeconfig names, writing
// its config and log into dir. Leader election is off unless cfg turns it
// on. It returns once /healthz answers.
func StartScheduler(cfg *schedconfigv1.KubeSchedulerConfiguration, kubeconfig, dir string) (*Process, error) {
	return StartSchedulerBinary("kube-scheduler", cfg, kubeconfig, dir)
}

// StartSchedulerBinary is StartScheduler with another build of
// kube-scheduler from bin/: "gputopo-scheduler" is the plugin build;
// extra are more flags (--feature-gates=..., say).
func StartSchedulerBinary(name string, cfg *schedconfigv1.KubeSchedulerConfiguration, kubeconfig, dir string, extra ...string) (*Process, error) {
	bin, err := Binary(name)
	if err != nil {
		return nil, err
	}
	if cfg == nil {
		cfg = &schedconfigv1.KubeSchedulerConfiguration{}
	} else {
		cfg = cfg.DeepCopy()
	}
	cfg.APIVersion, cfg.Kind = "kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration"
	cfg.ClientConnection.Kubeconfig = kubeconfig
	cfg.ClientConnection.QPS, cfg.ClientConnection.Burst = 500, 1000
	if cfg.LeaderElection.LeaderElect == nil {
		cfg.LeaderElection.LeaderElect = ptr.To(false)
	}
	doc, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("encode scheduler config: %w", err)
	}
	// The binary runs in a working directory of its own: every path it is
	// given must be absolute.
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, fmt.Errorf("scheduler dir: %w", err)
	}
	stamp := time.Now().UnixNano()
	path := filepath.Join(dir, fmt.Sprintf("scheduler-%d.yaml", stamp))
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		return nil, fmt.Errorf("write scheduler config: %w", err)
	}
	return startServing(name, dir, stamp, bin, func(port int) []string {
		return append([]string{
			"--config=" + path,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--v=2",
		}, extra...)
	})
}

// startServing starts a binary that serves /healthz over HTTPS on a free
// port and waits until it answers. FreePort cannot reserve the port, so
// when another process takes it first the binary exits with "address
// already in use"; then it is started again on another port.
func startServing(name, dir string, stamp int64, bin string, args func(port int) []string) (*Process, error) {
	var last error
	for attempt := 1; attempt <= 3; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		p, err := StartProcess(name, filepath.Join(dir, fmt.Sprintf("%s-%d-%d.log", name, stamp, attempt)), bin, args(port)...)
		if err != nil {
			return nil, err
		}
		err = WaitHealthy(p, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), time.Minute)
		if err == nil {
			return p, nil
		}
		p.Stop()
		last = fmt.Errorf("%s did not become healthy: %w\n%s", name, err, p.Tail(30))
		if !p.LogContains("address already in use") {
			break
		}
	}
	return nil, last
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitHealthy polls url (HTTP or HTTPS with a self-signed certificate)
// until it answers 200, the process exits, or timeout passes.
func WaitHealthy(p *Process, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a local binary's self-signed serving cert
	}}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("%s exited: %v", p.Name, err)
		}
		resp, err := hc.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// ChartSchedulerConfig is the Helm chart's KubeSchedulerConfiguration
// (charts/gputopo/files/scheduler-config.yaml), the one a Helm install runs,
// with its extender's scheme and host replaced by those of extenderURL (the
// path of the file's urlPrefix kept), as the chart replaces them with its
// Service. Leader election is off: one local scheduler, and no
// gputopo-system namespace for its Lease.
func ChartSchedulerConfig(extenderURL string) (*schedconfigv1.KubeSchedulerConfiguration, error) {
	cfg, err := readChartSchedulerConfig("scheduler-config.yaml", "scheduler config")
	if err != nil {
		return nil, err
	}
	if len(cfg.Extenders) != 1 {
		return nil, fmt.Errorf("the chart's scheduler config has %d extenders, want 1", len(cfg.Extenders))
	}
	in, err := url.Parse(cfg.Extenders[0].URLPrefix)
	if err != nil {
		return nil, fmt.Errorf("the chart's extender urlPrefix: %w", err)
	}
	to, err := url.Parse(extenderURL)
	if err != nil || to.Host == "" {
		return nil, fmt.Errorf("extender URL %q: want scheme://host:port", extenderURL)
	}
	in.Scheme, in.Host = to.Scheme, to.Host
	cfg.Extenders[0].URLPrefix = in.String()
	cfg.LeaderElection.LeaderElect = ptr.To(false)
	return cfg, nil
}

// readChartSchedulerConfig reads the chart's KubeSchedulerConfiguration
// file (under charts/gputopo/files), what it is for the error.
func readChartSchedulerConfig(file, what string) (*schedconfigv1.KubeSchedulerConfiguration, error) {
	doc, err := os.ReadFile(filepath.Join(RepoRoot(), "charts", "gputopo", "files", file))
	if err != nil {
		return nil, fmt.Errorf("read the chart's %s: %w", what, err)
	}
	return ParseSchedulerConfig(doc)
}

// PluginSchedulerConfig is the Helm chart's plugin-mode
// KubeSchedulerConfiguration (charts/gputopo/files/scheduler-config-plugin.yaml),
// the one `scheduler.mode: plugin` runs in gputopo-scheduler, with the
// GPUTopology plugin's args replaced by args and leader election off.
func PluginSchedulerConfig(args schedplugin.Args) (*schedconfigv1.KubeSchedulerConfiguration, error) {
	cfg, err := readChartSchedulerConfig("scheduler-config-plugin.yaml", "plugin scheduler config")
	if err != nil {
		return nil, err
	}
	if len(cfg.Profiles) != 1 || len(cfg.Profiles[0].PluginConfig) != 1 || cfg.Profiles[0].PluginConfig[0].Name != schedplugin.Name {
		return nil, fmt.Errorf("the chart's plugin scheduler config: want one profile with pluginConfig for %s only", schedplugin.Name)
	}
	raw, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	cfg.Profiles[0].PluginConfig[0].Args.Raw = raw
	cfg.LeaderElection.LeaderElect = ptr.To(false)
	return cfg, nil
}
