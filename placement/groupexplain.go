package placement

import (
	"context"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

func levelName(levels []configv1alpha1.FabricLevel, i int) string {
	if i < len(levels) {
		return levels[i].Name
	}
	return "cluster"
}

func levelNames(levels []configv1alpha1.FabricLevel) string {
	names := make([]string, len(levels))
	for i, l := range levels {
		names[i] = l.Name
	}
	return strings.Join(names, ", ")
}

// GroupExplanation is what `kubectl gputopo explain` shows of a pod's
// group: its plan when it has one, else where it would be planned now, or
// why it waits.
type GroupExplanation struct {
	// Group is namespace/name; Size the pods placed together.
	Group string
	Size  int
	// Planned says a plan is held; Domain and Level say where the group
	// is (or would be) placed, Nodes its pods' nodes (one per pod not
	// bound yet).
	Planned       bool
	Domain, Level string
	Nodes         []string
	// DomainNodes are every node of Domain, in name order, when Domain
	// is a fabric domain (not "cluster"): kube-scheduler's other plugins
	// may still choose among them.
	DomainNodes []string
	// Wait is why the group cannot be placed now ("" when it can).
	Wait string
}

// ExplainGroup explains pr's group without holding anything; nil for a
// pod that is not in a group of more than one.
func (x *Core) ExplainGroup(ctx context.Context, pr Request) *GroupExplanation {
	if pr.group == "" || pr.Count == 0 {
		return nil
	}
	if err := x.resolveGroup(&pr); err != nil {
		return &GroupExplanation{Group: pr.group, Wait: err.Error()}
	}
	if pr.groupSpec.Size < 2 {
		return nil
	}
	out := &GroupExplanation{Group: pr.group, Size: pr.groupSpec.Size}
	for _, p := range x.ledger.Report().GroupPlans() {
		if p.Key == pr.group {
			out.Planned, out.Domain, out.Level, out.Nodes = true, p.Domain, p.Level, p.Nodes
			out.DomainNodes = x.domainNodes(out.Level, out.Domain)
			return out
		}
	}
	x.ledger.Read(func(v ledger.View) {
		g, ok := v.Group(pr.group)
		if !ok {
			g = ledger.GroupView{Key: pr.group}
		}
		need := pr.groupSpec.Size - len(g.Bound)
		if need <= 0 {
			return
		}
		if !slices.ContainsFunc(g.Pending, func(m *ledger.PodInfo) bool { return m.UID == pr.UID }) {
			// Explained before the pod reached the ledger: count it.
			g.Pending = append(g.Pending, &ledger.PodInfo{UID: pr.UID, Key: pr.Key, GPUs: pr.Count})
		}
		slots, dom, lvl, err := x.planGroup(ctx, v, pr, g, need, nil, nil)
		if err != nil {
			out.Wait = err.Error()
			return
		}
		out.Domain, out.Level = dom, lvl
		for _, s := range slots {
			out.Nodes = append(out.Nodes, s.Node)
		}
	})
	if out.Wait == "" {
		out.DomainNodes = x.domainNodes(out.Level, out.Domain)
	}
	return out
}

// groupPending are the group's pods not bound yet, by name.
func (x *Core) groupPending(group string) []types.NamespacedName {
	var out []types.NamespacedName
	x.ledger.Read(func(v ledger.View) {
		g, _ := v.Group(group)
		for _, m := range g.Pending {
			out = append(out, m.Key)
		}
	})
	return out
}

// domainNodes are the nodes in domain (as GroupExplanation names it) at
// fabric level (a level name), in name order; nil for "" and "cluster".
func (x *Core) domainNodes(level, domain string) []string {
	if domain == "" || domain == "cluster" {
		return nil
	}
	lvl, ok := configv1alpha1.FabricLevelIndex(x.cfg.Fabric.Levels, level)
	var out []string
	x.ledger.Read(func(v ledger.View) {
		v.Nodes(func(n *ledger.Node) {
			d := n.Domain(lvl)
			if !ok || d == "" {
				d = "node=" + n.Name()
			}
			if d == domain {
				out = append(out, n.Name())
			}
		})
	})
	return out
}
