package extender

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/metrics"
)

// ShadowPath is where a shadow extender (--shadow) takes mirrored
// decisions; ShadowDecisionsPath serves its sampled decision log.
const (
	ShadowPath          = "/shadow"
	ShadowDecisionsPath = "/shadow/decisions"
)

// Kinds of shadow differences (the kind label of
// gputopo_extender_shadow_differences_total).
const (
	DiffFilter  = "filter"
	DiffTopNode = "top_node"
	DiffGPUs    = "gpus"
)

// ShadowRequest is what a serving extender mirrors to a shadow one: the
// request kube-scheduler sent and the answer it got.
type ShadowRequest struct {
	// Verb is filter or prioritize.
	Verb string `json:"verb"`
	// Args is the request; full Node lists are sent as names.
	Args extenderv1.ExtenderArgs `json:"args"`
	// Filter is the serving extender's filter answer (verb filter).
	Filter *extenderv1.ExtenderFilterResult `json:"filter,omitempty"`
	// Priorities are its scores (verb prioritize).
	Priorities extenderv1.HostPriorityList `json:"priorities,omitempty"`
	// Top is its top-ranked node (ties broken by node name) and the GPUs
	// it would bind there (verb prioritize).
	Top *placement.Pick `json:"top,omitempty"`
}

// ShadowPick is a top-ranked node and the GPUs a bind there would take.
type ShadowPick = placement.Pick

// ShadowDecision is the shadow's comparison of one mirrored decision.
type ShadowDecision struct {
	Time   metav1.Time `json:"time"`
	Verb   string      `json:"verb"`
	Pod    string      `json:"pod"`
	PodUID types.UID   `json:"podUID"`
	// Same is true when no difference was found.
	Same        bool               `json:"same"`
	Differences []ShadowDifference `json:"differences,omitempty"`
	// Omitted counts filter differences left out of Differences (beyond
	// the first maxFilterDifferences nodes); the metrics count them all.
	Omitted int `json:"omitted,omitempty"`
}

// maxFilterDifferences bounds the nodes one logged decision lists, so that
// a policy that rejects a whole cluster does not write megabyte log lines.
const maxFilterDifferences = 20

// ShadowDifference is one way the shadow would have decided otherwise.
type ShadowDifference struct {
	// Kind is filter, top_node or gpus.
	Kind string `json:"kind"`
	// Node is the node concerned: for filter the node filtered
	// differently, for gpus the serving extender's top node.
	Node string `json:"node,omitempty"`
	// Serving and Shadow are each side's filter verdict: "passed" or the
	// reason the node failed (filter).
	Serving string `json:"serving,omitempty"`
	Shadow  string `json:"shadow,omitempty"`
	// ServingNode and ShadowNode are each side's top-ranked node
	// (top_node).
	ServingNode string `json:"servingNode,omitempty"`
	ShadowNode  string `json:"shadowNode,omitempty"`
	// ServingGPUs and ShadowGPUs are the GPU indices each side would bind:
	// on Node (gpus), or on its own top node (top_node).
	ServingGPUs []int `json:"servingGPUs,omitempty"`
	ShadowGPUs  []int `json:"shadowGPUs,omitempty"`
	// Reason explains the shadow's side in words (scores and their terms,
	// or the placement's link tier and bandwidth).
	Reason string `json:"reason,omitempty"`
}

// sampled decides by a hash of the pod UID (salted per use), so that a
// pod's filter and prioritize, and its retries, are all in or all out.
func sampled(uid types.UID, salt string, rate float64) bool {
	switch {
	case rate >= 1:
		return true
	case rate <= 0:
		return false
	}
	h := fnv.New64a()
	_, _ = io.WriteString(h, salt)
	_, _ = io.WriteString(h, string(uid))
	// FNV's high bits mix short keys poorly; finish with murmur3's fmix64.
	v := h.Sum64()
	v ^= v >> 33
	v *= 0xff51afd7ed558ccd
	v ^= v >> 33
	v *= 0xc4ceb9fe1a85ec53
	v ^= v >> 33
	return float64(v>>11)/(1<<53) < rate
}

// Mirror queue and workers: the queue absorbs a burst of scheduling cycles
// while the shadow is slow; beyond it requests are dropped and counted.
const (
	mirrorQueueLen = 1024
	mirrorWorkers  = 4
)

// mirror sends sampled filter and prioritize requests to a shadow
// extender in the background. The request path only does a non-blocking
// channel send: a slow, failing or absent shadow never delays an answer.
type mirror struct {
	url     string
	client  *http.Client
	rate    float64
	queue   chan *ShadowRequest
	metrics *metrics.Metrics
	// resource is the managed GPU resource: only pods asking for it are
	// mirrored.
	resource corev1.ResourceName
	// failing is true while the last send failed, so that a down shadow is
	// logged once per outage rather than once per request.
	mu      sync.Mutex
	failing bool
}

func newMirror(o Options, m *metrics.Metrics) (*mirror, error) {
	u, err := url.Parse(o.ShadowURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--shadow-url %q: must be an http:// or https:// URL of an extender running with --shadow", o.ShadowURL)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = mirrorWorkers
	if o.ShadowCAFile != "" {
		pem, err := os.ReadFile(o.ShadowCAFile)
		if err != nil {
			return nil, fmt.Errorf("read --shadow-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--shadow-ca-file %s holds no PEM certificate", o.ShadowCAFile)
		}
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}
	}
	return &mirror{
		url:     strings.TrimSuffix(o.ShadowURL, "/") + ShadowPath,
		client:  &http.Client{Transport: tr, Timeout: o.ShadowTimeout},
		rate:    o.ShadowSampleRate,
		queue:   make(chan *ShadowRequest, mirrorQueueLen),
		metrics: m,
		// New sets the configured resourceName.
		resource: v1alpha1.ResourceGPU,
	}, nil
}

// wants reports whether the pod's requests are mirrored.
func (m *mirror) wants(args *extenderv1.ExtenderArgs) bool {
	if m == nil || args.Pod == nil || !sampled(args.Pod.UID, "mirror", m.rate) {
		return false
	}
	n, err := placement.GPUCount(args.Pod, m.resource)
	return err == nil && n > 0
}

// offer queues r without blocking; a full queue drops it.
func (m *mirror) offer(r *ShadowRequest) {
	select {
	case m.queue <- r:
	default:
		m.metrics.ShadowMirrored(r.Verb, "dropped")
	}
}

func (m *mirror) start(ctx context.Context) {
	for range mirrorWorkers {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case r := <-m.queue:
					m.send(ctx, r)
				}
			}
		}()
	}
}

func (m *mirror) send(ctx context.Context, r *ShadowRequest) {
	toNames(r)
	err := m.post(ctx, r)
	if ctx.Err() != nil {
		return // shutting down
	}
	result := "sent"
	if err != nil {
		result = "error"
	}
	m.metrics.ShadowMirrored(r.Verb, result)
	m.mu.Lock()
	changed := m.failing != (err != nil)
	m.failing = err != nil
	m.mu.Unlock()
	log := klog.FromContext(ctx).WithName("shadow-mirror")
	switch {
	case changed && err != nil:
		log.Error(err, "shadow extender unreachable; scheduling goes on unaffected, mirrored requests are counted as errors until it answers", "url", m.url)
	case changed:
		log.Info("shadow extender answers again", "url", m.url)
	case err != nil:
		log.V(4).Info("mirror failed", "err", err)
	}
}

func (m *mirror) post(ctx context.Context, r *ShadowRequest) error {
	body, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode mirrored %s: %w", r.Verb, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, m.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := m.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s (is the extender there running with --shadow?)", m.url, resp.Status)
	}
	return nil
}

// toNames replaces full Node lists by names: the shadow has its own node
// cache, and names are a fraction of the bytes.
func toNames(r *ShadowRequest) {
	if r.Args.NodeNames == nil && r.Args.Nodes != nil {
		names := nodeNames(&r.Args)
		r.Args.NodeNames, r.Args.Nodes = &names, nil
	}
	if f := r.Filter; f != nil && f.NodeNames == nil && f.Nodes != nil {
		names := make([]string, len(f.Nodes.Items))
		for i := range f.Nodes.Items {
			names[i] = f.Nodes.Items[i].Name
		}
		cp := *f
		cp.NodeNames, cp.Nodes = &names, nil
		r.Filter = &cp
	}
}

// decisionLogLen is how many differing decisions /shadow/decisions keeps.
const decisionLogLen = 256

// decisionLog is the sampled log of differing decisions: each goes to the
// process log and to a ring served at /shadow/decisions.
type decisionLog struct {
	rate    float64
	mu      sync.Mutex
	entries []ShadowDecision
	next    int
}

func (d *decisionLog) add(ctx context.Context, dec ShadowDecision) {
	if !sampled(dec.PodUID, "log", d.rate) {
		return
	}
	b, _ := json.Marshal(dec.Differences)
	klog.FromContext(ctx).WithName("shadow").Info("shadow decision differs", "verb", dec.Verb, "pod", dec.Pod, "podUID", dec.PodUID, "differences", string(b), "omitted", dec.Omitted)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.entries) < decisionLogLen {
		d.entries = append(d.entries, dec)
		return
	}
	d.entries[d.next] = dec
	d.next = (d.next + 1) % decisionLogLen
}

// list returns the kept decisions, oldest first.
func (d *decisionLog) list() []ShadowDecision {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]ShadowDecision, 0, len(d.entries))
	out = append(out, d.entries[d.next:]...)
	return append(out, d.entries[:d.next]...)
}

// ShadowDecisions returns the sampled log of differing decisions, oldest
// first (empty unless running with --shadow).
func (x *Extender) ShadowDecisions() []ShadowDecision {
	if x.shadowLog == nil {
		return nil
	}
	return x.shadowLog.list()
}

func (x *Extender) serveShadow(ctx context.Context, body io.Reader) (any, error) {
	var r ShadowRequest
	if err := decodeJSON(body, &r); err != nil {
		return nil, err
	}
	switch {
	case r.Args.Pod == nil:
		return nil, &httpError{http.StatusBadRequest, errBadRequest, "malformed shadow request: args.Pod is required"}
	case r.Args.NodeNames == nil:
		return nil, &httpError{http.StatusBadRequest, errBadRequest, "malformed shadow request: args.NodeNames is required"}
	case r.Verb == phaseFilter && r.Filter == nil:
		return nil, &httpError{http.StatusBadRequest, errBadRequest, "malformed shadow request: verb filter needs filter"}
	case r.Verb != phaseFilter && r.Verb != phasePrioritize:
		return nil, &httpError{http.StatusBadRequest, errBadRequest, fmt.Sprintf("malformed shadow request: verb %q must be filter or prioritize", r.Verb)}
	}
	dec, err := x.compare(ctx, &r)
	if err != nil {
		return nil, &httpError{http.StatusBadRequest, errBadRequest, err.Error()}
	}
	result := "same"
	var kinds, dirs []string
	if !dec.Same {
		result = "different"
		for _, k := range []string{DiffFilter, DiffTopNode, DiffGPUs} {
			if slices.ContainsFunc(dec.Differences, func(d ShadowDifference) bool { return d.Kind == k }) {
				kinds = append(kinds, k)
			}
		}
		for _, d := range dec.Differences {
			if d.Kind == DiffFilter {
				dir := "shadow_rejects"
				if d.Shadow == "passed" {
					dir = "shadow_accepts"
				}
				dirs = append(dirs, dir)
			}
		}
		if n := len(dec.Differences); r.Verb == phaseFilter && n > maxFilterDifferences {
			dec.Differences, dec.Omitted = dec.Differences[:maxFilterDifferences], n-maxFilterDifferences
		}
		x.shadowLog.add(ctx, dec)
	}
	x.metrics.ShadowCompared(r.Verb, result, kinds, dirs)
	return &dec, nil
}

func (x *Extender) serveShadowDecisions(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, x.ShadowDecisions())
}

// compare decides r's request as this extender would, as if the pod held
// no GPUs yet (the serving extender may have bound it by now), and lists
// the differences.
func (x *Extender) compare(ctx context.Context, r *ShadowRequest) (ShadowDecision, error) {
	pod := r.Args.Pod
	dec := ShadowDecision{Time: metav1.NewTime(x.core.Now()), Verb: r.Verb, Pod: pod.Namespace + "/" + pod.Name, PodUID: pod.UID}
	pr, err := x.request(&r.Args)
	if err != nil {
		return dec, err
	}
	evals := x.core.Explain(ctx, pr, nodeNames(&r.Args))
	switch r.Verb {
	case phaseFilter:
		dec.Differences = compareFilter(r.Filter, evals)
	case phasePrioritize:
		dec.Differences = comparePrioritize(r, evals)
	}
	dec.Same = len(dec.Differences) == 0
	return dec, nil
}

func compareFilter(serving *extenderv1.ExtenderFilterResult, evals []placement.NodeExplanation) []ShadowDifference {
	passed := make(map[string]bool)
	if serving.NodeNames != nil {
		for _, n := range *serving.NodeNames {
			passed[n] = true
		}
	}
	servingReason := func(node string) string {
		if r, ok := serving.FailedNodes[node]; ok {
			return r
		}
		if r, ok := serving.FailedAndUnresolvableNodes[node]; ok {
			return r
		}
		if serving.Error != "" {
			return "error: " + serving.Error
		}
		return "failed"
	}
	var diffs []ShadowDifference
	for _, e := range evals {
		if e.Passed == passed[e.Node] {
			continue
		}
		d := ShadowDifference{Kind: DiffFilter, Node: e.Node}
		if e.Passed {
			d.Serving, d.Shadow = servingReason(e.Node), "passed"
		} else {
			d.Serving, d.Shadow = "passed", e.Reason
		}
		diffs = append(diffs, d)
	}
	return diffs
}

func comparePrioritize(r *ShadowRequest, evals []placement.NodeExplanation) []ShadowDifference {
	servingScore := make(map[string]int64, len(r.Priorities))
	for _, p := range r.Priorities {
		servingScore[p.Host] = p.Score
	}
	byName := make(map[string]*placement.NodeExplanation, len(evals))
	var top *placement.NodeExplanation
	for i := range evals {
		e := &evals[i]
		byName[e.Node] = e
		if e.Passed && (top == nil || e.Score > top.Score || e.Score == top.Score && e.Node < top.Node) {
			top = e
		}
	}
	var diffs []ShadowDifference
	servingTop := r.Top
	explain := func(e *placement.NodeExplanation) string {
		if e == nil {
			return "not a candidate"
		}
		if !e.Passed {
			return fmt.Sprintf("%s: fails filter (%s)", e.Node, strings.TrimPrefix(e.Reason, placement.ReasonPrefix))
		}
		return fmt.Sprintf("%s: %d (utilization %.2f, affinity %.2f, headroom %.2f, fragmentation %.2f, bandwidth fit %.2f, conservation %.2f, island fit %.2f; serving extender %d)",
			e.Node, e.Score, e.Components.Utilization, e.Components.Affinity, e.Components.Headroom, e.Components.Fragmentation,
			e.Components.BandwidthFit, e.Components.Conservation, e.Components.IslandFit, servingScore[e.Node])
	}
	switch {
	case servingTop == nil && top == nil:
		return nil
	case servingTop == nil || top == nil || servingTop.Node != top.Node:
		d := ShadowDifference{Kind: DiffTopNode}
		var servingEval *placement.NodeExplanation
		if servingTop != nil {
			d.ServingNode, d.ServingGPUs = servingTop.Node, servingTop.GPUs
			servingEval = byName[servingTop.Node]
		}
		parts := []string{}
		if top != nil {
			d.ShadowNode, d.ShadowGPUs = top.Node, top.Result.GPUs
			parts = append(parts, "shadow ranks "+explain(top))
		} else {
			parts = append(parts, "shadow ranks no node: none passes its filter")
		}
		if servingTop != nil {
			parts = append(parts, "above "+explain(servingEval))
		}
		d.Reason = strings.Join(parts, " ")
		diffs = append(diffs, d)
	}
	if servingTop != nil {
		if e := byName[servingTop.Node]; e != nil && e.Passed && !slices.Equal(e.Result.GPUs, servingTop.GPUs) {
			diffs = append(diffs, ShadowDifference{Kind: DiffGPUs, Node: servingTop.Node, ServingGPUs: servingTop.GPUs, ShadowGPUs: e.Result.GPUs,
				Reason: fmt.Sprintf("shadow's placement: %s, %d GB/s lowest pair, %d GB/s ring", e.Result.Metrics.Tier, e.Result.Metrics.MinPairGBps, e.Result.Metrics.RingGBps)})
		}
	}
	return diffs
}

// mirrorFilter and mirrorPrioritize hand a decided request to the mirror.
func (x *Extender) mirrorFilter(args *extenderv1.ExtenderArgs, res *extenderv1.ExtenderFilterResult) {
	if x.mirror.wants(args) {
		x.mirror.offer(&ShadowRequest{Verb: phaseFilter, Args: *args, Filter: res})
	}
}

func (x *Extender) mirrorPrioritize(args *extenderv1.ExtenderArgs, list extenderv1.HostPriorityList, top *ShadowPick) {
	x.mirror.offer(&ShadowRequest{Verb: phasePrioritize, Args: *args, Priorities: list, Top: top})
}
