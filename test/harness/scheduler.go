package harness

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// SchedulerUser is the identity the harness gives kube-scheduler; the
// apiserver's bootstrap RBAC grants it exactly what a real scheduler has.
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
// default profile only). The harness points it at this control plane with
// its own kubeconfig, turns leader election off unless cfg enables it, and
// waits until /healthz answers.
func (cp *ControlPlane) StartScheduler(t testing.TB, cfg *schedconfigv1.KubeSchedulerConfiguration) *Process {
	t.Helper()
	bin, err := Binary("kube-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		cfg = &schedconfigv1.KubeSchedulerConfiguration{}
	} else {
		cfg = cfg.DeepCopy()
	}
	cfg.APIVersion, cfg.Kind = "kubescheduler.config.k8s.io/v1", "KubeSchedulerConfiguration"
	cfg.ClientConnection.Kubeconfig = cp.Kubeconfig(t, SchedulerUser)
	cfg.ClientConnection.QPS, cfg.ClientConnection.Burst = 500, 1000
	if cfg.LeaderElection.LeaderElect == nil {
		cfg.LeaderElection.LeaderElect = ptr.To(false)
	}
	doc, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatalf("encode scheduler config: %v", err)
	}
	path := filepath.Join(cp.Dir, fmt.Sprintf("scheduler-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		t.Fatalf("write scheduler config: %v", err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	p := StartProcess(t, "kube-scheduler", bin,
		"--config="+path,
		"--bind-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--v=2",
	)
	if err := waitHealthy(p, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), time.Minute); err != nil {
		t.Fatalf("kube-scheduler did not become healthy: %v\n%s", err, p.Tail(30))
	}
	return p
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

func waitHealthy(p *Process, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a local test binary's self-signed serving cert
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
