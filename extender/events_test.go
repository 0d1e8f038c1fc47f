package extender

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
)

// eventsOn is the default configuration with events.gpusBound on.
func eventsOn() *configv1alpha1.ExtenderConfiguration {
	cfg := configv1alpha1.DefaultExtenderConfiguration()
	cfg.Events.GPUsBound = new(true)
	return cfg
}

// With events.gpusBound on, a bound pod gets one Normal GPUsBound Event
// naming its node, GPU indices and UUIDs, tier and ring bandwidth; a
// replica that does not lead records nothing; by default (off) no bind
// records it.
func TestBindRecordsGPUsBoundEventOnLeaderOnly(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cfg     *configv1alpha1.ExtenderConfiguration
		leading bool
		want    int
	}{
		{name: "leader records the event", cfg: eventsOn(), leading: true, want: 1},
		{name: "standby records nothing", cfg: eventsOn(), leading: false, want: 0},
		{name: "off by default", leading: true, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := makePod("mp").gpus(4).req(modelParallel).obj()
			x, cs := newTestExtender(t, tc.cfg, pod)
			rec := record.NewFakeRecorder(4)
			runtimeOf(x).setRecorder(rec)
			if !tc.leading {
				runtimeOf(x).stopLeading()
			}
			x.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "a"))
			x.core.Feed().UpsertPod(pod)
			if res := x.Bind(context.Background(), bindArgs(pod, "a")); res.Error != "" {
				t.Fatalf("bind: %s", res.Error)
			}
			close(rec.Events)
			var events []string
			for e := range rec.Events {
				events = append(events, e)
			}
			if len(events) != tc.want {
				t.Fatalf("events %q; want %d", events, tc.want)
			}
			if tc.want == 0 {
				return
			}
			got := getPod(t, cs, "mp")
			e := events[0]
			for _, want := range []string{"Normal " + placement.ReasonGPUsBound, "node a:", "tier nvlink", "ring ", "GB/s", "strategy highest_bandwidth"} {
				if !strings.Contains(e, want) {
					t.Errorf("event %q does not contain %q", e, want)
				}
			}
			for _, u := range assignedOf(t, got) {
				if !strings.Contains(e, u) {
					t.Errorf("event %q does not name assigned GPU %s", e, u)
				}
			}
		})
	}
}

// A pod bound after its fallbackAfter to GPUs that miss its requirement
// also gets a Warning PlacementFellBack Event saying why (whether or not
// GPUsBound is on: the warning is always recorded).
func TestBindAfterFallbackRecordsPlacementFellBack(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("gpusBound=%v", on), func(t *testing.T) {
			cfg := configv1alpha1.DefaultExtenderConfiguration()
			cfg.Events.GPUsBound = new(on)
			fellBack(t, cfg, on)
		})
	}
}

func fellBack(t *testing.T, cfg *configv1alpha1.ExtenderConfiguration, bound bool) {
	pod := makePod("mp").gpus(2).req(`{"requireNVLink":true,"strategy":"highest_bandwidth","fallbackAfter":"30m"}`).obj()
	pod.CreationTimestamp = metav1.NewTime(testNow.Add(-time.Hour))
	x, _ := newTestExtender(t, cfg, pod)
	rec := record.NewFakeRecorder(4)
	runtimeOf(x).setRecorder(rec)
	x.core.Feed().UpsertTopology(topo(t, "pcie-8x", "pcie"))
	x.core.Feed().UpsertPod(pod)
	if res := x.Bind(context.Background(), bindArgs(pod, "pcie")); res.Error != "" {
		t.Fatalf("bind: %s", res.Error)
	}
	close(rec.Events)
	var events []string
	for e := range rec.Events {
		events = append(events, e)
	}
	if bound {
		if len(events) == 0 || !strings.HasPrefix(events[0], "Normal "+placement.ReasonGPUsBound) {
			t.Fatalf("events %q; want GPUsBound first", events)
		}
		events = events[1:]
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], "Warning "+placement.ReasonPlacementFellBack) || !strings.Contains(events[0], "fallbackAfter 30m0s") {
		t.Errorf("events %q; want PlacementFellBack naming fallbackAfter", events)
	}
}
