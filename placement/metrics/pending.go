package metrics

import (
	"time"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
)

// Pending is the Observer a core is built with when its metrics, which
// read the core's ledger, can only be made after it: Attach makes them
// and from then on Pending hands every count to them. Nothing is counted
// before Attach (building a core counts nothing).
type Pending struct{ m *Metrics }

var _ placement.Observer = (*Pending)(nil)

// Attach makes the metrics of core, whose Observer is p: its ledger's
// gauges, per-GPU gauges exported while it leads, topology states judged
// on its clock.
func (p *Pending) Attach(core *placement.Core) *Metrics {
	m := New(core.Report())
	m.Leader = core.Leading
	m.TopologyClock = func() (time.Time, time.Duration) { return core.Now(), core.Config().TopologyAgeLimit() }
	p.m = m
	return m
}

func (p *Pending) Filtered(r placement.Reason, n int)               { p.m.Filtered(r, n) }
func (p *Pending) Scored(c *[placement.MaxScore + 1]uint64)         { p.m.Scored(c) }
func (p *Pending) Failed(ph placement.Phase, k placement.ErrorKind) { p.m.Failed(ph, k) }
func (p *Pending) Bound(req string, pl v1alpha1.Placement)          { p.m.Bound(req, pl) }
func (p *Pending) DoubleHeld(n int)                                 { p.m.DoubleHeld(n) }
func (p *Pending) TelemetryRound(ok bool, at time.Time)             { p.m.TelemetryRound(ok, at) }
func (p *Pending) Patience(waited bool)                             { p.m.Patience(waited) }
