package simulator

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
)

// newGangPolicy builds the named gang policy for cfg's cluster.
func newGangPolicy(name string, cfg GangConfig, fab *fabric) (GangPolicy, error) {
	t := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	if cfg.PolicyTable != nil {
		t = *cfg.PolicyTable
	}
	switch name {
	case GangGputopo, GangPerPod:
		return newGangGputopo(name, cfg.Nodes, cfg.Extender, t)
	case GangFirstFit:
		return gangFirstFit{}, nil
	case GangTAS:
		return &tasLike{fab: fab}, nil
	case GangOptimum:
		return &gangOptimum{fab: fab, table: t, alloc: allocator.New(1 << 14)}, nil
	}
	return nil, fmt.Errorf("gang policy %q: unknown; known gang policies are %v", name, GangPolicyNames)
}

// gangStateless is the Release and Drop of a gang policy that reads only
// the free GPUs.
type gangStateless struct{}

func (gangStateless) Release(Job, []Placement) error { return nil }
func (gangStateless) Drop(Job, []Placement) error    { return nil }

// gangFirstFit is a count-only gang scheduler (coscheduling with a plain
// device plugin): all of a job's pods or none, each on the first node in
// cluster order with job.GPUs free GPUs left, on its lowest free indices.
type gangFirstFit struct{ gangStateless }

func (gangFirstFit) Name() string { return GangFirstFit }

func (gangFirstFit) Place(job Job, have []Placement, free []topology.Mask) ([]Placement, error) {
	need := job.PodCount() - len(have)
	var out []Placement
	for i, f := range free {
		for f.Count() >= job.GPUs && len(out) < need {
			set := lowestK(f, job.GPUs)
			out = append(out, Placement{Node: i, GPUs: set})
			f = f.Minus(set)
		}
		if len(out) == need {
			return out, nil
		}
	}
	return nil, nil
}

// tasLike is a placer in the manner of Kueue's topology-aware scheduling
// (BestFit): all of a job's pods or none; at the tightest level (one node,
// then each fabric level, then the cluster) where some domain has room
// for every pod by GPU count, the domain with the fewest free GPUs; inside
// it, down the levels, the child domains with the most room first and
// the last pods in the smallest child that holds them; on a node, the
// lowest free indices (count only: it knows no links inside the node).
type tasLike struct {
	gangStateless
	fab *fabric
}

func (*tasLike) Name() string { return GangTAS }

func (p *tasLike) Place(job Job, have []Placement, free []topology.Mask) ([]Placement, error) {
	if job.Slices() > 0 {
		return p.placeSliced(job, have, free), nil
	}
	need := job.PodCount() - len(have)
	g := job.GPUs
	room := func(idx []int) (pods, gpus int) {
		for _, i := range idx {
			pods += free[i].Count() / g
			gpus += free[i].Count()
		}
		return pods, gpus
	}
	var idx []int
	for i, f := range free {
		if f.Count() >= g {
			idx = append(idx, i)
		}
	}
	for x := 0; x < p.fab.extLevels(); x++ {
		var best []int
		bestFree := -1
		for _, d := range p.fab.domainsAt(idx, x) {
			if pods, gpus := room(d); pods >= need && (bestFree < 0 || gpus < bestFree) {
				best, bestFree = d, gpus
			}
		}
		if best == nil {
			continue
		}
		var out []Placement
		p.assign(best, x, need, g, free, room, &out)
		return out, nil
	}
	return nil, nil
}

// assign puts need pods into domain d of extended level x (it has room).
func (p *tasLike) assign(d []int, x, need, g int, free []topology.Mask, room func([]int) (int, int), out *[]Placement) {
	if x == 0 {
		f := free[d[0]]
		for range need {
			set := lowestK(f, g)
			*out = append(*out, Placement{Node: d[0], GPUs: set})
			f = f.Minus(set)
		}
		return
	}
	kids := p.fab.domainsAt(d, x-1)
	pods := make([]int, len(kids))
	for i, k := range kids {
		pods[i], _ = room(k)
	}
	order := make([]int, len(kids))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return pods[order[a]] > pods[order[b]] })
	for len(order) > 0 && need > 0 {
		// The smallest child that holds the rest takes it; else the
		// largest takes what it can.
		last := -1
		for k := len(order) - 1; k >= 0; k-- {
			if pods[order[k]] >= need {
				last = k
				break
			}
		}
		if last >= 0 {
			p.assign(kids[order[last]], x-1, need, g, free, room, out)
			return
		}
		k := order[0]
		if pods[k] > 0 {
			p.assign(kids[k], x-1, pods[k], g, free, room, out)
			need -= pods[k]
		}
		order = order[1:]
	}
}

// gangOptimum is the greedy per-decision optimum of group bandwidth: for
// every domain at every level (one node, each fabric level, the cluster)
// the pods' sets are the allocator's best sets on its nodes (allocated one
// after another on each node, under the pods' requirement); the domain's
// candidate takes the sets with the highest ring bandwidth (the fullest
// nodes first among equals), and the candidate with the highest group
// bandwidth wins, then the one leaving the fewest free GPUs in the
// tightest domain it lies in (least fragmentation), then the one on the
// fewest nodes. It looks at one decision, not the trace.
type gangOptimum struct {
	gangStateless
	fab   *fabric
	table configv1alpha1.PolicyTable
	alloc *allocator.Allocator
}

func (*gangOptimum) Name() string { return GangOptimum }

// optSet is a node's k-th set for the job.
type optSet struct {
	node, k int
	set     topology.Mask
	gbps    int
}

func (o *gangOptimum) Place(job Job, have []Placement, free []topology.Mask) ([]Placement, error) {
	need := job.PodCount() - len(have)
	g := job.GPUs
	req := topology.Request{Count: g, Requirement: o.table.For(job.Parallelism).Requirement(int64(g))}
	sets := map[int][]optSet{}
	var idx []int
	for i, n := range o.fab.nodes {
		if free[i].Count() < g || n.Graph.Len() < g {
			continue
		}
		f := free[i]
		for k := 0; k < need; k++ {
			res, err := o.alloc.Allocate(n.Graph, f, req)
			var inf *topology.InfeasibleError
			if errors.As(err, &inf) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("optimum on node %s: %w", n.Name, err)
			}
			set := topology.MaskOf(res.GPUs...)
			sets[i] = append(sets[i], optSet{node: i, k: k, set: set, gbps: podGBps(n.Graph, set, res.Metrics)})
			f = f.Minus(set)
		}
		if len(sets[i]) > 0 {
			idx = append(idx, i)
		}
	}
	var best []Placement
	var bestKey [3]float64
	for x := 0; x < o.fab.extLevels(); x++ {
		for _, d := range o.fab.domainsAt(idx, x) {
			pl := o.pick(d, sets, need, free)
			if pl == nil {
				continue
			}
			key := o.judge(pl, free)
			if best == nil || better3(key, bestKey) {
				best, bestKey = pl, key
			}
		}
	}
	return best, nil
}

// pick chooses need sets among the nodes of d: the highest ring
// bandwidth that need sets reach (each node's sets taken in order), then
// the fullest nodes first. nil when d has fewer than need sets.
func (o *gangOptimum) pick(d []int, sets map[int][]optSet, need int, free []topology.Mask) []Placement {
	var rings []int
	total := 0
	for _, i := range d {
		total += len(sets[i])
		for _, s := range sets[i] {
			rings = append(rings, s.gbps)
		}
	}
	if total < need {
		return nil
	}
	sort.Sort(sort.Reverse(sort.IntSlice(rings)))
	prefix := func(i, r int) int {
		n := 0
		for _, s := range sets[i] {
			if s.gbps < r {
				break
			}
			n++
		}
		return n
	}
	var floor int
	for _, r := range rings {
		c := 0
		for _, i := range d {
			c += prefix(i, r)
		}
		if c >= need {
			floor = r
			break
		}
	}
	order := append([]int(nil), d...)
	sort.SliceStable(order, func(a, b int) bool { return free[order[a]].Count() < free[order[b]].Count() })
	var out []Placement
	for _, i := range order {
		for _, s := range sets[i][:prefix(i, floor)] {
			if len(out) == need {
				return out
			}
			out = append(out, Placement{Node: i, GPUs: s.set})
		}
	}
	if len(out) < need {
		return nil
	}
	return out
}

// judge is a candidate's key, higher better: group bandwidth, minus the
// free GPUs left in the tightest domain it lies in, minus the nodes it
// touches.
func (o *gangOptimum) judge(pl []Placement, free []topology.Mask) [3]float64 {
	s := o.fab.shape(pl)
	nodes := map[int]bool{}
	taken := 0
	for _, p := range pl {
		nodes[p.Node] = true
		taken += p.GPUs.Count()
	}
	var idx []int
	for i := range nodes {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	x := 0
	if len(idx) > 1 {
		x = o.fab.sharedLevel(idx) + 1
	}
	key := o.fab.extKey(idx[0], x)
	left := -taken
	for i := range o.fab.nodes {
		if o.fab.extKey(i, x) == key {
			left += free[i].Count()
		}
	}
	bw := s.GBps
	if math.IsInf(bw, 1) {
		bw = math.MaxFloat64
	}
	return [3]float64{bw, -float64(left), -float64(len(idx))}
}

func better3(a, b [3]float64) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return false
}

// extLevelOf is the extended level (extName) of fabric level name, the
// cluster's for "" or a name the fabric does not know.
func (f *fabric) extLevelOf(name string) int {
	for i, l := range f.levels {
		if l.Name == name {
			return i + 1
		}
	}
	return len(f.levels) + 1
}

// placeSliced places a sliced job as Kueue's topology-aware scheduling
// places a pod set with slices (podset-slice-size and
// podset-slice-required-topology beside the pod set's required
// topology): all or nothing; from the slice level out to the group's,
// at the first level where a domain's slice-level subdomains hold every
// slice (each subdomain as many whole slices as its room by GPU count
// allows), the domain with the fewest free GPUs; inside it, the slices go
// to the subdomains with the most room first, the last ones to the
// smallest that holds them, each slice's pods as tas-like places a group
// in that subdomain (count only).
func (p *tasLike) placeSliced(job Job, have []Placement, free []topology.Mask) []Placement {
	if len(have) > 0 {
		return nil
	}
	g, size, k := job.GPUs, job.SliceSize, job.Slices()
	fr := slices.Clone(free)
	room := func(idx []int) (pods, gpus int) {
		for _, i := range idx {
			pods += fr[i].Count() / g
			gpus += fr[i].Count()
		}
		return pods, gpus
	}
	sliceX, groupX := p.fab.extLevelOf(job.SliceLevel), p.fab.extLevelOf(job.GroupLevel)
	var idx []int
	for i, f := range fr {
		if f.Count() >= g {
			idx = append(idx, i)
		}
	}
	holds := func(sub []int) int {
		pods, _ := room(sub)
		return pods / size
	}
	for x := sliceX; x <= groupX; x++ {
		var best []int
		bestFree := -1
		for _, d := range p.fab.domainsAt(idx, x) {
			n := 0
			for _, sub := range p.fab.domainsAt(d, sliceX) {
				n += holds(sub)
			}
			if _, gpus := room(d); n >= k && (bestFree < 0 || gpus < bestFree) {
				best, bestFree = d, gpus
			}
		}
		if best == nil {
			continue
		}
		subs := p.fab.domainsAt(best, sliceX)
		var out []Placement
		for left := k; left > 0; left-- {
			// The smallest subdomain that holds the slices left, else
			// the one that holds the most.
			pick := -1
			for i, sub := range subs {
				h := holds(sub)
				if h >= left && (pick < 0 || h < holds(subs[pick])) {
					pick = i
				}
			}
			if pick < 0 {
				for i, sub := range subs {
					if pick < 0 || holds(sub) > holds(subs[pick]) {
						pick = i
					}
				}
			}
			var part []Placement
			p.assign(subs[pick], sliceX, size, g, fr, room, &part)
			for _, pl := range part {
				fr[pl.Node] = fr[pl.Node].Minus(pl.GPUs)
			}
			out = append(out, part...)
		}
		return out
	}
	return nil
}
