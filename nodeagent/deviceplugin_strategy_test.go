package nodeagent

import (
	"context"
	"math/bits"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// answer is the part of a ContainerAllocateResponse that names GPUs, in
// plain values.
type answer struct {
	Env    map[string]string
	Mounts []mount
	CDI    []string
}

type mount struct{ ContainerPath, HostPath string }

func answerOf(r *pluginapi.ContainerAllocateResponse) answer {
	a := answer{Env: r.Envs}
	for _, m := range r.Mounts {
		a.Mounts = append(a.Mounts, mount{m.ContainerPath, m.HostPath})
	}
	for _, d := range r.CdiDevices {
		a.CDI = append(a.CDI, d.Name)
	}
	if len(r.Devices) > 0 || len(r.Annotations) > 0 {
		a.Env = map[string]string{"unexpected": "device specs or annotations in the answer"}
	}
	return a
}

func strategyPlugin(t *testing.T, opts DevicePluginOptions) (*DevicePlugin, []string) {
	t.Helper()
	f := fixture(t, "hgx-h100")
	opts.PluginDir = t.TempDir()
	p := NewDevicePlugin(opts, &fakePods{}, nil, logr.Discard())
	p.SetTopology(f.Graph(testNode).Status())
	ids := make([]string, f.GPUs)
	for i := range ids {
		ids[i] = p.devices[i].ID
	}
	return p, ids
}

func TestAllocateAnswersInEachDeviceListStrategy(t *testing.T) {
	_, ids := strategyPlugin(t, DevicePluginOptions{})
	envvar := func(idx ...int) map[string]string {
		return map[string]string{v1alpha1.EnvVisibleDevices: strings.Join(pick(ids, idx...), ",")}
	}
	mountRoot := map[string]string{v1alpha1.EnvVisibleDevices: "/var/run/nvidia-container-devices"}
	mounts := func(idx ...int) []mount {
		var out []mount
		for _, id := range pick(ids, idx...) {
			out = append(out, mount{"/var/run/nvidia-container-devices/" + id, "/dev/null"})
		}
		return out
	}
	cdi := func(kind string, idx ...int) []string {
		var out []string
		for _, id := range pick(ids, idx...) {
			out = append(out, kind+"="+id)
		}
		return out
	}
	// Two containers: GPUs 7 and 2 (kubelet's order), and GPU 0.
	tests := []struct {
		name       string
		strategies []configv1alpha1.DeviceListStrategy
		cdiKind    string
		want       []answer
	}{
		{
			name: "no strategy given means envvar",
			want: []answer{{Env: envvar(7, 2)}, {Env: envvar(0)}},
		},
		{
			name:       "envvar lists the GPUs in NVIDIA_VISIBLE_DEVICES in kubelet's order",
			strategies: []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListEnvvar},
			want:       []answer{{Env: envvar(7, 2)}, {Env: envvar(0)}},
		},
		{
			name:       "volume-mounts mounts /dev/null per GPU and points NVIDIA_VISIBLE_DEVICES at the mount root",
			strategies: []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListVolumeMounts},
			want:       []answer{{Env: mountRoot, Mounts: mounts(7, 2)}, {Env: mountRoot, Mounts: mounts(0)}},
		},
		{
			name:       "cdi-cri names CDI devices and sets no environment",
			strategies: []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListCDICRI},
			want:       []answer{{CDI: cdi("nvidia.com/gpu", 7, 2)}, {CDI: cdi("nvidia.com/gpu", 0)}},
		},
		{
			name:       "cdi-cri uses the configured CDI kind",
			strategies: []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListCDICRI}, cdiKind: "example.com/accelerator",
			want: []answer{{CDI: cdi("example.com/accelerator", 7, 2)}, {CDI: cdi("example.com/accelerator", 0)}},
		},
		{
			// As NVIDIA's plugin: the mount root replaces the UUID list.
			name:       "envvar with volume-mounts leaves the mounts to decide",
			strategies: []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListEnvvar, configv1alpha1.DeviceListVolumeMounts},
			want:       []answer{{Env: mountRoot, Mounts: mounts(7, 2)}, {Env: mountRoot, Mounts: mounts(0)}},
		},
		{
			name:       "envvar with cdi-cri carries the list and the CDI devices",
			strategies: []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListCDICRI, configv1alpha1.DeviceListEnvvar},
			want:       []answer{{Env: envvar(7, 2), CDI: cdi("nvidia.com/gpu", 7, 2)}, {Env: envvar(0), CDI: cdi("nvidia.com/gpu", 0)}},
		},
		{
			name:       "all three combine and a repeated strategy counts once",
			strategies: []configv1alpha1.DeviceListStrategy{configv1alpha1.DeviceListVolumeMounts, configv1alpha1.DeviceListCDICRI, configv1alpha1.DeviceListEnvvar, configv1alpha1.DeviceListCDICRI},
			want: []answer{
				{Env: mountRoot, Mounts: mounts(7, 2), CDI: cdi("nvidia.com/gpu", 7, 2)},
				{Env: mountRoot, Mounts: mounts(0), CDI: cdi("nvidia.com/gpu", 0)},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := strategyPlugin(t, DevicePluginOptions{DeviceListStrategies: tc.strategies, CDIKind: tc.cdiKind})
			resp, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
				{DevicesIds: pick(ids, 7, 2)}, {DevicesIds: pick(ids, 0)},
			}})
			if err != nil {
				t.Fatal(err)
			}
			var got []answer
			for _, cr := range resp.ContainerResponses {
				got = append(got, answerOf(cr))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answers (-want +got):\n%s", diff)
			}
		})
	}
}

// named is the set of GPUs an answer names through one strategy, read the
// way the NVIDIA container toolkit or the CDI runtime reads it.
func named(t *testing.T, s configv1alpha1.DeviceListStrategy, r *pluginapi.ContainerAllocateResponse) []string {
	t.Helper()
	var out []string
	switch s {
	case configv1alpha1.DeviceListEnvvar:
		if v := r.Envs[v1alpha1.EnvVisibleDevices]; v != "" {
			out = strings.Split(v, ",")
		}
	case configv1alpha1.DeviceListVolumeMounts:
		for _, m := range r.Mounts {
			dir, id := path.Split(m.ContainerPath)
			if m.HostPath != "/dev/null" || path.Clean(dir) != DeviceListMountRoot {
				t.Errorf("mount %s -> %s is not a device list entry", m.HostPath, m.ContainerPath)
			}
			out = append(out, id)
		}
	case configv1alpha1.DeviceListCDICRI:
		for _, d := range r.CdiDevices {
			id, ok := strings.CutPrefix(d.Name, configv1alpha1.DefaultCDIKind+"=")
			if !ok {
				t.Errorf("CDI device %q is not of kind %s", d.Name, configv1alpha1.DefaultCDIKind)
			}
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func TestEveryStrategyNamesExactlyTheAllocatedGPUs(t *testing.T) {
	for _, s := range configv1alpha1.DeviceListStrategies {
		t.Run(string(s), func(t *testing.T) {
			p, ids := strategyPlugin(t, DevicePluginOptions{DeviceListStrategies: []configv1alpha1.DeviceListStrategy{s}})
			// Every non-empty subset of the node's 8 GPUs, in a scrambled order.
			for set := uint(1); set < 1<<len(ids); set++ {
				var req []string
				for i := len(ids) - 1; i >= 0; i-- {
					if set&(1<<i) != 0 {
						req = append(req, ids[(i*5)%len(ids)])
					}
				}
				resp, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: req}}})
				if err != nil {
					t.Fatalf("allocate %v: %v", req, err)
				}
				want := slices.Sorted(slices.Values(req))
				if got := named(t, s, resp.ContainerResponses[0]); !slices.Equal(want, got) {
					t.Fatalf("%d GPUs %v allocated; the answer names %v", bits.OnesCount(set), want, got)
				}
			}
		})
	}
}

func TestAllocateRefusesWhenNoUsableStrategyIsConfigured(t *testing.T) {
	p, ids := strategyPlugin(t, DevicePluginOptions{DeviceListStrategies: []configv1alpha1.DeviceListStrategy{"cdi-annotations"}})
	_, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: pick(ids, 0)}}})
	if err == nil || !strings.Contains(err.Error(), `DeviceListStrategies[0]: Unsupported value: "cdi-annotations"`) {
		t.Errorf("Allocate with an unknown strategy: got %v, want an error naming the option and value", err)
	}
}

func TestDeviceListFlags(t *testing.T) {
	tests := []struct {
		name           string
		args           []string
		wantStrategies []string
		wantKind       string
		wantErrs       []string
	}{
		{
			name: "default is envvar with NVIDIA's CDI kind", wantStrategies: []string{"envvar"}, wantKind: "nvidia.com/gpu",
		},
		{
			name: "comma-separated strategies combine", args: []string{"--device-list-strategy=volume-mounts,cdi-cri"},
			wantStrategies: []string{"volume-mounts", "cdi-cri"}, wantKind: "nvidia.com/gpu",
		},
		{
			name: "a repeated flag accumulates", args: []string{"--device-list-strategy=cdi-cri", "--device-list-strategy", "volume-mounts", "--cdi-kind=example.com/gpu"},
			wantStrategies: []string{"cdi-cri", "volume-mounts"}, wantKind: "example.com/gpu",
		},
		{
			name: "an unknown strategy names the flag and the valid values", args: []string{"--device-list-strategy=envvar,cdi-annotations"},
			wantErrs: []string{`device-list-strategy[1]: Unsupported value: "cdi-annotations": supported values: "envvar", "volume-mounts", "cdi-cri"`},
		},
		{
			name: "a strategy is case-sensitive as in NVIDIA's plugin", args: []string{"--device-list-strategy=Volume-Mounts"},
			wantErrs: []string{`device-list-strategy[0]: Unsupported value: "Volume-Mounts"`},
		},
		{
			name: "a CDI kind without a class is refused", args: []string{"--cdi-kind=nvidia.com"},
			wantErrs: []string{`cdi-kind: Invalid value: "nvidia.com": must be a CDI kind <vendor>/<class>`},
		},
		{
			name: "every bad value is reported at once", args: []string{"--device-list-strategy=mounts", "--cdi-kind=nvidia.com/gpu=x"},
			wantErrs: []string{`device-list-strategy[0]: Unsupported value: "mounts"`, `cdi-kind: Invalid value: "nvidia.com/gpu=x"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var o Options
			fs := pflag.NewFlagSet("nodeagent", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(append([]string{"--node-name=n1"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			err := o.Validate()
			if len(tc.wantErrs) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if diff := cmp.Diff(tc.wantStrategies, o.DeviceListStrategies); diff != "" || o.CDIKind != tc.wantKind {
					t.Errorf("strategies (-want +got):\n%s\nCDI kind %q, want %q", diff, o.CDIKind, tc.wantKind)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted %q", tc.args)
			}
			for _, w := range tc.wantErrs {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
