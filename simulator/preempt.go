package simulator

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"slices"
	"time"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/topology"
	"github.com/gputopo/gputopo/topology/allocator"
)

// Preemption modes (Config.Preemption).
const (
	// PreemptTopology is gputopo's: on each node, the running jobs of
	// lower priority are taken off and given back most important first
	// (higher priority, then earlier start) while the job's requirement
	// still fits the node's free GPUs, as kube-scheduler's victim search
	// runs with gputopo's filter (plugin build, extender preempt verb).
	PreemptTopology = "topology"
	// PreemptCount is kube-scheduler's without gputopo's filter: the
	// same search, judging only the count of free GPUs; the job is then
	// placed by the policy on whatever the victims freed, or waits.
	PreemptCount = "count"
)

// PreemptionModes are the modes the preemption suite compares.
var PreemptionModes = []string{PreemptCount, PreemptTopology}

// preempt evicts, for job j that fits nowhere at t, the running jobs of
// lower priority on the one node kube-scheduler would pick (the lowest
// highest victim priority, then the lowest sum of priorities, then the
// fewest victims, then cluster order); evicted jobs start over, queued
// at t behind the jobs waiting now. It says whether it evicted anything.
func (e *engine) preempt(t time.Duration, j Job) (bool, error) {
	table := configv1alpha1.DefaultWebhookConfiguration().PolicyTable
	if e.cfg.PolicyTable != nil {
		table = *e.cfg.PolicyTable
	}
	req := topology.Request{Count: j.GPUs, Requirement: table.For(j.Parallelism).Requirement(int64(j.GPUs))}
	fits := func(node int, free topology.Mask) (bool, error) {
		if free.Count() < j.GPUs {
			return false, nil
		}
		if e.cfg.Preemption == PreemptCount {
			return true, nil
		}
		_, err := allocator.BruteForce(e.cfg.Nodes[node].Graph, free, req)
		var inf *topology.InfeasibleError
		if errors.As(err, &inf) {
			return false, nil
		}
		return err == nil, err
	}
	type choice struct {
		node    int
		victims []running
		top     int32
		sum     int64
	}
	var best *choice
	for i := range e.cfg.Nodes {
		var cands []running
		free := e.free[i]
		for _, r := range e.run {
			if r.pl.Node == i && r.job.Priority < j.Priority {
				cands = append(cands, r)
				free = free.Union(r.pl.GPUs)
			}
		}
		if len(cands) == 0 {
			continue
		}
		if ok, err := fits(i, free); err != nil || !ok {
			if err != nil {
				return false, fmt.Errorf("preempt for job %s on node %s: %w", j.ID, e.cfg.Nodes[i].Name, err)
			}
			continue
		}
		slices.SortStableFunc(cands, func(a, b running) int {
			if c := cmp.Compare(b.job.Priority, a.job.Priority); c != 0 {
				return c
			}
			return cmp.Compare(a.start, b.start)
		})
		c := &choice{node: i, top: -1 << 31}
		for _, r := range cands {
			back := free.Minus(r.pl.GPUs)
			ok, err := fits(i, back)
			if err != nil {
				return false, err
			}
			if ok {
				free = back // reprieved
				continue
			}
			c.victims = append(c.victims, r)
			c.top = max(c.top, r.job.Priority)
			c.sum += int64(r.job.Priority)
		}
		if len(c.victims) == 0 {
			continue
		}
		if best == nil || c.top < best.top || c.top == best.top && (c.sum < best.sum || c.sum == best.sum && len(c.victims) < len(best.victims)) {
			best = c
		}
	}
	if best == nil {
		return false, nil
	}
	gone := map[int]bool{}
	for _, v := range best.victims {
		gone[v.seq] = true
		if err := e.p.Release(v.job, v.pl); err != nil {
			return false, err
		}
		e.free[v.pl.Node] = e.free[v.pl.Node].Union(v.pl.GPUs)
		e.used -= v.job.GPUs
		e.res.Evictions++
		e.res.LostGPUHours += (t - v.start).Hours() * float64(v.job.GPUs)
		again := v.job
		again.Arrival = t
		e.requeue = append(e.requeue, again)
	}
	e.run = slices.DeleteFunc(e.run, func(r running) bool { return gone[r.seq] })
	heap.Init(&e.run)
	n := best.node
	e.island[n] = e.cfg.Nodes[n].Graph.Metrics(topology.Mask{}, e.free[n]).LeftLargestIsland
	return true, nil
}
