package kubectlplugin

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	clusterrt "github.com/gputopo/gputopo/placement/cluster"
	"github.com/gputopo/gputopo/topology"
)

// Explanation is `kubectl gputopo explain POD`.
type Explanation struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	Phase       string `json:"phase"`
	Requested   int    `json:"requested"`
	Requirement string `json:"requirement,omitempty"`
	Strategy    string `json:"strategy,omitempty"`
	// RequestedTier is what the requirement asks for: single-gpu, nvlink,
	// a bandwidth floor, or any.
	RequestedTier string `json:"requestedTier"`
	// ConfigSource is where the extender configuration came from.
	ConfigSource string `json:"configSource"`
	// SchedulerName is the pod's spec.schedulerName; GputopoDecides says
	// whether it is one of gputopo's scheduler profiles. When it is not,
	// gputopo is never asked about the pod, and Nodes say only what
	// gputopo would decide were the pod routed to it.
	SchedulerName  string   `json:"schedulerName"`
	GputopoDecides bool     `json:"gputopoDecides"`
	Profiles       []string `json:"gputopoProfiles"`
	// Scheduled is the pod's PodScheduled condition; nil while no
	// scheduler has tried the pod.
	Scheduled *ConditionView `json:"scheduled,omitempty"`
	// Events are the pod's recent events (FailedScheduling, GPUsBound,
	// ...), oldest first.
	Events Events `json:"events"`
	// Nodes are every GPU node's verdict (Pending pods): passing nodes by
	// score, best first, then the others by name.
	Nodes []NodeVerdict `json:"nodes,omitempty"`
	// Bound is the bound pod's plan and truth.
	Bound *BoundView `json:"bound,omitempty"`
	// Group is the pod's group, when it is placed with others
	// (docs/groups.md).
	Group *GroupView `json:"group,omitempty"`
}

// GroupView is a pod's group as explain shows it: what it asks for, its
// live pods, and where it is placed, would be placed now, or why it
// waits, by the core's own planning (placement.Core.ExplainGroup).
type GroupView struct {
	// Name is namespace/name.
	Name string `json:"name"`
	// Size is how many pods are placed together; 0 for a Kubernetes
	// PodGroup (PodGroup true), whose size lives in the PodGroup, which
	// the plugin does not read.
	Size     int  `json:"size,omitempty"`
	PodGroup bool `json:"podGroup,omitempty"`
	// Required and Preferred are the fabric levels of its annotations.
	Required  string `json:"requiredTopology,omitempty"`
	Preferred string `json:"preferredTopology,omitempty"`
	// SliceSize and SliceRequired: the group is cut into slices of that
	// many pods, each inside one domain of that level (0: no slices).
	SliceSize     int    `json:"sliceSize,omitempty"`
	SliceRequired string `json:"sliceRequiredTopology,omitempty"`
	// Members are its live pods: bound ones (by node), then the others
	// (by name).
	Members []GroupMember `json:"members"`
	// Domain is the fabric domain the group is placed in (its bound pods'
	// placement record) or would be placed in now, Level that domain's
	// fabric level (empty when only the record says where), and Nodes the
	// nodes its pods not bound yet would go to, one per pod.
	Domain string   `json:"domain,omitempty"`
	Level  string   `json:"level,omitempty"`
	Nodes  []string `json:"nodes,omitempty"`
	// Wait is why the group cannot be placed now, in the scheduler's
	// words ("" when it can).
	Wait string `json:"wait,omitempty"`
}

// GroupMember is one live pod of a group.
type GroupMember struct {
	Name string `json:"name"`
	// Node is where it is bound ("" while Pending), and Domain the domain
	// its placement record names.
	Node   string `json:"node,omitempty"`
	Domain string `json:"domain,omitempty"`
	// Slice and SliceDomain: its slice of a sliced group and where the
	// slice lies (SliceDomain "" for none).
	Slice       int    `json:"slice,omitempty"`
	SliceDomain string `json:"sliceDomain,omitempty"`
}

// Bound counts the members bound to a node.
func (g *GroupView) Bound() int {
	n := 0
	for _, m := range g.Members {
		if m.Node != "" {
			n++
		}
	}
	return n
}

// ReasonPackedOver is a fitting node's reason when domain packing scored
// it one below the best (docs/groups.md, "Pods outside groups").
const ReasonPackedOver = "as good as the best, one point less: another lies in a fuller fabric domain (domain packing)"

// NodeVerdict is one node's answer for a Pending pod.
type NodeVerdict struct {
	Node string `json:"node"`
	// Scheduler is why kube-scheduler's own filters leave the node out
	// (node selector or affinity, taints, GPU count), empty when they let
	// it through; gputopo's verdict below is then the one that decides.
	Scheduler string `json:"scheduler,omitempty"`
	// Verdict is fits, fails or never (fails even with every GPU free and
	// healthy: kube-scheduler does not preempt for it).
	Verdict string `json:"verdict"`
	Reason  string `json:"reason,omitempty"`
	Score   int64  `json:"score,omitempty"`
	// GPUs are the indices bind would take, in ring order, and what they
	// give.
	GPUs              []int  `json:"gpus,omitempty"`
	Tier              string `json:"tier,omitempty"`
	RingBandwidthGBps int    `json:"ringBandwidthGBps,omitempty"`
	MinPairGBps       int    `json:"minPairBandwidthGBps,omitempty"`
	// LeftLargestIsland is the largest free NVLink island the node keeps.
	LeftLargestIsland int `json:"leftLargestIsland,omitempty"`
	// Preempt are the pods (namespace/name) preemption would evict on a
	// node that fails now, so that the pod fits there: the fewest and
	// least important lower-priority pods whose GPUs free a set it
	// accepts. Empty where no eviction helps, or the pod may not preempt
	// (preemptionPolicy: Never).
	Preempt []string `json:"preempt,omitempty"`
}

// ConditionView is a pod condition as explain shows it.
type ConditionView struct {
	Status             string       `json:"status"`
	Reason             string       `json:"reason,omitempty"`
	Message            string       `json:"message,omitempty"`
	LastTransitionTime *metav1.Time `json:"lastTransitionTime,omitempty"`
	// AgeSeconds is how long ago the condition last changed.
	AgeSeconds int64 `json:"ageSeconds,omitempty"`
}

// Reasons of the PodScheduled condition that kube-scheduler sets.
const (
	ReasonUnschedulable  = "Unschedulable"
	ReasonSchedulerError = "SchedulerError"
)

// Verdicts.
const (
	VerdictFits  = "fits"
	VerdictFails = "fails"
	VerdictNever = "never"
)

// BoundView is a bound pod's requested against achieved placement.
type BoundView struct {
	Node string `json:"node"`
	// Placement is the extender's record (the plan); nil when the pod was
	// not bound by gputopo.
	Placement *v1alpha1.Placement `json:"placement,omitempty"`
	Assigned  []string            `json:"assignedGPUs,omitempty"`
	// Allocated is the allocated-gpus annotation, or for a pod that asks
	// for GPUs through DRA its Claims' allocation.
	Allocated []string `json:"allocatedGPUs,omitempty"`
	Claims    []string `json:"claims,omitempty"`
	// Truth is matches, drift, not-recorded or no-plan.
	Truth string `json:"truth"`
	// Achieved is the tier and bandwidth of the GPUs the pod really holds.
	AchievedTier string `json:"achievedTier,omitempty"`
	AchievedRing int    `json:"achievedRingBandwidthGBps,omitempty"`
	// Met says whether the held GPUs meet the requirement.
	Met bool `json:"met"`
}

// Truth values.
const (
	TruthMatches     = "matches"
	TruthDrift       = "drift"
	TruthNotRecorded = "not-recorded"
	TruthNoPlan      = "no-plan"
)

// Explain explains one pod: the scheduler it asked for and whether that is
// one of gputopo's profiles (default DefaultSchedulerName), its
// PodScheduled condition, and every node's verdict by the extender's own
// decision code when it is Pending, plan against truth when it is bound.
// The pod's events are read by the command (podEvents).
func (s *Snapshot) Explain(namespace, name string, profiles ...string) (*Explanation, error) {
	p := s.pod(namespace, name)
	if p == nil {
		return nil, fmt.Errorf("pod %s/%s not found (or finished)", namespace, name)
	}
	if len(profiles) == 0 {
		profiles = []string{v1alpha1.DefaultSchedulerName}
	}
	want, err := v1alpha1.PodGPUDemand(&p.Spec, s.resource())
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	claimed := s.claimsOf(p)
	if want == 0 {
		want = int64(claimed.asked)
	}
	if want == 0 {
		return nil, fmt.Errorf("pod %s/%s requests no %s and no GPUs through ResourceClaims of class %s: gputopo does not place it", namespace, name, s.resource(), strings.Join(s.Config.DRA.DeviceClasses, " or "))
	}
	e := &Explanation{Namespace: namespace, Name: name, Phase: string(p.Status.Phase), Requested: int(want),
		Requirement: p.Annotations[v1alpha1.AnnotationRequirement], ConfigSource: s.ConfigSource}
	if e.Phase == "" {
		e.Phase = string(corev1.PodPending)
	}
	e.SchedulerName, e.Profiles = p.Spec.SchedulerName, profiles
	if e.SchedulerName == "" {
		e.SchedulerName = corev1.DefaultSchedulerName
	}
	e.GputopoDecides = slices.Contains(profiles, e.SchedulerName)
	if c := podScheduled(p); c != nil {
		v := &ConditionView{Status: string(c.Status), Reason: c.Reason, Message: strings.TrimSpace(c.Message)}
		if !c.LastTransitionTime.IsZero() {
			t := c.LastTransitionTime
			v.LastTransitionTime, v.AgeSeconds = &t, int64(s.Now.Sub(t.Time)/time.Second)
		}
		e.Scheduled = v
	}
	req := v1alpha1.Requirement{}
	if e.Requirement != "" {
		if req, err = v1alpha1.ParseRequirement(e.Requirement); err != nil {
			return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, err)
		}
	}
	e.Strategy = string(req.EffectiveStrategy())
	e.RequestedTier = requestedTier(int(want), req)
	if e.Group, err = s.group(p); err != nil {
		return nil, err
	}
	if p.Spec.NodeName != "" {
		e.Bound = s.bound(p, req)
		return e, nil
	}
	e.Nodes, err = s.verdicts(p)
	return e, err
}

// offlineCore is a core fed with the snapshot, as its informers would
// feed it.
func (s *Snapshot) offlineCore() (*placement.Core, error) {
	x, err := placement.New(placement.Options{Config: s.Config, ClaimGPUs: func(p *corev1.Pod) int { return s.claimsOf(p).asked }})
	if err != nil {
		return nil, err
	}
	l := x.Feed()
	clusterrt.FeedDRA(l, s.Config.DRA, s.Slices, s.Claims)
	for i := range s.Topologies {
		l.UpsertTopology(&s.Topologies[i])
	}
	for i := range s.Nodes {
		l.UpsertNode(&s.Nodes[i])
	}
	for i := range s.Pods {
		l.UpsertPod(&s.Pods[i])
	}
	return x, nil
}

// group describes p's group: nil for a pod placed alone. Where the group
// would be placed, or why it waits, is the core's ExplainGroup for a
// member not bound yet (p itself when it is Pending); a group whose pods
// are all bound is where their placement records say.
func (s *Snapshot) group(p *corev1.Pod) (*GroupView, error) {
	key := podGroup(p, s.resource())
	if key == "" || key == groupInvalid {
		// An invalid group fails every node with the parse error
		// (verdicts); a bound pod's is of no consequence any more.
		return nil, nil
	}
	info := placement.NewPodInfo(p, s.resource())
	g := &GroupView{Name: key, PodGroup: info.GroupNative, Required: info.GroupSpec.Required, Preferred: info.GroupSpec.Preferred}
	if !info.GroupNative {
		g.Size = info.GroupSpec.Size
		g.SliceSize, g.SliceRequired = info.GroupSpec.SliceSize, info.GroupSpec.SliceRequired
	}
	var pending *corev1.Pod
	for i := range s.Pods {
		o := &s.Pods[i]
		if o.Namespace != p.Namespace || demand(o, s.resource()) == 0 || podGroup(o, s.resource()) != key {
			continue
		}
		m := GroupMember{Name: o.Name, Node: o.Spec.NodeName}
		if pl, err := v1alpha1.ParsePlacement(o.Annotations[v1alpha1.AnnotationPlacement]); err == nil && pl.Group == key {
			m.Domain = pl.Domain
			m.Slice, m.SliceDomain = pl.Slice, pl.SliceDomain
		}
		if m.Node != "" && m.Domain != "" && g.Domain == "" {
			g.Domain = m.Domain
		}
		if m.Node == "" && (pending == nil || o == p) {
			pending = o
		}
		g.Members = append(g.Members, m)
	}
	sort.SliceStable(g.Members, func(i, j int) bool {
		a, b := g.Members[i], g.Members[j]
		if (a.Node == "") != (b.Node == "") {
			return a.Node != ""
		}
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		return a.Name < b.Name
	})
	if g.PodGroup {
		// Its size and constraint are the PodGroup's, which the
		// snapshot does not hold: the scheduler's events say the rest.
		return g, nil
	}
	if pending == nil {
		if g.Size > 0 && len(g.Members) < g.Size {
			g.Wait = fmt.Sprintf("group %s has %d of its %d pods: the others do not exist", key, len(g.Members), g.Size)
		}
		return g, nil
	}
	x, err := s.offlineCore()
	if err != nil {
		return nil, err
	}
	pr, err := x.ParsePod(pending)
	if err != nil {
		// The scheduler refuses that pod with the same error.
		g.Wait = err.Error()
		return g, nil
	}
	ge := x.ExplainGroup(context.Background(), pr)
	if ge == nil {
		return g, nil
	}
	if ge.Size > 0 {
		g.Size = ge.Size
	}
	g.Wait = strings.TrimPrefix(ge.Wait, placement.ReasonPrefix)
	if ge.Domain != "" {
		g.Domain, g.Level, g.Nodes = ge.Domain, ge.Level, ge.Nodes
	}
	return g, nil
}

// requestedTier names what the requirement asks for.
func requestedTier(count int, req v1alpha1.Requirement) string {
	switch {
	case count == 1:
		return string(v1alpha1.TierSingleGPU)
	case req.RequireNVLink && req.MinPairBandwidthGBps > 0:
		return fmt.Sprintf("nvlink, >= %d GB/s per pair", req.MinPairBandwidthGBps)
	case req.RequireNVLink:
		return string(v1alpha1.TierNVLink)
	case req.MinPairBandwidthGBps > 0:
		return fmt.Sprintf(">= %d GB/s per pair", req.MinPairBandwidthGBps)
	}
	return "any"
}

// verdicts runs the extender's Filter and Explain on a core fed with the
// snapshot, as its informers would feed it.
func (s *Snapshot) verdicts(p *corev1.Pod) ([]NodeVerdict, error) {
	x, err := s.offlineCore()
	if err != nil {
		return nil, err
	}
	names := s.gpuNodeNames()
	pr, err := x.ParsePod(p)
	if err != nil {
		return nil, fmt.Errorf("extender filter: %w", err)
	}
	// The plugin evaluates in-process from the snapshot, synchronously.
	ctx := context.Background()
	filtered, err := x.Filter(ctx, pr, names)
	if err != nil {
		return nil, fmt.Errorf("extender filter: %w", err)
	}
	expl := x.Explain(ctx, pr, names)
	out := make([]NodeVerdict, 0, len(expl))
	for _, ex := range expl {
		v := NodeVerdict{Node: ex.Node, Scheduler: s.schedulerVerdict(p, ex.Node)}
		switch {
		case filtered.Unresolvable[ex.Node] != "":
			v.Verdict, v.Reason = VerdictNever, filtered.Unresolvable[ex.Node]
		case filtered.Failed[ex.Node] != "":
			v.Verdict, v.Reason = VerdictFails, filtered.Failed[ex.Node]
		case ex.Passed:
			m := ex.Result.Metrics
			v.Verdict, v.Score, v.GPUs = VerdictFits, ex.Score, ex.Result.GPUs
			v.Tier, v.RingBandwidthGBps, v.MinPairGBps, v.LeftLargestIsland = string(m.Tier), m.RingGBps, m.MinPairGBps, m.LeftLargestIsland
			if ex.PackedOver {
				v.Reason = ReasonPackedOver
			}
		default:
			v.Verdict, v.Reason = VerdictFails, ex.Reason
		}
		if v.Verdict == VerdictFails {
			v.Preempt = s.preemption(ctx, x, pr, p, ex.Node)
		}
		out = append(out, v)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Verdict == VerdictFits) != (b.Verdict == VerdictFits) {
			return a.Verdict == VerdictFits
		}
		if a.Score != b.Score {
			return a.Score > b.Score
		}
		return a.Node < b.Node
	})
	return out, nil
}

// preemption is what preemption would evict on node for pod p (request
// pr), as the extender's preempt verb answers with no victims proposed:
// nil when p may not preempt or no eviction lets it fit.
func (s *Snapshot) preemption(ctx context.Context, x *placement.Core, pr placement.Request, p *corev1.Pod, node string) []string {
	if p.Spec.PreemptionPolicy != nil && *p.Spec.PreemptionPolicy == corev1.PreemptNever || pr.Group() != "" {
		return nil
	}
	var prio int32
	if p.Spec.Priority != nil {
		prio = *p.Spec.Priority
	}
	uids, _, ok := x.Preemption().Victims(ctx, pr, prio, node, nil, 0, nil)
	if !ok || len(uids) == 0 {
		return nil
	}
	names := make(map[types.UID]string, len(s.Pods))
	for i := range s.Pods {
		names[s.Pods[i].UID] = s.Pods[i].Namespace + "/" + s.Pods[i].Name
	}
	out := make([]string, 0, len(uids))
	for _, u := range uids {
		out = append(out, names[u])
	}
	sort.Strings(out)
	return out
}

// schedulerVerdict says why kube-scheduler's own filters would leave the
// node out before the extender is asked: the pod's node selector or
// required affinity, an untolerated taint, or too few GPUs left by count.
func (s *Snapshot) schedulerVerdict(p *corev1.Pod, name string) string {
	n := s.node(name)
	if n == nil {
		return "no Node object"
	}
	var why []string
	// The node rules bind checks, as kube-scheduler's NodeAffinity and
	// TaintToleration filters do.
	if w, err := placement.NodeRulesOf(p).Excludes(context.Background(), n); err != nil {
		why = append(why, fmt.Sprintf("node affinity cannot be evaluated: %v", err))
	} else if w != "" {
		why = append(why, w)
	}
	if q, ok := n.Status.Allocatable[s.resource()]; ok {
		used := 0
		for i := range s.Pods {
			if o := &s.Pods[i]; o.Spec.NodeName == name {
				used += demand(o, s.resource())
			}
		}
		if int(q.Value())-used < demand(p, s.resource()) {
			why = append(why, fmt.Sprintf("Insufficient %s", s.resource()))
		}
	} else {
		why = append(why, fmt.Sprintf("advertises no %s", s.resource()))
	}
	return strings.Join(why, "; ")
}

func (s *Snapshot) bound(p *corev1.Pod, req v1alpha1.Requirement) *BoundView {
	b := &BoundView{Node: p.Spec.NodeName, Assigned: gpuList(p, v1alpha1.AnnotationAssignedGPUs), Allocated: gpuList(p, v1alpha1.AnnotationAllocatedGPUs)}
	if c := s.claimsOf(p); len(c.claims) > 0 {
		// Through DRA the claims' allocation is the truth.
		b.Allocated, b.Claims = c.gpus, c.claims
	}
	if pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement]); err == nil {
		b.Placement = &pl
	}
	held := b.Allocated
	switch {
	case b.Assigned == nil && b.Allocated == nil:
		b.Truth = TruthNoPlan
	case b.Assigned == nil:
		b.Truth = TruthNoPlan
	case b.Allocated == nil:
		b.Truth, held = TruthNotRecorded, b.Assigned
	case strings.Join(v1alpha1.SortedGPUList(b.Assigned), ",") == strings.Join(v1alpha1.SortedGPUList(b.Allocated), ","):
		b.Truth = TruthMatches
	default:
		b.Truth = TruthDrift
	}
	n := s.nodeState(p.Spec.NodeName)
	if n.graph != nil && len(held) > 0 {
		var set topology.Mask
		for _, u := range held {
			if i, ok := n.graph.IndexOf(u); ok {
				set = set.Union(topology.MaskOf(i))
			}
		}
		if set.Count() > 0 {
			m := n.graph.Metrics(set, topology.Mask{})
			b.AchievedTier, b.AchievedRing = string(m.Tier), m.RingGBps
			b.Met = meets(n.graph, set, req)
		}
	}
	return b
}

// meets says whether set satisfies the requirement's link constraints.
func meets(g *topology.Graph, set topology.Mask, req v1alpha1.Requirement) bool {
	idx := set.Indices()
	for i, a := range idx {
		for _, b := range idx[i+1:] {
			if req.RequireNVLink && !g.NVLinked(a, b) {
				return false
			}
			if req.MinPairBandwidthGBps > 0 && g.Bandwidth(a, b) < req.MinPairBandwidthGBps {
				return false
			}
		}
	}
	if req.GPUMemoryMiB > 0 {
		gpus := g.GPUs()
		for _, i := range idx {
			if gpus[i].MemoryMiB < req.GPUMemoryMiB {
				return false
			}
		}
	}
	return true
}
