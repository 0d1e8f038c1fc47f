package kubelet

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/test/harness"
)

// StartProxy runs the real kube-proxy (bin/, `make tools`) for nodeName in
// iptables mode, so that Services' ClusterIPs work for pods on the
// containerd network and for the host (kube-apiserver calling a webhook
// Service). It leaves the host's conntrack settings alone. At cleanup it
// stops kube-proxy, runs `kube-proxy --cleanup`, and fails the test if a
// KUBE- chain is left in the host's iptables.
func StartProxy(t testing.TB, cp *harness.ControlPlane, nodeName string) *harness.Process {
	t.Helper()
	bin, err := harness.Binary("kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Fatal("kube-proxy's iptables mode needs iptables: apt-get install iptables")
	}
	dir := t.TempDir()
	healthz, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	metrics, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The bootstrap policy binds system:node-proxier to this user.
	kubeconfig := cp.Kubeconfig(t, "system:kube-proxy")
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %q
mode: iptables
hostnameOverride: %q
clusterCIDR: %q
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
iptables:
  localhostNodePorts: false
`, kubeconfig, nodeName, podSubnet, healthz, metrics)
	path := filepath.Join(dir, "kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "--cleanup").CombinedOutput(); err != nil {
			t.Errorf("kube-proxy --cleanup: %v\n%s", err, out)
		}
		if left := kubeChains(); len(left) > 0 {
			t.Errorf("iptables chains left after kube-proxy --cleanup: %v", left)
		}
	})
	return harness.StartProcess(t, "kube-proxy", bin, "--config="+path, "--v=2")
}

// kubeChains lists kube-proxy's chains in the host's iptables (kubelet's
// own KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY and KUBE-FIREWALL are
// kubelet's, not kube-proxy's).
func kubeChains() []string {
	out, err := exec.Command("iptables-save").Output()
	if err != nil {
		return nil
	}
	var chains []string
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, ":KUBE-") {
			continue
		}
		name := strings.Fields(line)[0][1:]
		switch name {
		case "KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY", "KUBE-FIREWALL":
			continue
		}
		chains = append(chains, name)
	}
	return chains
}
