package harness

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Versions of the modules whose CRDs the chart's objects are checked
// against and installed with: the cert-manager and Prometheus Operator
// releases users run.
const (
	CertManagerModule        = "github.com/cert-manager/cert-manager@v1.21.2"
	PrometheusOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
)

// ModuleDir downloads a module into the module cache (a no-op when it is
// there) and returns its directory. It runs outside the main module so
// that neither go.mod nor go.sum changes: the module's Go code is never
// built, only its CRD files are read.
func ModuleDir(t testing.TB, module string) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", module)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GO111MODULE=on")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go mod download %s (needs the module proxy once, then the module cache): %v\n%s%s", module, err, stdout.String(), stderr.String())
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: no directory in %q (%v)", module, stdout.String(), err)
	}
	return info.Dir
}

// InstallThirdPartyCRDs installs cert-manager's CRDs (deploy/crds, the
// source its Helm chart's CRD templates are generated from) and the
// ServiceMonitor CRD, and waits until they are served.
func InstallThirdPartyCRDs(t testing.TB, cp *ControlPlane) {
	t.Helper()
	cm := filepath.Join(ModuleDir(t, CertManagerModule), "deploy", "crds")
	po := filepath.Join(ModuleDir(t, PrometheusOperatorModule), "example", "prometheus-operator-crd", "monitoring.coreos.com_servicemonitors.yaml")
	crds, err := envtest.InstallCRDs(cp.Config, envtest.CRDInstallOptions{Paths: []string{cm, po}, ErrorIfPathMissing: true})
	if err != nil {
		t.Fatalf("install cert-manager and ServiceMonitor CRDs: %v", err)
	}
	if len(crds) < 7 {
		t.Fatalf("installed %d third-party CRDs, want cert-manager's 6 and ServiceMonitor", len(crds))
	}
}
