package placement

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// BenchmarkFilterWhilePlanning: 16 goroutines filter every node of a
// 1,024-node cluster for one 1-GPU pod's cycle (as the framework's
// parallel Filter does) while another goroutine plans a group of 32 pods ×
// 8 GPUs repeatedly, back to back (plan, dissolve the plan, plan again). It
// reports the filters' throughput and their p99 and longest latency, and
// the plans made: a filter waits on the planner for as long as the
// planner holds the ledger's write lock.
func BenchmarkFilterWhilePlanning(b *testing.B) {
	t := &testing.T{}
	x, names := groupCore(t, "dgx-a100", 1024, func(i int) string { return fmt.Sprintf("l%d", i/32) })
	one := gpuPod("one", 1, nil)
	x.ledger.UpsertPod(one)
	pr, err := ParseRequest(one, v1alpha1.ResourceGPU, x.Now())
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	stop := make(chan struct{})
	var plans atomic.Int64
	var wg sync.WaitGroup
	var members []Request
	for i := range 32 {
		p := groupPod("g", i, 32, 8, nil)
		x.ledger.UpsertPod(p)
		r, err := ParseRequest(p, v1alpha1.ResourceGPU, x.Now())
		if err != nil {
			b.Fatal(err)
		}
		members = append(members, r)
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := x.slot(ctx, members[0], nil); err != nil {
				panic(err)
			}
			plans.Add(1)
			// Dissolve the plan (a negative TTL expires it), so that the
			// next call plans again.
			x.ledger.SweepGroups(-time.Hour)
		}
	})
	c := x.newCycle(ctx, pr)
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var filters sync.WaitGroup
	lat := make([][]time.Duration, 16)
	for g := range 16 {
		filters.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				c.FilterNode(names[i%int64(len(names))])
				lat[g] = append(lat[g], time.Since(t0))
			}
		})
	}
	filters.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(all[len(all)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(all[len(all)-1].Nanoseconds()), "max-ns")
	b.StopTimer()
	close(stop)
	wg.Wait()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "filters/s")
	b.ReportMetric(float64(plans.Load())/elapsed.Seconds(), "plans/s")
}
