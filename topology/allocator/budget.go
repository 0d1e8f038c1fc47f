package allocator

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
