//go:build integration

package extender_test

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/test/harness"
)

// setAgentTelemetry publishes telemetry for every GPU of node, as the node
// agent would.
func setAgentTelemetry(t *testing.T, e *env, node string, util, tempC int32) {
	t.Helper()
	ctx := harness.Context(t)
	obj := &v1alpha1.NodeGPUTopology{}
	if err := e.cp.Client.Get(ctx, client.ObjectKey{Name: node}, obj); err != nil {
		t.Fatal(err)
	}
	obj.Status.TelemetryTime = metav1.Now()
	obj.Status.Telemetry = nil
	for _, g := range obj.Status.GPUs {
		obj.Status.Telemetry = append(obj.Status.Telemetry, v1alpha1.Telemetry{Index: g.Index, UtilizationPercent: util, TemperatureC: tempC, PowerWatts: 100, PowerLimitWatts: 300})
	}
	if err := e.cp.Client.Status().Update(ctx, obj); err != nil {
		t.Fatalf("update telemetry of %s: %v", node, err)
	}
}

// counter reads one labelled counter of an extender's registry.
func counter(t *testing.T, x *extender.Extender, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := x.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !found {
					continue metrics
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

// slowAnswers counts filter and prioritize answers that took over 1s, from
// the serving extender's latency histogram.
func slowAnswers(t *testing.T, x *extender.Extender) (slow, total uint64) {
	t.Helper()
	mfs, err := x.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gputopo_extender_scheduling_latency_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			phase := ""
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "phase" {
					phase = lp.GetValue()
				}
			}
			if phase != "filter" && phase != "prioritize" {
				continue
			}
			h := m.GetHistogram()
			total += h.GetSampleCount()
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() == 1 {
					slow += h.GetSampleCount() - b.GetCumulativeCount()
				}
			}
		}
	}
	return slow, total
}

// TestShadowReportsDifferingDecisions runs two extenders on one control
// plane with the real kube-scheduler: the serving one with the default
// weights, a shadow ranking by thermal headroom alone. Node dgx-0 is idle
// but hot, dgx-1 busy but cool. Of three pods only the first has a choice
// to make, and there the policies differ: the shadow reports exactly that
// decision. Then the shadow stops answering (a listener that never
// replies): scheduling goes on, no answer waits for it, and the failed
// mirrors are counted.
func TestShadowReportsDifferingDecisions(t *testing.T) {
	e := newEnv(t, 2)
	setAgentTelemetry(t, e, "dgx-0", 0, 84)
	setAgentTelemetry(t, e, "dgx-1", 60, 30)

	thermal := configv1alpha1.DefaultExtenderConfiguration()
	zero, hundred := int32(0), int32(100)
	thermal.Weights = configv1alpha1.Weights{Profile: configv1alpha1.WeightsPlacement, UtilizationBalance: &zero, TaskAffinity: &zero, ThermalPowerHeadroom: &hundred, Fragmentation: &zero,
		BandwidthFit: &zero, CapabilityConservation: &zero, IslandBestFit: &zero}
	shadow := startExtenderWith(t, e, 0, func(o *extender.Options) {
		o.Shadow, o.ShadowLogSampleRate, o.Config = true, 1, thermal
	})
	// The serving extender balances utilization (the design profile): it
	// prefers the idle node, the shadow the cool one.
	design := &configv1alpha1.ExtenderConfiguration{Weights: configv1alpha1.Weights{Profile: configv1alpha1.WeightsDesign}}
	configv1alpha1.SetExtenderDefaults(design)
	serving := startExtenderWith(t, e, 0, func(o *extender.Options) {
		o.ShadowURL, o.ShadowTimeout, o.Config = shadow.url(), 4*time.Second, design
	})
	waitReady(t, serving, shadow)
	startScheduler(t, e, serving.url())
	ctx := harness.Context(t)

	decided := func(verb string) float64 {
		return counter(t, shadow.Extender.Extender, "gputopo_extender_shadow_decisions_total", "verb", verb, "result", "same") +
			counter(t, shadow.Extender.Extender, "gputopo_extender_shadow_decisions_total", "verb", verb, "result", "different")
	}
	// One pod at a time, each compared before the next is created, so that
	// the shadow decides each against the cluster the serving extender saw.
	steps := []struct {
		name               string
		gpus               int64
		filter, prioritize float64 // decisions compared so far
	}{
		{"p1", 1, 1, 1}, // a choice between dgx-0 and dgx-1
		{"p2", 8, 2, 1}, // only dgx-1 has 8 free: no scoring
		{"p3", 1, 3, 1}, // dgx-1 is full: only dgx-0
	}
	for _, s := range steps {
		createAll(t, e, []*corev1.Pod{gpuPod(s.name, s.gpus, "")})
		if _, err := e.cp.WaitForPod(ctx, "default", s.name, time.Minute, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" }); err != nil {
			t.Fatalf("pod %s not bound: %v", s.name, err)
		}
		harness.Poll(t, 30*time.Second, "the shadow to compare "+s.name, func() (bool, string) {
			f, p := decided("filter"), decided("prioritize")
			return f == s.filter && p == s.prioritize && shadow.Core().Report().Counts().Held == boundGPUs(listPods(t, e)),
				fmt.Sprintf("filter %v prioritize %v compared; shadow ledger %s", f, p, shadow.Core().Report().Counts())
		})
	}

	decisions := shadow.ShadowDecisions()
	if len(decisions) != 1 {
		t.Fatalf("decision log holds %d entries, want exactly the one for p1: %+v", len(decisions), decisions)
	}
	d := decisions[0]
	if d.Verb != "prioritize" || d.Pod != "default/p1" || len(d.Differences) != 1 {
		t.Fatalf("decision %+v, want p1's prioritize with one difference", d)
	}
	diff := d.Differences[0]
	if diff.Kind != extender.DiffTopNode || diff.ServingNode != "dgx-0" || diff.ShadowNode != "dgx-1" || len(diff.ServingGPUs) != 1 || len(diff.ShadowGPUs) != 1 {
		t.Errorf("difference %+v, want top_node dgx-0 (serving) vs dgx-1 (shadow), one GPU each", diff)
	}
	if !strings.Contains(diff.Reason, "shadow ranks dgx-1: 10 (") || !strings.Contains(diff.Reason, "above dgx-0: 0 (") {
		t.Errorf("reason %q does not give both scores", diff.Reason)
	}
	for _, c := range []struct {
		verb, result string
		want         float64
	}{{"filter", "same", 3}, {"filter", "different", 0}, {"prioritize", "different", 1}, {"prioritize", "same", 0}} {
		if got := counter(t, shadow.Extender.Extender, "gputopo_extender_shadow_decisions_total", "verb", c.verb, "result", c.result); got != c.want {
			t.Errorf("shadow decisions{%s,%s} = %v, want %v", c.verb, c.result, got, c.want)
		}
	}
	if got := counter(t, serving.Extender.Extender, "gputopo_extender_shadow_mirrored_requests_total", "verb", "filter", "result", "sent"); got != 3 {
		t.Errorf("serving extender mirrored %v filter requests, want 3", got)
	}
	if p1, err := e.cp.Clientset.CoreV1().Pods("default").Get(ctx, "p1", metav1.GetOptions{}); err != nil || p1.Spec.NodeName != "dgx-0" {
		t.Errorf("p1 bound to %q (%v): the serving extender's policy must decide, not the shadow's", p1.Spec.NodeName, err)
	}
	if slow, total := slowAnswers(t, serving.Extender.Extender); total == 0 || slow != 0 {
		t.Fatalf("with the shadow up: %d of %d answers over 1s", slow, total)
	}

	// The shadow goes away; its port now accepts connections and never
	// answers, the worst case for a caller that waited.
	port := shadow.port
	if err := shadow.stop(); err != nil {
		t.Fatalf("stop shadow: %v", err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("listen on the shadow's port: %v", err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	_, before := slowAnswers(t, serving.Extender.Extender)
	for i := range 4 {
		name := fmt.Sprintf("q%d", i)
		createAll(t, e, []*corev1.Pod{gpuPod(name, 1, "")})
		if _, err := e.cp.WaitForPod(ctx, "default", name, time.Minute, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" }); err != nil {
			t.Fatalf("with the shadow down, pod %s not bound: %v", name, err)
		}
	}
	harness.Poll(t, 30*time.Second, "mirror errors to be counted", func() (bool, string) {
		n := counter(t, serving.Extender.Extender, "gputopo_extender_shadow_mirrored_requests_total", "verb", "filter", "result", "error")
		return n >= 4, fmt.Sprintf("%v filter mirrors failed", n)
	})
	slow, total := slowAnswers(t, serving.Extender.Extender)
	if total <= before || slow != 0 {
		t.Errorf("with the shadow down: %d of %d answers over 1s (each mirror hung %s); answers must not wait for the shadow", slow, total-before, 4*time.Second)
	}
	auditPods(t, listPods(t, e))
}
