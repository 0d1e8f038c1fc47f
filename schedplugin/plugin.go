// Package schedplugin is gputopo as a kube-scheduler framework plugin: the
// same decision core as the HTTP extender (package extender: ledger,
// evaluator, GPU choice, bind), called in-process at PreFilter, Filter,
// PreScore, Score, Reserve, Unreserve and Bind, so that no pod pays the
// extender protocol's JSON round trips.
//
// It depends on the framework's interfaces only (k8s.io/kube-scheduler),
// not on k8s.io/kubernetes: the gputopo-scheduler binary that registers it
// with kube-scheduler's command (app.WithPlugin) is its own module,
// cmd/gputopo-scheduler. See docs/scheduler-plugin.md.
package schedplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// Name is the plugin's name in a KubeSchedulerConfiguration profile.
const Name = "GPUTopology"

// Version is gputopo's version in the gputopo-scheduler build (set with
// -ldflags -X by make gputopo-scheduler); the Kubernetes version is
// kube-scheduler's own (--version).
var Version = "v0.0.0-dev"

// scoreScale turns the core's 0..10 score into the framework's 0..100.
// With the profile's weight equal to the extender's weight, a node's share
// of the total is the same in both modes: kube-scheduler multiplies an
// extender's 0..10 by its weight and by MaxNodeScore/MaxExtenderPriority.
const scoreScale = fwk.MaxNodeScore / extenderv1.MaxExtenderPriority

// Args are the plugin's pluginConfig arguments.
type Args struct {
	// ConfigFile is an ExtenderConfiguration (config.gputopo.io/v1alpha1), the
	// file the extender reads with --config; empty uses the defaults.
	ConfigFile string `json:"configFile,omitempty"`
	// MetricsBindAddress serves the core's /metrics (the extender's
	// metric names); "0" turns it off. Default ":9090".
	MetricsBindAddress string `json:"metricsBindAddress,omitempty"`
	// SchedulerNames are the profiles that run this plugin; bind refuses
	// pods addressed to any other. Default [gputopo-scheduler].
	SchedulerNames []string `json:"schedulerNames,omitempty"`
	// DeciderLeaseNamespace and DeciderLeaseName name the cluster-wide
	// Lease this scheduler's leader holds to decide GPU pods (one gputopo
	// scheduler per GPU resource per cluster). Defaults kube-system and
	// gputopo-decider-<resource with / as ->.
	DeciderLeaseNamespace string `json:"deciderLeaseNamespace,omitempty"`
	DeciderLeaseName      string `json:"deciderLeaseName,omitempty"`
}

// DecodeArgs reads the plugin's arguments as kube-scheduler hands them to
// an out-of-tree plugin (JSON in a runtime.Unknown); nil means defaults.
// Unknown fields are errors that name the field.
func DecodeArgs(obj runtime.Object) (Args, error) {
	a := Args{MetricsBindAddress: DefaultMetricsBindAddress}
	var raw []byte
	switch o := obj.(type) {
	case nil:
		return a, nil
	case *runtime.Unknown:
		raw = o.Raw
	default:
		return a, fmt.Errorf("pluginConfig args of %s: got %T, want a JSON object with configFile, metricsBindAddress, schedulerNames, deciderLeaseNamespace, deciderLeaseName", Name, obj)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return a, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return a, fmt.Errorf("pluginConfig args of %s: %w (known fields: configFile, metricsBindAddress, schedulerNames, deciderLeaseNamespace, deciderLeaseName)", Name, err)
	}
	return a, nil
}

// DefaultMetricsBindAddress serves the core's /metrics and /readyz.
const DefaultMetricsBindAddress = ":9090"

// Plugin is the framework front end over one decision core.
type Plugin struct {
	x *placement.Core
	// h is the framework's handle (nil for NewForCore): it activates a
	// group's other pods once the group is planned.
	h fwk.Handle
	// stopped is the core's error once it stopped; every cycle reports it.
	mu      sync.Mutex
	stopped error
}

var (
	_ fwk.PreFilterPlugin = (*Plugin)(nil)
	_ fwk.FilterPlugin    = (*Plugin)(nil)
	_ fwk.PreScorePlugin  = (*Plugin)(nil)
	_ fwk.ScorePlugin     = (*Plugin)(nil)
	_ fwk.ReservePlugin   = (*Plugin)(nil)
	_ fwk.BindPlugin      = (*Plugin)(nil)
)

// NewForCore wraps a core the caller runs (tests, the demo).
func NewForCore(x *placement.Core) *Plugin { return &Plugin{x: x} }

// Name implements fwk.Plugin.
func (p *Plugin) Name() string { return Name }

// Core is the decision core the plugin calls.
func (p *Plugin) Core() *placement.Core { return p.x }

const (
	cycleKey fwk.StateKey = Name + "/cycle"
	scoreKey fwk.StateKey = Name + "/scores"
	bindKey  fwk.StateKey = Name + "/bind-unknown"
)

// cycle is the pod's filter in progress (the core's Cycle). refused is
// set, instead of c, when PreFilter found the pod cannot be placed now
// and the framework's preemption may still ask Filter about nodes: Filter
// then answers with it. over holds, per node, the pods the framework's
// preemption removed or added (PreFilterExtensions); nil outside
// preemption and nominated-pod checks.
// group is set with refused for a pod whose group waits but could be
// placed by evicting pods of lower priority.
type cycle struct {
	c       *placement.Cycle
	refused *fwk.Status
	group   *groupPreempt
	over    map[string]*placement.WhatIf
	// dra is the DRA driver whose devices are the pod's GPUs, when it
	// asks for them through ResourceClaims (DeviceView); nil otherwise.
	dra *configv1alpha1.DRA
	// onlyGPUs says the pod's claims ask for nothing but those GPUs
	// (claimGPUs).
	onlyGPUs bool
}

// Clone copies the per-node what-ifs, which AddPod and RemovePod change;
// the core's cycle and the group's preemption plan are shared.
func (c *cycle) Clone() fwk.StateData {
	out := &cycle{c: c.c, refused: c.refused, group: c.group, dra: c.dra, onlyGPUs: c.onlyGPUs}
	if len(c.over) > 0 {
		out.over = make(map[string]*placement.WhatIf, len(c.over))
		for node, w := range c.over {
			out.over[node] = w.Clone()
		}
	}
	return out
}

// coreCycle is the core's cycle of the pod, nil when PreFilter skipped
// or refused it.
func coreCycle(state fwk.CycleState) *placement.Cycle {
	d, err := state.Read(cycleKey)
	if err != nil {
		return nil
	}
	return d.(*cycle).c
}

type scores map[string]int64

func (s scores) Clone() fwk.StateData { return s }

type bindUnknown struct{}

func (bindUnknown) Clone() fwk.StateData { return bindUnknown{} }

// stoppedStatus is the status of a GPU pod's cycle once the plugin's
// runtime stopped; nil while it runs.
func (p *Plugin) stoppedStatus() *fwk.Status {
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	if stopped != nil {
		return fwk.AsStatus(fmt.Errorf("%sGPU decision core stopped: %w", placement.ReasonPrefix, stopped))
	}
	return nil
}

func nodeNames(nodes []fwk.NodeInfo) []string {
	names := make([]string, 0, len(nodes))
	for _, n := range nodes {
		if node := n.Node(); node != nil {
			names = append(names, node.Name)
		}
	}
	return names
}

// PreFilter reads the pod's request and requirement once per cycle,
// through the core's one PreFilter call, and translates its plan. Pods
// without GPUs skip the plugin; a malformed requirement ends the cycle as
// unresolvable with the message that names the field.
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*fwk.PreFilterResult, *fwk.Status) {
	claimsOut := 0
	var draMgr fwk.SharedDRAManager
	if p.h != nil {
		draMgr = p.h.SharedDRAManager()
	}
	dra := p.x.Config().DRA
	viaClaims, onlyGPUs, err := claimGPUs(pod, draMgr, dra)
	if err != nil {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, placement.ReasonPrefix+err.Error())
	}
	var selected func(string) ([]string, bool)
	if viaClaims > 0 {
		selected = claimSelected(ctx, pod, draMgr, dra)
	}
	plan := p.x.PreFilter(ctx, placement.PreFilterInput{
		ClaimGPUs:     viaClaims,
		ClaimSelected: selected,
		Pod:           pod,
		Nodes:         len(nodes),
		Allowed: func() []string {
			var allowed []string
			allowed, claimsOut = schedulable(ctx, pod, nodes, p.claimsFit(ctx, pod))
			return allowed
		},
		LeftOut: func() string { return claimsLeftOut(claimsOut) },
		EachNode: func(fn func(string, func(types.UID) bool)) {
			for _, ni := range nodes {
				if ni.Node() != nil {
					fn(ni.Node().Name, onNode(ni))
				}
			}
		},
	})
	if plan.Skip {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if st := p.stoppedStatus(); st != nil {
		return nil, st
	}
	if plan.Err != nil {
		return nil, fwk.AsStatus(plan.Err)
	}
	switch {
	case plan.Cycle != nil:
		c := &cycle{c: plan.Cycle, over: plan.Over}
		if viaClaims > 0 {
			c.dra, c.onlyGPUs = &dra, onlyGPUs
		}
		state.Write(cycleKey, c)
	case plan.Waiting != "":
		c := &cycle{refused: fwk.NewStatus(fwk.UnschedulableAndUnresolvable, plan.Waiting)}
		if plan.GroupPreemption != nil {
			c.group = &groupPreempt{uid: pod.UID, plan: plan.GroupPreemption}
		}
		state.Write(cycleKey, c)
	}
	if plan.Refusal != "" {
		code := fwk.Unschedulable
		if plan.Unresolvable {
			code = fwk.UnschedulableAndUnresolvable
		}
		return nil, fwk.NewStatus(code, plan.Refusal)
	}
	p.activate(ctx, plan.Activate)
	if plan.Nodes == nil {
		return nil, nil
	}
	return &fwk.PreFilterResult{NodeNames: plan.Nodes}, nil
}

// schedulable are the nodes a group's pod may go to by its own rules
// that PreFilter can read: its nodeSelector and required node affinity,
// and the taints it does not tolerate (NoSchedule, NoExecute), and, for a
// pod with ResourceClaims, where claimsFit says they can be allocated. The
// group is planned on them only, as the extender plans on the nodes
// kube-scheduler's filters passed.
func schedulable(ctx context.Context, pod *corev1.Pod, nodes []fwk.NodeInfo, claimsFit func(*corev1.Node) bool) (out []string, claimsOut int) {
	rules := placement.NodeRulesOf(pod)
	out = make([]string, 0, len(nodes))
	for _, ni := range nodes {
		n := ni.Node()
		if n == nil {
			continue
		}
		if why, err := rules.Excludes(ctx, n); err != nil || why != "" {
			continue
		}
		if claimsFit != nil && !claimsFit(n) {
			claimsOut++
			continue
		}
		out = append(out, n.Name)
	}
	return out, claimsOut
}

// activate moves the pods of keys (a group's other pending pods) to the
// active queue.
func (p *Plugin) activate(ctx context.Context, keys []types.NamespacedName) {
	if len(keys) == 0 || p.h == nil || p.h.SharedInformerFactory() == nil {
		return
	}
	lister := p.h.SharedInformerFactory().Core().V1().Pods().Lister()
	pods := map[string]*corev1.Pod{}
	for _, key := range keys {
		if pod, err := lister.Pods(key.Namespace).Get(key.Name); err == nil {
			pods[key.String()] = pod
		}
	}
	if len(pods) > 0 {
		p.h.Activate(klog.FromContext(ctx), pods)
	}
}

// Waiting pods are tried again usableGather after a node comes to offer
// GPUs (a node agent's first publish and a restart of many agents come as
// bursts), and at most once per usableEvery: a node agent flapping its
// topology cannot make the scheduler retry every waiting pod more often
// than kube-scheduler's own backoff would.
const (
	usableGather = 200 * time.Millisecond
	usableEvery  = 5 * time.Second
)

// watchUsable tries the pods waiting for GPUs again whenever a node comes
// to offer GPUs it did not from its topology's side (a topology
// published, trusted or fresh again): kube-scheduler does not watch
// NodeGPUTopologies, so without this such a pod would wait for the next
// cluster event it does watch, or its 5-minute flush of unschedulable
// pods.
func (p *Plugin) watchUsable(ctx context.Context) {
	b := newBatch(usableGather, usableEvery, func() { p.activatePending(ctx) })
	p.x.Upkeep().OnNodeUsable(b.signal)
	go b.run(ctx)
}

// batch runs act after signals, gathering them for gather and leaving at
// least every between two runs; a signal is never left without a run
// that starts after it.
type batch struct {
	wake          chan struct{}
	gather, every time.Duration
	act           func()
}

func newBatch(gather, every time.Duration, act func()) *batch {
	return &batch{wake: make(chan struct{}, 1), gather: gather, every: every, act: act}
}

// signal asks for a run; it never blocks.
func (b *batch) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *batch) run(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.wake:
		}
		wait := max(b.gather, time.Until(last.Add(b.every)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		select { // the run below covers a signal that came meanwhile
		case <-b.wake:
		default:
		}
		last = time.Now()
		b.act()
	}
}

// activatePending moves every pod that waits for GPUs to the active
// queue; kube-scheduler ignores those not in its queue (another
// scheduler's).
func (p *Plugin) activatePending(ctx context.Context) {
	if p.h == nil || p.h.SharedInformerFactory() == nil {
		return
	}
	all, err := p.h.SharedInformerFactory().Core().V1().Pods().Lister().List(labels.Everything())
	if err != nil {
		return
	}
	res := p.x.Config().GPUResource()
	pods := map[string]*corev1.Pod{}
	for _, pod := range all {
		if pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil {
			continue
		}
		if n, err := v1alpha1.PodGPUDemand(&pod.Spec, res); err == nil && n > 0 {
			pods[pod.Namespace+"/"+pod.Name] = pod
		}
	}
	if len(pods) > 0 {
		klog.FromContext(ctx).V(4).Info("nodes came to offer GPUs: trying the waiting GPU pods again", "pods", len(pods))
		p.h.Activate(klog.FromContext(ctx), pods)
	}
}

// PreFilterExtensions implements fwk.PreFilterPlugin: kube-scheduler's

// Filter is the extender's filter verdict on the node, with its reason:
// Unschedulable, or UnschedulableAndUnresolvable where no change of the
// node's GPU use could fix it (no preemption for it). Inside preemption
// the verdict is on the node as the cycle's what-if leaves it.
func (p *Plugin) Filter(_ context.Context, state fwk.CycleState, pod *corev1.Pod, nodeInfo fwk.NodeInfo) *fwk.Status {
	d, err := state.Read(cycleKey)
	if err != nil {
		return fwk.AsStatus(fmt.Errorf("%s: no PreFilter state in this cycle: %w", Name, err))
	}
	c := d.(*cycle)
	node := nodeInfo.Node().Name
	if c.c == nil {
		if c.group != nil && !c.over[node].Empty() {
			return c.group.filter(node, c.over[node])
		}
		return c.refused
	}
	w := c.over[node]
	if pod.Status.NominatedNodeName == node {
		// The node preemption made room on: decide as kube-scheduler's
		// snapshot sees it, victims gone, while the ledger catches up.
		w = p.x.Preemption().Lagging(w.Clone(), node, onNode(nodeInfo))
	}
	passed, unresolvable, reason := c.c.FilterNodeIf(node, w)
	switch {
	case passed:
		return nil
	case unresolvable:
		return fwk.NewStatus(fwk.UnschedulableAndUnresolvable, reason)
	}
	return fwk.NewStatus(fwk.Unschedulable, reason)
}

// onNode says whether a pod is on nodeInfo's node in kube-scheduler's
// snapshot.
func onNode(nodeInfo fwk.NodeInfo) func(types.UID) bool {
	uids := make(map[types.UID]bool, len(nodeInfo.GetPods()))
	for _, pi := range nodeInfo.GetPods() {
		uids[pi.GetPod().UID] = true
	}
	return func(uid types.UID) bool { return uids[uid] }
}

// PreScore scores every feasible node with the extender's prioritize (its
// cross-node terms compare each node with the others), once per cycle.
func (p *Plugin) PreScore(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	c := coreCycle(state)
	if c == nil {
		return fwk.NewStatus(fwk.Skip) // no GPUs: PreFilter skipped
	}
	names := nodeNames(nodes)
	list := c.Score(names)
	s := make(scores, len(list))
	for i, score := range list {
		s[names[i]] = score * scoreScale
	}
	state.Write(scoreKey, s)
	return nil
}

// Score returns PreScore's score of the node, 0..100.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *corev1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	d, err := state.Read(scoreKey)
	if err != nil {
		return 0, fwk.AsStatus(fmt.Errorf("%s: no PreScore state in this cycle: %w", Name, err))
	}
	return d.(scores)[nodeInfo.Node().Name], nil
}

// ScoreExtensions implements fwk.ScorePlugin. Scores are already relative
// to the best node (the core normalizes while it scores, as for the
// extender), so there is nothing left to normalize.
func (p *Plugin) ScoreExtensions() fwk.ScoreExtensions { return nil }

// Reserve chooses the pod's GPUs on the node and holds them in the ledger
// for the rest of the cycle.
func (p *Plugin) Reserve(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	c := coreCycle(state)
	if c == nil {
		return nil
	}
	if d, err := state.Read(cycleKey); err == nil && !d.(*cycle).over[node].Empty() {
		// Decided on kube-scheduler's snapshot with pods taken out
		// (pod-group preemption trying its victims): nothing to hold in
		// the ledger, where those pods still hold their GPUs. The real
		// cycle, once they are gone, reserves; and bind reserves on the
		// ledger in any case, so no GPU is issued twice.
		return nil
	}
	if res := p.x.Reserve(ctx, c.Request(), node); res.Err != nil {
		return fwk.NewStatus(fwk.Unschedulable, placement.ReasonPrefix+res.Err.Error())
	}
	return nil
}

// Unreserve releases the reservation of a cycle that failed after Reserve,
// unless a Binding may still land (its outcome was unknown): then the
// reservation stays, for the retry or until the reservation TTL.
func (p *Plugin) Unreserve(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, node string) {
	if _, err := state.Read(bindKey); err == nil {
		klog.FromContext(ctx).V(2).Info("keeping GPU reservation: the Binding's outcome is unknown", "pod", klog.KObj(pod), "node", node)
		return
	}
	p.x.Unreserve(pod.UID)
}

// Bind writes the pod's Binding with its GPU assignment and placement
// annotations in one write, as the extender's bind verb does. Pods without
// GPUs are left to the next bind plugin (DefaultBinder).
func (p *Plugin) Bind(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	c := coreCycle(state)
	if c == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	pr := c.Request()
	res := p.x.Bind(ctx, placement.BindRequest{Key: pr.Key, UID: pod.UID, Node: node, Request: &pr})
	if res.Outcome == placement.Unknown {
		state.Write(bindKey, bindUnknown{})
	}
	if res.Err != nil {
		return fwk.AsStatus(res.Err)
	}
	return nil
}

var (
	_ fwk.PlacementGeneratePlugin = (*Plugin)(nil)
	_ fwk.PlacementScorePlugin    = (*Plugin)(nil)
)

// GeneratePlacements offers kube-scheduler's pod-group cycle (feature gate
// TopologyAwareWorkloadScheduling) one placement for a group that
// requests GPUs: the nodes of the fabric domain gputopo plans the whole
// group in (docs/groups.md). A group gputopo cannot place now gets no
// placement and its reason. Groups without GPUs, and pods gputopo has no
// request for, keep the parent placement. The framework runs only the
// first PlacementGenerate plugin of a profile: disable
// TopologyPlacementGenerator for this one to run.
func (p *Plugin) GeneratePlacements(ctx context.Context, _ fwk.PodGroupCycleState, pg fwk.PodGroupInfo, parent *fwk.Placement) (*fwk.GeneratePlacementsResult, *fwk.Status) {
	all := &fwk.GeneratePlacementsResult{Placements: []*fwk.Placement{parent}}
	pods := pg.GetUnscheduledPods()
	if len(pods) == 0 {
		return all, nil
	}
	pr, err := placement.ParseRequest(pods[0], p.x.Config().GPUResource(), p.x.Now())
	if err != nil || pr.Count == 0 {
		return all, nil
	}
	gx := p.x.ExplainGroup(ctx, pr)
	switch {
	case gx == nil:
		return all, nil
	case gx.Wait != "":
		return &fwk.GeneratePlacementsResult{}, fwk.NewStatus(fwk.Unschedulable, placement.ReasonPrefix+gx.Wait)
	}
	want := sets.New(gx.Nodes...)
	if gx.Domain != "" && gx.Domain != "cluster" {
		// Every node of the domain, so that kube-scheduler's other
		// plugins may still choose among them.
		want = sets.New(gx.DomainNodes...)
	}
	out := &fwk.Placement{Name: "gputopo:" + gx.Domain}
	for _, n := range parent.Nodes {
		if node := n.Node(); node != nil && want.Has(node.Name) {
			out.Nodes = append(out.Nodes, n)
		}
	}
	return &fwk.GeneratePlacementsResult{Placements: []*fwk.Placement{out}}, nil
}

// ScorePlacement prefers the placement whose pods all landed on gputopo's
// planned nodes: MaxScore times the share of the group's proposed pods
// on them.
func (p *Plugin) ScorePlacement(ctx context.Context, _ fwk.PlacementCycleState, pg fwk.PodGroupInfo, a *fwk.PodGroupAssignments) (int64, *fwk.Status) {
	if a == nil || len(a.ProposedAssignments) == 0 {
		return 0, nil
	}
	pr, err := placement.ParseRequest(a.ProposedAssignments[0].GetPod(), p.x.Config().GPUResource(), p.x.Now())
	if err != nil || pr.Count == 0 {
		return 0, nil
	}
	gx := p.x.ExplainGroup(ctx, pr)
	if gx == nil || gx.Wait != "" {
		return 0, nil
	}
	planned := sets.New(gx.Nodes...)
	var on int64
	for _, pa := range a.ProposedAssignments {
		if planned.Has(pa.GetNodeName()) {
			on++
		}
	}
	return fwk.MaxScore * on / int64(len(a.ProposedAssignments)), nil
}

// PlacementScoreExtensions implements fwk.PlacementScorePlugin: scores are
// already 0..MaxScore.
func (p *Plugin) PlacementScoreExtensions() fwk.PlacementScoreExtensions { return nil }
