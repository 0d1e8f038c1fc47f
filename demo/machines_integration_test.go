//go:build integration

package demo

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology/machine"
)

// `gputopo demo --machines` on machines imported from real
// `nvidia-smi topo -m` outputs, on the real control plane: the node agents
// publish the imported shapes (explicit PCIe levels, NUMA nodes) through
// the simulated NVML, and the scheduler, webhook and extender place every
// workload on them.
func TestDemoRunsOnImportedMachines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cluster, err := ParseMachines(importedA30 + "=2," + importedV100 + "=1")
	if err != nil {
		t.Fatal(err)
	}
	workloads, err := WorkloadsFor(cluster)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	checked := false
	err = Run(ctx, Options{OutDir: t.TempDir(), Out: &out, Cluster: cluster, AfterPlacement: func(ctx context.Context, r Result) error {
		checked = true
		return checkPublishedMachines(ctx, r.Kubeconfig, cluster)
	}})
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log(text)
	if !checked {
		t.Error("the published topologies were not checked")
	}
	for _, w := range workloads {
		if !strings.Contains(text, "\n"+w.Name+" ") {
			t.Errorf("the table has no row for %s", w.Name)
		}
	}
	for _, node := range []string{"a30-nvlink-pairs-1", "a30-nvlink-pairs-2", "dgx1-v100-1"} {
		if !strings.Contains(text, node) {
			t.Errorf("the report never names node %s", node)
		}
	}
}

// checkPublishedMachines compares each node's NodeGPUTopology with the
// machine file it was built from.
func checkPublishedMachines(ctx context.Context, kubeconfig string, cluster []NodeSpec) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	for _, s := range cluster {
		f, err := machine.Load(s.Fixture)
		if err != nil {
			return err
		}
		var obj v1alpha1.NodeGPUTopology
		if err := c.Get(ctx, client.ObjectKey{Name: s.Name}, &obj); err != nil {
			return fmt.Errorf("node %s: %w", s.Name, err)
		}
		if want := f.Graph(s.Name).Hash(); obj.Status.TopologyHash != want {
			return fmt.Errorf("node %s published topology %s; the machine file's is %s", s.Name, obj.Status.TopologyHash, want)
		}
		for i, gpu := range obj.Status.GPUs {
			if gpu.NUMANode != f.NUMANode(i) {
				return fmt.Errorf("node %s GPU %d published NUMA node %d; the machine file says %d", s.Name, i, gpu.NUMANode, f.NUMANode(i))
			}
		}
	}
	return nil
}
