package placement

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gputopo/gputopo/topology/allocator"

	"k8s.io/klog/v2"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// ReasonPrefix starts every reason the core gives, so that a person
// reading kube-scheduler's "0/4 nodes are available: ..." knows who said no.
const ReasonPrefix = "gputopo: "

// Reason is why a node cannot take a pod, as a bounded code: metrics label
// by it (String), the pod reads the verdict's text.
type Reason uint8

// The reasons a node is refused.
const (
	ReasonNone Reason = iota
	ReasonNoTopology
	ReasonInvalidTopology
	ReasonStaleTopology
	ReasonTooFewGPUs
	ReasonNotEnoughFree
	ReasonMemory
	ReasonNVLink
	ReasonBandwidth
	ReasonInfeasible
	ReasonUntrustedTopology
	ReasonGroup
	ReasonReserved
	ReasonPatience
	NumReasons
)

var reasonNames = [NumReasons]string{
	"", "no_topology", "invalid_topology", "stale_topology", "too_few_gpus",
	"not_enough_free", "memory", "nvlink", "bandwidth", "infeasible",
	"untrusted_topology", "group", "reserved_for_group", "bandwidth_patience",
}

// String is the reason's metric label ("" for ReasonNone).
func (r Reason) String() string {
	if r >= NumReasons {
		return "unknown"
	}
	return reasonNames[r]
}

// verdict is the outcome of one (topology, free GPUs) question.
type verdict struct {
	ok           bool
	res          topology.Result
	reason       string
	code         Reason
	unresolvable bool
	// fit says frag and islandFit are prioritize's fragmentation and
	// island best fit terms of res on fitFree, the free GPUs the verdict
	// was decided on: they depend on nothing else, so the nodes that
	// share the verdict share them (fitTerms).
	fit             bool
	fitFree         topology.Mask
	frag, islandFit float64
}

type evalKey struct {
	topo     *ledger.Topo
	free     topology.Mask
	pristine bool
}

// evaluator answers filter and prioritize questions for one request (an
// HTTP verb, a scheduling cycle). Nodes of one topology with the same free
// GPUs get the same answer, so it remembers answers for the request's
// lifetime (no lock, no hashing of strings); the allocator's own memo
// carries them across requests. A concurrent evaluator (a plugin cycle's)
// is safe for concurrent use; two goroutines asking the same question at
// once may both compute the answer, which is the same.
type evaluator struct {
	alloc  *allocator.Allocator
	cfg    *configv1alpha1.ExtenderConfiguration
	pr     Request
	now    time.Time
	maxAge time.Duration
	// window bounds a fresh observedTime.
	window ledger.FreshWindow
	// telemetryAfterNs is the oldest telemetry time still steered by.
	telemetryAfterNs int64
	// slots is a direct-mapped cache in front of memo: most lookups are a
	// multiply and one compare instead of hashing a struct key. An
	// evaluator asked from one goroutine (an HTTP verb) uses them as
	// plain values; a concurrent one (a plugin cycle, whose Filter the
	// framework calls from parallel goroutines) uses cslots and cmemo,
	// which are safe for concurrent use.
	concurrent bool
	slots      [evalSlots]evalSlot
	memo       map[evalKey]*verdict
	cslots     [evalSlots]atomic.Pointer[evalSlot]
	cmemo      sync.Map // evalKey -> *verdict
	// Score constants, read once per request rather than per node.
	wU, wA, wH, wF, wB, wC, wI float64
	idleC, limitC              float64
	// wantsBandwidth: the pod asks for bandwidth, so bandwidth fit
	// counts for it.
	wantsBandwidth bool
	// snap is the snapshot a cycle's evaluator decides on (nil: the live
	// ledger; see read).
	snap *ledger.Snapshot
	// log is the request's logger; trace caches log.V(5).Enabled() for
	// the per-node verdict log.
	log   klog.Logger
	trace bool
	// patience refuses slower sets while the pod waits for a faster one
	// (evaluatorFor; zero: none); refusals remembers each refusal by the
	// verdict it replaces.
	patience patience
	refusals sync.Map // *verdict -> *verdict
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
	h := (k.free.Word(0)^k.free.Word(1)*0xD6E8FEB86659FD93)*0x9E3779B97F4A7C15 ^ (k.topo.ID()+1)*0xC2B2AE3D27D4EB4F
	if k.pristine {
		h ^= 0x165667B19E3779F9
	}
	return int(h >> (64 - 6))
}

// newEvaluator decides pr for one request (an HTTP verb, a scheduling
// cycle); it logs through ctx's logger.
func newEvaluator(ctx context.Context, alloc *allocator.Allocator, cfg *configv1alpha1.ExtenderConfiguration, pr Request, now time.Time) *evaluator {
	log := klog.FromContext(ctx)
	e := &evaluator{alloc: alloc, cfg: cfg, pr: pr, now: now, maxAge: cfg.TopologyAgeLimit(), log: log, trace: log.V(5).Enabled()}
	w := cfg.Weights
	e.wU, e.wA, e.wH, e.wF = float64(*w.UtilizationBalance), float64(*w.TaskAffinity), float64(*w.ThermalPowerHeadroom), float64(*w.Fragmentation)
	e.wB, e.wC, e.wI = float64(*w.BandwidthFit), float64(*w.CapabilityConservation), float64(*w.IslandBestFit)
	e.wantsBandwidth = pr.wantsBandwidth()
	e.idleC, e.limitC = float64(*cfg.Thermal.IdleTemperatureC), float64(*cfg.Thermal.LimitTemperatureC)
	e.telemetryAfterNs = now.Add(-cfg.TelemetryMaxAge.Duration).UnixNano()
	e.window = ledger.NewFreshWindow(now, e.maxAge)
	return e
}

// claimSelected is the GPUs of n the pod's claims' selectors allow, ok
// false when they allow every one.
func (e *evaluator) claimSelected(n *ledger.Node) (topology.Mask, bool) {
	if e.pr.selected == nil {
		return topology.Mask{}, false
	}
	uuids, ok := e.pr.selected(n.Name())
	if !ok {
		return topology.Mask{}, false
	}
	var m topology.Mask
	g := n.Graph()
	for _, u := range uuids {
		if i, ok := g.IndexOf(u); ok {
			m = m.With(i)
		}
	}
	return m, true
}

// check decides whether node n can take the pod now. The caller holds the
// ledger's read lock. At verbosity 5 every verdict is logged.
func (e *evaluator) check(n *ledger.Node) *verdict {
	v := e.checkNode(n)
	if e.trace {
		name := n.Name()
		if v.ok {
			e.log.V(5).Info("node passes", "node", name, "gpus", v.res.GPUs, "tier", v.res.Metrics.Tier)
		} else {
			e.log.V(5).Info("node refused", "node", name, "reason", v.reason, "unresolvable", v.unresolvable)
		}
	}
	return v
}

func (e *evaluator) checkNode(n *ledger.Node) *verdict {
	switch n.State(e.window) {
	case ledger.TopoMissing:
		return &verdict{code: ReasonNoTopology, reason: "node has no NodeGPUTopology; the gputopo node agent has not published its GPUs (is it running on this node?)"}
	case ledger.TopoInvalid:
		return &verdict{code: ReasonInvalidTopology, reason: "node's NodeGPUTopology is invalid (" + n.TopologyError() + "); fix or restart the gputopo node agent on this node"}
	case ledger.TopoAgentStale:
		reason := "node's GPU topology is stale"
		if r := n.StaleReason(); r != "" {
			reason += " (" + r + ")"
		}
		return &verdict{code: ReasonStaleTopology, reason: reason + "; check the gputopo node agent and the GPU driver on this node"}
	case ledger.TopoOld:
		return e.staleByTime(n)
	case ledger.TopoUntrusted:
		// It may heal (kubelet's next status, the agent republishing), so
		// kube-scheduler may try the node again.
		return &verdict{code: ReasonUntrustedTopology, reason: n.UntrustedReason()}
	}
	switch d := n.DRA(); {
	case e.pr.claims && d == "":
		return &verdict{code: ReasonTooFewGPUs, unresolvable: true, reason: fmt.Sprintf("pod asks for GPUs through ResourceClaims; node's GPUs are the device plugin's (%s), not published by DRA driver %s", e.cfg.GPUResource(), e.cfg.DRA.Driver)}
	case !e.pr.claims && d != "":
		return &verdict{code: ReasonTooFewGPUs, unresolvable: true, reason: fmt.Sprintf("pod asks for %s; node's GPUs are published by DRA driver %s: ask for them through a ResourceClaim of class %s", e.cfg.GPUResource(), d, strings.Join(e.cfg.DRA.DeviceClasses, " or "))}
	}
	if size := n.Size(); e.pr.Count > size {
		return &verdict{code: ReasonTooFewGPUs, unresolvable: true, reason: fmt.Sprintf("pod requests %d GPUs; node has %d", e.pr.Count, size)}
	}
	if a := n.Allocatable(); a >= 0 && e.pr.Count > a {
		return &verdict{code: ReasonTooFewGPUs, unresolvable: true, reason: fmt.Sprintf("pod requests %d GPUs; node advertises %d %s", e.pr.Count, a, e.cfg.GPUResource())}
	}
	free := e.freeFor(n)
	if sel, ok := e.claimSelected(n); ok {
		in := free.Intersect(sel)
		if !e.allocate(n, in, false).ok && e.allocate(n, free, false).ok {
			return &verdict{code: ReasonInfeasible, reason: fmt.Sprintf("pod's ResourceClaims' selectors allow GPUs %v of this node; no free set of them meets the request", sel.Indices())}
		}
		free = in
	}
	if u := n.UnknownHeld(); u > 0 && free.Count()-u < e.pr.Count {
		return &verdict{code: ReasonNotEnoughFree, reason: fmt.Sprintf("needs %d GPUs; %d of %d are free (%d more are held by pods whose GPUs are not recorded yet)",
			e.pr.Count, max(free.Count()-u, 0), n.Size(), u)}
	}
	v := e.allocate(n, free, false)
	if !v.ok && free != n.Free() {
		if e.allocate(n, n.Free(), false).ok {
			return e.keptForGroups(n)
		}
	}
	if v.ok {
		return e.patient(n, v)
	}
	if v.code != ReasonInfeasible && v.code != ReasonNotEnoughFree && v.code != ReasonMemory && v.code != ReasonNVLink && v.code != ReasonBandwidth {
		return v
	}
	if p := e.allocate(n, n.Topo().Pristine().All(), true); !p.ok {
		return &verdict{code: p.code, unresolvable: true, reason: "can never fit this node, even with every GPU free and healthy: " + p.reason}
	}
	return v
}

// topologyClockSkew is how far in the future a NodeGPUTopology's
// observedTime may lie before filter distrusts it (ledger.ClockSkew).
const topologyClockSkew = ledger.ClockSkew

// staleByTime says why n's observedTime makes its topology stale. A
// topology without one was never published by a topology read (the agent
// sets it on every read, failed or not). With the age check on
// (topologyMaxAge), one older than the limit is stale, and so is one
// further in the future than topologyClockSkew: a clock running ahead
// would otherwise keep a dead agent's topology fresh for as long as it is
// ahead. With the age check off neither counts.
func (e *evaluator) staleByTime(n *ledger.Node) *verdict {
	v := &verdict{code: ReasonStaleTopology}
	observed := n.Observed()
	switch {
	case observed.IsZero():
		v.reason = "node's NodeGPUTopology has no observedTime; the gputopo node agent has not published a topology read (is it running on this node?)"
	case observed.After(e.now.Add(topologyClockSkew)):
		ahead := observed.Sub(e.now).Round(time.Second)
		v.reason = fmt.Sprintf("node's NodeGPUTopology observedTime is %s in the future (more than the %s clock-skew allowance); check the node's clock (NTP) and the gputopo node agent", ahead, topologyClockSkew)
	default:
		v.reason = fmt.Sprintf("node's GPU topology was not refreshed for more than %s; check the gputopo node agent on this node", e.maxAge)
	}
	return v
}

// allocate asks the allocator, once per (topology, free GPUs) per request.
// balanced_utilization reads each node's telemetry, so its answers are
// per node and not shared.
func (e *evaluator) allocate(n *ledger.Node, free topology.Mask, pristine bool) *verdict {
	shared := pristine || e.pr.req.EffectiveStrategy() != v1alpha1.StrategyBalancedUtilization
	key := evalKey{topo: n.Topo(), free: free, pristine: pristine}
	slot := key.slot()
	if shared {
		// The one-goroutine hit, inline: most nodes end here.
		if s := &e.slots[slot]; !e.concurrent && s.v != nil && s.key == key {
			return s.v
		}
		if v := e.recall(slot, key); v != nil {
			return v
		}
	}
	g := n.Graph()
	req := topology.Request{Count: e.pr.Count, Requirement: e.pr.req}
	if pristine {
		g = key.topo.Pristine()
	} else if !shared {
		req.Utilization = n.Utilization(e.telemetryAfterNs)
	}
	res, err := e.alloc.Allocate(g, free, req)
	v := &verdict{ok: err == nil, res: res}
	if v.ok {
		v.fit, v.fitFree = true, free
		v.frag, v.islandFit = fitTerms(key.topo, g.Len(), free, res)
	}
	if err != nil {
		v.reason, v.code = err.Error(), ReasonInfeasible
		var inf *topology.InfeasibleError
		if errors.As(err, &inf) {
			v.reason, v.code = inf.Reason, classify(inf.Kind)
		}
	}
	if shared {
		e.remember(slot, key, v)
	}
	return v
}

// recall is the verdict remembered for key (in slot i), nil when none is.
func (e *evaluator) recall(i int, key evalKey) *verdict {
	if !e.concurrent {
		if s := &e.slots[i]; s.v != nil && s.key == key {
			return s.v
		}
		return e.memo[key]
	}
	if s := e.cslots[i].Load(); s != nil && s.key == key {
		return s.v
	}
	if v, ok := e.cmemo.Load(key); ok {
		return v.(*verdict)
	}
	return nil
}

// remember keeps v as key's verdict (in slot i) for the evaluator's
// lifetime.
func (e *evaluator) remember(i int, key evalKey, v *verdict) {
	if !e.concurrent {
		if s := &e.slots[i]; s.v == nil {
			s.key, s.v = key, v
			return
		}
		if e.memo == nil {
			e.memo = make(map[evalKey]*verdict, 8)
		}
		e.memo[key] = v
		return
	}
	if !e.cslots[i].CompareAndSwap(nil, &evalSlot{key: key, v: v}) {
		e.cmemo.Store(key, v)
	}
}

// reasonOf is the metric label of the allocator's kind of infeasibility
// (docs/topology.md, "Feasibility reasons").
var reasonOf = [...]Reason{
	topology.InfeasibleOther:      ReasonInfeasible,
	topology.InfeasibleTooFewFree: ReasonNotEnoughFree,
	topology.InfeasibleMemory:     ReasonMemory,
	topology.InfeasibleNVLink:     ReasonNVLink,
	topology.InfeasibleBandwidth:  ReasonBandwidth,
}

// classify is the Reason of an infeasibility of kind k.
func classify(k topology.InfeasibleKind) Reason {
	if int(k) < len(reasonOf) {
		return reasonOf[k]
	}
	return ReasonInfeasible
}

// wantsBandwidth says whether the pod asks for bandwidth between its
// GPUs (v1alpha1.Requirement.AsksBandwidth).
func (pr Request) wantsBandwidth() bool { return pr.req.AsksBandwidth(pr.Count) }

// cohort is what the cross-node terms compare a node with: the nodes that
// passed filter for the same pod in the same request.
type cohort struct {
	// bestRingGBps is the highest ring bandwidth any of them offers the
	// pod; leastLogCap and mostLogCap bound their machines' log
	// capability.
	bestRingGBps            int
	leastLogCap, mostLogCap float64
	any                     bool
}

// add counts node n with its feasible verdict v in the cohort.
func (c *cohort) add(n *ledger.Node, v *verdict) {
	c.bestRingGBps = max(c.bestRingGBps, v.res.Metrics.RingGBps)
	lc := n.Topo().LogCapability()
	if !c.any {
		c.leastLogCap, c.mostLogCap, c.any = lc, lc, true
		return
	}
	c.leastLogCap, c.mostLogCap = min(c.leastLogCap, lc), max(c.mostLogCap, lc)
}

// soloCohort is the cohort of n alone, for a decision that sees one node
// (bind's placement record): the cross-node terms score it 1.
func soloCohort(n *ledger.Node, v *verdict) cohort {
	var c cohort
	c.add(n, v)
	return c
}

// merit is the node's weighted mean of the terms that count for this pod,
// 0..1, for the placement v.res (see docs/extender.md for the formula).
// Task affinity counts only for a pod whose job has pods placed already,
// bandwidth fit only for a pod that asks for bandwidth; the others count
// for every pod.
func (e *evaluator) merit(n *ledger.Node, v *verdict, aff ledger.Affinity, co cohort) (float64, Components) {
	c := e.components(n, v, aff.Of(n), co)
	return e.combine(e.local(c, aff), c.BandwidthFit, c.Conservation, aff), c
}

// local is the weighted sum of the terms that do not compare the node
// with the others (all but bandwidth fit and capability conservation).
func (e *evaluator) local(c Components, aff ledger.Affinity) float64 {
	total := e.wU*c.Utilization + e.wH*c.Headroom + e.wF*c.Fragmentation + e.wI*c.IslandFit
	if aff.Placed() {
		total += e.wA * c.Affinity
	}
	return total
}

// combine adds the cross-node terms to a local sum and divides by the
// weights that count for the pod: the merit, 0..1. Task affinity counts
// when the pod's job has pods placed (aff).
func (e *evaluator) combine(local, bandwidthFit, conservation float64, aff ledger.Affinity) float64 {
	total, sum := local+e.wC*conservation, e.wU+e.wH+e.wF+e.wI+e.wC
	if aff.Placed() {
		sum += e.wA
	}
	if e.wantsBandwidth {
		total += e.wB * bandwidthFit
		sum += e.wB
	}
	if sum == 0 {
		return 0
	}
	return clamp01(total / sum)
}

// crossTerms are bandwidth fit and capability conservation of a node with
// ring bandwidth ring and log capability logCap, against co.
func crossTerms(ring int, logCap float64, co cohort) (bandwidthFit, conservation float64) {
	bandwidthFit, conservation = 1, 1
	if co.bestRingGBps > 0 {
		bandwidthFit = clamp01(float64(ring) / float64(co.bestRingGBps))
	}
	if span := co.mostLogCap - co.leastLogCap; span > 0 {
		conservation = clamp01(1 - (logCap-co.leastLogCap)/span)
	}
	return bandwidthFit, conservation
}

// absoluteScore is a merit on the 0..10 scale, for the placement record.
func absoluteScore(m float64) int64 { return int64(math.Round(10 * m)) }

// PrioritizeStep is the merit difference one prioritize point stands
// for. Prioritize gives the best node(s) of the request 10 and every other
// node 10 minus its distance from the best in steps of 2% of the weighted
// score (0 at 20% or more): kube-scheduler's 0..10 extender scale is too
// coarse to tell near-equal nodes apart otherwise, and it breaks ties at
// random, which undoes bin packing.
const PrioritizeStep = 0.02

// relativeScore is a node's prioritize score: its merit m against the
// request's best merit.
func relativeScore(m, best float64) int64 {
	s := 10 - int64(math.Round((best-m)/PrioritizeStep))
	return min(max(s, 0), 10)
}

// Components are the prioritize terms, each in 0..1.
type Components struct {
	Utilization, Affinity, Headroom, Fragmentation float64
	BandwidthFit, Conservation, IslandFit          float64
}

func (e *evaluator) components(n *ledger.Node, v *verdict, affinity float64, co cohort) Components {
	size, topo, freeMask := n.Size(), n.Topo(), e.freeFor(n)
	tel := n.Telemetry(e.telemetryAfterNs)
	gpus := v.res.GPUs
	// Utilization balance: 1 - the node's busy fraction after placement.
	// A held GPU is fully busy; a free one is as busy as its telemetry says.
	busy := float64(n.UsedCount() + n.UnknownHeld())
	c := Components{Affinity: affinity, Headroom: 0.5, BandwidthFit: 1, Conservation: 1}
	if tel != nil {
		busy += float64(n.UtilFree()) / 100
		// Thermal and power headroom of the chosen GPUs, in the same pass.
		idle, limit := e.idleC, e.limitC
		var sum float64
		for _, i := range gpus {
			th := tel[i]
			busy++
			busy -= float64(th.Util) / 100
			h := clamp01((limit - float64(th.TempC)) / (limit - idle))
			if th.LimitW > 0 {
				h = min(h, clamp01(1-float64(th.PowerW)/float64(th.LimitW)))
			}
			sum += h
		}
		if len(gpus) > 0 {
			c.Headroom = sum / float64(len(gpus))
		}
	} else {
		// Neutral headroom without recent telemetry.
		busy += float64(len(gpus))
	}
	c.Utilization = clamp01(1 - busy/float64(size))
	// Bandwidth fit: this node's ring bandwidth against the cohort's best.
	// Capability conservation: where this machine's capability lies
	// between the cohort's least and most capable, on a log scale (the
	// machines differ by orders of magnitude): 1 for the least capable,
	// 0 for the most.
	c.BandwidthFit, c.Conservation = crossTerms(v.res.Metrics.RingGBps, topo.LogCapability(), co)
	if v.fit && v.fitFree == freeMask {
		c.Fragmentation, c.IslandFit = v.frag, v.islandFit
	} else {
		c.Fragmentation, c.IslandFit = fitTerms(topo, size, freeMask, v.res)
	}
	return c
}

// fitTerms are prioritize's fragmentation and island best fit terms of
// res, a set chosen on the free GPUs free of a machine of topology topo
// with size GPUs.
func fitTerms(topo *ledger.Topo, size int, free topology.Mask, res topology.Result) (frag, islandFit float64) {
	gpus := res.GPUs
	// Fragmentation left: the largest free NVLink island after placement,
	// against the largest the free GPUs left could form on this machine.
	left := free.Count() - len(gpus)
	frag = 1
	if want := min(left, topo.MaxIsland()); want > 0 {
		frag = clamp01(float64(res.Metrics.LeftLargestIsland) / float64(want))
	}
	// Island best fit: the share of the touched islands' GPUs that is in
	// use once the pod is placed, and of the node's.
	var set, touched topology.Mask
	for _, i := range gpus {
		set = set.With(i)
		touched = touched.Union(topo.IslandOf(i))
	}
	// Half of it is the fill of the touched islands, half the fill of the
	// node: on a machine without NVLink every GPU is its own island, and
	// packing by node is what keeps a whole machine free there.
	islandFill, nodeFill := 1.0, 1.0
	if t := touched.Count(); t > 0 {
		islandFill = 1 - float64(free.Minus(set).Intersect(touched).Count())/float64(t)
	}
	if size > 0 {
		nodeFill = 1 - float64(free.Minus(set).Count())/float64(size)
	}
	return frag, (islandFill + nodeFill) / 2
}

func clamp01(x float64) float64 { return min(max(x, 0), 1) }

// requestedTier names what the requirement asked for, for the placements
// metric.
func requestedTier(pr Request) string {
	switch {
	case pr.Count == 1:
		return string(v1alpha1.TierSingleGPU)
	case pr.req.RequireNVLink:
		return string(v1alpha1.TierNVLink)
	case pr.req.MinPairBandwidthGBps > 0:
		return "min-bandwidth"
	}
	return "any"
}

// read calls fn with the ledger as e decides on it: its snapshot, or the
// live ledger l.
func (e *evaluator) read(l *ledger.Ledger, fn func(v ledger.View)) {
	if e.snap != nil {
		e.snap.Read(fn)
		return
	}
	l.Read(fn)
}

// readNode is read for a question about one node (Ledger.Read's stripe
// for it on a snapshot).
func (e *evaluator) readNode(l *ledger.Ledger, node string, fn func(v ledger.View)) {
	if e.snap != nil {
		e.snap.ReadNode(node, fn)
		return
	}
	l.Read(fn)
}
