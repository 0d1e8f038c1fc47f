package topology

// Work counts the units a computation has spent against a limit. One unit
// is one step of an inner loop (a bitmask operation, a bandwidth lookup, a
// cell of the ring search's table), each step's charge calibrated against
// its measured cost; one unit is about a nanosecond of CPU. The set
// searches of this package (LargestClique, CountCliques, RingWithin) charge
// the Work they are given, and the allocator raises Limit phase by phase
// (allocator.SearchBudget). Work is counted, not timed, so answers are
// deterministic. A nil *Work is unlimited.
type Work struct {
	// Used is the units spent so far, Limit what may be spent.
	Used, Limit int64
	// Short records that a step was refused: it is set exactly when a
	// search had to give up for want of work.
	Short bool
}

// Spend charges n units and reports whether the limit still holds; when it
// does not, the caller gives up.
func (w *Work) Spend(n int64) bool {
	if w == nil {
		return true
	}
	w.Used += n
	if w.Used > w.Limit {
		w.Short = true
		return false
	}
	return true
}

// Charge counts n units of a step too small to stop for; the next Spend
// or Afford sees them.
func (w *Work) Charge(n int64) {
	if w != nil {
		w.Used += n
	}
}

// Afford reports whether n more units fit under the limit, without
// charging them; expensive steps ask before they start, so that no single
// step overshoots the limit.
func (w *Work) Afford(n int64) bool {
	if w == nil || w.Used+n <= w.Limit {
		return true
	}
	w.Short = true
	return false
}
