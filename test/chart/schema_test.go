//go:build integration

package chart

import (
	"strings"
	"testing"
)

// values.schema.json (generated from values.yaml by hack/chartschema)
// makes the real helm refuse a value it does not know or of the wrong
// type, naming it, where before a typo was silently ignored and the
// default kept: `helm template` and `helm lint`, from a values file and
// from --set.
func TestChartSchemaRefusesUnknownAndMistypedValues(t *testing.T) {
	const prefix = "values don't meet the specifications of the schema(s)"
	for _, tc := range []struct {
		name string
		// values is a values file, set a --set argument.
		values, set string
		want        string
	}{
		{name: "a mistyped key", values: "nodeAgent: {deviceListStrategyy: envvar}",
			want: "at '/nodeAgent': additional properties 'deviceListStrategyy' not allowed"},
		{name: "a mistyped key from --set", set: "nodeAgent.deviceListStrategyy=envvar",
			want: "at '/nodeAgent': additional properties 'deviceListStrategyy' not allowed"},
		{name: "a mistyped section", values: "nodeagent: {enabled: false}",
			want: "additional properties 'nodeagent' not allowed"},
		{name: "a mistyped nested key", values: "extender: {tls: {enable: false}}",
			want: "at '/extender/tls': additional properties 'enable' not allowed"},
		{name: "a string for a number", values: "webhook: {replicas: two}",
			want: "at '/webhook/replicas': got string, want integer"},
		{name: "a string for a boolean from --set", set: "nodeAgent.enabled=yes",
			want: "at '/nodeAgent/enabled': got string, want boolean"},
		{name: "a map for a list", values: "webhook: {excludedNamespaces: {cert-manager: true}}",
			want: "at '/webhook/excludedNamespaces': got object, want array"},
		{name: "a number for a duration", values: "nodeAgent: {topologyInterval: 300}",
			want: "at '/nodeAgent/topologyInterval': got number, want string"},
		{name: "an unknown device list strategy", values: "nodeAgent: {deviceListStrategy: cdi-annotations}",
			want: "at '/nodeAgent/deviceListStrategy': 'cdi-annotations' does not match pattern"},
		{name: "an unknown strategy in a list", values: "nodeAgent: {deviceListStrategy: [volume-mounts, mounts]}",
			want: "at '/nodeAgent/deviceListStrategy/1': value must be one of 'envvar', 'volume-mounts', 'cdi-cri'"},
		{name: "an empty strategy list", values: "nodeAgent: {deviceListStrategy: []}",
			want: "at '/nodeAgent/deviceListStrategy': minItems: got 0, want 1"},
		{name: "an unknown scheduler mode", values: "scheduler: {mode: inprocess}",
			want: "at '/scheduler/mode': value must be one of 'extender', 'plugin'"},
		{name: "an unknown NVML access mode", values: "nodeAgent: {nvmlAccess: hostPath}",
			want: "at '/nodeAgent/nvmlAccess': value must be one of 'runtimeClass', 'privileged'"},
		{name: "an unknown policy strategy", values: "webhook: {policyTable: {data: {strategy: fastest}}}",
			want: "at '/webhook/policyTable/data/strategy': value must be one of"},
		{name: "an intent the webhook does not have", values: "webhook: {policyTable: {training: {strategy: numa_local}}}",
			want: "at '/webhook/policyTable': additional properties 'training' not allowed"},
		{name: "a webhook timeout out of range", values: "webhook: {timeoutSeconds: 9}",
			want: "at '/webhook/timeoutSeconds': maximum: got 9, want 5"},
		{name: "a negative API client rate", values: "extender: {kubeAPIQPS: -5}",
			want: "at '/extender/kubeAPIQPS': minimum: got -5, want 0"},
		{name: "a weight out of range", values: "extender: {weights: {fragmentation: 2000}}",
			want: "at '/extender/weights/fragmentation': maximum: got 2,000, want 1,000"},
		{name: "a label value that is not a string", values: "commonLabels: {team: {name: ml}}",
			want: "at '/commonLabels/team': got object, want string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rel := release{name: "gputopo", namespace: "gputopo-system", values: tc.values}
			var extra []string
			if tc.set != "" {
				extra = []string{"--set", tc.set}
			}
			for _, cmd := range [][]string{
				{"template", rel.name, chartDir(), "--namespace", rel.namespace, "--kube-version", kubeVersion},
				{"lint", chartDir(), "--namespace", rel.namespace, "--kube-version", kubeVersion},
			} {
				out, err := rel.helm(t, append(cmd, extra...)...)
				if err == nil {
					t.Fatalf("helm %s accepted %q%q:\n%.400s", cmd[0], tc.values, tc.set, out)
				}
				// helm lint reports on stdout.
				msg := err.Error() + string(out)
				if !strings.Contains(msg, prefix) || !strings.Contains(msg, tc.want) {
					t.Errorf("helm %s: %s\ndoes not say %q", cmd[0], msg, tc.want)
				}
			}
		})
	}
}

// Values that are Kubernetes objects or the user's maps take any keys, and
// the values the tests install with (the chart's defaults and every release
// of this package) pass the schema and render.
func TestChartSchemaAcceptsFreeFormValuesAndEveryTestRelease(t *testing.T) {
	free := release{name: "gputopo", namespace: "gputopo-system", values: `
commonLabels: {team: ml, cost-center: "42"}
imagePullSecrets: [{name: regcred}]
image: {tag: 20260101}
webhook:
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: infra, effect: NoSchedule}]
  affinity: {podAntiAffinity: {preferredDuringSchedulingIgnoredDuringExecution: []}}
  resources: {requests: {cpu: 10m}, limits: {cpu: "1", ephemeral-storage: 1Gi}}
  pdbMinAvailable: 50%
  policyTable: {data: {strategy: numa_local, requireNVLinkFromGPUs: 4, minPairBandwidthGBps: 0, fallbackAfter: 10m}}
extender:
  weights: {fragmentation: 40, islandBestFit: null}
  kubeAPIQPS: 12.5
shadowExtender:
  overrides: {weights: {fragmentation: 40}, thermal: {limitTemperatureC: 80}}
nodeAgent:
  deviceListStrategy: [volume-mounts, cdi-cri]
  updateStrategy: {type: OnDelete}
  affinity: {}
  tolerations: []
networkPolicy:
  metricsFrom: [{ipBlock: {cidr: 10.0.0.0/8}}]
dashboard:
  labels: {grafana_dashboard: "1", team: ml}
`}
	releases := map[string]release{"free-form values": free, "plugin mode": pluginRelease}
	for name, tc := range wants() {
		releases[name] = tc.rel
	}
	for name, rel := range releases {
		t.Run(name, func(t *testing.T) {
			if len(rel.render(t)) == 0 {
				t.Fatal("rendered nothing")
			}
			rel.lint(t)
		})
	}
}
