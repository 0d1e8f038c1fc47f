package v1alpha1

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestExtenderDefaultsGolden pins every default.
func TestExtenderDefaultsGolden(t *testing.T) {
	want := checkGolden(t, "extender", DefaultExtenderConfiguration())
	// The golden file must itself be a valid configuration.
	if _, err := ParseExtender(want); err != nil {
		t.Errorf("golden defaults do not parse: %v", err)
	}
}

func TestParseExtender(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr []string // substrings, all required
		check   func(t *testing.T, c *ExtenderConfiguration)
	}{{
		name: "empty body of the right kind gives the defaults",
		doc:  "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if diff := cmp.Diff(DefaultExtenderConfiguration(), c); diff != "" {
				t.Errorf("(-defaults +got):\n%s", diff)
			}
		},
	}, {
		name: "explicit zero weight switches a component off, others keep defaults",
		doc:  "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nweights:\n  taskAffinity: 0\nbindTimeout: 2s\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if *c.Weights.TaskAffinity != 0 || *c.Weights.UtilizationBalance != weightProfiles[WeightsPlacement][0] || c.BindTimeout.Duration != 2*time.Second {
				t.Errorf("weights %+v bindTimeout %s", c.Weights, c.BindTimeout.Duration)
			}
		},
	}, {
		name: "negative topologyMaxAge turns the age check off",
		doc:  "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\ntopologyMaxAge: -1s\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.TopologyAgeLimit() != 0 {
				t.Errorf("topologyMaxAge in force = %s, want 0 (off)", c.TopologyAgeLimit())
			}
		},
	}, {
		name: "topologyMaxAge 0 turns the age check off",
		doc:  "topologyMaxAge: 0\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.TopologyMaxAge == nil || c.TopologyMaxAge.Duration != 0 || c.TopologyAgeLimit() != 0 {
				t.Errorf("topologyMaxAge = %v, in force %s; want 0 (off)", c.TopologyMaxAge, c.TopologyAgeLimit())
			}
		},
	}, {
		name: "topologyMaxAge 0s turns the age check off",
		doc:  "topologyMaxAge: 0s\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.TopologyAgeLimit() != 0 {
				t.Errorf("topologyMaxAge in force = %s, want 0 (off)", c.TopologyAgeLimit())
			}
		},
	}, {
		name: "topologyMaxAge unset takes the default 15m",
		doc:  "bindTimeout: 3s\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.TopologyAgeLimit() != 15*time.Minute {
				t.Errorf("topologyMaxAge in force = %s, want 15m", c.TopologyAgeLimit())
			}
		},
	}, {
		name: "topologyMaxAge set is kept",
		doc:  "topologyMaxAge: 40m\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.TopologyAgeLimit() != 40*time.Minute {
				t.Errorf("topologyMaxAge in force = %s, want 40m", c.TopologyAgeLimit())
			}
		},
	}, {
		name: "patience defaults to 10m at 50%; bandwidthWait 0s turns it off",
		doc:  "patience:\n  bandwidthWait: 0s\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if w, share := c.BandwidthPatience(); w != 0 || share != 0 {
				t.Errorf("patience in force = %s at %.2f, want off", w, share)
			}
			if w, share := DefaultExtenderConfiguration().BandwidthPatience(); w != 10*time.Minute || share != 0.5 {
				t.Errorf("default patience = %s at %.2f, want 10m at 0.50", w, share)
			}
		},
	}, {
		name: "dra names another driver, attribute and classes",
		doc:  "dra:\n  driver: gpu.example.com\n  uuidAttribute: gpu.example.com/uuid\n  deviceClasses: [gpu.example.com, big-gpus]\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.DRA.Driver != "gpu.example.com" || c.DRA.UUIDAttribute != "gpu.example.com/uuid" || len(c.DRA.DeviceClasses) != 2 {
				t.Errorf("dra = %+v", c.DRA)
			}
		},
	}, {
		name:    "bad dra fields are named with the fix",
		doc:     "dra:\n  driver: Not_A_Driver\n  uuidAttribute: 'a b'\n  deviceClasses: [gpu.nvidia.com, gpu.nvidia.com]\n",
		wantErr: []string{`dra.driver: Invalid value: "Not_A_Driver"`, `dra.uuidAttribute: Invalid value: "a b": name the device attribute that carries the GPU's UUID`, `dra.deviceClasses[1]: Duplicate value: "gpu.nvidia.com"`},
	}, {
		name:    "patience out of range names the field and the range",
		doc:     "patience:\n  bandwidthWait: -1m\n  bandwidthPercent: 0\n",
		wantErr: []string{`patience.bandwidthWait: Invalid value: "-1m0s": must be 0 (patience off) or a duration up to 24h`, `patience.bandwidthPercent: Invalid value: 0: must be between 1 and 100`},
	}, {
		name:    "a duration other than 0 without a unit is refused with a hint",
		doc:     "topologyMaxAge: 900\nbindTimeout: 4\n",
		wantErr: []string{`topologyMaxAge: Invalid value: "900": a duration needs a unit`, `bindTimeout: Invalid value: "4": a duration needs a unit`},
	}, {
		name:    "unknown field is an error, not a silent default",
		doc:     "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nweight:\n  taskAffinity: 1\n",
		wantErr: []string{`unknown field "weight"`},
	}, {
		name: "every unknown field is reported at once with its full path, with the invalid values",
		doc: "weights:\n  utilisation: 40\n  taskAffinity: 1\nthermal: {limitC: 90}\n" +
			"telemetry:\n  source: prometheus\n  prometheus:\n    url: http://prom:9090\n    metrics: {gpuUtil: X}\n" +
			"bindTimout: 2s\nbindTimeout: 5m\n",
		wantErr: []string{
			`unknown field "weights.utilisation"`,
			`unknown field "thermal.limitC"`,
			`unknown field "telemetry.prometheus.metrics.gpuUtil"`,
			`unknown field "bindTimout"`,
			"bindTimeout: Invalid value",
		},
	}, {
		name:    "field names are case-sensitive",
		doc:     "Weights: {taskAffinity: 1}\n",
		wantErr: []string{`unknown field "Weights"`},
	}, {
		name:    "a key written twice is an error",
		doc:     "bindTimeout: 2s\nbindTimeout: 3s\n",
		wantErr: []string{`"bindTimeout" already set`},
	}, {
		name: "apiVersion and kind may be omitted",
		doc:  "weights: {taskAffinity: 5}\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.APIVersion != ExtenderAPIVersion || c.Kind != ExtenderKind || *c.Weights.TaskAffinity != 5 {
				t.Errorf("apiVersion %q kind %q taskAffinity %d", c.APIVersion, c.Kind, *c.Weights.TaskAffinity)
			}
		},
	}, {
		name: "an empty file gives the defaults",
		doc:  "# nothing to change\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if diff := cmp.Diff(DefaultExtenderConfiguration(), c); diff != "" {
				t.Errorf("(-defaults +got):\n%s", diff)
			}
		},
	}, {
		name: "the legacy apiVersion still loads, rewritten to the current one",
		doc:  "apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nbindTimeout: 2s\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			want := DefaultExtenderConfiguration()
			want.BindTimeout.Duration = 2 * time.Second
			if diff := cmp.Diff(want, c); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if c.APIVersion != "config.gputopo.io/v1alpha1" {
				t.Errorf("apiVersion = %q, want config.gputopo.io/v1alpha1", c.APIVersion)
			}
		},
	}, {
		name:    "wrong version names the field and both accepted versions",
		doc:     "apiVersion: gputopo.io/v2\nkind: ExtenderConfiguration\n",
		wantErr: []string{`apiVersion: Unsupported value: "gputopo.io/v2": supported values: "config.gputopo.io/v1alpha1", "gputopo.io/v1alpha1"`},
	}, {
		name:    "another component's configuration group is not the extender's",
		doc:     "apiVersion: config.gputopo.io/v1beta1\nkind: ExtenderConfiguration\n",
		wantErr: []string{`apiVersion: Unsupported value: "config.gputopo.io/v1beta1": supported values: "config.gputopo.io/v1alpha1", "gputopo.io/v1alpha1"`},
	}, {
		name:    "wrong kind",
		doc:     "kind: KubeSchedulerConfiguration\n",
		wantErr: []string{`kind: Unsupported value: "KubeSchedulerConfiguration"`},
	}, {
		name:    "a second document is refused, naming its number",
		doc:     "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\n---\nweights: {taskAffinity: 0}\n",
		wantErr: []string{"document 2: the file must hold one ExtenderConfiguration, not a multi-document YAML stream"},
	}, {
		name: "separators around one document and comment-only documents are fine",
		doc:  "---\n# gputopo extender\n---\nbindTimeout: 3s\n---\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.BindTimeout.Duration != 3*time.Second {
				t.Errorf("bindTimeout = %s, want 3s", c.BindTimeout.Duration)
			}
		},
	}, {
		name: "every invalid field reported at once",
		doc: "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\n" +
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
		doc:  "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: example.com/accel\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			if c.GPUResource() != "example.com/accel" {
				t.Errorf("GPUResource() = %q, want example.com/accel", c.GPUResource())
			}
		},
	}, {
		name:    "resourceName without a domain is refused",
		doc:     "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: gpu\n",
		wantErr: []string{`resourceName: Invalid value: "gpu": must be an extended resource name such as nvidia.com/gpu`, "a domain prefix"},
	}, {
		name:    "resourceName in the kubernetes.io namespace is refused",
		doc:     "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: kubernetes.io/gpu\n",
		wantErr: []string{`resourceName: Invalid value: "kubernetes.io/gpu"`, "Kubernetes' own resources"},
	}, {
		name:    "resourceName that is not a qualified name is refused",
		doc:     "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nresourceName: nvidia.com/gpu count\n",
		wantErr: []string{`resourceName: Invalid value: "nvidia.com/gpu count"`},
	}, {
		name:    "all weights zero",
		doc:     "apiVersion: config.gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nweights: {utilizationBalance: 0, taskAffinity: 0, thermalPowerHeadroom: 0, fragmentation: 0, bandwidthFit: 0, capabilityConservation: 0, islandBestFit: 0}\n",
		wantErr: []string{"weights: Invalid value: \"all 0\": at least one weight must be positive"},
	}, {
		name:    "weights that leave most pods unscored",
		doc:     "weights: {utilizationBalance: 0, taskAffinity: 5, thermalPowerHeadroom: 0, fragmentation: 0, bandwidthFit: 10, capabilityConservation: 0, islandBestFit: 0}\n",
		wantErr: []string{`weights: Invalid value: "only taskAffinity and bandwidthFit": most pods would score 0 on every node`},
	}, {
		name:    "unknown weight profile",
		doc:     "weights: {profile: balanced}\n",
		wantErr: []string{`weights.profile: Unsupported value: "balanced": supported values: "placement", "design"`},
	}, {
		name:    "unknown term",
		doc:     "weights: {bandwidth: 10}\n",
		wantErr: []string{`unknown field "weights.bandwidth"`},
	}, {
		name: "design profile restores 40/30/20/10 and switches the node-choice terms off",
		doc:  "weights: {profile: design, fragmentation: 15}\n",
		check: func(t *testing.T, c *ExtenderConfiguration) {
			w := c.Weights
			got := []int32{*w.UtilizationBalance, *w.TaskAffinity, *w.ThermalPowerHeadroom, *w.Fragmentation, *w.BandwidthFit, *w.CapabilityConservation, *w.IslandBestFit}
			if diff := cmp.Diff([]int32{40, 30, 20, 15, 0, 0, 0}, got); diff != "" {
				t.Errorf("weights (-want +got):\n%s", diff)
			}
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseExtender([]byte(tc.doc))
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

func TestLoadExtenderNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	multi := write("multi.yaml", "bindTimeout: 2s\n---\nbindTimeout: 3s\n---\nbindTimeout: 4s\n")
	if _, err := LoadExtender(multi); err == nil || !strings.Contains(err.Error(), "extender config "+multi+": document 2: ") {
		t.Errorf("LoadExtender(multi-document) = %v, want the file and document 2 named", err)
	}
	typo := write("typo.yaml", "weights: {utilisation: 1}\n")
	if _, err := LoadExtender(typo); err == nil || !strings.Contains(err.Error(), "extender config "+typo+": ") || !strings.Contains(err.Error(), `unknown field "weights.utilisation"`) {
		t.Errorf("LoadExtender(typo) = %v, want the file and the field's path named", err)
	}
	c, err := LoadExtender(write("ok.yaml", "topologyMaxAge: 0s\n"))
	if err != nil || c.TopologyAgeLimit() != 0 {
		t.Errorf("LoadExtender(topologyMaxAge: 0s) = %v, %v; want the age check off", c, err)
	}
}

// TestExtenderAPIVersions: Validate accepts the current apiVersion and the
// legacy one as they are (a configuration built in code need not be
// defaulted), and refuses any other naming the field and both.
func TestExtenderAPIVersions(t *testing.T) {
	for _, v := range []string{ExtenderAPIVersion, ExtenderLegacyAPIVersion} {
		c := DefaultExtenderConfiguration()
		c.APIVersion = v
		if errs := c.Validate(); len(errs) != 0 {
			t.Errorf("apiVersion %q: %v, want valid", v, errs.ToAggregate())
		}
	}
	c := DefaultExtenderConfiguration()
	c.APIVersion = "example.com/v1"
	errs := c.Validate()
	want := `apiVersion: Unsupported value: "example.com/v1": supported values: "config.gputopo.io/v1alpha1", "gputopo.io/v1alpha1"`
	if len(errs) != 1 || errs[0].Error() != want {
		t.Errorf("Validate() = %v, want exactly %q", errs.ToAggregate(), want)
	}

	// A file written with the legacy apiVersion, as users have them.
	path := filepath.Join(t.TempDir(), "legacy.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: gputopo.io/v1alpha1\nkind: ExtenderConfiguration\nweights: {profile: design}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadExtender(path)
	if err != nil {
		t.Fatalf("LoadExtender(legacy apiVersion) = %v, want it accepted", err)
	}
	if got.APIVersion != ExtenderAPIVersion || got.Weights.Profile != WeightsDesign {
		t.Errorf("LoadExtender(legacy apiVersion): apiVersion %q profile %q, want %q and design", got.APIVersion, got.Weights.Profile, ExtenderAPIVersion)
	}
}
