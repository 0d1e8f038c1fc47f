//go:build integration

package ecosystem

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

// kubebuilderConfig is the Configuration JobSet's and LeaderWorkerSet's
// managers read (apiVersion names the controller's config group): leader
// election, internal certificate management, metrics and probes off, the
// webhook server on 127.0.0.1:port serving the certificate in certDir.
func kubebuilderConfig(apiVersion string, port int, certDir string) string {
	return fmt.Sprintf(`apiVersion: %s
kind: Configuration
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
metrics:
  bindAddress: "0"
health:
  healthProbeBindAddress: "0"
`, apiVersion, port, certDir)
}

// startManager runs a controller manager built by make tools (bin/<name>)
// as a cluster admin with the configuration cfg (--config), through wrap
// when it is not empty (a command that ends by running the rest of its
// arguments), and waits until ready says it serves.
func (e *env) startManager(t *testing.T, name, cfg string, wrap []string, ready func(p *localcluster.Process) (bool, string)) {
	t.Helper()
	bin, err := localcluster.Binary(name)
	if err != nil {
		t.Fatalf("%v (make tools builds it)", err)
	}
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append(append(wrap[:len(wrap):len(wrap)], bin), "--config", path, "--kubeconfig", e.cp.Kubeconfig(t, name, "system:masters"))
	p := harness.StartProcess(t, name, args[0], args[1:]...)
	harness.Poll(t, time.Minute, name+" to serve", func() (bool, string) {
		if exited, err := p.Exited(); exited {
			t.Fatalf("%s exited: %v\n%s", name, err, p.Tail(30))
		}
		return ready(p)
	})
}

// waitAllFreed waits until no pod is left in nsTeam and the deciding
// core holds no GPU, after what was deleted, and says so when that takes
// longer than within. It confirms pod deletions as kubelet would.
func (e *env) waitAllFreed(t *testing.T, what string, within time.Duration) {
	t.Helper()
	ctx := harness.Context(t)
	start := time.Now()
	harness.Poll(t, time.Minute, "every GPU free after "+what+" was deleted", func() (bool, string) {
		left := 0
		for _, p := range listPods(t, e) {
			left++
			if p.DeletionTimestamp != nil {
				_ = e.cp.Clientset.CoreV1().Pods(nsTeam).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			}
		}
		h := e.held(t)
		return left == 0 && h == 0, fmt.Sprintf("%d pods left, %d GPUs held", left, h)
	})
	if d := time.Since(start); d > within {
		t.Errorf("GPUs freed %s after %s was deleted, want within %s", d.Round(time.Second), what, within)
	}
}

// anyMap is m as the map[string]any of an unstructured object.
func anyMap(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
