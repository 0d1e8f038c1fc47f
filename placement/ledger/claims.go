package ledger

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// GPUs allocated through DRA (docs/dra.md). A ResourceClaim's
// status.allocation is the truth for the GPUs a DRA driver hands out: the
// ledger holds each allocated claim's GPUs for the pod the claim is
// reserved for (its holding, as if the pod were bound with those GPUs),
// or for the claim itself while it is reserved for none. A pod gputopo
// bound already holds the GPUs it chose; the claim's allocation then
// confirms them, and one that names other GPUs replaces them and is
// counted as a mismatch (ClaimMismatches): the allocator that wrote the
// claim decided, and the ledger follows it, so no GPU is issued twice.

// ClaimAllocation is an allocated ResourceClaim's GPUs on one node, as the
// cluster runtime read them from the claim and the driver's
// ResourceSlices.
type ClaimAllocation struct {
	// Claim and UID name the claim.
	Claim types.NamespacedName
	UID   types.UID
	// Pod and PodUID are the pod the claim is reserved for; empty while
	// it is reserved for none (or for several: a shared claim).
	Pod    types.NamespacedName
	PodUID types.UID
	Node   string
	UUIDs  []string
}

// UpsertClaim records an allocated claim's GPUs (a claim with none is
// DeleteClaim).
func (l *Ledger) UpsertClaim(a ClaimAllocation) {
	if len(a.UUIDs) == 0 {
		l.DeleteClaim(a.UID)
		return
	}
	a.UUIDs = slices.Clone(a.UUIDs)
	slices.Sort(a.UUIDs)
	l.mu.Lock()
	defer l.mu.Unlock()
	holder, key := a.UID, a.Claim
	if a.PodUID != "" {
		holder, key = a.PodUID, a.Pod
	}
	if prev, ok := l.draClaims[a.UID]; ok && prev != holder {
		l.releaseClaimLocked(a.UID)
	}
	if h := l.holdings[holder]; h != nil && h.node == a.Node && sameSet(h.uuids, a.UUIDs) {
		// gputopo's own choice, confirmed by the allocation.
		l.draClaims[a.UID], l.claimHolders[holder] = holder, a.UID
		if h.reserved {
			h.reserved = false
			l.recomputeLocked(l.nodeLocked(h.node))
			l.confirmGroupLocked(h.group)
		}
		return
	}
	nh := &holding{uid: holder, pod: key, node: a.Node, uuids: a.UUIDs, since: l.now()}
	if h := l.holdings[holder]; h != nil {
		if len(h.uuids) > 0 {
			l.claimMismatches++ // GPUs it was known to hold; an unknown count is only made known
		}
		nh.placement, nh.group = h.placement, h.group
	}
	l.draClaims[a.UID], l.claimHolders[holder] = holder, a.UID
	l.setHoldingLocked(nh)
}

// DeleteClaim forgets a claim that is gone or no longer allocated, and
// frees the GPUs it held for no pod or for a pod the ledger does not
// hold otherwise (a pod bound with the GPUs in its assigned-gpus
// annotation keeps them until it ends).
func (l *Ledger) DeleteClaim(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseClaimLocked(uid)
}

func (l *Ledger) releaseClaimLocked(uid types.UID) {
	holder, ok := l.draClaims[uid]
	if !ok {
		return
	}
	delete(l.draClaims, uid)
	delete(l.claimHolders, holder)
	h := l.holdings[holder]
	if h == nil {
		return
	}
	if info := l.pods[h.pod]; info != nil && info.UID == holder && len(info.Assigned) > 0 {
		return // the pod's own annotation holds them
	}
	l.releaseLocked(holder)
}

// viaClaims fills in the GPUs pod p asks through ResourceClaims, when it
// asks none of the ledger's resource and the ledger can read claims.
func (l *Ledger) viaClaims(p *corev1.Pod, info *PodInfo) { AddClaimGPUs(p, info, l.claimGPUs) }

// AddClaimGPUs fills in info, pod p's reading, with the GPUs p asks
// through ResourceClaims as claimGPUs counts them (Options.ClaimGPUs),
// when it asks none of the resource; nil claimGPUs reads no claims.
func AddClaimGPUs(p *corev1.Pod, info *PodInfo, claimGPUs func(*corev1.Pod) int) {
	if info.GPUs != 0 || info.DemandErr != nil || len(p.Spec.ResourceClaims) == 0 || claimGPUs == nil {
		return
	}
	if n := claimGPUs(p); n > 0 {
		info.GPUs, info.ViaClaims = n, true
		if info.HasRequirement && n > 1 {
			if r, err := v1alpha1.ParseRequirement(info.Requirement); err == nil {
				info.AsksBandwidth = r.AsksBandwidth(n)
			}
		}
	}
}

// SetDRADevices records the GPU UUIDs driver's ResourceSlices publish on
// node (none: the driver serves no GPU there). Such a node's GPUs are
// the driver's: trusted while every UUID it publishes is one of the
// node's NodeGPUTopology and the Node advertises none of the device
// plugin's resource; a pod that asks for the resource does not fit
// there, nor a pod that asks through claims on a node the driver does not
// serve.
func (l *Ledger) SetDRADevices(node, driver string, uuids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.nodeLocked(node)
	if len(uuids) == 0 {
		n.dra, n.draDriver = nil, ""
	} else {
		n.dra, n.draDriver = slices.Clone(uuids), driver
	}
	l.countsLocked(n)
	l.trustLocked(n)
	l.dropIfEmptyLocked(n)
}

// draDistrust is why the GPUs of n, a node a DRA driver serves, are not
// trusted: "" when they are.
func (l *Ledger) draDistrust(n *Node) string {
	if n.capacity > 0 {
		return fmt.Sprintf("node's GPUs are served both by the device plugin (capacity %d %s) and by DRA driver %s's ResourceSlices; serve a node's GPUs one way: remove the device plugin from the node or the driver from it (docs/dra.md)",
			n.capacity, l.resource, n.draDriver)
	}
	for _, u := range n.dra {
		if _, ok := n.graph.IndexOf(u); !ok {
			return fmt.Sprintf("DRA driver %s's ResourceSlice lists GPU %s, which the node's NodeGPUTopology does not; the node's GPUs are not trusted until they agree; check the driver and the gputopo node agent on this node", n.draDriver, u)
		}
	}
	return ""
}

// DRA says which DRA driver serves n's GPUs ("" when the device plugin
// does).
func (n *Node) DRA() string { return n.draDriver }

// ClaimMismatches counts the claim allocations that named other GPUs than
// the ledger held for their pod.
func (v View) ClaimMismatches() int { return v.l.claimMismatches }

// sameSet says whether a and b (b sorted) hold the same UUIDs.
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	s := slices.Clone(a)
	slices.Sort(s)
	return slices.Equal(s, b)
}
