package extender

import (
	"time"

	"k8s.io/client-go/kubernetes"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// NewWithClient builds a ready extender core on an existing clientset,
// without informers, servers or leader election: the caller feeds the
// ledger (Ledger().UpsertTopology, UpsertNode, UpsertPod, DeletePod) as the
// informers would, and calls Filter, Prioritize and Bind directly. The
// simulator uses it to replay traces through the same decision code the
// HTTP server runs. cfg nil means DefaultExtenderConfiguration.
func NewWithClient(cfg *configv1alpha1.ExtenderConfiguration, cs kubernetes.Interface) *Extender {
	if cfg == nil {
		cfg = configv1alpha1.DefaultExtenderConfiguration()
	}
	x := newExtender(cfg, cs)
	x.synced.Store(true)
	x.leading.Store(true)
	return x
}

// SetClock replaces the extender's clock (and its ledger's) for a
// simulation that runs in simulated time: pod ages (fallbackAfter),
// reservation TTLs and topology ages are then measured on it. Call it
// before the first request.
func (x *Extender) SetClock(now func() time.Time) {
	x.now = now
	x.ledger.SetClock(now)
}
