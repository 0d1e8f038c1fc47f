//go:build integration

package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/test/harness"
)

// kubeVersion is the cluster version helm renders for; the chart requires
// at least 1.30 and helm's built-in default is older.
const kubeVersion = "1.37.2"

// release is one way of installing the chart.
type release struct {
	name      string
	namespace string
	// values is a values file's content; empty uses the chart's defaults.
	values string
}

// Prefix of the component names; helm's fullname rule gives the release
// name when it contains "gputopo", else "<release>-gputopo".
func (r release) fullname() string {
	if strings.Contains(r.name, "gputopo") {
		return r.name
	}
	return r.name + "-gputopo"
}

func chartDir() string { return filepath.Join(harness.RepoRoot(), "charts", "gputopo") }

func helmBin(t testing.TB) string {
	t.Helper()
	bin, err := harness.Binary("helm")
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// helm runs the helm binary with args plus the release's values file; it
// returns stdout, and stderr inside the error.
func (r release) helm(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	if r.values != "" {
		// helm splits --values on commas, which test names can contain, so
		// the file does not live in t.TempDir().
		dir, err := os.MkdirTemp("", "gputopo-chart-values-")
		if err != nil {
			t.Fatalf("temp dir: %v", err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		p := filepath.Join(dir, "values.yaml")
		if err := os.WriteFile(p, []byte(r.values), 0o600); err != nil {
			t.Fatalf("write values: %v", err)
		}
		args = append(args, "--values", p)
	}
	cmd := exec.Command(helmBin(t), args...)
	// No user's helm configuration, cache or plugins may change the result.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), errors.Join(err, errors.New(strings.TrimSpace(stderr.String())))
	}
	return stdout.Bytes(), nil
}

func (r release) lint(t testing.TB) {
	t.Helper()
	out, err := r.helm(t, "lint", chartDir(), "--strict", "--namespace", r.namespace, "--kube-version", kubeVersion)
	if err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}

// render returns every object helm template produces, CRDs included.
func (r release) render(t testing.TB) []*unstructured.Unstructured {
	t.Helper()
	objs, err := r.renderFor(t, kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// renderFor renders the release for a cluster of Kubernetes version kv,
// returning helm's error when it refuses.
func (r release) renderFor(t testing.TB, kv string) ([]*unstructured.Unstructured, error) {
	t.Helper()
	out, err := r.helm(t, "template", r.name, chartDir(), "--namespace", r.namespace, "--kube-version", kv, "--include-crds")
	if err != nil {
		return nil, fmt.Errorf("helm template for Kubernetes %s: %w", kv, err)
	}
	objs, err := decodeObjects(out)
	if err != nil {
		return nil, fmt.Errorf("decode rendered manifests: %w", err)
	}
	return objs, nil
}

// decodeObjects splits a multi-document YAML stream into objects, skipping
// empty documents.
func decodeObjects(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, errors.New("document without apiVersion or kind: " + strings.TrimSpace(string(mustYAML(m))))
		}
		objs = append(objs, u)
	}
}

func mustYAML(v any) []byte {
	b, err := yaml.Marshal(v)
	if err != nil {
		return []byte(err.Error())
	}
	return b
}

// find returns the rendered object of kind and name, failing the test when
// there is none.
func find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %q among the rendered objects", kind, name)
	return nil
}

func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

// into converts a rendered object into a typed one, strictly: a field the
// typed API does not know is an error, as the apiserver would report it.
func into(t testing.TB, u *unstructured.Unstructured, out any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// configData returns data[key] of a rendered ConfigMap.
func configData(t testing.TB, objs []*unstructured.Unstructured, name, key string) []byte {
	t.Helper()
	cm := find(t, objs, "ConfigMap", name)
	v, ok, err := unstructured.NestedString(cm.Object, "data", key)
	if err != nil || !ok {
		t.Fatalf("ConfigMap %s has no data[%q] (err %v)", name, key, err)
	}
	return []byte(v)
}
