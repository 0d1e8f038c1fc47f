package extender

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestDefaultsGolden pins every default: a change shows up as a diff of
// testdata/defaults.json in review. Regenerate with UPDATE_GOLDEN=1.
func TestDefaultsGolden(t *testing.T) {
	got, err := json.MarshalIndent(DefaultConfiguration(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", "defaults.json")
	if os.Getenv("UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with UPDATE_GOLDEN=1 to create it): %v", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("defaults changed (-golden +now); if intended, run UPDATE_GOLDEN=1 go test ./extender/ -run TestDefaultsGolden:\n%s", diff)
	}
	// The golden file must itself be a valid configuration.
	if _, err := ParseConfiguration(want); err != nil {
		t.Errorf("golden defaults do not parse: %v", err)
	}
}

func TestParseConfiguration(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr []string // substrings, all required
		check   func(t *testing.T, c *Configuration)
	}{{
		name: "empty body of the right kind gives the defaults",
		doc:  "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\n",
		check: func(t *testing.T, c *Configuration) {
			if diff := cmp.Diff(DefaultConfiguration(), c); diff != "" {
				t.Errorf("(-defaults +got):\n%s", diff)
			}
		},
	}, {
		name: "explicit zero weight switches a component off, others keep defaults",
		doc:  "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nweights:\n  taskAffinity: 0\nbindTimeout: 2s\n",
		check: func(t *testing.T, c *Configuration) {
			if *c.Weights.TaskAffinity != 0 || *c.Weights.UtilizationBalance != 40 || c.BindTimeout.Duration != 2*time.Second {
				t.Errorf("weights %+v bindTimeout %s", c.Weights, c.BindTimeout.Duration)
			}
		},
	}, {
		name: "negative topologyMaxAge turns the age check off",
		doc:  "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\ntopologyMaxAge: -1s\n",
		check: func(t *testing.T, c *Configuration) {
			if c.topologyMaxAge() != 0 {
				t.Errorf("topologyMaxAge in force = %s, want 0 (off)", c.topologyMaxAge())
			}
		},
	}, {
		name:    "unknown field is an error, not a silent default",
		doc:     "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nweight:\n  taskAffinity: 1\n",
		wantErr: []string{`unknown field "weight"`},
	}, {
		name:    "missing apiVersion and kind",
		doc:     "weights: {}\n",
		wantErr: []string{"apiVersion and kind are required"},
	}, {
		name:    "wrong version",
		doc:     "apiVersion: gputopo.io/v2\nkind: ExtenderConfiguration\n",
		wantErr: []string{`apiVersion: Unsupported value: "gputopo.io/v2"`},
	}, {
		name: "every invalid field reported at once",
		doc: "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\n" +
			"weights:\n  utilizationBalance: -1\n  fragmentation: 5000\n" +
			"thermal:\n  idleTemperatureC: 90\n" +
			"bindTimeout: 5m\nmaxRequestBytes: 10\nallocatorMemoSize: -3\n",
		wantErr: []string{
			"weights.utilizationBalance: Invalid value: -1",
			"weights.fragmentation: Invalid value: 5000",
			"thermal.limitTemperatureC: Invalid value: 85: must be above idleTemperatureC (90)",
			"bindTimeout: Invalid value",
			"reservationTTL: Invalid value",
			"maxRequestBytes: Invalid value: 10",
			"allocatorMemoSize: Invalid value: -3",
		},
	}, {
		name: "resourceName names the managed extended resource",
		doc:  "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: example.com/accel\n",
		check: func(t *testing.T, c *Configuration) {
			if c.GPUResource() != "example.com/accel" {
				t.Errorf("GPUResource() = %q, want example.com/accel", c.GPUResource())
			}
		},
	}, {
		name:    "resourceName without a domain is refused",
		doc:     "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: gpu\n",
		wantErr: []string{`resourceName: Invalid value: "gpu": must be an extended resource name such as nvidia.com/gpu`, "a domain prefix"},
	}, {
		name:    "resourceName in the kubernetes.io namespace is refused",
		doc:     "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: kubernetes.io/gpu\n",
		wantErr: []string{`resourceName: Invalid value: "kubernetes.io/gpu"`, "Kubernetes' own resources"},
	}, {
		name:    "resourceName that is not a qualified name is refused",
		doc:     "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: nvidia.com/gpu count\n",
		wantErr: []string{`resourceName: Invalid value: "nvidia.com/gpu count"`},
	}, {
		name:    "all weights zero",
		doc:     "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nweights: {utilizationBalance: 0, taskAffinity: 0, thermalPowerHeadroom: 0, fragmentation: 0}\n",
		wantErr: []string{"weights: Invalid value: \"all 0\": at least one weight must be positive"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfiguration([]byte(tc.doc))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error; want %q", tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(o *Options)
		wantErr string
	}{
		{"defaults are valid", func(*Options) {}, ""},
		{"cert without key", func(o *Options) { o.TLSCertFile = "c.pem" }, "must be given together"},
		{"client CA without TLS", func(o *Options) { o.ClientCAFile = "ca.pem" }, "needs --tls-cert-file"},
		{"renew deadline not below lease", func(o *Options) { o.LeaderElect, o.RenewDeadline = true, 20*time.Second }, "must be shorter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			tc.mutate(&o)
			err := o.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}
