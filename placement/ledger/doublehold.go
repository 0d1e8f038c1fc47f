package ledger

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/topology"
)

// DoubleHold is a GPU that more than one pod holds (or has been promised)
// at once.
type DoubleHold struct {
	Node string
	// GPU is the UUID.
	GPU string
	// Holders are the pods naming it, sorted by namespace/name.
	Holders []GPUHolder
}

// GPUHolder is one pod of a DoubleHold.
type GPUHolder struct {
	PodUID types.UID
	Pod    types.NamespacedName
	// Reserved: a bind in flight, not yet a bound pod.
	Reserved bool
}

func (d *DoubleHold) key() string {
	k := d.Node + "\x00" + d.GPU
	for _, h := range d.Holders {
		k += "\x00" + string(h.PodUID)
	}
	return k
}

// noteDoubleHeldLocked rebuilds n's list of GPUs held more than once from
// the duplicates recompute found, and reports what changed.
func (l *Ledger) noteDoubleHeldLocked(n *Node, dup topology.Mask, unresolved []string) {
	var gpus []string
	if !dup.Empty() {
		all := n.graph.GPUs()
		for _, i := range dup.Indices() {
			gpus = append(gpus, all[i].UUID)
		}
	}
	gpus = append(gpus, unresolved...)
	slices.Sort(gpus)
	gpus = slices.Compact(gpus)
	var now []DoubleHold
	for _, g := range gpus {
		d := DoubleHold{Node: n.name, GPU: g}
		for _, h := range n.holdings {
			if slices.Contains(h.uuids, g) {
				d.Holders = append(d.Holders, GPUHolder{PodUID: h.uid, Pod: h.pod, Reserved: h.reserved})
			}
		}
		if len(d.Holders) < 2 {
			continue
		}
		slices.SortFunc(d.Holders, func(a, b GPUHolder) int {
			if c := strings.Compare(a.Pod.String(), b.Pod.String()); c != 0 {
				return c
			}
			return strings.Compare(string(a.PodUID), string(b.PodUID))
		})
		now = append(now, d)
	}
	before := make(map[string]bool, len(n.doubleHeld))
	for i := range n.doubleHeld {
		before[n.doubleHeld[i].key()] = true
	}
	after := make(map[string]bool, len(now))
	var added, cleared []DoubleHold
	for i := range now {
		k := now[i].key()
		after[k] = true
		if !before[k] {
			added = append(added, now[i])
		}
	}
	for i := range n.doubleHeld {
		if !after[n.doubleHeld[i].key()] {
			cleared = append(cleared, n.doubleHeld[i])
		}
	}
	n.doubleHeld = now
	if (len(added) > 0 || len(cleared) > 0) && l.onDoubleHeld != nil {
		l.onDoubleHeld(added, cleared)
	}
}

// DoubleHolds lists the GPUs that more than one pod holds now, sorted by
// node then GPU. Empty in a healthy cluster.
func (r Report) DoubleHolds() []DoubleHold {
	l := r.l
	l.mu.RLock()
	defer l.mu.RUnlock()
	var out []DoubleHold
	for _, n := range l.nodes {
		for _, d := range n.doubleHeld {
			d.Holders = slices.Clone(d.Holders)
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b DoubleHold) int {
		if c := strings.Compare(a.Node, b.Node); c != 0 {
			return c
		}
		return strings.Compare(a.GPU, b.GPU)
	})
	return out
}
