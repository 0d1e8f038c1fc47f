package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestPluginNeedsNoCgo keeps the plugin cross-compilable for the krew
// manifest's platforms: nothing it imports may pull in go-nvml (cgo).
func TestPluginNeedsNoCgo(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=darwin", "GOARCH=arm64")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "go-nvml") {
			t.Errorf("kubectl-gputopo depends on %s, which needs cgo; keep NVML code out of the plugin", pkg)
		}
	}
}

// TestKubectlBinaryLinksNoServerNorFake keeps `kubectl gputopo` a client:
// it runs the decision core offline, so it links neither the HTTP
// extender (its server, TLS and shadow mode) nor client-go's fake
// clientset or any other test double. (k8s.io/client-go/testing itself
// comes with client-go's typed clients, through gentype.)
func TestKubectlBinaryLinksNoServerNorFake(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/gputopo/gputopo/placement") {
		t.Fatalf("kubectl-gputopo does not link the decision core; the check below would prove nothing: %v", deps)
	}
	for _, pkg := range deps {
		for _, banned := range []string{
			"github.com/gputopo/gputopo/extender",
			"github.com/gputopo/gputopo/internal/fakeapi",
			"k8s.io/client-go/kubernetes/fake",
			"sigs.k8s.io/controller-runtime/pkg/client/fake",
		} {
			if pkg == banned || strings.HasPrefix(pkg, banned+"/") {
				t.Errorf("kubectl-gputopo links %s; the plugin must call the decision core (placement) directly", pkg)
			}
		}
	}
}
