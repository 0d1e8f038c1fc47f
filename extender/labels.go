package extender

import (
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/metrics"
)

// Label values of the verbs' phases and errors: the core's, and the HTTP
// front end's own.
const (
	phaseFilter     = string(placement.PhaseFilter)
	phasePrioritize = string(placement.PhasePrioritize)
	phaseBind       = string(placement.PhaseBind)
	phaseShadow     = metrics.PhaseShadow
	phasePreempt    = string(placement.PhasePreempt)

	errBadRequest   = string(placement.ErrBadRequest)
	errDecode       = metrics.ErrDecode
	errTooLarge     = metrics.ErrTooLarge
	errUnauthorized = metrics.ErrUnauthorized
	errForbidden    = metrics.ErrForbidden
	errNotReady     = metrics.ErrNotReady
)
