package placement

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
	"github.com/gputopo/gputopo/topology"
)

// Request is a pod's GPU request, parsed once per pod and decision (an
// HTTP verb, a scheduling cycle): every answer about the pod reads it.
type Request struct {
	// UID is the pod's: nodes are seen as it sees them (ledger.View.NodeFor).
	UID types.UID
	// Key is the pod's namespace and name.
	Key types.NamespacedName
	// Count is the pod's GPU demand; 0: not the core's to decide.
	Count int
	// claims: Count is GPUs the pod asks through ResourceClaims
	// (PreFilterInput.ClaimGPUs), not the resource.
	claims bool
	// selected, when not nil, is which GPUs (UUIDs) of a node the pod's
	// claims' selectors allow; ok false: they allow every one
	// (PreFilterInput.ClaimSelected).
	selected func(node string) (uuids []string, ok bool)
	req      v1alpha1.Requirement
	job      string // namespace/job label
	// strict is the requirement as written. With fallbackAfter due, req
	// is its relaxed form and fallback is true; fallbackIn is the time
	// left before it falls back (0: it never does, or it already did).
	strict     v1alpha1.Requirement
	fallback   bool
	fallbackIn time.Duration
	// created is the pod's creation time, which fallbackAfter counts from.
	created time.Time
	// group is the pod's group (namespace/name, "" for none) and
	// groupSpec what its annotations say of it.
	group     string
	groupSpec v1alpha1.GroupSpec
	// native: the group is a Kubernetes PodGroup, whose spec the ledger
	// has (ledger.View.NativeGroup).
	native bool
	// indexes say the pod's slice in a sliced group (sliceOf).
	indexes map[string]string
	// nominated is the node kube-scheduler's preemption nominated the
	// pod to ("" for none): its group slot is taken there when it can be.
	nominated string
	// pinned is the node label value the pod's nodeSelector pins it to
	// by kubernetes.io/hostname (ledger.PodInfo.Pinned), or "".
	pinned string
	// priority is the pod's spec.priority.
	priority int32
	// deadline is the pod's activeDeadlineSeconds (0: none): how long it
	// runs at most.
	deadline time.Duration
	// rules are the pod's own node rules, when the request was read from
	// the pod itself (ParseRequest); patience counts only the machines
	// they allow.
	rules *NodeRules
}

// Group is the pod's group, namespace/name ("" for none).
func (r Request) Group() string { return r.group }

// ParseRequest reads the GPU count and requirement of a pod at now, with
// the ledger's reading of the pod (ledger.NewPodInfo: one parser of the
// demand, the job and the requirement). A pod without the requirement
// annotation gets the zero requirement: no constraint, the default
// strategy (lowest_fragmentation), which keeps NVLink islands whole for
// the pods that do need them. A malformed annotation is an error naming
// the field.
func ParseRequest(pod *corev1.Pod, resource corev1.ResourceName, now time.Time) (Request, error) {
	return parseRequest(pod, ledger.NewPodInfo(pod, resource), now)
}

// parseRequest is ParseRequest with the pod's reading given.
func parseRequest(pod *corev1.Pod, info *ledger.PodInfo, now time.Time) (Request, error) {
	r, err := requestOf(info, pod.CreationTimestamp.Time, now)
	if err == nil && r.wantsBandwidth() {
		rules := NodeRulesOf(pod)
		r.rules = &rules
	}
	return r, err
}

// ParsePod is ParseRequest at the core's now, with the GPUs a pod that
// asks none of the resource asks through its ResourceClaims
// (Options.ClaimGPUs): the request of a front end that gets the pod
// alone, as the HTTP extender does. Its node is then gputopo's choice;
// its devices are the allocator's (docs/dra.md).
func (x *Core) ParsePod(pod *corev1.Pod) (Request, error) {
	info := ledger.NewPodInfo(pod, x.cfg.GPUResource())
	ledger.AddClaimGPUs(pod, info, x.opts.ClaimGPUs)
	return parseRequest(pod, info, x.now())
}

// requestOf is the request of a pod the ledger has read.
func requestOf(info *ledger.PodInfo, created, now time.Time) (Request, error) {
	if info.DemandErr != nil {
		return Request{}, info.DemandErr
	}
	if info.GroupErr != nil {
		return Request{}, info.GroupErr
	}
	r := Request{UID: info.UID, Key: info.Key, Count: info.GPUs, claims: info.ViaClaims, job: info.Job, created: created, group: info.Group, groupSpec: info.GroupSpec, native: info.GroupNative, indexes: info.Indexes, nominated: info.Nominated, pinned: info.Pinned, priority: info.Priority, deadline: info.Deadline}
	if info.HasRequirement {
		req, err := v1alpha1.ParseRequirement(info.Requirement)
		if err != nil {
			return r, fmt.Errorf("pod %s: %w", info.Key, err)
		}
		r.setRequirement(req, created, now)
	}
	return r, nil
}

// setRequirement sets the pod's requirement, relaxed when its
// fallbackAfter has passed since created.
func (r *Request) setRequirement(req v1alpha1.Requirement, created, now time.Time) {
	r.req, r.strict = req, req
	if r.Count < 2 {
		return
	}
	due, wait := req.FallbackDue(created, now)
	switch {
	case due:
		r.req, r.fallback = req.Relaxed(), true
	case wait > 0:
		r.fallbackIn = wait
	}
}

// degraded says whether a set with metrics m misses the pod's strict
// requirement, and why, for the placement record. Only a pod that fell
// back can be placed on such a set.
func (r Request) degraded(m topology.SetMetrics) (bool, string) {
	if !r.fallback {
		return false, ""
	}
	after := r.strict.FallbackAfter.Duration
	switch {
	case r.strict.RequireNVLink && m.Tier != v1alpha1.TierNVLink && m.Tier != v1alpha1.TierNVSwitch:
		return true, fmt.Sprintf("Pending longer than fallbackAfter %s with no free NVLink-connected set of %d GPUs; placed on a %s set (ring %d GB/s)", after, r.Count, m.Tier, m.RingGBps)
	case r.strict.MinPairBandwidthGBps > 0 && m.MinPairGBps < r.strict.MinPairBandwidthGBps:
		return true, fmt.Sprintf("Pending longer than fallbackAfter %s with no free set of %d GPUs at %d GB/s per pair; placed at %d GB/s", after, r.Count, r.strict.MinPairBandwidthGBps, m.MinPairGBps)
	}
	return false, ""
}

// slice is the pod's slice in its sliced group, -1 when the group has no
// slices or the pod names none (its group spec resolved).
func (r Request) slice() int {
	s, err := ledger.SliceOf(r.Key, r.groupSpec, r.indexes)
	if err != nil {
		return -1
	}
	return s
}
