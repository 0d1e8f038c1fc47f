package main

import (
	"os"
	"os/exec"
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
