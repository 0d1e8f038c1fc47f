package kubectlplugin

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/topology"
)

// NodeSummary is one line of `kubectl gputopo nodes`.
type NodeSummary struct {
	Name string `json:"name"`
	// Machine is "<count>x <GPU model>, <interconnect>" (NVSwitch, NVLink
	// or PCIe).
	Machine string `json:"machine,omitempty"`
	// GPUs is the count in the NodeGPUTopology (0 without a valid one:
	// see Status).
	GPUs int `json:"gpus"`
	// Advertised is what the Node advertises: its allocatable of the GPU
	// resource, as kubelet reports it from the device plugin.
	Advertised int `json:"advertised"`
	// Free GPUs: healthy and held by no live pod.
	Free int `json:"free"`
	// LargestFreeNVLinkIsland is the largest set of free GPUs that are all
	// NVLinked to each other.
	LargestFreeNVLinkIsland int `json:"largestFreeNVLinkIsland"`
	Unhealthy               int `json:"unhealthy"`
	// Drift counts pods whose allocated-gpus (truth) differ from their
	// assigned-gpus (plan).
	Drift int `json:"drift"`
	// Status is fresh, stale, invalid, untrusted (its GPU counts disagree
	// with its Node's) or no-topology (the Node advertises
	// the GPU resource but has no NodeGPUTopology: Free, GPUs and the
	// island are unknown); StaleReason says why for all but fresh.
	Status       string       `json:"status"`
	StaleReason  string       `json:"staleReason,omitempty"`
	ObservedTime *metav1.Time `json:"observedTime,omitempty"`
	// AgeSeconds is how long ago the topology was observed.
	AgeSeconds int64 `json:"ageSeconds,omitempty"`
	// Planned counts the GPUs the scheduler has planned for a group's
	// pods not bound yet (not counted in Free); Kept those it keeps for
	// groups that wait, free or not. HeldFor names each group and what
	// it has here ("ml/llm planned 8 since 2026-12-07T04:00:00Z").
	Planned int      `json:"planned,omitempty"`
	Kept    int      `json:"kept,omitempty"`
	HeldFor []string `json:"heldFor,omitempty"`
}

// holder is one pod's GPUs on a node.
type holder struct {
	pod  *corev1.Pod
	gpus []int // indices; empty when the pod records none yet
	// source is allocated-gpus (truth), assigned-gpus (plan) or
	// sourceClaims; claims are the pod's claims that ask for GPUs.
	source string
	drift  bool
	claims []string
}

// sourceClaims is a holder's source when its GPUs are its ResourceClaims'
// allocation.
const sourceClaims = "resourceclaims"

// nodeState is what the views know of one node.
type nodeState struct {
	name    string
	topo    *v1alpha1.NodeGPUTopology
	graph   *topology.Graph
	topoErr error
	holders []holder
	// owner maps a GPU index to the holders' index in holders.
	owner   map[int][]int
	unknown int // GPUs held by pods that record none
	// planned and kept name, per GPU index, the group the scheduler
	// plans it for or keeps it for, and since when.
	planned, kept map[int]string
	heldFor       []string
}

func (s *Snapshot) nodeState(name string) *nodeState {
	n := &nodeState{name: name, topo: s.topology(name), owner: map[int][]int{}}
	if n.topo != nil {
		n.graph, n.topoErr = topology.FromStatus(&n.topo.Status)
	}
	for i := range s.Pods {
		p := &s.Pods[i]
		if p.Spec.NodeName != name {
			continue
		}
		want := demand(p, s.resource())
		var claimed claimHold
		if want == 0 {
			claimed = s.claimsOf(p)
			want = claimed.asked
		}
		if want == 0 {
			continue
		}
		h := holder{pod: p, claims: claimed.claims}
		assigned := gpuList(p, v1alpha1.AnnotationAssignedGPUs)
		allocated := gpuList(p, v1alpha1.AnnotationAllocatedGPUs)
		uuids := assigned
		h.source = v1alpha1.AnnotationAssignedGPUs
		switch {
		case len(claimed.claims) > 0:
			// The claims' allocation is the truth for GPUs through DRA.
			uuids, h.source = claimed.gpus, sourceClaims
		case allocated != nil:
			uuids, h.source = allocated, v1alpha1.AnnotationAllocatedGPUs
			h.drift = assigned != nil && !slices.Equal(v1alpha1.SortedGPUList(assigned), v1alpha1.SortedGPUList(allocated))
		}
		if n.graph != nil {
			for _, u := range uuids {
				if idx, ok := n.graph.IndexOf(u); ok {
					h.gpus = append(h.gpus, idx)
				}
			}
		}
		if len(h.gpus) == 0 {
			n.unknown += want
		}
		for _, g := range h.gpus {
			n.owner[g] = append(n.owner[g], len(n.holders))
		}
		n.holders = append(n.holders, h)
	}
	s.plansOn(n)
	return n
}

// plansOn marks n's GPUs that the scheduler plans or keeps for groups.
func (s *Snapshot) plansOn(n *nodeState) {
	for _, gp := range s.Plans {
		into, what := &n.kept, "kept"
		if gp.Spec.State == v1alpha1.GroupPlanned {
			into, what = &n.planned, "planned"
		}
		group := gp.Namespace + "/" + gp.Name
		label := group + " since " + gp.Spec.Since.UTC().Format(time.RFC3339)
		count := 0
		for _, sl := range gp.Spec.Slots {
			if sl.Node != n.name {
				continue
			}
			for _, i := range sl.GPUs {
				if *into == nil {
					*into = map[int]string{}
				}
				(*into)[i] = label
				count++
			}
		}
		if count > 0 {
			n.heldFor = append(n.heldFor, fmt.Sprintf("%s %s %d since %s", group, what, count, gp.Spec.Since.UTC().Format(time.RFC3339)))
		}
	}
}

func gpuList(p *corev1.Pod, key string) []string {
	v, ok := p.Annotations[key]
	if !ok {
		return nil
	}
	l, err := v1alpha1.ParseGPUList(key, v)
	if err != nil {
		return nil
	}
	return l
}

// free is the healthy GPUs no pod holds.
func (n *nodeState) free() topology.Mask {
	if n.graph == nil {
		return topology.Mask{}
	}
	m := n.graph.Healthy()
	for g := range n.owner {
		m = m.Minus(topology.MaskOf(g))
	}
	return m
}

func (n *nodeState) drift() int {
	d := 0
	for _, h := range n.holders {
		if h.drift {
			d++
		}
	}
	return d
}

// machine describes the node's GPUs: "8x NVIDIA A100-SXM4-40GB, NVSwitch".
func machine(g *topology.Graph) string {
	gpus := g.GPUs()
	if len(gpus) == 0 {
		return ""
	}
	link := "PCIe"
	for a := 0; a < g.Len(); a++ {
		for b := a + 1; b < g.Len(); b++ {
			l := g.Link(a, b)
			switch {
			case l.NVSwitch:
				link = "NVSwitch"
			case l.NVLinks > 0 && link == "PCIe":
				link = "NVLink"
			}
		}
	}
	return fmt.Sprintf("%dx %s, %s", len(gpus), gpus[0].Model, link)
}

// Nodes summarises every GPU node.
func (s *Snapshot) NodeSummaries() []NodeSummary {
	names := s.gpuNodeNames()
	out := make([]NodeSummary, 0, len(names))
	for _, name := range names {
		out = append(out, s.summary(s.nodeState(name)))
	}
	return out
}

// Node statuses, as summary sets them.
const (
	StatusFresh      = "fresh"
	StatusStale      = "stale"
	StatusInvalid    = "invalid"
	StatusNoTopology = "no-topology"
	// StatusUntrusted: the topology disagrees with its Node's GPU counts
	// (capacity, allocatable), so the extender places no pod there.
	StatusUntrusted = "untrusted"
)

func (s *Snapshot) summary(n *nodeState) NodeSummary {
	sum := NodeSummary{Name: n.name, Drift: n.drift()}
	capacity, allocatable := -1, -1
	if node := s.node(n.name); node != nil {
		if q, ok := node.Status.Allocatable[s.resource()]; ok {
			sum.Advertised = int(q.Value())
			allocatable = sum.Advertised
		}
		if q, ok := node.Status.Capacity[s.resource()]; ok {
			capacity = int(q.Value())
		}
	}
	switch {
	case n.topo == nil:
		sum.Status, sum.StaleReason = StatusNoTopology, "the gputopo node agent has not published its GPUs"
		return sum
	case n.graph == nil:
		sum.Status, sum.StaleReason = StatusInvalid, n.topoErr.Error()
		return sum
	}
	st := &n.topo.Status
	sum.Machine = machine(n.graph)
	sum.GPUs = n.graph.Len()
	free := n.free()
	for i := range n.planned {
		free = free.Minus(topology.MaskOf(i))
	}
	sum.Free = max(free.Count()-n.unknown, 0)
	sum.Planned, sum.Kept, sum.HeldFor = len(n.planned), len(n.kept), n.heldFor
	sum.LargestFreeNVLinkIsland = n.graph.Metrics(topology.Mask{}, free).LeftLargestIsland
	sum.Unhealthy = n.graph.All().Minus(n.graph.Healthy()).Count()
	sum.Status = StatusFresh
	if !st.ObservedTime.IsZero() {
		t := st.ObservedTime
		sum.ObservedTime = &t
		sum.AgeSeconds = int64(s.Now.Sub(t.Time) / time.Second)
	}
	maxAge := s.maxAge()
	switch {
	case st.Stale:
		sum.Status, sum.StaleReason = StatusStale, st.StaleReason
	case st.ObservedTime.IsZero():
		sum.Status, sum.StaleReason = StatusStale, "no observedTime: the node agent has not published a topology read"
	case maxAge > 0 && s.Now.Sub(st.ObservedTime.Time) > maxAge:
		sum.Status, sum.StaleReason = StatusStale, fmt.Sprintf("not refreshed for more than %s (topologyMaxAge)", maxAge)
	default:
		// The extender's own rule: a topology its Node's GPU counts
		// contradict is not trusted.
		if why := placement.CountDistrust(n.graph, capacity, allocatable, s.resource()); why != "" {
			sum.Status, sum.StaleReason = StatusUntrusted, why
		}
	}
	return sum
}

// maxAge is the extender's topologyMaxAge in force (0: off).
func (s *Snapshot) maxAge() time.Duration {
	if s.Config.TopologyMaxAge == nil || s.Config.TopologyMaxAge.Duration < 0 {
		return 0
	}
	return s.Config.TopologyMaxAge.Duration
}

// GPUView is one GPU of `kubectl gputopo node NAME`.
type GPUView struct {
	Index        int    `json:"index"`
	UUID         string `json:"uuid"`
	Model        string `json:"model,omitempty"`
	NUMANode     int    `json:"numaNode"`
	PCIBusID     string `json:"pciBusID,omitempty"`
	Health       string `json:"health"`
	HealthReason string `json:"healthReason,omitempty"`
	// PCIeGroup numbers the GPUs that share a PCIe switch (from 0, in
	// index order).
	PCIeGroup int `json:"pcieGroup"`
	// Holders are the pods holding the GPU (more than one is a conflict).
	Holders []string `json:"holders,omitempty"`
	// PlannedFor names the group the scheduler plans the GPU for, and
	// since when; KeptFor the waiting group it keeps the GPU for.
	PlannedFor string `json:"plannedFor,omitempty"`
	KeptFor    string `json:"keptFor,omitempty"`
}

// LinkView is one GPU pair.
type LinkView struct {
	A             int    `json:"a"`
	B             int    `json:"b"`
	Tier          string `json:"tier"`
	NVLinks       int    `json:"nvlinks,omitempty"`
	NVSwitch      bool   `json:"nvswitch,omitempty"`
	PCIe          string `json:"pcie"`
	BandwidthGBps int    `json:"bandwidthGBps"`
}

// NodeDetail is `kubectl gputopo node NAME`.
type NodeDetail struct {
	NodeSummary
	DriverVersion string     `json:"driverVersion,omitempty"`
	GPUList       []GPUView  `json:"gpuList"`
	Links         []LinkView `json:"links"`
	Pods          []PodRow   `json:"pods,omitempty"`
}

// NodeDetail describes one node; an error names a node gputopo does not
// know.
func (s *Snapshot) NodeDetail(name string) (*NodeDetail, error) {
	n := s.nodeState(name)
	if n.topo == nil {
		if s.node(name) == nil {
			return nil, fmt.Errorf("node %q not found", name)
		}
		return nil, fmt.Errorf("node %s has no NodeGPUTopology: the gputopo node agent has not published its GPUs (is it running there?)", name)
	}
	if n.graph == nil {
		return nil, fmt.Errorf("node %s: NodeGPUTopology is invalid: %w", name, n.topoErr)
	}
	d := &NodeDetail{NodeSummary: s.summary(n), DriverVersion: n.topo.Status.DriverVersion}
	groups := pcieGroups(n.graph)
	for _, g := range n.graph.GPUs() {
		v := GPUView{Index: g.Index, UUID: g.UUID, Model: g.Model, NUMANode: g.NUMANode, PCIBusID: g.PCIBusID,
			Health: string(g.Health), HealthReason: g.HealthReason, PCIeGroup: groups[g.Index],
			PlannedFor: n.planned[g.Index], KeptFor: n.kept[g.Index]}
		for _, hi := range n.owner[g.Index] {
			h := n.holders[hi]
			holder := h.pod.Namespace + "/" + h.pod.Name
			if len(h.claims) > 0 {
				holder += " (claim " + strings.Join(h.claims, ", ") + ")"
			}
			v.Holders = append(v.Holders, holder)
		}
		d.GPUList = append(d.GPUList, v)
	}
	for a := 0; a < n.graph.Len(); a++ {
		for b := a + 1; b < n.graph.Len(); b++ {
			l := n.graph.Link(a, b)
			d.Links = append(d.Links, LinkView{A: a, B: b, Tier: string(pairTier(n.graph, a, b)), NVLinks: l.NVLinks, NVSwitch: l.NVSwitch,
				PCIe: string(l.PCIe), BandwidthGBps: n.graph.Bandwidth(a, b)})
		}
	}
	for _, r := range s.PodRows() {
		if r.Node == name {
			d.Pods = append(d.Pods, r)
		}
	}
	return d, nil
}

// pairTier is the link tier between two GPUs, as placements report it.
func pairTier(g *topology.Graph, a, b int) v1alpha1.LinkTier {
	return g.Metrics(topology.MaskOf(a, b), topology.Mask{}).Tier
}

// pcieGroups numbers the GPUs by PCIe switch: GPUs whose link is Internal
// or SameSwitch share a group.
func pcieGroups(g *topology.Graph) map[int]int {
	out := map[int]int{}
	next := 0
	for a := 0; a < g.Len(); a++ {
		if _, ok := out[a]; ok {
			continue
		}
		out[a] = next
		for b := a + 1; b < g.Len(); b++ {
			if _, ok := out[b]; ok {
				continue
			}
			if l := g.Link(a, b).PCIe; l == v1alpha1.PCIeSameSwitch || l == v1alpha1.PCIeInternal {
				out[b] = next
			}
		}
		next++
	}
	return out
}

// PodRow is one line of `kubectl gputopo pods`.
type PodRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	// Intent is the parallelism annotation (model, data or empty).
	Intent string `json:"intent,omitempty"`
	// Requirement is the gpu-topology-requirement annotation.
	Requirement string `json:"requirement,omitempty"`
	Requested   int    `json:"requested"`
	Node        string `json:"node,omitempty"`
	// GPUs are the indices the pod holds (truth when recorded, else plan).
	GPUs              []int  `json:"gpus,omitempty"`
	Tier              string `json:"tier,omitempty"`
	RingBandwidthGBps int    `json:"ringBandwidthGBps,omitempty"`
	// Drift is true when allocated-gpus differ from assigned-gpus.
	Drift bool `json:"drift,omitempty"`
	// Claims are the pod's ResourceClaims (namespace/name) that ask for
	// its GPUs, when it asks through DRA; GPUs are then their allocation.
	Claims []string `json:"claims,omitempty"`
	// Group is the pod's group (namespace/name) when it is placed with
	// others (docs/groups.md): the placement record's for a bound pod,
	// else its annotations' (or its Kubernetes PodGroup's); "invalid"
	// when its group annotations do not parse. Domain is the fabric
	// domain the record says the whole group was placed in; empty while
	// the pod is not bound.
	Group  string `json:"group,omitempty"`
	Domain string `json:"domain,omitempty"`
	// Slice and SliceDomain are the pod's slice of a sliced group and the
	// domain the slice was placed in (SliceDomain "" for none).
	Slice       int    `json:"slice,omitempty"`
	SliceDomain string `json:"sliceDomain,omitempty"`
}

// domainCell is the DOMAIN cell of a pod row: the slice and its domain
// for a pod of a sliced group, else the group's domain.
func (r PodRow) domainCell() string {
	if r.SliceDomain != "" {
		return fmt.Sprintf("slice %d: %s", r.Slice, r.SliceDomain)
	}
	return dash(r.Domain)
}

// groupInvalid is the GROUP cell of a pod whose group annotations do not
// parse (the scheduler keeps it Pending with the message).
const groupInvalid = "invalid"

// podGroup is the group a pod's annotations (or PodGroup) put it in: ""
// for none, and for a group of one pod, which is placed as an ordinary
// pod.
func podGroup(p *corev1.Pod, resource corev1.ResourceName) string {
	info := placement.NewPodInfo(p, resource)
	switch {
	case info.GroupErr != nil:
		return groupInvalid
	case info.Group == "" || !info.GroupNative && info.GroupSpec.Size < 2:
		return ""
	}
	return info.Group
}

// PodRows lists the GPU pods, bound ones by node and first GPU, then
// Pending ones by name.
func (s *Snapshot) PodRows() []PodRow {
	states := map[string]*nodeState{}
	var out []PodRow
	for i := range s.Pods {
		p := &s.Pods[i]
		want := demand(p, s.resource())
		var claimed claimHold
		if want == 0 {
			claimed = s.claimsOf(p)
			want = claimed.asked
		}
		if want == 0 {
			continue
		}
		r := PodRow{Claims: claimed.claims, Namespace: p.Namespace, Name: p.Name, Phase: string(p.Status.Phase), Requested: want, Node: p.Spec.NodeName,
			Intent: p.Annotations[v1alpha1.AnnotationParallelism], Requirement: p.Annotations[v1alpha1.AnnotationRequirement]}
		if r.Phase == "" {
			r.Phase = string(corev1.PodPending)
		}
		r.Group = podGroup(p, s.resource())
		if pl, err := v1alpha1.ParsePlacement(p.Annotations[v1alpha1.AnnotationPlacement]); err == nil {
			r.Tier, r.RingBandwidthGBps = string(pl.Tier), pl.RingBandwidthGBps
			if pl.Group != "" {
				r.Group, r.Domain = pl.Group, pl.Domain
				r.Slice, r.SliceDomain = pl.Slice, pl.SliceDomain
			}
		}
		if r.Node != "" {
			n := states[r.Node]
			if n == nil {
				n = s.nodeState(r.Node)
				states[r.Node] = n
			}
			for _, h := range n.holders {
				if h.pod == p {
					r.GPUs, r.Drift = slices.Clone(h.gpus), h.drift
					slices.Sort(r.GPUs)
					if (h.drift || len(h.claims) > 0) && n.graph != nil && len(h.gpus) > 0 {
						// The placement describes the plan (none for a
						// claim pod bound in extender mode); describe the
						// truth.
						m := n.graph.Metrics(topology.MaskOf(h.gpus...), topology.Mask{})
						r.Tier, r.RingBandwidthGBps = string(m.Tier), m.RingGBps
					}
				}
			}
		}
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.Node == "") != (b.Node == "") {
			return a.Node != ""
		}
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		if fa, fb := first(a.GPUs), first(b.GPUs); fa != fb {
			return fa < fb
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	return out
}

func first(s []int) int {
	if len(s) == 0 {
		return 1 << 30
	}
	return s[0]
}
