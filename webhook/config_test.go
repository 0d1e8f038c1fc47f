package webhook

import (
	"encoding/json"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// TestDefaultConfigGolden pins every default; regenerate with
// UPDATE_GOLDEN=1 go test ./webhook -run TestDefaultConfigGolden.
func TestDefaultConfigGolden(t *testing.T) {
	got, err := json.MarshalIndent(DefaultConfig(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "defaults.json")
	if os.Getenv("UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden file (UPDATE_GOLDEN=1 writes it): %v", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("defaults changed (-golden +now):\n%s", diff)
	}
	if errs := DefaultConfig().Validate(); len(errs) > 0 {
		t.Errorf("defaults are invalid: %v", errs)
	}
}

func TestParseConfig(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    func(*Config)
		wantErr string
	}{
		"empty file gives the defaults": {in: "", want: func(*Config) {}},
		"a file states only what it changes": {
			in: "apiVersion: config.gputopo.io/v1alpha1\nkind: WebhookConfiguration\nschedulerName: gpu-sched\npolicyTable:\n  data:\n    strategy: balanced_utilization\n",
			want: func(c *Config) {
				c.APIVersion, c.Kind = ConfigAPIVersion, ConfigKind
				c.SchedulerName = "gpu-sched"
				c.PolicyTable.Data.Strategy = v1alpha1.StrategyBalancedUtilization
			},
		},
		"NVLink for model pods can be turned off": {
			in:   "policyTable:\n  model:\n    requireNVLinkFromGPUs: 0\n",
			want: func(c *Config) { c.PolicyTable.Model.RequireNVLinkFromGPUs = 0 },
		},
		"model pods may fall back after a wait": {
			in:   "policyTable:\n  model:\n    fallbackAfter: 30m\n",
			want: func(c *Config) { c.PolicyTable.Model.FallbackAfter = &metav1.Duration{Duration: 30 * time.Minute} },
		},
		"fallbackAfter on an intent that never requires NVLink is an error": {
			in:      "policyTable:\n  data:\n    fallbackAfter: 30m\n",
			wantErr: `policyTable.data.fallbackAfter: Invalid value: "30m0s": applies only to a policy that sets requireNVLinkFromGPUs or minPairBandwidthGBps (there is nothing to fall back from); remove fallbackAfter or require NVLink`,
		},
		"negative fallbackAfter is an error": {
			in:      "policyTable:\n  model:\n    fallbackAfter: -1m\n",
			wantErr: `policyTable.model.fallbackAfter: Invalid value: "-1m0s": must be a positive duration such as "30m"; leave it out to never fall back`,
		},
		"lists replace the defaults": {
			in: `{"systemServiceAccounts":["system:serviceaccount:gpu:ext","system:serviceaccount:gpu:agent"],"excludedNamespaces":["kube-system","monitoring"]}`,
			want: func(c *Config) {
				c.SystemServiceAccounts = []string{"system:serviceaccount:gpu:ext", "system:serviceaccount:gpu:agent"}
				c.ExcludedNamespaces = []string{"kube-system", "monitoring"}
			},
		},
		"a misspelt key is an error": {
			in:      "schedulername: x\n",
			wantErr: `decode: unknown field "schedulername"`,
		},
		"an unknown intent in the policy table is an error": {
			in:      "policyTable:\n  pipeline:\n    strategy: numa_local\n",
			wantErr: `decode: unknown field "policyTable.pipeline"`,
		},
		"every invalid field is reported with its path": {
			in: `{"apiVersion":"v2","kind":"Other","schedulerName":"Not_A_Name","policyTable":{"model":{"strategy":"fastest","requireNVLinkFromGPUs":-1,"minPairBandwidthGBps":-3}},` +
				`"systemServiceAccounts":["alice","system:serviceaccount:gpu:agent","system:serviceaccount:gpu:agent"],"excludedNamespaces":["Bad NS"],"namespaceDefaultAnnotation":"not a key!"}`,
			wantErr: `[apiVersion: Unsupported value: "v2": supported values: "config.gputopo.io/v1alpha1", ` +
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
		"an empty node agent list is an error": {
			in:      `{"nodeAgentServiceAccounts":[]}`,
			wantErr: `nodeAgentServiceAccounts: Required value: list the node agent's service account user name (system:serviceaccount:<namespace>:<name>), or it cannot record allocated GPUs`,
		},
		"an empty system account list is allowed: the extender writes through Bindings": {
			in:   `{"systemServiceAccounts":[]}`,
			want: func(c *Config) { c.SystemServiceAccounts = []string{} },
		},
		"another GPU resource and envFrom allowed": {
			in: "resourceName: example.com/gpu\ngpuContainerEnvFrom: Allow\nnodeAgentServiceAccounts: [\"system:serviceaccount:gpu:agent\"]\n",
			want: func(c *Config) {
				c.ResourceName, c.GPUContainerEnvFrom = "example.com/gpu", EnvFromAllow
				c.NodeAgentServiceAccounts = []string{"system:serviceaccount:gpu:agent"}
			},
		},
		"node agents, resource name and envFrom policy are checked": {
			in: `{"nodeAgentServiceAccounts":["agent","system:serviceaccount:gpu:agent","system:serviceaccount:gpu:agent"],"resourceName":"gpu","gpuContainerEnvFrom":"refuse"}`,
			wantErr: `[nodeAgentServiceAccounts[0]: Invalid value: "agent": must be a service account user name: system:serviceaccount:<namespace>:<name>, ` +
				`nodeAgentServiceAccounts[2]: Duplicate value: "system:serviceaccount:gpu:agent", ` +
				`resourceName: Invalid value: "gpu": must be an extended resource name with a domain, e.g. nvidia.com/gpu, ` +
				`gpuContainerEnvFrom: Unsupported value: "refuse": supported values: "Refuse", "Allow"]`,
		},
		"a resource name that is not a qualified name is an error": {
			in:      `{"resourceName":"nvidia.com/gpu'"}`,
			wantErr: `resourceName: Invalid value: "nvidia.com/gpu'": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseConfig([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("no error, want %q", tc.wantErr)
				}
				if diff := cmp.Diff(tc.wantErr, err.Error()); diff != "" {
					t.Errorf("error (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			want := DefaultConfig()
			tc.want(&want)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte("schedulerName: gpu-sched\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.SchedulerName != "gpu-sched" {
		t.Errorf("schedulerName = %q, want gpu-sched", got.SchedulerName)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("a missing file gave no error")
	}
	if def, err := LoadConfig(""); err != nil || !cmp.Equal(def, DefaultConfig()) {
		t.Errorf("LoadConfig(\"\") = %v, %v; want the defaults", def, err)
	}
}

func TestOptionsFlags(t *testing.T) {
	o := DefaultOptions()
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--port=10250", "--cert-dir=/certs", "--config=/etc/gputopo/webhook.yaml", "--metrics-bind-address=0", "--health-probe-bind-address=:9000"}); err != nil {
		t.Fatal(err)
	}
	want := DefaultOptions()
	want.Port, want.CertDir, want.ConfigFile, want.MetricsBindAddress, want.HealthProbeBindAddress = 10250, "/certs", "/etc/gputopo/webhook.yaml", "0", ":9000"
	if diff := cmp.Diff(want, o); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("valid options: %v", err)
	}
	o.Port = 0
	if err := o.Validate(); err == nil {
		t.Error("port 0 accepted")
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
