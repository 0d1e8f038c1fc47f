package extender

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/machine"
)

// slowFilterEnv, when set to a duration (e.g. 50ms), makes FuzzStatus
// fail on any input whose UpsertTopology, filter or prioritize takes
// longer, so that the fuzzer keeps it as a finding. Off by default: timings
// are not assertions in ordinary runs.
const slowFilterEnv = "GPUTOPO_FUZZ_SLOW_FILTER"

// FuzzStatus feeds arbitrary NodeGPUTopology statuses, as the extender's
// informer would hand them over, through the ledger's UpsertTopology and
// then filter and prioritize for a few requests. No input may panic; a
// node passes only when its topology is one the model accepts, observed
// at a believable time and not stale; every refusal carries the reason
// prefix; scores stay in the extender API's range.
func FuzzStatus(f *testing.F) {
	seed := func(st v1alpha1.NodeGPUTopologyStatus, offsetSec int64, k, variant uint8) {
		data, err := json.Marshal(st)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, offsetSec, k, variant)
	}
	for _, fx := range machine.Fixtures() {
		if fx.GPUs > 4 { // larger seeds (5 KB of JSON) stall the fuzzing engine
			continue
		}
		st := fx.Graph("seed").Status()
		seed(st, 0, 2, 0x05)
		st.Telemetry = []v1alpha1.Telemetry{{Index: 0, UtilizationPercent: 250, TemperatureC: -40, PowerWatts: 1 << 30}, {Index: 9}}
		seed(st, 600, 3, 0x2a)
	}
	for _, s := range []string{
		`{"gpus":[{"index":0,"uuid":"a"},{"index":1,"uuid":"b"}],"links":[{"a":0,"b":1,"pcie":"SameSwitch","nvlinks":2,"bandwidthGBps":0}]}`,
		`{"gpus":[{"index":0,"uuid":"a"},{"index":1,"uuid":"b"}],"links":[{"a":0,"b":1,"pcie":"CrossSocket","bandwidthGBps":900}]}`,
		`{"gpus":[{"index":0,"uuid":"a"},{"index":1,"uuid":"b"}],"links":[{"a":1,"b":0,"pcie":"SameNUMA","nvlinks":18,"nvswitch":true,"bandwidthGBps":9223372036854775807}]}`,
		`{"gpus":[{"index":0,"uuid":"a","pciBusID":"0000:07:00.0","memoryMiB":9223372036854775807},{"index":1,"uuid":"b","pciBusID":"0000:07:00.0","health":"Unhealthy"}],"links":[{"a":0,"b":1,"pcie":"HostBridge","p2p":true,"bandwidthGBps":48}],"observedTime":"9999-12-31T23:59:59Z"}`,
		`{"gpus":[{"index":1,"uuid":"a"},{"index":0,"uuid":"a"}],"stale":true,"staleReason":"nvml topology refused: DuplicateBusID: GPU 0 and GPU 1 both report PCI bus ID 0000:07:00.0","conditions":[{"type":"TopologyConsistent","status":"False","reason":"DuplicateBusID","message":"m","lastTransitionTime":"2026-01-01T00:00:00Z"}]}`,
		`{"gpus":[{"index":0,"uuid":"a","fabricClique":"x.1"},{"index":2,"uuid":"c"},{"index":1,"uuid":"b"}],"links":[{"a":0,"b":1,"pcie":"Internal","bandwidthGBps":256},{"a":0,"b":2,"pcie":"SameSwitch","bandwidthGBps":64},{"a":2,"b":1,"pcie":"SameSwitch","bandwidthGBps":64}],"telemetry":[{"index":2,"utilizationPercent":-5}]}`,
		`{"observedTime":"1969-07-20T20:17:40Z"}`, `{}`, `null`, `{"gpus":null,"links":[{}]}`,
	} {
		f.Add([]byte(s), int64(0), uint8(1), uint8(0x01))
	}

	var slow time.Duration
	if v := os.Getenv(slowFilterEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.Fatalf("%s=%q: %v", slowFilterEnv, v, err)
		}
		slow = d
	}
	x, _ := newTestExtender(f, nil)
	const node = "n"
	f.Fuzz(func(t *testing.T, data []byte, offsetSec int64, k, variant uint8) {
		var st v1alpha1.NodeGPUTopologyStatus
		if json.Unmarshal(data, &st) != nil {
			return
		}
		// Most inputs get an observedTime near the extender's clock, some
		// none at all; the JSON's own (any year) wins when it has one.
		if st.ObservedTime.IsZero() && variant&0x80 == 0 {
			st.ObservedTime = metav1.NewTime(testNow.Add(time.Duration(offsetSec%(1<<32)) * time.Second))
		}
		if variant&0x40 != 0 {
			st.TelemetryTime = metav1.NewTime(testNow)
		}
		obj := &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: st}
		timed := func(what string, fn func()) {
			start := time.Now()
			fn()
			if took := time.Since(start); slow > 0 && took > slow {
				t.Errorf("%s took %s (over %s=%s) for this input", what, took, slowFilterEnv, slow)
			}
		}
		timed("UpsertTopology", func() { x.core.Feed().UpsertTopology(obj) })

		_, graphErr := topology.FromStatus(&st)
		ahead, maxAge := st.ObservedTime.Time.Sub(testNow), x.cfg.TopologyAgeLimit()
		trusted := graphErr == nil && !st.Stale && !st.ObservedTime.IsZero() &&
			(maxAge <= 0 || ahead <= ledger.ClockSkew && -ahead <= maxAge)

		strategy := v1alpha1.Strategies[int(variant)%len(v1alpha1.Strategies)]
		for i, req := range []v1alpha1.Requirement{
			{Strategy: strategy},
			{Strategy: strategy, RequireNVLink: true, MinPairBandwidthGBps: int(variant&0x0c) * 50},
			{GPUMemoryMiB: int64(variant&0x30) << 12},
		} {
			raw, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			gpus := int64(k%10) + int64(i)
			pod := makePod(fmt.Sprintf("p%d", i)).gpus(gpus).req(string(raw)).obj()
			names := []string{node}
			args := &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names}
			var res *extenderv1.ExtenderFilterResult
			timed(fmt.Sprintf("filter of a %d-GPU pod %s", gpus, raw), func() { res = x.Filter(context.Background(), args) })
			if res.Error != "" {
				t.Fatalf("filter Error %q for a well-formed pod", res.Error)
			}
			passed := len(*res.NodeNames) == 1
			failed, unresolvable := res.FailedNodes[node], res.FailedAndUnresolvableNodes[node]
			switch {
			case passed && (failed != "" || unresolvable != ""):
				t.Fatalf("node both passed and failed: %+v", res)
			case gpus == 0:
				// A pod without GPUs passes untouched.
			case passed && !trusted:
				t.Fatalf("node passed with a topology that must be refused (graph error %v, stale %v, observed %v)", graphErr, st.Stale, st.ObservedTime)
			case !passed && failed == "" && unresolvable == "":
				t.Fatalf("node neither passed nor failed: %+v", res)
			case !passed && !strings.HasPrefix(failed+unresolvable, placement.ReasonPrefix):
				t.Fatalf("refusal %q lacks the %q prefix", failed+unresolvable, placement.ReasonPrefix)
			}
			var list extenderv1.HostPriorityList
			timed(fmt.Sprintf("prioritize of a %d-GPU pod %s", gpus, raw), func() { list, err = x.Prioritize(context.Background(), args) })
			if err != nil {
				t.Fatalf("prioritize: %v", err)
			}
			for _, h := range list {
				if h.Score < extenderv1.MinExtenderPriority || h.Score > extenderv1.MaxExtenderPriority {
					t.Fatalf("score %d out of range", h.Score)
				}
			}
		}
	})
}
