package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// RepoRoot is the repository root, found from this file's location so that
// tests work from any package directory.
func RepoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		wd, _ := os.Getwd()
		return wd
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// BinDir is where hack/tools puts the control-plane binaries. It honours
// KUBEBUILDER_ASSETS, which envtest reads too.
func BinDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	return filepath.Join(RepoRoot(), "bin")
}

// CRDDir holds gputopo's generated CRDs; the Helm chart installs the same
// files.
func CRDDir() string { return filepath.Join(RepoRoot(), "charts", "gputopo", "crds") }

// Binary returns the path of a control-plane binary, or an error that says
// how to build it.
func Binary(name string) (string, error) {
	p := filepath.Join(BinDir(), name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("control-plane binary %s not found in %s: run `make tools` first (about 15 minutes cold): %w", name, BinDir(), err)
	}
	return p, nil
}
