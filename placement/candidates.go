package placement

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/gputopo/gputopo/placement/ledger"
)

// Candidates is the fit index's answer (ledger.View.Fits) for one pod: the
// nodes that can hold it now, or, when none can, why.
type Candidates struct {
	// Nodes are the only nodes whose filter the pod needs; nil: every
	// node (the pod fits on most of them, or asks for more GPUs than the
	// index counts).
	Nodes sets.Set[string]
	// Reason, with ReasonPrefix, says why no node can hold the pod now;
	// Unresolvable when no machine in the cluster ever could.
	Reason       string
	Unresolvable bool
}

// candidateShare is the share of the cluster above which Candidates
// returns every node rather than a set: a pod that fits most nodes is
// found feasible nodes for in a few filters, and the set would cost more
// to copy (twice: here and in the framework) than it spares.
const candidateShare = 0.5

// fits narrows a scheduling cycle over total nodes to the nodes
// that can hold pr now, from the index the ledger keeps current: free,
// countable GPUs, and for a requireNVLink pod as many joined by NVLink.
// A node outside the set always fails filter; one inside may still fail
// it (topology age, GPU memory, pair bandwidth), so filter still runs on
// each. The nodes left out are counted with the observer as refused.
func (x *Core) fits(pr Request, total int) Candidates {
	linked := pr.req.RequireNVLink && pr.Count > 1
	var f ledger.Fit
	x.ledger.Read(func(v ledger.View) { f = v.Fits(pr.Count, linked, int(candidateShare*float64(total)), pr.UID) })
	if f.Nodes == nil {
		return Candidates{}
	}
	code := ReasonNotEnoughFree
	if linked {
		code = ReasonNVLink
	}
	if left := total - f.Nodes.Len(); left > 0 {
		x.obs.Filtered(code, left)
	}
	if f.Nodes.Len() > 0 {
		return Candidates{Nodes: f.Nodes}
	}
	return Candidates{Reason: ReasonPrefix + noFitReason(pr, linked, f), Unresolvable: f.Ever == 0 && f.Unusable == 0}
}

// noFitReason is why no node can hold pr now, from the index's answer.
func noFitReason(pr Request, linked bool, f ledger.Fit) string {
	what := "1 free GPU"
	switch {
	case linked:
		what = fmt.Sprintf("%d free GPUs joined by NVLink", pr.Count)
	case pr.Count > 1:
		what = fmt.Sprintf("%d free GPUs", pr.Count)
	}
	var msg string
	switch {
	case f.Ever == 0 && linked:
		msg = fmt.Sprintf("no node could ever hold %d GPUs joined by NVLink, even with every GPU free (the most any machine here offers is %d)", pr.Count, f.EverMost)
	case f.Ever == 0:
		msg = fmt.Sprintf("no node could ever hold %d GPUs, even with every GPU free (the most any node here offers is %d)", pr.Count, f.EverMost)
	case f.Most == 0:
		msg = fmt.Sprintf("no node has %s; no node has a free GPU", what)
	case linked:
		msg = fmt.Sprintf("no node has %s; the largest free NVLink-joined set is %d GPUs, on %s", what, f.Most, f.MostNode)
	default:
		msg = fmt.Sprintf("no node has %s; the most free on one node is %d, on %s", what, f.Most, f.MostNode)
	}
	if f.Unusable > 0 {
		msg += fmt.Sprintf("; %d node(s) not counted: their GPU topology is missing, invalid, stale or not trusted", f.Unusable)
	}
	if linked && pr.fallbackIn > 0 {
		msg += fallbackNote(pr)
	}
	return msg + fmt.Sprintf(" (kubectl gputopo explain -n %s %s gives each node's reason)", pr.Key.Namespace, pr.Key.Name)
}
