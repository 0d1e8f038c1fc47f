package placement

import (
	"time"
)

// Upkeep is what a cluster runtime (package placement/cluster) drives on
// its core besides feeding it: the periodic sweeps and reservations, the
// decider handover, the double-hold announcements. Front ends that decide
// for pods never call it.
type Upkeep struct{ x *Core }

// Upkeep is the core's upkeep.
func (x *Core) Upkeep() Upkeep { return Upkeep{x: x} }

// OnNodeUsable sets the function told when a node comes to offer GPUs it
// did not from its topology's or Node's side (ledger.Report.OnUsable); it
// must not block.
func (u Upkeep) OnNodeUsable(fn func()) { u.x.ledger.Report().OnUsable(fn) }

// BindsInFlight counts binds between their decider check and their
// Binding's outcome: a runtime releases the decider Lease only once none
// is in flight.
func (u Upkeep) BindsInFlight() int64 { return u.x.binding.Load() }

// Sweep releases GPU reservations and group plans that outlived their
// TTLs, and forgets group preemption plans unused for preemptionKept; a
// runtime calls it periodically (SweepPeriod).
func (u Upkeep) Sweep() {
	x := u.x
	if n := x.ledger.SweepReservations(x.cfg.ReservationTTL.Duration); n > 0 {
		x.log.Info("expired GPU reservations released", "count", n)
	}
	if n := x.ledger.SweepGroups(x.cfg.Fabric.GroupReservationTTL.Duration); n > 0 {
		x.log.Info("group plans whose pods did not all come were released", "count", n)
	}
	now := x.now()
	x.preempting.Range(func(k, v any) bool {
		if now.Sub(v.(*keptPlan).at) > preemptionKept {
			x.preempting.CompareAndDelete(k, v)
		}
		return true
	})
}

// SweepPeriod is how often Sweep should run: a quarter of the shorter
// TTL, at most 30 s.
func (u Upkeep) SweepPeriod() time.Duration {
	x := u.x
	return min(x.cfg.ReservationTTL.Duration/4, x.cfg.Fabric.GroupReservationTTL.Duration/4, 30*time.Second)
}
