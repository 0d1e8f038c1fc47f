package placement

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/placement/ledger"
)

// Pinned groups (docs/integrations.md, "Kueue"): a queue's
// topology-aware scheduling may choose each pod's node itself and pin the
// pod to it with a nodeSelector on kubernetes.io/hostname (Kueue's
// ungater does, when its Topology's lowest level is the host). A group
// whose pods not bound yet are all pinned so is planned on their nodes:
// gputopo chooses the GPUs on each and checks that the nodes lie in one
// domain at the group's required level; it does not move a pod off the
// node it is pinned to.

// pinnedGroup says whether the group's pods to place (need of them) are
// all pinned to a node.
func pinnedGroup(g ledger.GroupView, need int) bool {
	if len(g.Pending) == 0 || len(g.Pending) != need {
		return false
	}
	for _, m := range g.Pending {
		if m.Pinned == "" {
			return false
		}
	}
	return true
}

// pinnedNode is the node whose kubernetes.io/hostname label is host (the
// node named host first, as kubelet names it by default), nil when the
// ledger knows none.
func pinnedNode(v ledger.View, host string) *ledger.Node {
	matches := func(n *ledger.Node) bool {
		o := n.Object()
		return o != nil && o.Labels[corev1.LabelHostname] == host
	}
	if n := v.Node(host); n != nil && matches(n) {
		return n
	}
	var found *ledger.Node
	v.EachNode(func(n *ledger.Node) {
		if found == nil && matches(n) {
			found = n
		}
	})
	return found
}

// planPinned plans a pinned group: each pod not bound yet on the node it
// is pinned to, with the GPUs gputopo chooses there, the nodes and the
// bound members' inside one domain at the required level req (top: the
// cluster). Pins across domains are unresolvable: the pods never move.
func (x *Core) planPinned(ctx context.Context, v ledger.View, pr Request, g ledger.GroupView, req, top int) ([]ledger.Slot, string, string, error) {
	levels := x.cfg.Fabric.Levels
	count := map[string]int{}
	for _, m := range g.Pending {
		n := pinnedNode(v, m.Pinned)
		if n == nil {
			return nil, "", "", &GroupWait{Group: pr.group, Msg: fmt.Sprintf("group %s: pod %s is pinned by its nodeSelector to %s=%s, which no node the scheduler knows carries", pr.group, m.Key.Name, corev1.LabelHostname, m.Pinned)}
		}
		count[n.Name()]++
	}
	nodes := slices.Sorted(maps.Keys(count))
	all := append(slices.Clone(nodes), g.Bound...)
	// The tightest level whose one domain holds every node.
	lvl, dom := -1, ""
	for l := 0; l <= req && lvl < 0; l++ {
		doms := map[string]bool{}
		for _, name := range all {
			doms[domainKey(v.Node(name), name, l, top)] = true
		}
		if len(doms) == 1 {
			lvl = l
			for d := range doms {
				dom = d
			}
		} else if l == req {
			return nil, "", "", &GroupWait{Group: pr.group, Unresolvable: true, Msg: fmt.Sprintf(
				"group %s requires one %s domain, but its pods' nodeSelectors (%s, as a queue's topology-aware assignment writes them) pin them to nodes in %d: %s; have the queue assign the group inside one %s domain (Kueue: kueue.x-k8s.io/podset-required-topology with that level's node label)",
				pr.group, levelName(levels, req), corev1.LabelHostname, len(doms), strings.Join(slices.Sorted(maps.Keys(doms)), ", "), levelName(levels, req))}
		}
	}
	e := newEvaluator(ctx, x.alloc, x.cfg, pr, x.now())
	byName := map[string]*groupNode{}
	for _, gn := range x.groupNodes(e, v, pr, len(g.Pending), nodes, nil) {
		byName[gn.n.Name()] = gn
	}
	var out []ledger.Slot
	aff := v.Affinity(pr.job)
	for _, name := range nodes {
		gn := byName[name]
		if gn == nil || len(gn.sets) < count[name] {
			room := 0
			if gn != nil {
				room = len(gn.sets)
			}
			return nil, "", "", &GroupWait{Group: pr.group, Msg: fmt.Sprintf("group %s: node %s, to which %d of its pods are pinned, has room now for %d pods × %d GPUs as they require", pr.group, name, count[name], room, pr.Count)}
		}
		for _, res := range gn.sets[:count[name]] {
			vd := &verdict{ok: true, res: res}
			merit, _ := e.merit(gn.n, vd, aff, soloCohort(gn.n, vd))
			p := pr.placementOf(name, vd, merit)
			p.Group, p.Domain = pr.group, dom
			out = append(out, ledger.Slot{Node: name, Choice: ledger.Choice{UUIDs: uuidsOf(gn.n, res.GPUs), Placement: p}})
		}
	}
	return out, dom, levelName(levels, lvl), nil
}
