package placement

import (
	"encoding/binary"
	"sync"
	"unique"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
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
