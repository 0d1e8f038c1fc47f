package kubelet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gputopo/gputopo/test/harness"
)

// StartDNS runs CoreDNS (bin/coredns, `make tools`) with its kubernetes
// plugin on ip:53, answering for cluster.local from the control plane's
// Services and EndpointSlices: the cluster DNS that pods given
// Options.ClusterDNS = ip resolve Service names with. It returns once
// CoreDNS answers.
func StartDNS(t testing.TB, cp *harness.ControlPlane, ip string) *harness.Process {
	t.Helper()
	bin, err := harness.Binary("coredns")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	corefile := fmt.Sprintf(`cluster.local:53 in-addr.arpa:53 {
    bind %s
    errors
    kubernetes cluster.local in-addr.arpa {
        kubeconfig %s
    }
}
`, ip, cp.Kubeconfig(t, "gputopo-test-coredns", "system:masters"))
	path := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(path, []byte(corefile), 0o600); err != nil {
		t.Fatal(err)
	}
	p := harness.StartProcess(t, "coredns", bin, "-conf", path)
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", net.JoinHostPort(ip, "53"))
	}}
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := r.LookupHost(ctx, "kubernetes.default.svc.cluster.local")
		cancel()
		if err == nil {
			return p
		}
		if exited, _ := p.Exited(); exited || time.Now().After(deadline) {
			t.Fatalf("CoreDNS on %s:53 does not resolve kubernetes.default.svc.cluster.local: %v\n%s", ip, err, p.Tail(20))
		}
		time.Sleep(300 * time.Millisecond)
	}
}
