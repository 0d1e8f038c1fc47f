package demo

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/topology/allocator"
	topomachine "github.com/gputopo/gputopo/topology/machine"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// NodeSpec is one simulated node of the demo cluster.
type NodeSpec struct {
	Name string
	// Fixture is the node's machine: a built-in fixture name or the path
	// of a machine file (machine.Load).
	Fixture string
}

// DefaultCluster is the built-in mixed cluster: NVSwitch, hybrid cube-mesh
// and PCIe-only machines side by side.
var DefaultCluster = []NodeSpec{
	{Name: "dgx-a100-1", Fixture: "dgx-a100"},
	{Name: "dgx-a100-2", Fixture: "dgx-a100"},
	{Name: "dgx1-v100-1", Fixture: "dgx1-v100"},
	{Name: "dgx1-v100-2", Fixture: "dgx1-v100"},
	{Name: "pcie-l40s-1", Fixture: "pcie-8x"},
	{Name: "pcie-l40s-2", Fixture: "pcie-8x"},
}

// Workload is one step of the demo: a Job (Pods > 0 pods of GPUs each) or,
// with Bare, that many standalone pods.
type Workload struct {
	Name   string
	Intent v1alpha1.Parallelism // "" for none
	Pods   int
	GPUs   int
	Bare   bool
	// Machine, when set, pins the pods to nodes of that machine (its name),
	// as a team pins work to its own pool of machines.
	Machine string
	// Priority is the pods' PriorityClass: PriorityBatch, PriorityServing
	// or "" (none: priority 0).
	Priority string
	// Fill makes Pods the number of GPUs still free when the workload is
	// submitted (GPUs must be 1): the cluster is then full, and what comes
	// next must preempt.
	Fill bool
	// Shows is what the workload demonstrates, as the report says it.
	Shows string
}

// The demo's PriorityClasses: preemptible batch below the default 0, and
// serving above it.
const (
	PriorityBatch   = "demo-batch"
	PriorityServing = "demo-serving"
)

// priorityValues are the demo's PriorityClasses' values.
var priorityValues = map[string]int32{PriorityBatch: -100, PriorityServing: 1000}

// labelMachine is the node label the demo sets to the node's machine name.
const labelMachine = "demo.gputopo.io/machine"

// The demo's network, as NVIDIA's topology labels state a real one (the
// default fabric.levels read them, docs/groups.md): the nodes of one
// machine share a leaf switch, as a rack of one machine type does, and
// every leaf hangs off one spine. A group too large for one leaf is then
// placed across the spine, and its DOMAIN says so.
const (
	labelLeaf  = "network.topology.nvidia.com/leaf"
	labelSpine = "network.topology.nvidia.com/spine"
	demoSpine  = "spine-1"
)

// nodeLabels are the labels of a demo node of machine (its name).
func nodeLabels(machine string) map[string]string {
	return map[string]string{
		"nvidia.com/gpu.present": "true",
		labelMachine:             machine,
		labelLeaf:                "leaf-" + machine,
		labelSpine:               demoSpine,
	}
}

// ParseMachines reads --machines: "machine=count,..." where a machine is a
// built-in fixture name or a machine file, e.g. "mybox.yaml=2,dgx-a100=2".
// Nodes are named "<machine name>-<i>" from 1, as in DefaultCluster.
func ParseMachines(spec string) ([]NodeSpec, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, fmt.Errorf("--machines: empty; give machine=count pairs, e.g. mybox.yaml=2,dgx-a100=2")
	}
	var out []NodeSpec
	seen := map[string]string{}
	for _, part := range strings.Split(spec, ",") {
		machine, count, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("--machines: entry %q: want machine=count, e.g. mybox.yaml=2 or dgx-a100=2", part)
		}
		n, err := strconv.Atoi(count)
		if err != nil || n < 1 || n > 50 {
			return nil, fmt.Errorf("--machines: entry %q: count must be an integer 1..50 (every node runs its own agent)", part)
		}
		f, err := topomachine.Load(machine)
		if err != nil {
			return nil, fmt.Errorf("--machines: entry %q: %w", part, err)
		}
		if prev, dup := seen[f.Name]; dup {
			return nil, fmt.Errorf("--machines: entries %q and %q are both machine %q; node names would clash (sum the counts, or rename one machine file)", prev, machine, f.Name)
		}
		seen[f.Name] = machine
		for i := 1; i <= n; i++ {
			out = append(out, NodeSpec{Name: fmt.Sprintf("%s-%d", f.Name, i), Fixture: machine})
		}
	}
	return out, nil
}

// WorkloadsFor adapts DefaultWorkloads to a cluster. On DefaultCluster it
// returns them as they are. On any other cluster it plans them the way the
// system will place them, in the order they are then submitted:
// model-parallel jobs first (their NVLink needs are the constraint, and
// every node is still empty when they come), then the rest; each workload
// is pinned to the machine (by name) where the most of its pods fit with
// the webhook's default requirement for their intent and the allocator's
// own choice of GPUs among those still free. A job too large for every
// machine halves its GPUs per pod; a workload with no room left is
// dropped. The priority case comes last: the batch fill as it is, then
// the high-priority job, pinned where it fits best on the idle cluster
// (it preempts there). Pinning keeps the scheduler from spending a machine the plan
// saved for a later job.
func WorkloadsFor(cluster []NodeSpec) ([]Workload, error) {
	if slices.Equal(cluster, DefaultCluster) {
		return DefaultWorkloads, nil
	}
	type planNode struct {
		machine string
		g       *topology.Graph
		free    topology.Mask
	}
	var nodes []*planNode
	var machines []string
	largest := 0
	for _, s := range cluster {
		f, err := topomachine.Load(s.Fixture)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", s.Name, err)
		}
		g := f.Graph(s.Name)
		nodes = append(nodes, &planNode{machine: f.Name, g: g, free: g.All()})
		if !slices.Contains(machines, f.Name) {
			machines = append(machines, f.Name)
		}
		largest = max(largest, f.GPUs)
	}
	policy := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	alloc := allocator.New(0)
	// fit places up to pods pods of gpus GPUs on nodes of machine, first
	// fit, and returns how many fit and the GPUs they took per node.
	fit := func(machine string, intent v1alpha1.Parallelism, pods, gpus int) (int, map[*planNode]topology.Mask) {
		taken := map[*planNode]topology.Mask{}
		req := topology.Request{Count: gpus, Requirement: policy.For(intent).Requirement(int64(gpus))}
		placed := 0
		for placed < pods {
			ok := false
			for _, n := range nodes {
				if n.machine != machine {
					continue
				}
				res, err := alloc.Allocate(n.g, n.free.Minus(taken[n]), req)
				if err != nil {
					continue
				}
				taken[n] = taken[n].Union(topology.MaskOf(res.GPUs...))
				placed, ok = placed+1, true
				break
			}
			if !ok {
				break
			}
		}
		return placed, taken
	}
	planned := make([]*Workload, len(DefaultWorkloads))
	order := make([]int, 0, len(DefaultWorkloads))
	// The priority case comes last, in its own order: the batch fill, then
	// what preempts it.
	late := func(w Workload) bool { return w.Fill || w.Priority != "" }
	for i, w := range DefaultWorkloads {
		if w.Intent == v1alpha1.ParallelismModel && !late(w) {
			order = append(order, i)
		}
	}
	for i, w := range DefaultWorkloads {
		if w.Intent != v1alpha1.ParallelismModel && !late(w) {
			order = append(order, i)
		}
	}
	for i, w := range DefaultWorkloads {
		if late(w) {
			order = append(order, i)
		}
	}
	for _, i := range order {
		w := DefaultWorkloads[i]
		if w.Fill {
			planned[i] = &w
			continue
		}
		if w.Priority != "" {
			// It preempts: planned on the idle cluster, where the GPUs it
			// frees are.
			for _, n := range nodes {
				n.free = n.g.All()
			}
		}
		for gpus := min(w.GPUs, largest); gpus >= 1 && planned[i] == nil; gpus /= 2 {
			best, bestPods := "", 0
			var bestTaken map[*planNode]topology.Mask
			for _, m := range machines {
				if pods, taken := fit(m, w.Intent, w.Pods, gpus); pods > bestPods {
					best, bestPods, bestTaken = m, pods, taken
				}
			}
			if bestPods == 0 {
				continue
			}
			for n, m := range bestTaken {
				n.free = n.free.Minus(m)
			}
			w.Machine, w.Pods, w.GPUs = best, bestPods, gpus
			planned[i] = &w
		}
	}
	var out []Workload
	for _, i := range order {
		if planned[i] != nil {
			out = append(out, *planned[i])
		}
	}
	return out, nil
}

// DefaultWorkloads fill the cluster: model-parallel jobs that need NVLink,
// a data-parallel job, single-GPU notebooks that must not break up NVLink
// islands, preemptible batch work on every GPU left, and then a
// high-priority model-parallel job that must preempt some of it.
var DefaultWorkloads = []Workload{
	{Name: "llm-pretrain", Intent: v1alpha1.ParallelismModel, Pods: 1, GPUs: 8,
		Shows: "an 8-GPU model-parallel pod gets a whole NVSwitch node"},
	{Name: "notebook", Pods: 2, GPUs: 1, Bare: true, Machine: "dgx1-v100",
		Shows: "single-GPU notebooks leave NVLink-connected GPUs whole for later jobs"},
	{Name: "resnet", Intent: v1alpha1.ParallelismData, Pods: 2, GPUs: 2, Machine: "pcie-8x",
		Shows: "a data-parallel job's pods share a PCIe switch, on one node"},
	{Name: "llm-finetune", Intent: v1alpha1.ParallelismModel, Pods: 3, GPUs: 4,
		Shows: "a 3-pod model-parallel group is placed whole, on NVLink quads under one leaf switch"},
	{Name: "batch", Pods: 1, GPUs: 1, Bare: true, Fill: true, Priority: PriorityBatch,
		Shows: "preemptible batch work takes every GPU left: the cluster is full"},
	{Name: "llm-serve", Intent: v1alpha1.ParallelismModel, Pods: 1, GPUs: 4, Priority: PriorityServing,
		Shows: "a high-priority 4-GPU model-parallel pod preempts batch pods that free NVLink-connected GPUs"},
}
