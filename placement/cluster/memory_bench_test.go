package cluster

import (
	"fmt"
	"runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
)

// BenchmarkMemoryPerNode is what one GPU node costs the decision core in
// live heap: its NodeGPUTopology as the informer cache keeps it (decoded
// from JSON, then stripped) and its Node (with leaf and spine labels), fed
// to the ledger, for 2,000 DGX A100 nodes, after one telemetry round (each
// topology written again, as its agent does). It reports bytes per node
// (the scheduler benchmark's peak RSS grows with this, and with the heap's
// headroom).
func BenchmarkMemoryPerNode(b *testing.B) {
	const nodes = 2000
	t := &testing.T{}
	for b.Loop() {
		strip := stripTopology()
		before := liveHeap()
		x, err := placement.New(placement.Options{})
		if err != nil {
			b.Fatal(err)
		}
		var keep []any
		topos := make([]*v1alpha1.NodeGPUTopology, nodes)
		// publish is the node agent's write as the cache keeps it: a new
		// object each time, round telling the telemetry apart.
		publish := func(i, round int) *v1alpha1.NodeGPUTopology {
			d := decoded(t, "dgx-a100", fmt.Sprintf("node-%05d", i))
			d.Status.Stale, d.Status.StaleReason = false, "" // a node in use
			d.Status.Telemetry[0].UtilizationPercent = int32(round)
			o, err := strip(d)
			if err != nil {
				b.Fatal(err)
			}
			topos[i] = o.(*v1alpha1.NodeGPUTopology)
			return topos[i]
		}
		for i := range nodes {
			name := fmt.Sprintf("node-%05d", i)
			topo := publish(i, 0)
			gpus := corev1.ResourceList{v1alpha1.ResourceGPU: *resource.NewQuantity(8, resource.DecimalSI)}
			labels := map[string]string{"kubernetes.io/hostname": name, // leaves of 8 nodes, spines of 16 leaves
				"network.topology.nvidia.com/leaf": fmt.Sprintf("leaf-%d", i/8), "network.topology.nvidia.com/spine": fmt.Sprintf("spine-%d", i/128)}
			n, _ := stripNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
				Status: corev1.NodeStatus{Capacity: gpus, Allocatable: gpus}})
			x.Feed().UpsertNode(n.(*corev1.Node))
			x.Feed().UpsertTopology(topo)
			keep = append(keep, n)
		}
		// A telemetry round: every agent writes its status again, the
		// cache replaces each object.
		for i := range nodes {
			x.Feed().UpsertTopology(publish(i, 1))
		}
		after := liveHeap()
		b.ReportMetric(float64(after-before)/nodes, "B/node")
		runtime.KeepAlive(x)
		runtime.KeepAlive(keep)
		runtime.KeepAlive(topos)
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
