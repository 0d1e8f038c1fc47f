package placement

import (
	"time"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Observer receives what the core counts; the front ends export it as
// metrics (package placement/metrics). Its methods are called on the
// decision path, concurrently: they must be cheap and safe for concurrent
// use.
type Observer interface {
	// Filtered counts n nodes that filter passed (ReasonNone) or refused
	// with reason.
	Filtered(reason Reason, n int)
	// Scored adds one prioritize answer: counts[s] nodes scored s.
	Scored(counts *[MaxScore + 1]uint64)
	// Failed counts a refused or failed request of phase, by kind.
	Failed(phase Phase, kind ErrorKind)
	// Bound counts a pod bound with placement p; requested names the tier
	// its requirement asked for.
	Bound(requested string, p v1alpha1.Placement)
	// DoubleHeld counts n newly found GPUs held by more than one pod.
	DoubleHeld(n int)
	// TelemetryRound counts a Prometheus telemetry query round ending at.
	TelemetryRound(ok bool, at time.Time)
	// Patience counts a decision for a pod inside its patience window
	// with evidence of faster GPUs freeing: waited, it refused slower
	// sets; not, the GPUs expected to free did not cover it and the pods
	// waiting ahead of it.
	Patience(waited bool)
}

// Phase is a decision's phase, as errors are counted.
type Phase string

// The phases of a decision.
const (
	PhaseFilter     Phase = "filter"
	PhasePrioritize Phase = "prioritize"
	PhaseBind       Phase = "bind"
	// PhasePreempt is the extender's preempt verb; kube-scheduler's own
	// scheduler_preemption_attempts_total and scheduler_preemption_victims
	// count preemptions and victims, in both modes.
	PhasePreempt Phase = "preempt"
)

// ErrorKind is a bounded label for a failed request.
type ErrorKind string

// The kinds of failure the core reports.
const (
	ErrBadRequest  ErrorKind = "bad_request"
	ErrInfeasible  ErrorKind = "infeasible"
	ErrAPIDefinite ErrorKind = "api_definite"
	ErrAPIUnknown  ErrorKind = "api_ambiguous"
	ErrConflict    ErrorKind = "conflict"
	// ErrRefused: a bind kube-scheduler's gputopo profile would never
	// have sent.
	ErrRefused ErrorKind = "refused"
	// ErrNotDecider: another gputopo scheduler holds the decider Lease
	// (or it is being acquired); the pod is refused, not decided.
	ErrNotDecider ErrorKind = "not_decider"
	ErrInternal   ErrorKind = "internal"
)

// MaxScore is the highest prioritize score (kube-scheduler's extender
// scale, 0..10).
const MaxScore = 10

type nopObserver struct{}

func (nopObserver) Filtered(Reason, int)             {}
func (nopObserver) Scored(*[MaxScore + 1]uint64)     {}
func (nopObserver) Failed(Phase, ErrorKind)          {}
func (nopObserver) Bound(string, v1alpha1.Placement) {}
func (nopObserver) DoubleHeld(int)                   {}
func (nopObserver) TelemetryRound(bool, time.Time)   {}
func (nopObserver) Patience(bool)                    {}
