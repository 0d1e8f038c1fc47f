package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/placement/metrics"

	"k8s.io/apimachinery/pkg/util/wait"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// thermalOnly is a configuration that ranks by thermal headroom alone.
func thermalOnly() *configv1alpha1.ExtenderConfiguration {
	c := configv1alpha1.DefaultExtenderConfiguration()
	c.Weights = configv1alpha1.Weights{Profile: configv1alpha1.WeightsPlacement, UtilizationBalance: ptr[int32](0), TaskAffinity: ptr[int32](0), ThermalPowerHeadroom: ptr[int32](100), Fragmentation: ptr[int32](0),
		BandwidthFit: ptr[int32](0), CapabilityConservation: ptr[int32](0), IslandBestFit: ptr[int32](0)}
	return c
}

// shadowPair is a serving extender with default weights and a shadow with
// thermal-only weights, both fed the same cluster: node a idle but hot,
// node b busy but cool.
func shadowPair(t *testing.T) (serving, shadow *Extender) {
	t.Helper()
	// The design profile's utilization balance prefers the idle node.
	serving, _ = newTestExtender(t, profile(configv1alpha1.WeightsDesign))
	shadow, _ = newTestExtender(t, thermalOnly())
	shadow.opts.Shadow = true
	shadow.shadowLog = &decisionLog{rate: 1}
	for _, x := range []*Extender{serving, shadow} {
		x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "a"), 0, 84, 0, 300))
		x.core.Feed().UpsertTopology(withTelemetry(topo(t, "dgx1-v100", "b"), 60, 30, 0, 300))
	}
	return serving, shadow
}

// mirrored builds what the serving extender would mirror for args.
func mirrored(t *testing.T, x *Extender, verb string, args *extenderv1.ExtenderArgs) *ShadowRequest {
	t.Helper()
	if verb == phaseFilter {
		return &ShadowRequest{Verb: verb, Args: *args, Filter: x.Filter(context.Background(), args)}
	}
	list, top, err := x.prioritize(context.Background(), args, true)
	if err != nil {
		t.Fatal(err)
	}
	return &ShadowRequest{Verb: verb, Args: *args, Priorities: list, Top: top}
}

func postShadow(t *testing.T, shadow *Extender, r *ShadowRequest) ShadowDecision {
	t.Helper()
	b, _ := json.Marshal(r)
	rec := httptest.NewRecorder()
	shadow.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, ShadowPath, bytes.NewReader(b)))
	if rec.Code != http.StatusOK {
		t.Fatalf("POST %s: %d %s", ShadowPath, rec.Code, rec.Body)
	}
	var d ShadowDecision
	if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestShadowReportsDifferingTopNode(t *testing.T) {
	serving, shadow := shadowPair(t)
	pod := makePod("p").gpus(1).obj()
	args := &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"a", "b"}}

	if d := postShadow(t, shadow, mirrored(t, serving, phaseFilter, args)); !d.Same {
		t.Errorf("filter: weights do not change filter, yet the shadow reports %+v", d.Differences)
	}
	r := mirrored(t, serving, phasePrioritize, args)
	if r.Top == nil || r.Top.Node != "a" {
		t.Fatalf("serving extender's top pick %+v, want node a (idle)", r.Top)
	}
	d := postShadow(t, shadow, r)
	if d.Same || len(d.Differences) != 1 {
		t.Fatalf("prioritize: want exactly one difference, got %+v", d)
	}
	diff := d.Differences[0]
	if diff.Kind != DiffTopNode || diff.ServingNode != "a" || diff.ShadowNode != "b" || len(diff.ShadowGPUs) != 1 || !slices.Equal(diff.ServingGPUs, r.Top.GPUs) {
		t.Errorf("difference %+v, want top_node a -> b with one GPU each", diff)
	}
	for _, want := range []string{"shadow ranks b: 10 (", "headroom 1.00", "above a: 0 (", "serving extender 10"} {
		if !strings.Contains(diff.Reason, want) {
			t.Errorf("reason %q lacks %q", diff.Reason, want)
		}
	}
	if d.Pod != "default/p" || d.PodUID != pod.UID || d.Verb != phasePrioritize {
		t.Errorf("decision names %s %s %s", d.Verb, d.Pod, d.PodUID)
	}
	if got := shadow.ShadowDecisions(); len(got) != 1 || got[0].Differences[0].ShadowNode != "b" {
		t.Errorf("decision log %+v, want the one differing decision", got)
	}
	for _, c := range []struct {
		verb, result string
		want         float64
	}{{phaseFilter, "same", 1}, {phasePrioritize, "different", 1}, {phasePrioritize, "same", 0}} {
		if got := metricValue(t, shadow, "gputopo_extender_shadow_decisions_total", "verb", c.verb, "result", c.result); got != c.want {
			t.Errorf("decisions{%s,%s} = %v, want %v", c.verb, c.result, got, c.want)
		}
	}
	if got := metricValue(t, shadow, "gputopo_extender_shadow_differences_total", "kind", DiffTopNode); got != 1 {
		t.Errorf("differences{top_node} = %v, want 1", got)
	}
}

// TestShadowReportsFilterDifferences: a node the shadow sees with an
// unhealthy GPU fails there with its reason, in both directions.
func TestShadowReportsFilterDifferences(t *testing.T) {
	serving, shadow := shadowPair(t)
	sick := topo(t, "dgx1-v100", "b")
	sick.Status.GPUs[3].Health = v1alpha1.GPUUnhealthy
	shadow.core.Feed().UpsertTopology(sick)
	args := &extenderv1.ExtenderArgs{Pod: makePod("big").gpus(8).obj(), NodeNames: &[]string{"a", "b"}}
	d := postShadow(t, shadow, mirrored(t, serving, phaseFilter, args))
	if len(d.Differences) != 1 {
		t.Fatalf("want one difference, got %+v", d.Differences)
	}
	diff := d.Differences[0]
	if diff.Kind != DiffFilter || diff.Node != "b" || diff.Serving != "passed" || !strings.Contains(diff.Shadow, "gputopo: needs 8 GPUs; 7 of 8 are free") {
		t.Errorf("difference %+v", diff)
	}
	// The reverse: the serving extender saw b sick, the shadow healthy.
	serving.core.Feed().UpsertTopology(sick)
	shadow.core.Feed().UpsertTopology(topo(t, "dgx1-v100", "b"))
	d = postShadow(t, shadow, mirrored(t, serving, phaseFilter, args))
	if len(d.Differences) != 1 || d.Differences[0].Shadow != "passed" || !strings.Contains(d.Differences[0].Serving, "7 of 8 are free") {
		t.Errorf("reverse difference %+v", d.Differences)
	}
	if got := metricValue(t, shadow, "gputopo_extender_shadow_filter_node_differences_total", "direction", "shadow_rejects"); got != 1 {
		t.Errorf("filter node differences{shadow_rejects} = %v, want 1", got)
	}
}

// TestShadowBoundsLoggedFilterDifferences: a shadow that rejects a whole
// cluster logs the first nodes and a count; the metrics count every node.
func TestShadowBoundsLoggedFilterDifferences(t *testing.T) {
	serving, shadow := shadowPair(t)
	var names []string
	for i := range 30 {
		name := fmt.Sprintf("n%02d", i)
		names = append(names, name)
		serving.core.Feed().UpsertTopology(topo(t, "dgx-a100", name))
		sick := topo(t, "dgx-a100", name)
		sick.Status.Stale, sick.Status.StaleReason = true, "NVML: driver not loaded"
		shadow.core.Feed().UpsertTopology(sick)
	}
	args := &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &names}
	d := postShadow(t, shadow, mirrored(t, serving, phaseFilter, args))
	if len(d.Differences) != maxFilterDifferences || d.Omitted != 30-maxFilterDifferences {
		t.Errorf("logged %d differences, omitted %d; want %d and %d", len(d.Differences), d.Omitted, maxFilterDifferences, 30-maxFilterDifferences)
	}
	if !strings.Contains(d.Differences[0].Shadow, "NVML: driver not loaded") {
		t.Errorf("shadow's reason %q does not carry the stale reason", d.Differences[0].Shadow)
	}
	if got := metricValue(t, shadow, "gputopo_extender_shadow_filter_node_differences_total", "direction", "shadow_rejects"); got != 30 {
		t.Errorf("filter node differences{shadow_rejects} = %v, want 30", got)
	}
}

// TestShadowIgnoresThePodsOwnBinding: a mirror may arrive after the
// serving extender bound the pod; the shadow decides as before the bind.
func TestShadowIgnoresThePodsOwnBinding(t *testing.T) {
	serving, shadow := shadowPair(t)
	pod := makePod("whole").gpus(8).job("train").obj()
	args := &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &[]string{"a", "b"}}
	filter := mirrored(t, serving, phaseFilter, args)
	prio := mirrored(t, serving, phasePrioritize, args)
	var uuids []string
	for _, g := range topo(t, "dgx1-v100", prio.Top.Node).Status.GPUs {
		uuids = append(uuids, g.UUID)
	}
	bound := makePod("whole").gpus(8).job("train").node(prio.Top.Node).assigned(uuids...).obj()
	shadow.core.Feed().UpsertPod(bound)
	for _, r := range []*ShadowRequest{filter, prio} {
		if d := postShadow(t, shadow, r); r.Verb == phaseFilter && !d.Same {
			t.Errorf("%s: the pod's own GPUs counted against it: %+v", r.Verb, d.Differences)
		} else if r.Verb == phasePrioritize && slices.ContainsFunc(d.Differences, func(x ShadowDifference) bool { return x.Kind == DiffGPUs }) {
			t.Errorf("%s: GPUs differ on the pod's own node: %+v", r.Verb, d.Differences)
		}
	}
	// Another pod still sees those GPUs held.
	other := &extenderv1.ExtenderArgs{Pod: makePod("other").gpus(8).obj(), NodeNames: &[]string{prio.Top.Node}}
	pr, err := shadow.request(other)
	if err != nil {
		t.Fatal(err)
	}
	if evals := shadow.core.Explain(context.Background(), pr, *other.NodeNames); evals[0].Passed {
		t.Errorf("a different pod passes node %s whose 8 GPUs are held", prio.Top.Node)
	}
}

func TestShadowRefusesBindAndBadRequests(t *testing.T) {
	_, shadow := shadowPair(t)
	h := shadow.Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/bind", strings.NewReader(`{"PodName":"p","PodNamespace":"default","PodUID":"u","Node":"a"}`)))
	if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "runs with --shadow and never binds") {
		t.Errorf("bind on a shadow: %d %s", rec.Code, rec.Body)
	}
	for body, want := range map[string]string{
		`{"verb":"bind","args":{"Pod":{},"NodeNames":[]}}`:   `verb \"bind\" must be filter or prioritize`,
		`{"verb":"filter","args":{"NodeNames":[]}}`:          "args.Pod is required",
		`{"verb":"filter","args":{"Pod":{},"NodeNames":[]}}`: "verb filter needs filter",
		`not json`: "malformed request",
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, ShadowPath, strings.NewReader(body)))
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("%s: %d %s, want 400 with %q", body, rec.Code, rec.Body, want)
		}
	}
	// A serving extender has no shadow endpoint.
	serving, _ := newTestExtender(t, nil)
	rec = httptest.NewRecorder()
	serving.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, ShadowPath, strings.NewReader(`{}`)))
	if rec.Code != http.StatusNotFound {
		t.Errorf("POST /shadow on a serving extender: %d, want 404", rec.Code)
	}
}

// blackhole accepts mirrored requests and answers none until released.
type blackhole struct {
	srv      *httptest.Server
	release  chan struct{}
	received atomic.Int64
	inflight atomic.Int64
}

func newBlackhole(t testing.TB) *blackhole {
	b := &blackhole{release: make(chan struct{})}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.received.Add(1)
		b.inflight.Add(1)
		defer b.inflight.Add(-1)
		select {
		case <-b.release:
		case <-r.Context().Done():
		}
	}))
	var once sync.Once
	t.Cleanup(func() {
		once.Do(func() { close(b.release) })
		b.srv.Close()
	})
	return b
}

// servingWithShadow is a serving extender mirroring to url.
func servingWithShadow(t *testing.T, url string) *Extender {
	t.Helper()
	x, _ := shadowPair(t)
	attachMirror(t, x, url)
	return x
}

// attachMirror makes x mirror to url until the test ends.
func attachMirror(t testing.TB, x *Extender, url string) {
	t.Helper()
	o := NewOptions()
	o.ShadowURL, o.ShadowTimeout = url, 30*time.Second
	o.setDefaults()
	var err error
	if x.mirror, err = newMirror(o, x.metrics); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	x.mirror.start(ctx)
}

func serve(t *testing.T, h http.Handler, verb string, args *extenderv1.ExtenderArgs) *httptest.ResponseRecorder {
	t.Helper()
	b, _ := json.Marshal(args)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/"+verb, bytes.NewReader(b)))
	if rec.Code != http.StatusOK {
		t.Fatalf("%s: %d %s", verb, rec.Code, rec.Body)
	}
	return rec
}

// TestMirrorNeverWaitsForTheShadow: every answer is written while the
// shadow still holds the mirrored requests unanswered; beyond the queue,
// requests are dropped and counted, and scheduling answers go on.
func TestMirrorNeverWaitsForTheShadow(t *testing.T) {
	b := newBlackhole(t)
	x := servingWithShadow(t, b.srv.URL)
	h := x.Handler()
	want := serve(t, h, "prioritize", &extenderv1.ExtenderArgs{Pod: makePod("p0").gpus(1).obj(), NodeNames: &[]string{"a", "b"}}).Body.String()
	n := mirrorQueueLen + 2*mirrorWorkers + 50
	for i := range n {
		args := &extenderv1.ExtenderArgs{Pod: makePod(fmt.Sprintf("p%d", i)).gpus(1).obj(), NodeNames: &[]string{"a", "b"}}
		if got := serve(t, h, "prioritize", args).Body.String(); got != want {
			t.Fatalf("answer %d changed with mirroring: %s, want %s", i, got, want)
		}
	}
	if b.received.Load() == 0 || b.inflight.Load() == 0 {
		t.Fatalf("the shadow got %d requests, %d in flight; want requests held while answers went out", b.received.Load(), b.inflight.Load())
	}
	if dropped := metricValue(t, x, "gputopo_extender_shadow_mirrored_requests_total", "verb", phasePrioritize, "result", "dropped"); dropped < 50 {
		t.Errorf("dropped = %v, want at least 50 once the queue (%d) is full", dropped, mirrorQueueLen)
	}
}

// TestMirrorToAbsentShadow: a refused connection is counted as an error;
// an up shadow gets the exact answer that kube-scheduler got.
func TestMirrorToAbsentShadow(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	x := servingWithShadow(t, "http://"+addr)
	args := &extenderv1.ExtenderArgs{Pod: makePod("p").gpus(1).obj(), NodeNames: &[]string{"a", "b"}}
	serve(t, x.Handler(), "filter", args)
	waitFor(t, func() bool {
		return metricValue(t, x, "gputopo_extender_shadow_mirrored_requests_total", "verb", phaseFilter, "result", "error") == 1
	})

	_, shadow := shadowPair(t)
	srv := httptest.NewServer(shadow.Handler())
	defer srv.Close()
	x = servingWithShadow(t, srv.URL)
	serve(t, x.Handler(), "filter", args)
	serve(t, x.Handler(), "prioritize", args)
	waitFor(t, func() bool {
		return metricValue(t, shadow, "gputopo_extender_shadow_decisions_total", "verb", phasePrioritize, "result", "different") == 1 &&
			metricValue(t, shadow, "gputopo_extender_shadow_decisions_total", "verb", phaseFilter, "result", "same") == 1
	})
	if got := metricValue(t, x, "gputopo_extender_shadow_mirrored_requests_total", "verb", phasePrioritize, "result", "sent"); got != 1 {
		t.Errorf("sent{prioritize} = %v, want 1", got)
	}
}

// waitFor polls cond every 10ms, failing the test if it does not hold
// within 10s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatal("condition not met within 10s")
	}
}

func TestSampledIsStableAndProportional(t *testing.T) {
	in := 0
	for i := range 10000 {
		uid := makePod(fmt.Sprint(i)).obj().UID
		s := sampled(uid, "mirror", 0.25)
		if s != sampled(uid, "mirror", 0.25) {
			t.Fatal("sampling is not stable for a UID")
		}
		if s {
			in++
		}
	}
	if in < 2200 || in > 2800 {
		t.Errorf("rate 0.25 sampled %d of 10000", in)
	}
	if !sampled("x", "mirror", 1) || sampled("x", "mirror", 0) {
		t.Error("rates 1 and 0 must take all and none")
	}
}

func TestShadowOptions(t *testing.T) {
	for name, tc := range map[string]struct {
		mod  func(*Options)
		want string
	}{
		"rate above 1":     {func(o *Options) { o.ShadowSampleRate = 1.5 }, "--shadow-sample-rate 1.5"},
		"log rate below 0": {func(o *Options) { o.ShadowLogSampleRate = -1 }, "--shadow-log-sample-rate -1"},
		"shadow chains":    {func(o *Options) { o.Shadow, o.ShadowURL = true, "http://x" }, "--shadow and --shadow-url exclude each other"},
		"shadow elects":    {func(o *Options) { o.Shadow, o.LeaderElect = true, true }, "--shadow and --leader-elect exclude each other"},
		"ca without url":   {func(o *Options) { o.ShadowCAFile = "ca.pem" }, "--shadow-ca-file needs --shadow-url"},
	} {
		o := NewOptions()
		tc.mod(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
	o := NewOptions()
	o.ShadowURL = "shadow:8080"
	if _, err := newMirror(o, metrics.New(ledger.New(ledger.Options{}).Report())); err == nil || !strings.Contains(err.Error(), "must be an http:// or https:// URL") {
		t.Errorf("bad --shadow-url: %v", err)
	}
}
