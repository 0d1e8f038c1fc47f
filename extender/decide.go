package extender

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// ReasonPrefix starts every reason the extender gives, so that a person
// reading kube-scheduler's "0/4 nodes are available: ..." knows who said no.
const ReasonPrefix = "gputopo: "

// reasonCode is a bounded label for the filter_results metric; the
// free-text reason goes to the pod.
type reasonCode uint8

const (
	reasonNone reasonCode = iota
	reasonNoTopology
	reasonInvalidTopology
	reasonStaleTopology
	reasonTooFewGPUs
	reasonNotEnoughFree
	reasonMemory
	reasonNVLink
	reasonBandwidth
	reasonInfeasible
	numReasonCodes
)

var reasonNames = [numReasonCodes]string{
	"", "no_topology", "invalid_topology", "stale_topology", "too_few_gpus",
	"not_enough_free", "memory", "nvlink", "bandwidth", "infeasible",
}

// podRequest is a pod's GPU request, parsed once per HTTP request.
type podRequest struct {
	count int
	req   v1alpha1.Requirement
	job   string // namespace/job label
}

// parsePodRequest reads the GPU count and requirement of a pod. A pod
// without the requirement annotation gets the zero requirement: no
// constraint, the default strategy (lowest_fragmentation), which keeps
// NVLink islands whole for the pods that do need them. A malformed
// annotation is an error naming the field.
func parsePodRequest(pod *corev1.Pod, resource corev1.ResourceName) (podRequest, error) {
	n, err := GPUCount(pod, resource)
	if err != nil {
		return podRequest{}, err
	}
	r := podRequest{count: n}
	if j := pod.Labels[v1alpha1.LabelJob]; j != "" {
		r.job = pod.Namespace + "/" + j
	}
	if v, ok := pod.Annotations[v1alpha1.AnnotationRequirement]; ok {
		req, err := v1alpha1.ParseRequirement(v)
		if err != nil {
			return r, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		r.req = req
	}
	return r, nil
}

// verdict is the outcome of one (topology, free GPUs) question.
type verdict struct {
	ok           bool
	res          topology.Result
	reason       string
	code         reasonCode
	unresolvable bool
}

type evalKey struct {
	topo     *topoEntry
	free     topology.Mask
	pristine bool
}

// evaluator answers filter and prioritize questions for one HTTP request.
// Nodes of one topology with the same free GPUs get the same answer, so it
// remembers answers for the request's lifetime (no lock, no hashing of
// strings); the allocator's own memo carries them across requests.
type evaluator struct {
	alloc  *topology.Allocator
	cfg    *Configuration
	pr     podRequest
	now    time.Time
	maxAge time.Duration
	// staleBeforeNs and futureAfterNs bound a fresh observedTime: now -
	// maxAge and now + topologyClockSkew in Unix nanoseconds (MinInt64 and
	// MaxInt64: no age check).
	staleBeforeNs, futureAfterNs int64
	// telemetryAfterNs is the oldest telemetry time still steered by.
	telemetryAfterNs int64
	// slots is a direct-mapped cache in front of memo: most lookups are a
	// multiply and one compare instead of hashing a struct key.
	slots [evalSlots]evalSlot
	memo  map[evalKey]*verdict
	// Score constants, read once per request rather than per node.
	wU, wA, wH, wF, wSum float64
	idleC, limitC        float64
}

// evalSlots is the size of the evaluator's direct-mapped cache (a power of
// two); a request rarely sees more distinct (topology, free GPUs) pairs.
const evalSlots = 64

type evalSlot struct {
	key evalKey
	v   *verdict
}

// slot picks the cache slot of k.
func (k evalKey) slot() int {
	h := uint64(k.free)*0x9E3779B97F4A7C15 ^ (k.topo.id+1)*0xC2B2AE3D27D4EB4F
	if k.pristine {
		h ^= 0x165667B19E3779F9
	}
	return int(h >> (64 - 6))
}

func newEvaluator(alloc *topology.Allocator, cfg *Configuration, pr podRequest, now time.Time) *evaluator {
	e := &evaluator{alloc: alloc, cfg: cfg, pr: pr, now: now, maxAge: cfg.topologyMaxAge()}
	w := cfg.Weights
	e.wU, e.wA, e.wH, e.wF = float64(*w.UtilizationBalance), float64(*w.TaskAffinity), float64(*w.ThermalPowerHeadroom), float64(*w.Fragmentation)
	e.wSum = e.wU + e.wA + e.wH + e.wF
	e.idleC, e.limitC = float64(*cfg.Thermal.IdleTemperatureC), float64(*cfg.Thermal.LimitTemperatureC)
	e.telemetryAfterNs = now.Add(-cfg.TelemetryMaxAge.Duration).UnixNano()
	e.staleBeforeNs, e.futureAfterNs = math.MinInt64, math.MaxInt64
	if e.maxAge > 0 {
		e.staleBeforeNs = now.Add(-e.maxAge).UnixNano()
		e.futureAfterNs = now.Add(topologyClockSkew).UnixNano()
	}
	return e
}

// check decides whether node n can take the pod now. The caller holds the
// ledger's read lock.
func (e *evaluator) check(n *nodeState) *verdict {
	switch {
	case n == nil || !n.hasTopology:
		return &verdict{code: reasonNoTopology, reason: "node has no NodeGPUTopology; the gputopo node agent has not published its GPUs (is it running on this node?)"}
	case n.graph == nil:
		return &verdict{code: reasonInvalidTopology, reason: "node's NodeGPUTopology is invalid (" + n.topoErr + "); fix or restart the gputopo node agent on this node"}
	case n.stale:
		reason := "node's GPU topology is stale"
		if n.staleReason != "" {
			reason += " (" + n.staleReason + ")"
		}
		return &verdict{code: reasonStaleTopology, reason: reason + "; check the gputopo node agent and the GPU driver on this node"}
	case n.observedNs == 0 || n.observedNs < e.staleBeforeNs || n.observedNs > e.futureAfterNs:
		return e.staleByTime(n)
	}
	if size := n.size; e.pr.count > size {
		return &verdict{code: reasonTooFewGPUs, unresolvable: true, reason: fmt.Sprintf("pod requests %d GPUs; node has %d", e.pr.count, size)}
	}
	if n.allocatable >= 0 && e.pr.count > n.allocatable {
		return &verdict{code: reasonTooFewGPUs, unresolvable: true, reason: fmt.Sprintf("pod requests %d GPUs; node advertises %d %s", e.pr.count, n.allocatable, e.cfg.GPUResource())}
	}
	free := n.free()
	if n.unknownHeld > 0 && free.Count()-n.unknownHeld < e.pr.count {
		return &verdict{code: reasonNotEnoughFree, reason: fmt.Sprintf("needs %d GPUs; %d of %d are free (%d more are held by pods whose GPUs are not recorded yet)",
			e.pr.count, max(free.Count()-n.unknownHeld, 0), n.size, n.unknownHeld)}
	}
	v := e.allocate(n, free, false)
	if v.ok || v.code != reasonInfeasible && v.code != reasonNotEnoughFree && v.code != reasonMemory && v.code != reasonNVLink && v.code != reasonBandwidth {
		return v
	}
	if p := e.allocate(n, n.topo.pristine.All(), true); !p.ok {
		return &verdict{code: p.code, unresolvable: true, reason: "can never fit this node, even with every GPU free and healthy: " + p.reason}
	}
	return v
}

// topologyClockSkew is how far in the future a NodeGPUTopology's
// observedTime may lie before filter distrusts it: the node's clock and the
// extender's may differ by this much (docs/extender.md).
const topologyClockSkew = 2 * time.Minute

// staleByTime says why n's observedTime makes its topology stale. A
// topology without one was never published by a topology read (the agent
// sets it on every read, failed or not). With the age check on
// (topologyMaxAge), one older than the limit is stale, and so is one
// further in the future than topologyClockSkew: a clock running ahead
// would otherwise keep a dead agent's topology fresh for as long as it is
// ahead. With the age check off neither counts.
func (e *evaluator) staleByTime(n *nodeState) *verdict {
	v := &verdict{code: reasonStaleTopology}
	switch {
	case n.observedNs == 0:
		v.reason = "node's NodeGPUTopology has no observedTime; the gputopo node agent has not published a topology read (is it running on this node?)"
	case n.observed.After(e.now.Add(topologyClockSkew)):
		ahead := n.observed.Sub(e.now).Round(time.Second)
		v.reason = fmt.Sprintf("node's NodeGPUTopology observedTime is %s in the future (more than the %s clock-skew allowance); check the node's clock (NTP) and the gputopo node agent", ahead, topologyClockSkew)
	default:
		v.reason = fmt.Sprintf("node's GPU topology was not refreshed for more than %s; check the gputopo node agent on this node", e.maxAge)
	}
	return v
}

// allocate asks the allocator, once per (topology, free GPUs) per request.
// balanced_utilization reads each node's telemetry, so its answers are
// per node and not shared.
func (e *evaluator) allocate(n *nodeState, free topology.Mask, pristine bool) *verdict {
	shared := pristine || e.pr.req.EffectiveStrategy() != v1alpha1.StrategyBalancedUtilization
	key := evalKey{topo: n.topo, free: free, pristine: pristine}
	var slot *evalSlot
	if shared {
		slot = &e.slots[key.slot()]
		if slot.v != nil && slot.key == key {
			return slot.v
		}
		if v, ok := e.memo[key]; ok {
			return v
		}
	}
	g := n.graph
	req := topology.Request{Count: e.pr.count, Requirement: e.pr.req}
	if pristine {
		g = n.topo.pristine
	} else if !shared {
		req.Utilization = n.freshUtil(e.telemetryAfterNs)
	}
	res, err := e.alloc.Allocate(g, free, req)
	v := &verdict{ok: err == nil, res: res}
	if err != nil {
		v.reason, v.code = err.Error(), reasonInfeasible
		var inf *topology.InfeasibleError
		if errors.As(err, &inf) {
			v.reason, v.code = inf.Reason, classify(inf.Reason)
		}
	}
	if shared {
		if slot.v == nil {
			slot.key, slot.v = key, v
		} else {
			if e.memo == nil {
				e.memo = make(map[evalKey]*verdict, 8)
			}
			e.memo[key] = v
		}
	}
	return v
}

// classify maps the allocator's reasons (docs/topology.md, "Feasibility
// reasons") to metric labels.
func classify(reason string) reasonCode {
	switch {
	case strings.Contains(reason, "MiB"):
		return reasonMemory
	case strings.Contains(reason, "GB/s"):
		return reasonBandwidth
	case strings.Contains(reason, "NVLink between"):
		return reasonNVLink
	case strings.HasPrefix(reason, "needs ") && strings.Contains(reason, " are free"):
		return reasonNotEnoughFree
	}
	return reasonInfeasible
}

// freshUtil is the node's utilization when its telemetry is recent enough
// to steer by, else nil.
func (n *nodeState) freshUtil(afterNs int64) []int32 {
	if n.util == nil || n.telemetryNs == 0 || n.telemetryNs < afterNs {
		return nil
	}
	return n.util
}

// score is the node's priority 0..MaxExtenderPriority for the placement
// v.res (see docs/extender.md for the formula).
func (e *evaluator) score(n *nodeState, v *verdict, affinity float64) (int64, components) {
	c := e.components(n, v, affinity)
	total := e.wU*c.utilization + e.wA*c.affinity + e.wH*c.headroom + e.wF*c.fragmentation
	s := int64(math.Round(10 * total / e.wSum))
	return min(max(s, 0), 10), c
}

// components are the four prioritize terms, each in 0..1.
type components struct {
	utilization, affinity, headroom, fragmentation float64
}

func (e *evaluator) components(n *nodeState, v *verdict, affinity float64) components {
	size := n.size
	fresh := n.tel != nil && n.telemetryNs != 0 && n.telemetryNs >= e.telemetryAfterNs
	gpus := v.res.GPUs
	// Utilization balance: 1 - the node's busy fraction after placement.
	// A held GPU is fully busy; a free one is as busy as its telemetry says.
	busy := float64(n.usedCount + n.unknownHeld)
	c := components{affinity: affinity, headroom: 0.5}
	if fresh {
		busy += float64(n.utilFree) / 100
		// Thermal and power headroom of the chosen GPUs, in the same pass.
		idle, limit := e.idleC, e.limitC
		var sum float64
		for _, i := range gpus {
			th := n.tel[i]
			busy++
			busy -= float64(th.util) / 100
			h := clamp01((limit - float64(th.tempC)) / (limit - idle))
			if th.limitW > 0 {
				h = min(h, clamp01(1-float64(th.powerW)/float64(th.limitW)))
			}
			sum += h
		}
		if len(gpus) > 0 {
			c.headroom = sum / float64(len(gpus))
		}
	} else {
		// Neutral headroom without recent telemetry.
		busy += float64(len(gpus))
	}
	c.utilization = clamp01(1 - busy/float64(size))
	// Fragmentation left: the largest free NVLink island after placement,
	// against the largest the free GPUs left could form on this machine.
	left := n.freeMask.Count() - len(gpus)
	c.fragmentation = 1
	if want := min(left, n.topo.maxIsland); want > 0 {
		c.fragmentation = clamp01(float64(v.res.Metrics.LeftLargestIsland) / float64(want))
	}
	return c
}

func clamp01(x float64) float64 { return min(max(x, 0), 1) }

// affinityIndex answers "does the pod's job run on this node or in its
// NVLink fabric clique?" for one request.
type affinityIndex struct {
	nodes   map[string]int
	cliques map[string]bool
}

// affinityLocked builds the index for job; the caller holds the read lock.
func (l *Ledger) affinityLocked(job string) affinityIndex {
	if job == "" {
		return affinityIndex{}
	}
	return l.affinityOfLocked(l.jobs[job])
}

// affinityOfLocked indexes a job's pod counts by node.
func (l *Ledger) affinityOfLocked(nodes map[string]int) affinityIndex {
	idx := affinityIndex{nodes: nodes}
	for name := range nodes {
		if n, ok := l.nodes[name]; ok && n.clique != "" {
			if idx.cliques == nil {
				idx.cliques = make(map[string]bool)
			}
			idx.cliques[n.clique] = true
		}
	}
	return idx
}

// affinityExcludingLocked is affinityLocked without pod itself, for
// deciding as if it were not bound yet.
func (l *Ledger) affinityExcludingLocked(job string, pod *corev1.Pod) affinityIndex {
	idx := l.affinityLocked(job)
	info := l.pods[types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}]
	if info == nil || info.uid != pod.UID || info.node == "" || info.job != job || idx.nodes[info.node] == 0 {
		return idx
	}
	nodes := maps.Clone(idx.nodes)
	if nodes[info.node]--; nodes[info.node] == 0 {
		delete(nodes, info.node)
	}
	return l.affinityOfLocked(nodes)
}

// withoutLocked is n as if uid held nothing on it (a copy; n is left
// alone).
func (l *Ledger) withoutLocked(n *nodeState, uid types.UID) *nodeState {
	if _, ok := n.holdings[uid]; !ok {
		return n
	}
	c := *n
	c.holdings = make(map[types.UID]*holding, len(n.holdings))
	for k, h := range n.holdings {
		if k != uid {
			c.holdings[k] = h
		}
	}
	l.recomputeLocked(&c)
	return &c
}

func (a affinityIndex) of(n *nodeState) float64 {
	switch {
	case a.nodes == nil:
		return 0
	case a.nodes[n.name] > 0:
		return 1
	case n.clique != "" && a.cliques[n.clique]:
		return 0.5
	}
	return 0
}

// requestedTier names what the requirement asked for, for the placements
// metric.
func requestedTier(pr podRequest) string {
	switch {
	case pr.count == 1:
		return string(v1alpha1.TierSingleGPU)
	case pr.req.RequireNVLink:
		return string(v1alpha1.TierNVLink)
	case pr.req.MinPairBandwidthGBps > 0:
		return "min-bandwidth"
	}
	return "any"
}
