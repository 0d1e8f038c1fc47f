package v1alpha1

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseRequirementAcceptsValidValues(t *testing.T) {
	tests := map[string]struct {
		in   string
		want Requirement
	}{
		"full model-parallel requirement": {
			in:   `{"requireNVLink": true, "minPairBandwidthGBps": 300, "strategy": "highest_bandwidth", "gpuMemoryMiB": 40000}`,
			want: Requirement{RequireNVLink: true, MinPairBandwidthGBps: 300, Strategy: StrategyHighestBandwidth, GPUMemoryMiB: 40000},
		},
		"empty object means defaults": {in: `{}`, want: Requirement{}},
		"each strategy by name: numa_local": {
			in: `{"strategy":"numa_local"}`, want: Requirement{Strategy: StrategyNUMALocal},
		},
		"each strategy by name: balanced_utilization": {
			in: `{"strategy":"balanced_utilization"}`, want: Requirement{Strategy: StrategyBalancedUtilization},
		},
		"each strategy by name: lowest_fragmentation": {
			in: `{"strategy":"lowest_fragmentation"}`, want: Requirement{Strategy: StrategyLowestFragmentation},
		},
		"limits are inclusive": {
			in:   `{"minPairBandwidthGBps":100000,"gpuMemoryMiB":16777216}`,
			want: Requirement{MinPairBandwidthGBps: MaxPairBandwidthGBps, GPUMemoryMiB: MaxGPUMemoryMiB},
		},
		"surrounding whitespace": {in: " \n{\"requireNVLink\":false}\n ", want: Requirement{}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseRequirement(tc.in)
			if err != nil {
				t.Fatalf("ParseRequirement(%q) error: %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseRequirement(%q) mismatch (-want +got):\n%s", tc.in, diff)
			}
		})
	}
}

func TestParseRequirementRejectsEveryBadFieldWithExactMessage(t *testing.T) {
	const p = "metadata.annotations[gputopo.io/gpu-topology-requirement]"
	tests := map[string]struct {
		in   string
		want string
	}{
		"empty value": {
			in:   ``,
			want: p + `: Required value: must be a JSON object such as {"requireNVLink":true,"strategy":"highest_bandwidth"}`,
		},
		"unknown field is named": {
			in:   `{"requireNvlink": true}`,
			want: p + `.requireNvlink: Unsupported value: "requireNvlink": supported values: "requireNVLink", "minPairBandwidthGBps", "strategy", "gpuMemoryMiB", "fallbackAfter"`,
		},
		"fallbackAfter without a link constraint": {
			in:   `{"strategy":"highest_bandwidth","fallbackAfter":"30m"}`,
			want: p + `.fallbackAfter: Invalid value: "30m0s": applies only to a requirement with requireNVLink or minPairBandwidthGBps (there is nothing to fall back from); remove fallbackAfter or require NVLink`,
		},
		"negative fallbackAfter": {
			in:   `{"requireNVLink":true,"fallbackAfter":"-5m"}`,
			want: p + `.fallbackAfter: Invalid value: "-5m0s": must be a positive duration such as "30m"; leave it out to never fall back`,
		},
		"fallbackAfter beyond a week": {
			in:   `{"requireNVLink":true,"fallbackAfter":"200h"}`,
			want: p + `.fallbackAfter: Invalid value: "200h0m0s": must be at most 168h0m0s`,
		},
		"fallbackAfter that is not a duration": {
			in:   `{"requireNVLink":true,"fallbackAfter":"soon"}`,
			want: p + `.fallbackAfter: Invalid value: "{\"requireNVLink\":true,\"fallbackAfter\":\"soon\"}": must be a duration string such as "30m"`,
		},
		"fallbackAfter as a number": {
			in:   `{"requireNVLink":true,"fallbackAfter":1800}`,
			want: p + `.fallbackAfter: Invalid value: "{\"requireNVLink\":true,\"fallbackAfter\":1800}": must be a JSON string, not number`,
		},
		"unknown strategy": {
			in:   `{"strategy":"fastest"}`,
			want: p + `.strategy: Unsupported value: "fastest": supported values: "highest_bandwidth", "numa_local", "balanced_utilization", "lowest_fragmentation"`,
		},
		"negative bandwidth": {
			in:   `{"minPairBandwidthGBps":-1}`,
			want: p + `.minPairBandwidthGBps: Invalid value: -1: must be 0 (no minimum) or a positive bandwidth in GB/s, bidirectional`,
		},
		"bandwidth beyond any machine": {
			in:   `{"minPairBandwidthGBps":100001}`,
			want: p + `.minPairBandwidthGBps: Invalid value: 100001: must be at most 100000 GB/s`,
		},
		"negative memory": {
			in:   `{"gpuMemoryMiB":-5}`,
			want: p + `.gpuMemoryMiB: Invalid value: -5: must be 0 (any) or a positive amount of memory per GPU in MiB`,
		},
		"memory beyond any GPU": {
			in:   `{"gpuMemoryMiB":16777217}`,
			want: p + `.gpuMemoryMiB: Invalid value: 16777217: must be at most 16777216 MiB`,
		},
		"requireNVLink of the wrong type": {
			in:   `{"requireNVLink":"yes"}`,
			want: p + `.requireNVLink: Invalid value: "{\"requireNVLink\":\"yes\"}": must be a JSON boolean, not string`,
		},
		"fractional bandwidth": {
			in:   `{"minPairBandwidthGBps":300.5}`,
			want: p + `.minPairBandwidthGBps: Invalid value: "{\"minPairBandwidthGBps\":300.5}": must be a JSON integer, not number 300.5`,
		},
		"strategy of the wrong type": {
			in:   `{"strategy":1}`,
			want: p + `.strategy: Invalid value: "{\"strategy\":1}": must be a JSON string, not number`,
		},
		"not an object": {
			in:   `[1,2]`,
			want: p + `: Invalid value: "[1,2]": must be a JSON object: cannot unmarshal array into Go value of type v1alpha1.Requirement`,
		},
		"truncated JSON": {
			in:   `{"strategy":`,
			want: p + `: Invalid value: "{\"strategy\":": must be a JSON object: unexpected end of JSON input`,
		},
		"trailing data": {
			in:   `{} {}`,
			want: p + `: Invalid value: "{} {}": must be a JSON object: invalid character '{' after top-level value`,
		},
		"duplicate field": {
			in:   `{"strategy":"numa_local","strategy":"numa_local"}`,
			want: p + `.strategy: Duplicate value: "strategy"`,
		},
		"every problem at once": {
			in: `{"minPairBandwidthGBps":-1,"gpuMemoryMiB":-1,"strategy":"x"}`,
			want: "[" + p + `.minPairBandwidthGBps: Invalid value: -1: must be 0 (no minimum) or a positive bandwidth in GB/s, bidirectional, ` +
				p + `.gpuMemoryMiB: Invalid value: -1: must be 0 (any) or a positive amount of memory per GPU in MiB, ` +
				p + `.strategy: Unsupported value: "x": supported values: "highest_bandwidth", "numa_local", "balanced_utilization", "lowest_fragmentation"]`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseRequirement(tc.in)
			if err == nil {
				t.Fatalf("ParseRequirement(%q) = %+v, want error %q", tc.in, got, tc.want)
			}
			if diff := cmp.Diff(tc.want, err.Error()); diff != "" {
				t.Errorf("error message mismatch (-want +got):\n%s", diff)
			}
			if got != (Requirement{}) {
				t.Errorf("on error the returned requirement must be zero, got %+v", got)
			}
		})
	}
}

func TestRequirementStringRoundTrips(t *testing.T) {
	in := Requirement{RequireNVLink: true, MinPairBandwidthGBps: 300, Strategy: StrategyNUMALocal, GPUMemoryMiB: 1}
	got, err := ParseRequirement(in.String())
	if err != nil {
		t.Fatalf("parse %q: %v", in.String(), err)
	}
	if diff := cmp.Diff(in, got); diff != "" {
		t.Errorf("round trip mismatch (-want +got):\n%s", diff)
	}
	if s := (Requirement{}).String(); s != "{}" {
		t.Errorf("zero requirement encodes as %q, want {}", s)
	}
}

func TestEffectiveStrategyDefaultsToLowestFragmentation(t *testing.T) {
	if got := (Requirement{}).EffectiveStrategy(); got != StrategyLowestFragmentation {
		t.Errorf("got %q", got)
	}
	if got := (Requirement{Strategy: StrategyNUMALocal}).EffectiveStrategy(); got != StrategyNUMALocal {
		t.Errorf("got %q", got)
	}
}

func TestParseParallelism(t *testing.T) {
	for _, ok := range []string{"data", "model", " model "} {
		if _, err := ParseParallelism(nil, ok); err != nil {
			t.Errorf("ParseParallelism(%q): %v", ok, err)
		}
	}
	_, err := ParseParallelism(RequirementPath.Root().Child("metadata", "annotations").Key(AnnotationParallelism), "pipeline")
	if err == nil || !strings.Contains(err.Error(), `metadata.annotations[gputopo.io/parallelism]: Unsupported value: "pipeline": supported values: "data", "model"`) {
		t.Errorf("got %v", err)
	}
}

func TestParseGPUList(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []string
		wantErr string
	}{
		"empty is no GPUs":     {in: "", want: nil},
		"two UUIDs":            {in: "GPU-a,GPU-b", want: []string{"GPU-a", "GPU-b"}},
		"spaces around commas": {in: "GPU-a , GPU-b", want: []string{"GPU-a", "GPU-b"}},
		"empty entry":          {in: "GPU-a,,GPU-b", wantErr: "annotation gputopo.io/assigned-gpus: entry 1 is empty; want comma-separated GPU UUIDs"},
		"duplicate":            {in: "GPU-a,GPU-a", wantErr: "annotation gputopo.io/assigned-gpus: GPU GPU-a listed twice"},
		"inner whitespace":     {in: "GPU a", wantErr: `annotation gputopo.io/assigned-gpus: entry 0 "GPU a" contains whitespace`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseGPUList(AnnotationAssignedGPUs, tc.in)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestPlacementRoundTrips(t *testing.T) {
	in := Placement{Node: "n1", Strategy: StrategyHighestBandwidth, GPUIndices: []int{0, 3, 2, 1}, Tier: TierNVLink, MinPairBandwidthGBps: 50, RingBandwidthGBps: 100, Score: 9}
	got, err := ParsePlacement(in.String())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(in, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if _, err := ParsePlacement("{"); err == nil || !strings.Contains(err.Error(), AnnotationPlacement) {
		t.Errorf("malformed placement: error %v should name the annotation", err)
	}
}
