package topology

// SearchBudget bounds the work of one Allocate call, in work units: one
// unit is one step of an inner loop (a bitmask operation, a bandwidth
// lookup, a cell of the ring search's table), each step's charge calibrated
// against its measured cost. Every part of a decision is charged: the feasibility check's clique
// searches, every partial and complete set the exact search visits, the
// bounds and keys it computes on them (ring, cliques, quads), the heuristic
// and the final ring. A share is kept back for the final ring and metrics
// (finishReserve); the exact search may spend searchShare percent of the
// rest; when it runs out before it has proved its best set optimal, the
// heuristic (heuristic.go) improves that set with what remains of the rest
// and the Result says Heuristic. Work is counted, not timed, so answers are
// deterministic and the memo holds. One unit is about a nanosecond of CPU:
// see docs/topology.md for the measured time per decision.
const SearchBudget = 4_000_000

// searchShare is the exact search's part, in percent, of the budget less
// finish's reserve; the heuristic may use the rest of it.
const searchShare = 80

// work counts the units a decision has spent against a limit that the
// phases raise in turn. A nil *work is unlimited. short records that a
// step was refused: it is set exactly when the search or the final ring
// had to give up, which is what Result.Heuristic reports.
type work struct {
	used, limit int64
	short       bool
}

func newWork(budget int64) *work { return &work{limit: budget} }

// spend charges n units and reports whether the limit still holds; when it
// does not, the caller gives up.
func (w *work) spend(n int64) bool {
	if w == nil {
		return true
	}
	w.used += n
	if w.used > w.limit {
		w.short = true
		return false
	}
	return true
}

// charge counts n units of a step too small to stop for; the next spend
// or afford sees them.
func (w *work) charge(n int64) {
	if w != nil {
		w.used += n
	}
}

// afford reports whether n more units fit under the limit, without
// charging them; expensive steps ask before they start, so that no single
// step overshoots the budget.
func (w *work) afford(n int64) bool {
	if w == nil || w.used+n <= w.limit {
		return true
	}
	w.short = true
	return false
}
