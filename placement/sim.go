package placement

import (
	"time"

	"k8s.io/client-go/kubernetes"
)

// NewOffline builds a ready core without a cluster: no informers, no
// decider Lease, no Events. The caller feeds the ledger
// (Ledger().UpsertTopology, UpsertNode, UpsertPod, DeletePod) as the
// informers would and asks the core directly; binds go to api (nil: a
// core that only answers filter, score and explain, as `kubectl gputopo
// explain` uses it). The simulator replays traces through it with the
// decision code a cluster's scheduler runs.
func NewOffline(o Options, api API) (*Core, error) {
	x, err := newCore(o)
	if err != nil {
		return nil, err
	}
	if api == nil {
		api = noAPI{}
	}
	x.api = api
	x.synced.Store(true)
	x.leading.Store(true)
	return x, nil
}

// SetClock replaces the core's clock (and its ledger's) for a simulation
// that runs in simulated time: pod ages (fallbackAfter), reservation TTLs
// and topology ages are then measured on it. Call it before the first
// request.
func (x *Core) SetClock(now func() time.Time) {
	x.now = now
	x.ledger.SetClock(now)
}

// NewWithClient builds a ready core on a clientset, without informers, a
// decider Lease or Events: the caller feeds the ledger as the informers
// would, and binds write to cs (bind's reads ask cs too).
func NewWithClient(cs kubernetes.Interface, o Options) (*Core, error) {
	x, err := newCore(o)
	if err != nil {
		return nil, err
	}
	x.client = cs
	x.api = &clusterAPI{x: x}
	x.synced.Store(true)
	x.leading.Store(true)
	return x, nil
}
