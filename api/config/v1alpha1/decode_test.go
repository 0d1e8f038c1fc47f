package v1alpha1

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDecodeRules: the one decoder, whatever the configuration.
func TestDecodeRules(t *testing.T) {
	for name, tc := range map[string]struct {
		obj     any
		in      string
		wantErr string // substring; empty: no error
	}{
		"a second document":                     {&ExtenderConfiguration{}, "bindTimeout: 2s\n---\nbindTimeout: 3s\n", "document 2: the file must hold one ExtenderConfiguration"},
		"a key written twice":                   {&ExtenderConfiguration{}, "bindTimeout: 2s\nbindTimeout: 3s\n", `key "bindTimeout" already set in map`},
		"a key written twice in JSON":           {&ExtenderConfiguration{}, `{"bindTimeout": "2s", "bindTimeout": "3s"}`, `key "bindTimeout" already set in map`},
		"an unknown field by its path":          {&ExtenderConfiguration{}, "thermal: {limitC: 90}\n", `unknown field "thermal.limitC"`},
		"a case-insensitive match":              {&ExtenderConfiguration{}, "BindTimeout: 2s\n", `unknown field "BindTimeout"`},
		"a nested duration needs a unit":        {&ExtenderConfiguration{}, "telemetry: {prometheus: {interval: 30}}\n", `telemetry.prometheus.interval: Invalid value: "30": a duration needs a unit`},
		"comment-only documents and separators": {&ExtenderConfiguration{}, "---\n# extender\n---\nbindTimeout: 2s\n---\n", ""},
		"not YAML":                              {&ExtenderConfiguration{}, "bindTimeout: [a\n", "decode ExtenderConfiguration document 1: "},
		"a second document, webhook":            {&WebhookConfiguration{}, "schedulerName: a\n---\n{}\n", "document 2: the file must hold one WebhookConfiguration"},
		"a key written twice, webhook":          {&WebhookConfiguration{}, `{"schedulerName": "a", "schedulerName": "b"}`, `key "schedulerName" already set in map`},
		"an unknown field by its path, webhook": {&WebhookConfiguration{}, "policyTable: {model: {strategie: x}}\n", `unknown field "policyTable.model.strategie"`},
		"a second document, node agent":         {&NodeAgentConfiguration{}, "nodeName: a\n---\nnodeName: b\n", "document 2: the file must hold one NodeAgentConfiguration"},
		"a key written twice, node agent":       {&NodeAgentConfiguration{}, "nodeName: a\nnodeName: b\n", `key "nodeName" already set in map`},
		"a case-insensitive match, node agent":  {&NodeAgentConfiguration{}, "NodeName: a\n", `unknown field "NodeName"`},
	} {
		t.Run(name, func(t *testing.T) {
			err := Decode([]byte(tc.in), tc.obj)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Decode = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestDecodeKeepsWhatTheFileLeavesOut(t *testing.T) {
	e := DefaultExtenderConfiguration()
	if err := Decode([]byte("telemetry: {prometheus: {timeout: 0}}\ntopologyMaxAge: 0\n"), e); err != nil {
		t.Fatal(err)
	}
	if e.Telemetry.Prometheus == nil || e.Telemetry.Prometheus.Timeout.Duration != 0 || e.TopologyMaxAge == nil || e.TopologyMaxAge.Duration != 0 {
		t.Errorf("a bare 0 is not a duration of 0: %+v", e)
	}
	if *e.Weights.TaskAffinity != 30 || e.BindTimeout.Duration != 4*time.Second {
		t.Errorf("fields the file leaves out changed: %+v", e)
	}
	before := *e
	if err := Decode([]byte("# nothing to change\n"), e); err != nil || !cmp.Equal(before, *e) {
		t.Errorf("an empty file changed the configuration: %v, %s", err, cmp.Diff(before, *e))
	}
	c := DefaultNodeAgentConfiguration()
	if err := Decode([]byte("nodeName: n1\nreconcileInterval: 0\n"), &c); err != nil {
		t.Fatal(err)
	}
	want := DefaultNodeAgentConfiguration()
	want.NodeName, want.ReconcileInterval.Duration = "n1", 0
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("node agent (-want +got):\n%s", diff)
	}
}

// TestImportsNoComponent: every component imports this package, so it
// imports none of theirs; of gputopo's packages only api/v1alpha1.
func TestImportsNoComponent(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, "github.com/gputopo/gputopo/") && path != "github.com/gputopo/gputopo/api/v1alpha1" {
				t.Errorf("%s imports %s", name, path)
			}
		}
	}
}
