package nodeagent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// toolkitDefaults is the config.toml the NVIDIA container toolkit's
// packages install: the two settings commented out at their defaults,
// then its tables.
const toolkitDefaults = `#accept-nvidia-visible-devices-as-volume-mounts = false
#accept-nvidia-visible-devices-envvar-when-unprivileged = true
disable-require = false
supported-driver-capabilities = "compat32,compute,display,graphics,ngx,utility,video"
#swarm-resource = "DOCKER_RESOURCE_GPU"

[nvidia-container-cli]
environment = []
ldconfig = "@/sbin/ldconfig.real"
load-kmods = true

[nvidia-container-runtime]
log-level = "info"
mode = "auto"
runtimes = ["docker-runc", "runc", "crun"]

[nvidia-container-runtime.modes.cdi]
annotation-prefixes = ["cdi.k8s.io/"]
default-kind = "nvidia.com/gpu"
spec-dirs = ["/etc/cdi", "/var/run/cdi"]
`

func writeToolkitConfig(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadToolkitConfig(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		want          ToolkitSettings
	}{
		{name: "the packaged file: both at the toolkit's defaults", content: toolkitDefaults,
			want: ToolkitSettings{EnvvarWhenUnprivileged: true}},
		{name: "hardened for volume-mounts",
			content: "accept-nvidia-visible-devices-envvar-when-unprivileged = false\naccept-nvidia-visible-devices-as-volume-mounts = true\n" + toolkitDefaults,
			want:    ToolkitSettings{EnvvarWhenUnprivileged: false, VolumeMounts: true}},
		{name: "set explicitly to true, with a comment and CRLF line ends",
			content: "accept-nvidia-visible-devices-envvar-when-unprivileged=true # the default\r\n[nvidia-container-cli]\r\n",
			want:    ToolkitSettings{EnvvarWhenUnprivileged: true}},
		{name: "quoted keys",
			content: "\"accept-nvidia-visible-devices-envvar-when-unprivileged\" = false\n'accept-nvidia-visible-devices-as-volume-mounts' = true\n",
			want:    ToolkitSettings{VolumeMounts: true}},
		{name: "the same key in a table is another key",
			content: toolkitDefaults + "[nvidia-container-runtime-hook]\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n",
			want:    ToolkitSettings{EnvvarWhenUnprivileged: true}},
		{name: "a top-level multi-line array and string are skipped whole",
			content: "environment = [\n  \"accept-nvidia-visible-devices-envvar-when-unprivileged = maybe\",\n]\nnote = \"\"\"\naccept-nvidia-visible-devices-as-volume-mounts = x\n\"\"\"\naccept-nvidia-visible-devices-envvar-when-unprivileged = false\n",
			want:    ToolkitSettings{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadToolkitConfig(writeToolkitConfig(t, tc.content))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("settings %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadToolkitConfigRefusesMalformedSettings(t *testing.T) {
	for _, tc := range []struct{ name, content, want string }{
		{name: "a string", content: "disable-require = false\naccept-nvidia-visible-devices-envvar-when-unprivileged = \"false\"\n",
			want: `:2: accept-nvidia-visible-devices-envvar-when-unprivileged = "false": not a boolean; want true or false`},
		{name: "no value", content: "accept-nvidia-visible-devices-as-volume-mounts =\n",
			want: ":1: accept-nvidia-visible-devices-as-volume-mounts = : not a boolean"},
		{name: "a boolean in another spelling", content: "accept-nvidia-visible-devices-envvar-when-unprivileged = False\n",
			want: ":1: accept-nvidia-visible-devices-envvar-when-unprivileged = False: not a boolean"},
		{name: "set twice", content: "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n\naccept-nvidia-visible-devices-envvar-when-unprivileged = true\n",
			want: ":3: accept-nvidia-visible-devices-envvar-when-unprivileged is set twice (also on line 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeToolkitConfig(t, tc.content)
			_, err := ReadToolkitConfig(p)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.HasPrefix(err.Error(), p+":") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q; want the file %s and %q", err, p, tc.want)
			}
		})
	}
}

func TestCheckEnvIsolation(t *testing.T) {
	cdi := []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListCDICRI}
	mounts := []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListVolumeMounts}
	envvar := []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListEnvvar}
	hardened := writeToolkitConfig(t, "accept-nvidia-visible-devices-envvar-when-unprivileged = false\n"+toolkitDefaults)
	hardenedMounts := writeToolkitConfig(t, "accept-nvidia-visible-devices-envvar-when-unprivileged = false\naccept-nvidia-visible-devices-as-volume-mounts = true\n")
	explicitTrue := writeToolkitConfig(t, "accept-nvidia-visible-devices-envvar-when-unprivileged = true\n")
	malformed := writeToolkitConfig(t, "accept-nvidia-visible-devices-envvar-when-unprivileged = no\n")
	absent := filepath.Join(t.TempDir(), "config.toml")
	for _, tc := range []struct {
		name       string
		path       string
		strategies []configv1alpha1.DeviceListStrategy
		isolated   bool
		reason     string
		// logV0 must be in the V(0) log (warnings and errors), logV1 only
		// at V(1); noV0 means nothing at V(0).
		logV0, logV1 []string
		noV0         bool
		// notV0 must not be in the V(0) log.
		notV0 []string
	}{
		{name: "cdi-cri, the file absent: unknown, said at V(1) only", path: absent, strategies: cdi,
			reason: EnvIsolationUnknown, logV1: []string{"Environment isolation unknown", `"reason"="unknown"`, absent}, noV0: true},
		{name: "cdi-cri, the check disabled: unknown at V(1)", path: "", strategies: cdi,
			reason: EnvIsolationUnknown, logV1: []string{"--toolkit-config is empty"}, noV0: true},
		{name: "cdi-cri, the setting at its default true (commented out)", path: writeToolkitConfig(t, toolkitDefaults), strategies: cdi,
			reason: EnvIsolationEnvvarAccepted,
			logV0:  []string{"Warning: a container's environment can select GPUs", `"key"="accept-nvidia-visible-devices-envvar-when-unprivileged"`, `"value"=true`, `"reason"="envvar_accepted"`}},
		{name: "cdi-cri, the setting true", path: explicitTrue, strategies: cdi,
			reason: EnvIsolationEnvvarAccepted, logV0: []string{"Warning: a container's environment can select GPUs", `"value"=true`}},
		{name: "cdi-cri, the setting false: isolated", path: hardened, strategies: cdi,
			isolated: true, reason: EnvIsolationEnvvarIgnored, logV0: []string{"Container environments cannot select GPUs", `"value"=false`}},
		{name: "volume-mounts, the setting false, mounts accepted: isolated, no warning", path: hardenedMounts, strategies: mounts,
			isolated: true, reason: EnvIsolationEnvvarIgnored, logV0: []string{"Container environments cannot select GPUs"}, notV0: []string{"Warning"}},
		{name: "volume-mounts, mounts not accepted: isolated and warned that the mounts are ignored", path: hardened, strategies: mounts,
			isolated: true, reason: EnvIsolationEnvvarIgnored,
			logV0: []string{"Warning: the volume-mounts strategy needs", `"key"="accept-nvidia-visible-devices-as-volume-mounts"`}},
		{name: "envvar with volume-mounts counts as volume-mounts", path: hardenedMounts, strategies: []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListEnvvar, configv1alpha1.DeviceListVolumeMounts},
			isolated: true, reason: EnvIsolationEnvvarIgnored},
		{name: "a malformed file: an error naming the file and the key, the check does not fail", path: malformed, strategies: cdi,
			reason: EnvIsolationConfigError,
			logV0:  []string{"reading the NVIDIA container toolkit configuration failed", malformed + ":1: accept-nvidia-visible-devices-envvar-when-unprivileged = no: not a boolean", `"reason"="config_error"`}},
		{name: "envvar, the file absent: the env decides, warned", path: absent, strategies: envvar,
			reason: EnvIsolationEnvvarStrategy, logV0: []string{"Warning: any container's environment can select GPUs", `"reason"="envvar_strategy"`}},
		{name: "envvar, the setting true: warned", path: explicitTrue, strategies: envvar,
			reason: EnvIsolationEnvvarStrategy, logV0: []string{"Warning: any container's environment can select GPUs"}},
		{name: "envvar, the setting false: GPU containers get no GPU", path: hardened, strategies: envvar,
			reason: EnvIsolationEnvvarStrategy, logV0: []string{"Warning: GPU containers get no GPU", `"value"=false`}},
		{name: "no strategy named is envvar", path: absent, strategies: nil, reason: EnvIsolationEnvvarStrategy},
		{name: "envvar, a malformed file: warned, and the error logged", path: malformed, strategies: envvar,
			reason: EnvIsolationEnvvarStrategy, logV0: []string{"Warning: any container's environment can select GPUs", "not a boolean"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := CheckEnvIsolation(tc.path, tc.strategies)
			if r.Isolated != tc.isolated || r.Reason != tc.reason {
				t.Errorf("isolated %v reason %q, want %v %q (err %v)", r.Isolated, r.Reason, tc.isolated, tc.reason, r.Err)
			}
			if (tc.path == malformed) != (r.Err != nil) || errors.Is(r.Err, fs.ErrNotExist) {
				t.Errorf("err %v; want one exactly for the malformed file, never for an absent one", r.Err)
			}
			for v, want := range map[int][]string{0: tc.logV0, 1: tc.logV1} {
				var lines []string
				logger := funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{Verbosity: v})
				r.log(logger, tc.strategies)
				got := strings.Join(lines, "\n")
				for _, w := range want {
					if !strings.Contains(got, w) {
						t.Errorf("log at V(%d) does not say %q:\n%s", v, w, got)
					}
				}
				if v == 0 && tc.noV0 && got != "" {
					t.Errorf("log at V(0) is not empty:\n%s", got)
				}
				for _, nw := range tc.notV0 {
					if v == 0 && strings.Contains(got, nw) {
						t.Errorf("log at V(0) says %q:\n%s", nw, got)
					}
				}
			}

			reg := prometheus.NewRegistry()
			m := NewMetrics(reg, "node-1")
			m.setEnvIsolation(CheckEnvIsolation(explicitTrue, cdi)) // a previous value is replaced
			m.setEnvIsolation(r)
			want := 0.0
			if tc.isolated {
				want = 1
			}
			if n := testutil.CollectAndCount(m.envIsolation); n != 1 {
				t.Errorf("%d series of gputopo_nodeagent_env_isolation, want 1", n)
			}
			if got := testutil.ToFloat64(m.envIsolation.WithLabelValues(tc.reason)); got != want {
				t.Errorf("gputopo_nodeagent_env_isolation{reason=%q} = %v, want %v", tc.reason, got, want)
			}
		})
	}
}
