package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The committed schema is what the committed values.yaml generates.
func TestSchemaIsUpToDate(t *testing.T) {
	chart := filepath.Join("..", "..", "charts", "gputopo")
	values, err := os.ReadFile(filepath.Join(chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := Generate(values)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(chart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("charts/gputopo/values.schema.json is stale: run 'go run ./hack/chartschema' (make generate) and commit it")
	}
}

func TestGenerate(t *testing.T) {
	for _, tc := range []struct {
		name, values string
		// want are substrings of the schema; err of the error.
		want []string
		err  string
	}{
		{name: "fixed keys, YAML types, the description from # --",
			values: "# A section.\nnodeAgent:\n  # -- Run it.\n  enabled: true\n  port: 9400\n  rate: 0.5\n  name: x\n  names: [a]\n",
			want: []string{`"nodeAgent": {
      "description": "A section.",
      "type": "object",
      "properties": {
        "enabled": {
          "description": "Run it.",
          "type": "boolean"
        },
        "name": {
          "type": "string"
        },
        "names": {
          "type": "array",
          "items": {
            "type": "string"
          }
        },
        "port": {
          "type": "integer"
        },
        "rate": {
          "type": "number"
        }
      },
      "additionalProperties": false
    }`}},
		{name: "overrides by path: an enum, a free-form map, a nullable weight",
			values: "scheduler:\n  mode: extender\n  nodeSelector: {}\nextender:\n  weights:\n    fragmentation: null\n",
			want: []string{`"enum": [
            "extender",
            "plugin"
          ]`, `"nodeSelector": {
          "type": "object",
          "additionalProperties": {
            "type": "string"
          }
        }`, `"type": [
                "integer",
                "null"
              ]`}},
		{name: "an empty map without an override is refused", values: "extender:\n  annotations: {}\n",
			err: "extender.annotations: an empty map by default; add an override in hack/chartschema"},
		{name: "an empty list without an override is refused", values: "webhook:\n  extraArgs: []\n",
			err: "webhook.extraArgs: an empty list by default"},
		{name: "null without an override is refused", values: "webhook:\n  maxPods: null\n",
			err: "webhook.maxPods: null by default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Generate([]byte(tc.values))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(got), w) {
					t.Errorf("schema lacks\n%s\nin\n%s", w, got)
				}
			}
			if !strings.Contains(string(got), `"global": {`) {
				t.Errorf("schema lacks the global values a parent chart passes")
			}
		})
	}
}
