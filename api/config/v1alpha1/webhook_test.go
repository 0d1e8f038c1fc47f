package v1alpha1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// TestWebhookDefaultsGolden pins every default.
func TestWebhookDefaultsGolden(t *testing.T) {
	checkGolden(t, "webhook", DefaultWebhookConfiguration())
	if errs := DefaultWebhookConfiguration().Validate(); len(errs) > 0 {
		t.Errorf("defaults are invalid: %v", errs)
	}
}

func TestParseWebhook(t *testing.T) {
	runParseCases(t, ParseWebhook, DefaultWebhookConfiguration, map[string]parseCase[WebhookConfiguration]{
		"empty file gives the defaults": {in: "", want: func(*WebhookConfiguration) {}},
		"a file states only what it changes": {
			in: "apiVersion: config.gputopo.io/v1alpha1\nkind: WebhookConfiguration\nschedulerName: gpu-sched\npolicyTable:\n  data:\n    strategy: balanced_utilization\n",
			want: func(c *WebhookConfiguration) {
				c.APIVersion, c.Kind = WebhookAPIVersion, WebhookKind
				c.SchedulerName = "gpu-sched"
				c.PolicyTable.Data.Strategy = v1alpha1.StrategyBalancedUtilization
			},
		},
		"NVLink for model pods can be turned off": {
			in:   "policyTable:\n  model:\n    requireNVLinkFromGPUs: 0\n",
			want: func(c *WebhookConfiguration) { c.PolicyTable.Model.RequireNVLinkFromGPUs = 0 },
		},
		"model pods may fall back after a wait": {
			in: "policyTable:\n  model:\n    fallbackAfter: 30m\n",
			want: func(c *WebhookConfiguration) {
				c.PolicyTable.Model.FallbackAfter = &metav1.Duration{Duration: 30 * time.Minute}
			},
		},
		"fallbackAfter on an intent that never requires NVLink is an error": {
			in:      "policyTable:\n  data:\n    fallbackAfter: 30m\n",
			wantErr: `invalid WebhookConfiguration: policyTable.data.fallbackAfter: Invalid value: "30m0s": applies only to a policy that sets requireNVLinkFromGPUs or minPairBandwidthGBps (there is nothing to fall back from); remove fallbackAfter or require NVLink`,
		},
		"negative fallbackAfter is an error": {
			in:      "policyTable:\n  model:\n    fallbackAfter: -1m\n",
			wantErr: `invalid WebhookConfiguration: policyTable.model.fallbackAfter: Invalid value: "-1m0s": must be a positive duration such as "30m"; leave it out to never fall back`,
		},
		"lists replace the defaults": {
			in: `{"systemServiceAccounts":["system:serviceaccount:gpu:ext","system:serviceaccount:gpu:agent"],"excludedNamespaces":["kube-system","monitoring"]}`,
			want: func(c *WebhookConfiguration) {
				c.SystemServiceAccounts = []string{"system:serviceaccount:gpu:ext", "system:serviceaccount:gpu:agent"}
				c.ExcludedNamespaces = []string{"kube-system", "monitoring"}
			},
		},
		"a misspelt key is an error": {
			in:      "schedulername: x\n",
			wantErr: `invalid WebhookConfiguration: unknown field "schedulername"`,
		},
		"an unknown intent in the policy table is an error": {
			in:      "policyTable:\n  pipeline:\n    strategy: numa_local\n",
			wantErr: `invalid WebhookConfiguration: unknown field "policyTable.pipeline"`,
		},
		"every invalid field is reported with its path": {
			in: `{"apiVersion":"v2","kind":"Other","schedulerName":"Not_A_Name","policyTable":{"model":{"strategy":"fastest","requireNVLinkFromGPUs":-1,"minPairBandwidthGBps":-3}},` +
				`"systemServiceAccounts":["alice","system:serviceaccount:gpu:agent","system:serviceaccount:gpu:agent"],"excludedNamespaces":["Bad NS"],"namespaceDefaultAnnotation":"not a key!"}`,
			wantErr: `invalid WebhookConfiguration: [apiVersion: Unsupported value: "v2": supported values: "config.gputopo.io/v1alpha1", ` +
				`kind: Unsupported value: "Other": supported values: "WebhookConfiguration", ` +
				`schedulerName: Invalid value: "Not_A_Name": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'), ` +
				`policyTable.model.requireNVLinkFromGPUs: Invalid value: -1: must be 0 (never) or the GPU count from which NVLink is required, ` +
				`policyTable.model.minPairBandwidthGBps: Invalid value: -3: must be 0 (no minimum) or a positive bandwidth in GB/s, bidirectional, ` +
				`policyTable.model.strategy: Unsupported value: "fastest": supported values: "highest_bandwidth", "numa_local", "balanced_utilization", "lowest_fragmentation", ` +
				`systemServiceAccounts[0]: Invalid value: "alice": must be a service account user name: system:serviceaccount:<namespace>:<name>, ` +
				`systemServiceAccounts[2]: Duplicate value: "system:serviceaccount:gpu:agent", ` +
				`excludedNamespaces[0]: Invalid value: "Bad NS": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?'), ` +
				`namespaceDefaultAnnotation: Invalid value: "not a key!": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')]`,
		},
		"a DeviceClass name that is not one is refused, with its path": {
			in: "claimDeviceClasses: [gpu.nvidia.com, GPU_Class, gpu.nvidia.com]\n",
			wantErr: `invalid WebhookConfiguration: [claimDeviceClasses[1]: Invalid value: "GPU_Class": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*') (a DeviceClass name), ` +
				`claimDeviceClasses[2]: Duplicate value: "gpu.nvidia.com"]`,
		},
		"a key written twice is refused, naming the key": {
			in:      "schedulerName: a\nexcludedNamespaces: [kube-system]\nschedulerName: b\n",
			wantErr: "decode WebhookConfiguration document 1: yaml: unmarshal errors:\n  line 3: key \"schedulerName\" already set in map",
		},
		"a second document is refused, naming its number": {
			in:      "schedulerName: a\n---\nschedulerName: b\n",
			wantErr: "document 2: the file must hold one WebhookConfiguration, not a multi-document YAML stream; remove the other documents or the --- separator",
		},
		"a duration without a unit is refused with a hint": {
			in:      "policyTable:\n  model:\n    fallbackAfter: 30\n",
			wantErr: `invalid WebhookConfiguration: policyTable.model.fallbackAfter: Invalid value: "30": a duration needs a unit, e.g. 15m, 90s or 2m30s (only 0 may be written without one)`,
		},
		"a bare 0 is a duration of 0": {
			in:      "policyTable:\n  model:\n    fallbackAfter: 0\n",
			wantErr: `invalid WebhookConfiguration: policyTable.model.fallbackAfter: Invalid value: "0s": must be a positive duration such as "30m"; leave it out to never fall back`,
		},
		"unknown fields and invalid values are reported together": {
			in:      "schedulername: x\nresourceName: gpu\n",
			wantErr: `invalid WebhookConfiguration: [unknown field "schedulername", resourceName: Invalid value: "gpu": must be an extended resource name with a domain, e.g. nvidia.com/gpu]`,
		},
		"an empty node agent list is an error": {
			in:      `{"nodeAgentServiceAccounts":[]}`,
			wantErr: `invalid WebhookConfiguration: nodeAgentServiceAccounts: Required value: list the node agent's service account user name (system:serviceaccount:<namespace>:<name>), or it cannot record allocated GPUs`,
		},
		"an empty system account list is allowed: the extender writes through Bindings": {
			in:   `{"systemServiceAccounts":[]}`,
			want: func(c *WebhookConfiguration) { c.SystemServiceAccounts = []string{} },
		},
		"another GPU resource and envFrom allowed": {
			in: "resourceName: example.com/gpu\ngpuContainerEnvFrom: Allow\nnodeAgentServiceAccounts: [\"system:serviceaccount:gpu:agent\"]\n",
			want: func(c *WebhookConfiguration) {
				c.ResourceName, c.GPUContainerEnvFrom = "example.com/gpu", EnvFromAllow
				c.NodeAgentServiceAccounts = []string{"system:serviceaccount:gpu:agent"}
			},
		},
		"node agents, resource name and envFrom policy are checked": {
			in: `{"nodeAgentServiceAccounts":["agent","system:serviceaccount:gpu:agent","system:serviceaccount:gpu:agent"],"resourceName":"gpu","gpuContainerEnvFrom":"refuse"}`,
			wantErr: `invalid WebhookConfiguration: [nodeAgentServiceAccounts[0]: Invalid value: "agent": must be a service account user name: system:serviceaccount:<namespace>:<name>, ` +
				`nodeAgentServiceAccounts[2]: Duplicate value: "system:serviceaccount:gpu:agent", ` +
				`resourceName: Invalid value: "gpu": must be an extended resource name with a domain, e.g. nvidia.com/gpu, ` +
				`gpuContainerEnvFrom: Unsupported value: "refuse": supported values: "Refuse", "Allow"]`,
		},
		"a resource name that is not a qualified name is an error": {
			in:      `{"resourceName":"nvidia.com/gpu'"}`,
			wantErr: `invalid WebhookConfiguration: resourceName: Invalid value: "nvidia.com/gpu'": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`,
		},
	})
}

func TestLoadWebhook(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte("schedulerName: gpu-sched\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadWebhook(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.SchedulerName != "gpu-sched" {
		t.Errorf("schedulerName = %q, want gpu-sched", got.SchedulerName)
	}
	if _, err := LoadWebhook(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file gave no error")
	}
	if def, err := LoadWebhook(""); err != nil || !cmp.Equal(def, DefaultWebhookConfiguration()) {
		t.Errorf("LoadWebhook(\"\") = %v, %v; want the defaults", def, err)
	}
	// The webhook's decoder used to read a second document or a repeated
	// key without a word; both are refused now, as the extender's are.
	multi := filepath.Join(dir, "multi.yaml")
	if err := os.WriteFile(multi, []byte("schedulerName: gpu-sched\n---\nschedulerName: other\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadWebhook(multi); err == nil || !strings.Contains(err.Error(), "webhook config "+multi+": document 2: ") {
		t.Errorf("LoadWebhook(multi-document) = %v, want the file and document 2 named", err)
	}
	twice := filepath.Join(dir, "twice.yaml")
	if err := os.WriteFile(twice, []byte("schedulerName: gpu-sched\nschedulerName: other\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadWebhook(twice); err == nil || !strings.Contains(err.Error(), "webhook config "+twice+": ") || !strings.Contains(err.Error(), `key "schedulerName" already set`) {
		t.Errorf("LoadWebhook(key written twice) = %v, want the file and the key named", err)
	}
}

func TestPolicyCopiesFallbackAfterOnlyIntoStrictRequirements(t *testing.T) {
	p := Policy{Strategy: v1alpha1.StrategyHighestBandwidth, RequireNVLinkFromGPUs: 2, FallbackAfter: &metav1.Duration{Duration: 30 * time.Minute}}
	if r := p.Requirement(4); r.FallbackAfter == nil || r.FallbackAfter.Duration != 30*time.Minute || !r.RequireNVLink {
		t.Errorf("4-GPU requirement %+v: want requireNVLink with fallbackAfter 30m", r)
	}
	if r := p.Requirement(1); r.FallbackAfter != nil {
		t.Errorf("1-GPU requirement %+v: a lone GPU requires no NVLink, so it has nothing to fall back from", r)
	}
	if errs := p.Requirement(4).Validate(v1alpha1.RequirementPath); len(errs) > 0 {
		t.Errorf("derived requirement does not validate: %v", errs)
	}
}
