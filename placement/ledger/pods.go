package ledger

import (
	"fmt"
	"math"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// PodInfo is what the ledger keeps of a GPU pod, read from the pod object.
type PodInfo struct {
	UID  types.UID
	Key  types.NamespacedName
	Node string
	// GPUs is the pod's GPU demand (see GPUCount); ViaClaims: it asks
	// them through ResourceClaims (Options.ClaimGPUs), not the resource.
	GPUs      int
	ViaClaims bool
	// Job is namespace/job label, "" without one.
	Job string
	// Priority is the pod's spec.priority (0 when unset); Started its
	// status.startTime (zero before it started). Preemption orders its
	// victims by them, as kube-scheduler does.
	Priority int32
	Started  time.Time
	// Deadline is the pod's spec.activeDeadlineSeconds (0 when unset):
	// kubelet ends the pod that long after it started, so it is gone by
	// then (a waiting group's reservation counts on it).
	Deadline time.Duration
	// Nominated is status.nominatedNodeName: the node kube-scheduler's
	// preemption made room on for it.
	Nominated string
	// Pinned is the pod's nodeSelector for kubernetes.io/hostname, the
	// form a queue's topology-aware assignment pins each pod to the node
	// it chose (Kueue's ungater writes it), or "".
	Pinned string
	// Preempted: kube-scheduler is evicting the pod to make room for a
	// pod of higher priority (its DisruptionTarget condition): the GPUs
	// it frees are remembered for that pod (TakeFreed).
	Preempted bool
	// Requirement is the requirement annotation as written;
	// HasRequirement says whether the pod has one. AsksBandwidth: it
	// is valid and asks for bandwidth between the pod's GPUs
	// (v1alpha1.Requirement.AsksBandwidth).
	Requirement    string
	HasRequirement bool
	AsksBandwidth  bool
	// Created is the pod's creation time.
	Created time.Time
	// Assigned is allocated-gpus, else assigned-gpus.
	Assigned []string
	// AssignedRaw is the assigned-gpus annotation as written.
	AssignedRaw string
	// AssignErr is why the GPU annotation could not be read.
	AssignErr error
	// DemandErr is why the pod's GPU demand could not be read (a negative,
	// fractional or oversized count, naming the field); GPUs is then 0
	// and must not be taken for "no GPUs".
	DemandErr error
	// Group is the pod's group (namespace/name, "" for none) and
	// GroupSpec what its annotations say of it; GroupErr is why they
	// could not be read.
	Group     string
	GroupSpec v1alpha1.GroupSpec
	GroupErr  error
	// GroupNative: the group is a Kubernetes PodGroup
	// (spec.schedulingGroup.podGroupName); its spec comes from the
	// PodGroup object (View.NativeGroup).
	GroupNative bool
	// Indexes are the pod's annotations and labels that say its slice in
	// a sliced group (v1alpha1.SliceOf); nil when it has none.
	Indexes map[string]string
}

// Slice is m's slice in group spec (v1alpha1.SliceOf); -1 when spec has no
// slices or m names none.
func (m *PodInfo) Slice(spec v1alpha1.GroupSpec) (int, error) {
	return SliceOf(m.Key, spec, m.Indexes)
}

// SliceOf is the slice in group spec of pod key with indexes (its
// PodInfo.Indexes); -1 when spec has no slices or the pod names none.
func SliceOf(key types.NamespacedName, spec v1alpha1.GroupSpec, indexes map[string]string) (int, error) {
	if indexes == nil {
		return -1, nil
	}
	s, ferr := v1alpha1.SliceOf(groupPath, spec, indexes, indexes)
	if ferr != nil {
		return -1, fmt.Errorf("pod %s/%s: %w", key.Namespace, key.Name, ferr)
	}
	return s, nil
}

// IndexKeys are the annotations and labels PodInfo.Indexes keeps: a
// group's pod's rank, from which its slice follows. A front end that
// trims the pods it feeds the ledger keeps them.
var IndexKeys = []string{v1alpha1.AnnotationRank, v1alpha1.LabelJobSetJobIndex, v1alpha1.AnnotationCompletionIndex}

// GPUCount is the number of devices of resource (the configuration's
// GPUResource) the pod needs, by v1alpha1.PodGPUDemand: app containers and
// sidecars summed, one-shot init containers the largest, limits over
// requests. A negative, fractional or oversized count is an error naming
// the container's field.
func GPUCount(pod *corev1.Pod, resource corev1.ResourceName) (int, error) {
	n, err := v1alpha1.PodGPUDemand(&pod.Spec, resource)
	if err != nil {
		return 0, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if n > math.MaxInt32 {
		return 0, fmt.Errorf("pod %s/%s: spec: Invalid value: %d %s in all: must be at most %d", pod.Namespace, pod.Name, n, resource, math.MaxInt32)
	}
	return int(n), nil
}

// NewPodInfo reads what the ledger keeps of pod p, counting resource.
func NewPodInfo(p *corev1.Pod, resource corev1.ResourceName) *PodInfo {
	info := &PodInfo{
		UID:  p.UID,
		Key:  types.NamespacedName{Namespace: p.Namespace, Name: p.Name},
		Node: p.Spec.NodeName,
	}
	if n, err := GPUCount(p, resource); err != nil {
		info.DemandErr = err
	} else {
		info.GPUs = n
	}
	if j := p.Labels[v1alpha1.LabelJob]; j != "" {
		info.Job = p.Namespace + "/" + j
	}
	if p.Spec.Priority != nil {
		info.Priority = *p.Spec.Priority
	}
	if p.Status.StartTime != nil {
		info.Started = p.Status.StartTime.Time
	}
	if d := p.Spec.ActiveDeadlineSeconds; d != nil && *d > 0 && *d < math.MaxInt64/int64(time.Second) {
		info.Deadline = time.Duration(*d) * time.Second
	}
	info.Nominated = p.Status.NominatedNodeName
	info.Pinned = p.Spec.NodeSelector[corev1.LabelHostname]
	info.Preempted = preemptedBy(p)
	info.Requirement, info.HasRequirement = p.Annotations[v1alpha1.AnnotationRequirement]
	if info.HasRequirement && info.GPUs > 1 {
		if r, err := v1alpha1.ParseRequirement(info.Requirement); err == nil {
			info.AsksBandwidth = r.AsksBandwidth(info.GPUs)
		}
	}
	info.Created = p.CreationTimestamp.Time
	g, ok, errs := v1alpha1.ParseGroup(groupPath, p.Annotations)
	native := p.Spec.SchedulingGroup != nil && p.Spec.SchedulingGroup.PodGroupName != nil
	switch {
	case len(errs) > 0:
		info.GroupErr = fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, errs.ToAggregate())
	case ok && native:
		info.GroupErr = fmt.Errorf("pod %s/%s: metadata.annotations[%s] %q and spec.schedulingGroup.podGroupName %q name two groups: name one (the PodGroup, or the annotations)",
			p.Namespace, p.Name, v1alpha1.AnnotationGroup, g.Name, *p.Spec.SchedulingGroup.PodGroupName)
	case ok:
		info.Group, info.GroupSpec = p.Namespace+"/"+g.Name, g
	case native:
		// A Kubernetes PodGroup: its size and constraint are the
		// PodGroup's (UpsertPodGroup).
		info.Group, info.GroupNative = p.Namespace+"/"+*p.Spec.SchedulingGroup.PodGroupName, true
		info.GroupSpec = v1alpha1.GroupSpec{Name: *p.Spec.SchedulingGroup.PodGroupName}
	}
	for _, k := range IndexKeys {
		v, ok := p.Annotations[k]
		if !ok {
			v, ok = p.Labels[k]
		}
		if ok {
			if info.Indexes == nil {
				info.Indexes = map[string]string{}
			}
			info.Indexes[k] = v
		}
	}
	if info.GroupErr == nil && !info.GroupNative {
		if _, err := info.Slice(info.GroupSpec); err != nil {
			info.GroupErr = err
		}
	}
	info.AssignedRaw = p.Annotations[v1alpha1.AnnotationAssignedGPUs]
	for _, key := range []string{v1alpha1.AnnotationAllocatedGPUs, v1alpha1.AnnotationAssignedGPUs} {
		v, ok := p.Annotations[key]
		if !ok {
			continue
		}
		uuids, err := v1alpha1.ParseGPUList(key, v)
		if err != nil {
			info.AssignErr = err
			continue
		}
		if len(uuids) > 0 {
			info.Assigned = uuids
			break
		}
	}
	return info
}

var groupPath = field.NewPath("metadata", "annotations")

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// UpsertPod records a pod from the informer (or from the rebuild list).
func (l *Ledger) UpsertPod(p *corev1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.gone[p.UID]; ok {
		return // a stale copy of a pod already deleted or finished
	}
	if terminal(p) {
		l.gone[p.UID] = l.now()
		l.forgetPodLocked(p.UID, types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
		return
	}
	info := NewPodInfo(p, l.resource)
	l.viaClaims(p, info)
	if info.GPUs == 0 && len(info.Assigned) == 0 && info.DemandErr == nil {
		l.forgetPodLocked(p.UID, info.Key)
		return
	}
	old, had := l.pods[info.Key]
	if had {
		l.jobDeltaLocked(old, -1)
		l.groupLeaveLocked(old, old.UID != info.UID || old.Group != info.Group)
	}
	if info.Node == "" && info.Group != "" && info.Pinned != "" && (!had || old.Pinned != info.Pinned) && l.onUsable != nil {
		// A pending group member pinned to a node (a queue's
		// topology-aware assignment ungating it): its group's other pods,
		// refused while the scheduler's copy of the group was not all
		// pinned yet, are decided on the whole group's pins. kube-scheduler
		// may have retried them on this update before the ledger saw it.
		defer l.onUsable()
	}
	l.pods[info.Key] = info
	l.jobDeltaLocked(info, +1)
	l.groupJoinLocked(info)
	if info.Node == "" {
		return // a reservation, if any, stays: its bind may be in flight
	}
	h := l.holdings[info.UID]
	switch {
	case len(info.Assigned) > 0:
		if h != nil && h.node == info.Node && !h.reserved && slices.Equal(h.uuids, info.Assigned) {
			return
		}
		nh := &holding{uid: info.UID, pod: info.Key, node: info.Node, uuids: info.Assigned, since: l.now()}
		if h != nil {
			nh.placement, nh.group = h.placement, h.group
		}
		l.setHoldingLocked(nh)
		l.confirmGroupLocked(info.Group)
	case h != nil && h.node == info.Node:
		// Bound by our Binding but seen without the annotation: keep the
		// GPUs we reserved, now confirmed.
		if h.reserved {
			h.reserved = false
			l.recomputeLocked(l.nodeLocked(h.node))
			l.confirmGroupLocked(info.Group)
		}
	case info.DemandErr != nil:
		// Bound with a demand that cannot be read (kube-apiserver admits
		// none such): nothing to count; filter and bind report the error.
		return
	default:
		if h != nil && h.uuids == nil && h.node == info.Node && h.unknown == info.GPUs {
			return
		}
		// Bound by someone else with no record of which GPUs: they count
		// against the node's capacity until the node agent records them.
		l.setHoldingLocked(&holding{uid: info.UID, pod: info.Key, node: info.Node, unknown: info.GPUs, since: l.now()})
	}
}

// DeletePod forgets the deleted pod key with UID uid and frees what it
// held; a pod of that name with another UID (recreated) is kept.
func (l *Ledger) DeletePod(key types.NamespacedName, uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if uid != "" {
		l.gone[uid] = l.now()
	}
	l.forgetPodLocked(uid, key)
}

func (l *Ledger) forgetPodLocked(uid types.UID, key types.NamespacedName) {
	if info, ok := l.pods[key]; ok && info.UID == uid {
		l.noteFreedLocked(info, l.holdings[uid])
		l.noteEndedLocked(info, l.holdings[uid])
		l.jobDeltaLocked(info, -1)
		l.groupLeaveLocked(info, true)
		delete(l.pods, key)
	}
	if _, byClaim := l.claimHolders[uid]; byClaim {
		return // an allocated ResourceClaim holds them until it is deallocated (claims.go)
	}
	l.releaseLocked(uid)
}

func (l *Ledger) jobDeltaLocked(info *PodInfo, d int) {
	if info.Job == "" || info.Node == "" {
		return
	}
	m := l.jobs[info.Job]
	if m == nil {
		if d < 0 {
			return
		}
		m = make(map[string]int)
		l.jobs[info.Job] = m
	}
	m[info.Node] += d
	if m[info.Node] <= 0 {
		delete(m, info.Node)
	}
	if len(m) == 0 {
		delete(l.jobs, info.Job)
	}
}

func (l *Ledger) setHoldingLocked(h *holding) {
	l.releaseLocked(h.uid)
	h.counted = false
	if info := l.pods[h.pod]; info != nil && info.UID == h.uid {
		h.prio, h.counted = info.Priority, true
		l.byPriority[h.prio]++
	}
	l.holdings[h.uid] = h
	n := l.nodeLocked(h.node)
	n.holdings[h.uid] = h
	l.recomputeLocked(n)
}

func (l *Ledger) releaseLocked(uid types.UID) {
	h, ok := l.holdings[uid]
	if !ok {
		return
	}
	delete(l.holdings, uid)
	if h.counted {
		if l.byPriority[h.prio]--; l.byPriority[h.prio] <= 0 {
			delete(l.byPriority, h.prio)
		}
	}
	if n, ok := l.nodes[h.node]; ok {
		delete(n.holdings, uid)
		l.recomputeLocked(n)
		l.dropIfEmptyLocked(n)
	}
}
