//go:build integration

package chart

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/nodeagent"
)

// nodeAgentPodSpec renders the release and returns the agent's pod spec.
func nodeAgentPodSpec(t *testing.T, r release) corev1.PodSpec {
	t.Helper()
	var ds appsv1.DaemonSet
	into(t, find(t, r.render(t), "DaemonSet", r.fullname()+"-nodeagent"), &ds)
	return ds.Spec.Template.Spec
}

// nodeDeviceListFlags are the device list options the agent parses from
// its rendered arguments.
func nodeDeviceListFlags(t *testing.T, args []string) nodeagent.Options {
	t.Helper()
	var o nodeagent.Options
	fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
	o.AddFlags(fs)
	fs.ParseErrorsAllowlist.UnknownFlags = true // --v and --kubeconfig belong to the command
	if err := fs.Parse(args[1:]); err != nil {
		t.Fatalf("agent args %q: %v", args, err)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("agent args %q do not validate: %v", args, err)
	}
	return o
}

func TestChartRendersDeviceListStrategyForTheNodeAgent(t *testing.T) {
	for _, tc := range []struct {
		name           string
		values         string
		wantStrategies []string
		// wantKind is the --cdi-kind rendered; empty: none.
		wantKind string
	}{
		{name: "by default cdi-cri with the CDI kind", wantStrategies: []string{"cdi-cri"}, wantKind: "nvidia.com/gpu"},
		{name: "envvar by explicit choice, no CDI kind", values: "nodeAgent: {deviceListStrategy: envvar}", wantStrategies: []string{"envvar"}},
		{
			name:           "comma-separated names with spaces",
			values:         `nodeAgent: {deviceListStrategy: "volume-mounts, cdi-cri", cdiKind: example.com/gpu}`,
			wantStrategies: []string{"volume-mounts", "cdi-cri"}, wantKind: "example.com/gpu",
		},
		{
			name:           "a list, repeats counted once, CDI kind defaulted",
			values:         "nodeAgent: {deviceListStrategy: [cdi-cri, cdi-cri]}",
			wantStrategies: []string{"cdi-cri"}, wantKind: "nvidia.com/gpu",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rel := release{name: "gputopo", namespace: "gputopo-system", values: tc.values}
			args := nodeAgentPodSpec(t, rel).Containers[0].Args
			o := nodeDeviceListFlags(t, args)
			if diff := cmp.Diff(tc.wantStrategies, o.DeviceListStrategies); diff != "" {
				t.Errorf("strategies the agent parses from %q (-want +got):\n%s", args, diff)
			}
			hasKind := slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--cdi-kind") })
			if tc.wantKind == "" && hasKind {
				t.Errorf("args %q carry --cdi-kind without cdi-cri", args)
			}
			if tc.wantKind != "" && o.CDIKind != tc.wantKind {
				t.Errorf("CDI kind the agent parses from %q: %q, want %q", args, o.CDIKind, tc.wantKind)
			}
		})
	}
}

// With nvmlAccess runtimeClass the agent asks the toolkit for every GPU
// through a /dev/null mount as well as the env, so it still sees them on a
// node whose toolkit refuses the env of unprivileged containers.
func TestChartRendersTheAgentsOwnDeviceListMount(t *testing.T) {
	const mountPath = "/var/run/nvidia-container-devices/all"
	for _, tc := range []struct {
		name, values string
		want         bool
	}{
		{name: "runtimeClass access mounts /dev/null at the device list root's all", want: true},
		{name: "privileged access has no device list mount", values: "nodeAgent: {nvmlAccess: privileged}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := nodeAgentPodSpec(t, release{name: "gputopo", namespace: "gputopo-system", values: tc.values})
			var volume string
			for _, m := range spec.Containers[0].VolumeMounts {
				if m.MountPath == mountPath {
					volume = m.Name
				}
			}
			var source *corev1.HostPathVolumeSource
			for _, v := range spec.Volumes {
				if v.Name == volume {
					source = v.HostPath
				}
			}
			got := volume != "" && source != nil && source.Path == "/dev/null" &&
				source.Type != nil && *source.Type == corev1.HostPathCharDev
			if got != tc.want {
				t.Errorf("host /dev/null (CharDevice) mounted at %s: %v, want %v (volume %q, source %+v)", mountPath, got, tc.want, volume, source)
			}
		})
	}
}

// The template's own checks, which stand when helm runs with
// --skip-schema-validation; values.schema.json refuses the same values
// first (TestChartSchemaRefusesUnknownAndMistypedValues).
func TestChartRenderRefusesBadDeviceListStrategy(t *testing.T) {
	for name, tc := range map[string]struct{ values, want string }{
		"an unknown strategy": {"nodeAgent: {deviceListStrategy: cdi-annotations}",
			`nodeAgent.deviceListStrategy: "cdi-annotations" is not supported; use envvar, volume-mounts or cdi-cri`},
		"an unknown strategy in a list": {"nodeAgent: {deviceListStrategy: [volume-mounts, mounts]}",
			`nodeAgent.deviceListStrategy: "mounts" is not supported`},
		"an unknown strategy after a comma": {`nodeAgent: {deviceListStrategy: "envvar,Volume-Mounts"}`,
			`nodeAgent.deviceListStrategy: "Volume-Mounts" is not supported`},
		"an empty name": {`nodeAgent: {deviceListStrategy: ""}`,
			`nodeAgent.deviceListStrategy: "" is not supported`},
		"an empty list": {"nodeAgent: {deviceListStrategy: []}",
			"nodeAgent.deviceListStrategy: empty; name at least one of envvar, volume-mounts or cdi-cri"},
		"a map": {"nodeAgent: {deviceListStrategy: {envvar: true}}",
			"is not a strategy name or a list of them"},
	} {
		t.Run(name, func(t *testing.T) {
			rel := release{name: "gputopo", namespace: "gputopo-system", values: tc.values}
			out, err := rel.helm(t, "template", rel.name, chartDir(), "--namespace", rel.namespace, "--kube-version", kubeVersion, "--skip-schema-validation")
			if err == nil {
				t.Fatalf("helm template accepted %q:\n%.400s", tc.values, out)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}
