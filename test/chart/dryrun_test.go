//go:build integration

package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/test/harness"
)

// Versions of the modules whose CRDs the chart's objects are checked
// against: the cert-manager and Prometheus Operator releases users run.
const (
	certManagerModule        = "github.com/cert-manager/cert-manager@v1.21.2"
	prometheusOperatorModule = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
)

// moduleDir downloads a module into the module cache (a no-op when it is
// there) and returns its directory. It runs outside the main module so
// that neither go.mod nor go.sum changes: the module's Go code is never
// built, only its CRD files are read.
func moduleDir(t testing.TB, module string) string {
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

// installThirdPartyCRDs installs cert-manager's CRDs (deploy/crds, the
// source its Helm chart's CRD templates are generated from) and the
// ServiceMonitor CRD, and waits until they are served.
func installThirdPartyCRDs(t testing.TB, cp *harness.ControlPlane) {
	t.Helper()
	cm := filepath.Join(moduleDir(t, certManagerModule), "deploy", "crds")
	po := filepath.Join(moduleDir(t, prometheusOperatorModule), "example", "prometheus-operator-crd", "monitoring.coreos.com_servicemonitors.yaml")
	crds, err := envtest.InstallCRDs(cp.Config, envtest.CRDInstallOptions{Paths: []string{cm, po}, ErrorIfPathMissing: true})
	if err != nil {
		t.Fatalf("install cert-manager and ServiceMonitor CRDs: %v", err)
	}
	if len(crds) < 7 {
		t.Fatalf("installed %d third-party CRDs, want cert-manager's 6 and ServiceMonitor", len(crds))
	}
}

func createNamespace(t testing.TB, cp *harness.ControlPlane, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cp.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", name, err)
	}
}

// apply server-side applies obj as helm's field manager; dryRun asks the
// apiserver to run every validation and admission step and persist
// nothing.
func apply(ctx context.Context, cp *harness.ControlPlane, dyn dynamic.Interface, obj *unstructured.Unstructured, dryRun bool) error {
	gvk := obj.GroupVersionKind()
	mapping, err := cp.Client.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	ri := dyn.Resource(mapping.Resource)
	var r dynamic.ResourceInterface = ri
	if mapping.Scope.Name() == "namespace" {
		r = ri.Namespace(obj.GetNamespace())
	}
	opts := metav1.ApplyOptions{FieldManager: "helm", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = r.Apply(ctx, obj.GetName(), obj, opts)
	return err
}

// Every object of both releases, and of certs/, is accepted by a real
// kube-apiserver that knows cert-manager's and Prometheus Operator's CRDs.
func TestRenderedManifestsPassServerSideDryRun(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := harness.Context(t)
	installThirdPartyCRDs(t, cp)
	dyn, err := dynamic.NewForConfig(cp.Config)
	if err != nil {
		t.Fatalf("dynamic client: %v", err)
	}
	sets := map[string][]*unstructured.Unstructured{}
	for name, tc := range wants() {
		sets["chart, "+name] = tc.rel.render(t)
		createNamespace(t, cp, tc.rel.namespace)
	}
	// Plugin mode (no extender Deployment; gputopo-scheduler from the
	// gputopo image), with NetworkPolicies and ServiceMonitors on.
	plugin := release{name: "inproc", namespace: "gputopo-plugin", values: pluginRelease.values + "networkPolicy: {enabled: true, metricsFrom: [{namespaceSelector: {}}]}\nserviceMonitor: {enabled: true}\n"}
	sets["chart, plugin mode"] = plugin.render(t)
	createNamespace(t, cp, plugin.namespace)
	sets["certs/"] = loadKustomization(t, filepath.Join(harness.RepoRoot(), "certs"))
	for name, objs := range sets {
		t.Run(name, func(t *testing.T) {
			kinds := map[string]int{}
			for _, o := range objs {
				if o.GetKind() == "CustomResourceDefinition" {
					continue // installed by the harness from the same crds/ directory
				}
				if err := apply(ctx, cp, dyn, o, true); err != nil {
					t.Errorf("%s %s/%s refused: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
					continue
				}
				kinds[o.GetKind()]++
			}
			if len(kinds) == 0 {
				t.Fatal("nothing was applied")
			}
			t.Logf("accepted: %v", kinds)
		})
	}
}
