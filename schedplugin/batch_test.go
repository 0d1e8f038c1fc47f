package schedplugin

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// A burst of signals (a node agent flapping its topology) runs the batch
// at most once per interval, and the last signal is always followed by a
// run that starts after it.
func TestBatchBoundsRunsAndNeverDropsTheLastSignal(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs atomic.Int32
	var lastRun atomic.Int64
	b := newBatch(5*time.Millisecond, 100*time.Millisecond, func() {
		runs.Add(1)
		lastRun.Store(time.Now().UnixNano())
	})
	go b.run(ctx)
	start := time.Now()
	var lastSignal time.Time
	for time.Since(start) < 350*time.Millisecond {
		lastSignal = time.Now()
		b.signal()
		time.Sleep(time.Millisecond)
	}
	burst := time.Since(start)
	deadline := time.Now().Add(5 * time.Second)
	for lastRun.Load() < lastSignal.UnixNano() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if lastRun.Load() < lastSignal.UnixNano() {
		t.Fatal("no run started after the last signal")
	}
	// One run per 100 ms at most over the burst, plus the one after it.
	if n, most := int(runs.Load()), int(burst/(100*time.Millisecond))+2; n > most {
		t.Errorf("%d runs for a %s burst of signals, want at most %d (one per 100ms)", n, burst.Round(time.Millisecond), most)
	}
	if n := runs.Load(); n < 2 {
		t.Errorf("%d runs, want at least 2 (one in the burst, one after it)", n)
	}
}
