package placement

import (
	"slices"

	"github.com/gputopo/gputopo/placement/ledger"
)

// Domain packing (docs/groups.md, "Pods outside groups"): on a cluster
// whose nodes carry fabric domain labels, a pod that is not in a group
// goes, among the nodes that would score best, to the one in the
// best-fitting domain: the fewest free GPUs in its tightest labelled
// domain, then in the domains around it. Left alone, equally scored nodes
// are chosen at random and single-pod jobs spread over every leaf and
// rack, so that no domain stays whole for the groups that need one.
//
// It is a tie-break, not a term: the nodes it passes over score one step
// below the best (MaxScore-1), so that it reorders only nodes the node
// score already rates within half a step of the best. A cluster without
// fabric labels is scored as before.

// packDomains says which of the nodes scoring MaxScore (merit within half
// a prioritize step of best) lie outside the best-fitting fabric domain:
// out[i] for node i of nodes, where passed(i) says it passed filter. It
// returns nil when nothing is passed over (no fabric labels, fewer than
// two such nodes, or all of them in domains that fit alike). Call it under
// the ledger's read lock that nodes were read in.
func packDomains(lv ledger.View, pr Request, nodes []*ledger.Node, merits []float64, best float64, passed func(i int) bool) []bool {
	if pr.group != "" || lv.FabricLevels() == 0 {
		return nil
	}
	var top []int
	for i, n := range nodes {
		if n != nil && passed(i) && best-merits[i] < PrioritizeStep/2 {
			top = append(top, i)
		}
	}
	if len(top) < 2 {
		return nil
	}
	// The levels at which the top nodes lie in more than one domain.
	levels := lv.FabricLevels()
	var differ []int
	for l := range levels {
		first, labelled, split := "", false, false
		for _, i := range top {
			d := nodes[i].Domain(l)
			labelled = labelled || d != ""
			if d == "" {
				d = "node=" + nodes[i].Name()
			}
			if first == "" {
				first = d
			} else if d != first {
				split = true
			}
		}
		if labelled && split {
			differ = append(differ, l)
		}
	}
	if len(differ) == 0 {
		return nil
	}
	free := lv.DomainFree()
	key := func(i int) []int {
		n := nodes[i]
		k := make([]int, len(differ))
		for j, l := range differ {
			if d := n.Domain(l); d != "" {
				k[j] = free[l][d]
			} else {
				k[j] = n.Free().Count() // a domain of its own
			}
		}
		return k
	}
	keys := make([][]int, len(top))
	bestKey := -1
	for j, i := range top {
		keys[j] = key(i)
		if bestKey < 0 || slices.Compare(keys[j], keys[bestKey]) < 0 {
			bestKey = j
		}
	}
	var out []bool
	for j, i := range top {
		if slices.Compare(keys[j], keys[bestKey]) != 0 {
			if out == nil {
				out = make([]bool, len(nodes))
			}
			out[i] = true
		}
	}
	return out
}

// packedScore is a node's prioritize score with domain packing: one step
// below the best for a node packDomains passes over.
func packedScore(score int64, passedOver []bool, i int) int64 {
	if passedOver != nil && passedOver[i] && score == MaxScore {
		return MaxScore - 1
	}
	return score
}
