package v1alpha1

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestNodeAgentDefaultsGolden pins the node agent's defaults, which are
// its flags' (NodeName aside).
func TestNodeAgentDefaultsGolden(t *testing.T) {
	want := checkGolden(t, "nodeagent", DefaultNodeAgentConfiguration())
	// The golden file is a configuration that lacks only the node's name.
	if _, err := ParseNodeAgent(want); err == nil || err.Error() != "invalid NodeAgentConfiguration: nodeName: Required value: set --node-name or $NODE_NAME (downward API spec.nodeName)" {
		t.Errorf("golden defaults: %v, want only nodeName required", err)
	}
}

func TestParseNodeAgent(t *testing.T) {
	runParseCases(t, ParseNodeAgent, DefaultNodeAgentConfiguration, map[string]parseCase[NodeAgentConfiguration]{
		"a file states only what it changes": {
			in: "apiVersion: config.gputopo.io/v1alpha1\nkind: NodeAgentConfiguration\nnodeName: n1\ntelemetryInterval: 1m\ndeviceListStrategies: [cdi-cri]\n",
			want: func(c *NodeAgentConfiguration) {
				c.APIVersion, c.Kind = NodeAgentAPIVersion, NodeAgentKind
				c.NodeName = "n1"
				c.TelemetryInterval = metav1.Duration{Duration: time.Minute}
				c.DeviceListStrategies = []string{"cdi-cri"}
			},
		},
		"an empty toolkitConfig skips the toolkit check": {
			in:   `{"nodeName": "n1", "toolkitConfig": ""}`,
			want: func(c *NodeAgentConfiguration) { c.NodeName, c.ToolkitConfig = "n1", "" },
		},
		"every invalid field is reported with its path": {
			in: "kind: WebhookConfiguration\nresourceName: \"\"\ntopologyInterval: 0\nreconcileInterval: -1s\ndevicePluginDir: \"\"\n" +
				"deviceListStrategies: [envvar, mounts]\ncdiKind: nvidia.com\n",
			wantErr: `invalid NodeAgentConfiguration: [kind: Unsupported value: "WebhookConfiguration": supported values: "NodeAgentConfiguration", ` +
				`nodeName: Required value: set --node-name or $NODE_NAME (downward API spec.nodeName), ` +
				`resourceName: Required value: e.g. nvidia.com/gpu, ` +
				`topologyInterval: Invalid value: "0s": must be a positive duration, e.g. 30s, ` +
				`reconcileInterval: Invalid value: "-1s": must be a positive duration, e.g. 30s, ` +
				`devicePluginDir: Required value: kubelet's device plugin directory, ` +
				`deviceListStrategies[1]: Unsupported value: "mounts": supported values: "envvar", "volume-mounts", "cdi-cri", ` +
				`cdiKind: Invalid value: "nvidia.com": must be a CDI kind <vendor>/<class> (letters, digits, '-', '_', and '.' in the vendor), e.g. nvidia.com/gpu]`,
		},
		"a duration without a unit and an unknown field": {
			in:      "nodeName: n1\ntelemetryInterval: 30\ndeviceListStrategy: envvar\n",
			wantErr: `invalid NodeAgentConfiguration: [telemetryInterval: Invalid value: "30": a duration needs a unit, e.g. 15m, 90s or 2m30s (only 0 may be written without one), unknown field "deviceListStrategy"]`,
		},
	})
}

func TestValidateDeviceListNamesThePaths(t *testing.T) {
	c := DefaultNodeAgentConfiguration()
	c.NodeName, c.CDIKind, c.DeviceListStrategies = "n1", "", nil
	if errs := c.Validate(); len(errs) > 0 {
		t.Errorf("empty strategies and CDI kind (envvar, %s) are valid: %v", DefaultCDIKind, errs)
	}
	c.DeviceListStrategies = []string{"Volume-Mounts"}
	if errs := c.Validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), `deviceListStrategies[0]: Unsupported value: "Volume-Mounts"`) {
		t.Errorf("a strategy is case-sensitive: %v", errs)
	}
}
