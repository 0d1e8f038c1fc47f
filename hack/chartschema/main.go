// Command chartschema writes charts/gputopo/values.schema.json, the JSON
// schema helm checks every install, upgrade, template and lint against, from
// the chart's values.yaml: so that a mistyped key (nodeAgent.deviceListStrategyy)
// or a value of the wrong type stops helm with an error naming it, instead
// of being ignored.
//
// Run it after adding or changing a value in values.yaml:
//
//	make generate                 # runs it with controller-gen's generators
//	go run ./hack/chartschema     # the same, alone
//	go run ./hack/chartschema -check   # fail if the schema is stale (make verify)
//
// and commit the schema with the values. Its unit test fails while the
// committed schema differs from what it generates.
//
// The schema follows values.yaml: every mapping is an object of exactly its
// keys (additionalProperties false), every scalar has its YAML type, a list
// has the type of its first item, and the "# --" comment above a key is its
// description. What values.yaml cannot say is in the overrides table below:
// enums, ranges, values that may be null, and the free-form values passed
// through to Kubernetes objects (nodeSelector, tolerations, affinity,
// resources, labels, ...), which accept any keys. A new value needs an
// override only when it is one of those.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Schema is the subset of JSON schema (draft-07, which every helm 3 reads)
// the chart needs. Field order is the output's key order.
type Schema struct {
	Schema      string `json:"$schema,omitempty"`
	Title       string `json:"title,omitempty"`
	Description string `json:"description,omitempty"`
	// Type is a type name or a list of them.
	Type    any      `json:"type,omitempty"`
	Enum    []string `json:"enum,omitempty"`
	Pattern string   `json:"pattern,omitempty"`
	Minimum *float64 `json:"minimum,omitempty"`
	Maximum *float64 `json:"maximum,omitempty"`
	// MinItems and Items describe lists.
	MinItems   *int               `json:"minItems,omitempty"`
	Items      *Schema            `json:"items,omitempty"`
	Properties map[string]*Schema `json:"properties,omitempty"`
	// AdditionalProperties is false (fixed keys) or a schema (a map).
	AdditionalProperties any       `json:"additionalProperties,omitempty"`
	AnyOf                []*Schema `json:"anyOf,omitempty"`
}

// override rewrites the schema inferred for the values at a path: dotted
// keys, "*" matching any one key.
type override struct {
	path string
	set  func(*Schema)
}

func ptr[T any](v T) *T { return &v }

// The schema's rewrites of what values.yaml's defaults say, by path.
func freeObject(s *Schema) { *s = Schema{Description: s.Description, Type: "object"} }

func freeList(s *Schema) { *s = Schema{Description: s.Description, Type: "array"} }

func stringMap(s *Schema) {
	*s = Schema{Description: s.Description, Type: "object", AdditionalProperties: &Schema{Type: "string"}}
}

func enum(values ...string) func(*Schema) {
	return func(s *Schema) { s.Type, s.Enum = "string", values }
}

func integer(lo, hi *float64) func(*Schema) {
	return func(s *Schema) { s.Type, s.Minimum, s.Maximum = "integer", lo, hi }
}

func number(lo, hi *float64) func(*Schema) {
	return func(s *Schema) { s.Type, s.Minimum, s.Maximum = "number", lo, hi }
}

func types(t ...string) func(*Schema) { return func(s *Schema) { s.Type = t } }

var (
	zero = ptr(0.0)
	one  = ptr(1.0)
	port = integer(one, ptr(65535.0))
	// strategies are the node agent's device list strategies
	// (DeviceListStrategies in api/config/v1alpha1).
	strategies = []string{"envvar", "volume-mounts", "cdi-cri"}
	// policyStrategies are the allocator's strategies a policy names.
	policyStrategies = []string{"highest_bandwidth", "numa_local", "balanced_utilization", "lowest_fragmentation"}
)

var overrides = []override{
	// Passed through to Kubernetes objects, or maps of the user's keys.
	{"global", freeObject}, // what a parent chart passes a subchart
	{"commonLabels", stringMap},
	{"imagePullSecrets", freeList},
	{"*.nodeSelector", stringMap},
	{"*.tolerations", freeList},
	{"*.affinity", freeObject},
	{"*.resources", freeObject},
	{"nodeAgent.updateStrategy", freeObject},
	{"shadowExtender.overrides", freeObject},
	{"networkPolicy.metricsFrom", freeList},
	{"networkPolicy.extenderFrom", freeList},
	{"serviceMonitor.labels", stringMap},
	{"prometheusRule.labels", stringMap},
	{"dashboard.labels", stringMap},

	// One of a few names.
	{"image.pullPolicy", enum("Always", "IfNotPresent", "Never")},
	{"scheduler.image.pullPolicy", enum("Always", "IfNotPresent", "Never")},
	{"certManager.issuer.kind", enum("Issuer", "ClusterIssuer")},
	{"webhook.gpuContainerEnvFrom", enum("Refuse", "Allow")},
	{"webhook.extraSystemServiceAccounts", func(s *Schema) { s.Items = &Schema{Type: "string"} }},
	// The extender configuration's fabric.levels (api/config/v1alpha1).
	{"*.fabric.levels", func(s *Schema) {
		s.Items = &Schema{Type: "object", AdditionalProperties: false, Properties: map[string]*Schema{
			"name":          {Type: "string"},
			"labels":        {Type: "array", MinItems: ptr(1), Items: &Schema{Type: "string"}},
			"bandwidthGBps": {Type: "integer", Minimum: ptr(0.0)},
		}}
	}},
	{"webhook.policyTable.*.strategy", enum(policyStrategies...)},
	{"extender.antiAffinity", enum("soft", "hard")},
	{"scheduler.genericWorkload", enum("auto", "on", "off")},
	{"extender.weights.profile", enum("placement", "design")},
	{"extender.telemetry.source", enum("nodeGPUTopology", "prometheus")},
	{"scheduler.mode", enum("extender", "plugin")},
	{"nodeAgent.nvmlAccess", enum("runtimeClass", "privileged")},
	// A name, comma-separated names, or a list of them.
	{"nodeAgent.deviceListStrategy", func(s *Schema) {
		name := "(" + strings.Join(strategies, "|") + ")"
		*s = Schema{Description: s.Description, AnyOf: []*Schema{
			{Type: "string", Pattern: `^\s*` + name + `\s*(,\s*` + name + `\s*)*$`},
			{Type: "array", MinItems: ptr(1), Items: &Schema{Type: "string", Enum: strategies}},
		}}
	}},

	// Numbers: ranges, fractions, and null for "the profile's value".
	{"logVerbosity", integer(zero, nil)},
	{"webhook.timeoutSeconds", integer(one, ptr(5.0))},
	{"*.replicas", integer(zero, nil)},
	{"webhook.port", port},
	{"extender.port", port},
	{"extender.metricsPort", port},
	{"scheduler.securePort", port},
	{"nodeAgent.metricsPort", port},
	{"webhook.pdbMinAvailable", types("integer", "string")},
	{"extender.pdbMaxUnavailable", types("integer", "string")},
	{"webhook.policyTable.*.requireNVLinkFromGPUs", integer(zero, nil)},
	{"webhook.policyTable.*.minPairBandwidthGBps", integer(zero, nil)},
	// Every intent may fall back (it matters for those requiring NVLink).
	{"webhook.policyTable.*", func(s *Schema) {
		if _, ok := s.Properties["fallbackAfter"]; !ok {
			s.Properties["fallbackAfter"] = &Schema{Type: "string"}
		}
	}},
	{"extender.kubeAPIQPS", number(zero, nil)},
	{"extender.kubeAPIBurst", integer(zero, nil)},
	{"extender.weights.*", func(s *Schema) {
		if s.Type == "null" {
			*s = Schema{Description: s.Description, Type: []string{"integer", "null"}, Minimum: zero, Maximum: ptr(1000.0)}
		}
	}},
	{"extender.shadow.sampleRate", number(zero, one)},
	{"shadowExtender.logSampleRate", number(zero, one)},
	{"prometheusRule.extenderErrorRate", number(zero, nil)},
	{"nodeAgent.criticalPodsQuota", integer(one, nil)},
	// Image tags that look like numbers (--set image.tag=20240101).
	{"image.tag", types("string", "integer")},
	{"*.image.tag", types("string", "integer")},
}

// infer is the schema of the values node n at path.
func infer(n *yaml.Node, path []string, desc string) (*Schema, error) {
	s := &Schema{Description: desc}
	switch n.Kind {
	case yaml.MappingNode:
		s.Type, s.AdditionalProperties, s.Properties = "object", false, map[string]*Schema{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			sub, err := infer(v, append(path[:len(path):len(path)], k.Value), describe(k.HeadComment))
			if err != nil {
				return nil, err
			}
			s.Properties[k.Value] = sub
		}
	case yaml.SequenceNode:
		s.Type = "array"
		if len(n.Content) > 0 {
			item, err := infer(n.Content[0], append(path[:len(path):len(path)], "[]"), "")
			if err != nil {
				return nil, err
			}
			s.Items = item
		}
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str":
			s.Type = "string"
		case "!!int":
			s.Type = "integer"
		case "!!float":
			s.Type = "number"
		case "!!bool":
			s.Type = "boolean"
		case "!!null":
			s.Type = "null"
		default:
			return nil, fmt.Errorf("%s: a value of YAML type %s", strings.Join(path, "."), n.Tag)
		}
	case yaml.AliasNode:
		return infer(n.Alias, path, desc)
	default:
		return nil, fmt.Errorf("%s: unexpected YAML node kind %v", strings.Join(path, "."), n.Kind)
	}
	overridden := false
	for _, o := range overrides {
		if matches(o.path, path) {
			o.set(s)
			overridden = true
		}
	}
	// What a default cannot say, an override must.
	where := strings.Join(path, ".")
	switch {
	case overridden:
	case s.Type == "null":
		return nil, fmt.Errorf("%s: null by default; add an override in hack/chartschema saying what it may be", where)
	case n.Kind == yaml.MappingNode && len(n.Content) == 0:
		return nil, fmt.Errorf("%s: an empty map by default; add an override in hack/chartschema (free-form, a map of strings, or its keys)", where)
	case n.Kind == yaml.SequenceNode && len(n.Content) == 0:
		return nil, fmt.Errorf("%s: an empty list by default; add an override in hack/chartschema saying what its items are", where)
	}
	return s, nil
}

func matches(pattern string, path []string) bool {
	p := strings.Split(pattern, ".")
	if len(p) != len(path) {
		return false
	}
	for i := range p {
		if p[i] != "*" && p[i] != path[i] {
			return false
		}
	}
	return true
}

// describe is a key's description: its head comment from the "# --"
// marker on (the whole comment without one), without the comment signs.
func describe(comment string) string {
	lines := strings.Split(comment, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "# --") {
			lines = lines[i:]
			lines[0] = strings.Replace(lines[0], "# --", "#", 1)
			break
		}
	}
	var out []string
	for _, l := range lines {
		l = strings.TrimPrefix(strings.TrimPrefix(l, "#"), " ")
		if l != "" || len(out) > 0 {
			out = append(out, l)
		}
	}
	return strings.TrimSpace(strings.Join(out, "\n"))
}

// Generate is the schema of values.yaml's content, as written to
// values.schema.json.
func Generate(values []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(values, &doc); err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("values.yaml: not a mapping")
	}
	// global is not in values.yaml; helm adds it for subcharts.
	root := doc.Content[0]
	root.Content = append(root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "global"},
		&yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"})
	s, err := infer(root, nil, "")
	if err != nil {
		return nil, err
	}
	s.Schema = "http://json-schema.org/draft-07/schema#"
	s.Title = "Values of the gputopo chart"
	s.Description = "Generated from values.yaml by hack/chartschema (make generate); do not edit."
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func main() {
	chart := flag.String("chart", "charts/gputopo", "the chart's directory")
	check := flag.Bool("check", false, "do not write: fail if values.schema.json differs from what values.yaml generates")
	flag.Parse()
	values, err := os.ReadFile(filepath.Join(*chart, "values.yaml"))
	if err != nil {
		fatal(err)
	}
	want, err := Generate(values)
	if err != nil {
		fatal(err)
	}
	out := filepath.Join(*chart, "values.schema.json")
	if *check {
		got, err := os.ReadFile(out)
		if err != nil || !bytes.Equal(got, want) {
			fatal(fmt.Errorf("%s is not what %s generates; run 'go run ./hack/chartschema' (make generate) and commit it", out, filepath.Join(*chart, "values.yaml")))
		}
		return
	}
	if err := os.WriteFile(out, want, 0o644); err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "chartschema:", err)
	os.Exit(1)
}
