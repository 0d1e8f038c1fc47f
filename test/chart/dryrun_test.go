//go:build integration

package chart

import (
	"context"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/gputopo/gputopo/test/harness"
)

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
	harness.InstallThirdPartyCRDs(t, cp)
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
