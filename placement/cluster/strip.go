package cluster

import (
	"encoding/binary"
	"slices"
	"sync"
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// maxLinkTables bounds the link tables stripTopology shares: a fleet has a
// handful of machine shapes; past the bound (a hostile or very mixed fleet)
// each object keeps its own table, as without sharing.
const maxLinkTables = 1024

// linkTables holds one copy of each distinct link table the cache has
// seen, keyed by its encoding. Cached objects are read-only, so the nodes
// of one machine shape can all point at one table.
type linkTables struct {
	mu     sync.Mutex
	tables map[string][]v1alpha1.Link
	buf    []byte
}

func (t *linkTables) share(links []v1alpha1.Link) []v1alpha1.Link {
	if len(links) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b := t.buf[:0]
	for _, l := range links {
		b = binary.AppendVarint(b, int64(l.A))
		b = binary.AppendVarint(b, int64(l.B))
		b = binary.AppendVarint(b, int64(l.NVLinks))
		b = binary.AppendVarint(b, int64(l.BandwidthGBps))
		var f byte
		if l.NVSwitch {
			f |= 1
		}
		if l.P2P {
			f |= 2
		}
		b = append(b, f)
		b = binary.AppendUvarint(b, uint64(len(l.PCIe)))
		b = append(b, l.PCIe...)
	}
	t.buf = b
	if s, ok := t.tables[string(b)]; ok {
		return s
	}
	own := make([]v1alpha1.Link, len(links))
	for i, l := range links {
		l.PCIe = v1alpha1.PCIeLevel(intern(string(l.PCIe)))
		own[i] = l
	}
	if len(t.tables) < maxLinkTables {
		if t.tables == nil {
			t.tables = make(map[string][]v1alpha1.Link)
		}
		t.tables[string(b)] = own
	}
	return own
}

// intern returns the one copy of s: the strings many GPUs repeat (model,
// PCI bus ID, health, fabric clique) are then held once.
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// stripTopology returns the NodeGPUTopology cache's transform, with its
// own shared link tables.
func stripTopology() func(obj any) (any, error) {
	t := &linkTables{}
	return func(obj any) (any, error) { return t.strip(obj) }
}

// strip keeps what the ledger reads of a NodeGPUTopology (its name and the
// status's GPUs, links, telemetry, times and staleness), with the link
// table and repeated strings shared between objects: a cache of thousands
// of nodes of a few machine shapes then holds each node's UUIDs and
// telemetry, and each shape's links once.
func (t *linkTables) strip(obj any) (any, error) {
	o, ok := obj.(*v1alpha1.NodeGPUTopology)
	if !ok {
		return obj, nil
	}
	st := &o.Status
	out := &v1alpha1.NodeGPUTopology{
		TypeMeta:   o.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: o.Name, UID: o.UID, ResourceVersion: o.ResourceVersion},
		Status: v1alpha1.NodeGPUTopologyStatus{
			Links:        t.share(st.Links),
			Telemetry:    st.Telemetry,
			ObservedTime: st.ObservedTime, TelemetryTime: st.TelemetryTime,
			Stale: st.Stale, StaleReason: st.StaleReason,
		},
	}
	if len(st.GPUs) > 0 {
		out.Status.GPUs = make([]v1alpha1.GPU, len(st.GPUs))
		for i, g := range st.GPUs {
			g.Model, g.PCIBusID, g.FabricClique = intern(g.Model), intern(g.PCIBusID), intern(g.FabricClique)
			g.Health, g.HealthReason = v1alpha1.GPUHealth(intern(string(g.Health))), intern(g.HealthReason)
			out.Status.GPUs[i] = g
		}
	}
	for i := range out.Status.Telemetry {
		for j, r := range out.Status.Telemetry[i].ThrottleReasons {
			out.Status.Telemetry[i].ThrottleReasons[j] = intern(r)
		}
	}
	return out, nil
}

// StripPod keeps only what the ledger reads, so that a cluster's pods cost
// little memory. Of the containers it keeps those that ask for resource
// (the managed GPU resource), with what v1alpha1.PodGPUDemand reads:
// resources and restartPolicy (a sidecar's devices add up, a one-shot init
// container's do not). Containers without the resource add nothing to the
// demand.
func StripPod(resource corev1.ResourceName) toolscache.TransformFunc {
	return func(obj any) (any, error) { return stripPodOf(obj, resource) }
}

// keptAnnotations are the annotations the stripped pod cache keeps: what
// the ledger reads (ledger.NewPodInfo), a group pod's rank (its slice)
// included.
var keptAnnotations = slices.Concat([]string{v1alpha1.AnnotationRequirement, v1alpha1.AnnotationAssignedGPUs,
	v1alpha1.AnnotationPlacement, v1alpha1.AnnotationAllocatedGPUs}, v1alpha1.GroupAnnotations, ledger.IndexKeys)

func stripPodOf(obj any, resource corev1.ResourceName) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp,
			// Bind counts a requirement's fallbackAfter from it.
			CreationTimestamp: p.CreationTimestamp,
		},
		// Bind checks the node constraints kube-scheduler checked.
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, SchedulerName: p.Spec.SchedulerName,
			NodeSelector: p.Spec.NodeSelector, Tolerations: p.Spec.Tolerations,
			// The pod's Kubernetes PodGroup (groups).
			SchedulingGroup: p.Spec.SchedulingGroup,
			// Preemption orders victims by priority and start.
			Priority: p.Spec.Priority, ActiveDeadlineSeconds: p.Spec.ActiveDeadlineSeconds,
			// GPUs asked through ResourceClaims (docs/dra.md).
			ResourceClaims: p.Spec.ResourceClaims},
		// A group's pods plan on the nodes preemption nominated them to.
		Status: corev1.PodStatus{Phase: p.Status.Phase, StartTime: p.Status.StartTime, NominatedNodeName: p.Status.NominatedNodeName,
			ResourceClaimStatuses: p.Status.ResourceClaimStatuses},
	}
	// A preemption victim's GPUs are remembered for the pod that
	// preempted it (ledger.PodInfo.Preempted).
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget {
			out.Status.Conditions = append(out.Status.Conditions, corev1.PodCondition{Type: c.Type, Status: c.Status, Reason: c.Reason})
		}
	}
	// The job, and a group pod's rank where a label carries it.
	for _, k := range append([]string{v1alpha1.LabelJob}, ledger.IndexKeys...) {
		if v, ok := p.Labels[k]; ok {
			if out.Labels == nil {
				out.Labels = map[string]string{}
			}
			out.Labels[k] = v
		}
	}
	for _, k := range keptAnnotations {
		if v, ok := p.Annotations[k]; ok {
			if out.Annotations == nil {
				out.Annotations = make(map[string]string, len(keptAnnotations))
			}
			out.Annotations[k] = v
		}
	}
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		out.Spec.Affinity = &corev1.Affinity{NodeAffinity: a.NodeAffinity}
	}
	strip := func(cs []corev1.Container) []corev1.Container {
		var res []corev1.Container
		for _, c := range cs {
			_, l := c.Resources.Limits[resource]
			_, r := c.Resources.Requests[resource]
			if l || r {
				res = append(res, corev1.Container{Name: c.Name, Resources: c.Resources, RestartPolicy: c.RestartPolicy})
			}
		}
		return res
	}
	out.Spec.Containers = strip(p.Spec.Containers)
	out.Spec.InitContainers = strip(p.Spec.InitContainers)
	if len(out.Spec.Containers)+len(out.Spec.InitContainers) > 0 {
		// A GPU pod's labels: the PodDisruptionBudgets that select it,
		// which the extender's preemption counts (Runtime.Protected).
		out.Labels = p.Labels
	}
	return out, nil
}

func stripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		TypeMeta: n.TypeMeta,
		// Labels and taints: bind checks the pod's node constraints.
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels},
		Spec:       corev1.NodeSpec{Taints: n.Spec.Taints},
		// Capacity and allocatable: the GPU counts a topology is checked
		// against.
		Status: corev1.NodeStatus{Capacity: n.Status.Capacity, Allocatable: n.Status.Allocatable},
	}, nil
}
