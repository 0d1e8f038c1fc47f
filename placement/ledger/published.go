package ledger

import (
	"slices"
	"sort"
	"strings"
	"time"
)

// Held is what the ledger holds for one group, as it is published
// (v1alpha1.GroupPlan): its plan's GPUs (Planned) or the GPUs kept for it
// while it waits (Kept).
type Held struct {
	// Group is namespace/name.
	Group   string
	Planned bool
	Since   time.Time
	// Domain and Level are where the GPUs lie.
	Domain, Level string
	Priority      int32
	Slots         []HeldSlot
}

// HeldSlot is one node's GPUs of a Held.
type HeldSlot struct {
	Node  string
	GPUs  []int
	UUIDs []string
	// Pod is the member that claimed a planned slot ("" for none).
	Pod string
}

// Held lists what the ledger holds for groups, by group: plans first
// claimed, then what is kept for waiting groups.
func (r Report) Held() []Held {
	l := r.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []Held
	for key, g := range l.groups {
		switch {
		case g.plan != nil:
			h := Held{Group: key, Planned: true, Since: g.plan.since, Domain: g.plan.domain, Level: g.plan.level}
			for _, s := range g.plan.slots {
				hs := HeldSlot{Node: s.node}
				if hd := l.holdings[s.holder]; hd != nil {
					hs.UUIDs = slices.Clone(hd.uuids)
				}
				if s.claim != "" {
					for _, m := range g.members {
						if m.UID == s.claim {
							hs.Pod = m.Key.Name
						}
					}
				}
				if n := l.nodes[s.node]; n != nil && n.graph != nil {
					for _, u := range hs.UUIDs {
						if i, ok := n.graph.IndexOf(u); ok {
							hs.GPUs = append(hs.GPUs, i)
						}
					}
				}
				sortTogether(&hs)
				h.Slots = append(h.Slots, hs)
			}
			out = append(out, h)
		case g.reserve != nil:
			r := g.reserve
			h := Held{Group: key, Since: r.since, Domain: r.domain, Level: r.level, Priority: r.priority}
			for name, m := range r.nodes {
				hs := HeldSlot{Node: name, GPUs: m.Indices()}
				if n := l.nodes[name]; n != nil && n.graph != nil {
					for _, i := range hs.GPUs {
						hs.UUIDs = append(hs.UUIDs, n.graph.GPU(i).UUID)
					}
				}
				h.Slots = append(h.Slots, hs)
			}
			out = append(out, h)
		}
	}
	for i := range out {
		slices.SortFunc(out[i].Slots, func(a, b HeldSlot) int {
			if c := strings.Compare(a.Node, b.Node); c != 0 {
				return c
			}
			return slices.Compare(a.GPUs, b.GPUs)
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Group < out[j].Group })
	return out
}

// sortTogether sorts a slot's GPUs ascending, its UUIDs alongside.
func sortTogether(s *HeldSlot) {
	if len(s.GPUs) != len(s.UUIDs) {
		slices.Sort(s.GPUs)
		return
	}
	idx := make([]int, len(s.GPUs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return s.GPUs[a] - s.GPUs[b] })
	gpus, uuids := make([]int, len(idx)), make([]string, len(idx))
	for i, j := range idx {
		gpus[i], uuids[i] = s.GPUs[j], s.UUIDs[j]
	}
	s.GPUs, s.UUIDs = gpus, uuids
}
