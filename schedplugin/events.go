package schedplugin

import (
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// eventAction is the action of the core's Events (events.k8s.io requires
// one): they are about binding a pod's GPUs.
const eventAction = "Binding"

// frameworkRecorder records the core's Events (GPUsBound,
// PlacementFellBack, GPUDoubleHeld) through kube-scheduler's own
// recorder: events.k8s.io Events whose reporting controller is the
// scheduler profile, rate-limited and folded into series by the
// framework's broadcaster.
type frameworkRecorder struct{ r events.EventRecorder }

func (f frameworkRecorder) Event(o runtime.Object, eventtype, reason, message string) {
	f.r.Eventf(o, nil, eventtype, reason, eventAction, "%s", message)
}

func (f frameworkRecorder) Eventf(o runtime.Object, eventtype, reason, format string, args ...any) {
	f.r.Eventf(o, nil, eventtype, reason, eventAction, format, args...)
}
