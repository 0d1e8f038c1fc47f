package harness

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/localcluster"
)

// Extender is gputopo's extender running in the test process.
type Extender = localcluster.Extender

// StartExtender runs gputopo's extender in the test process with o, as
// cfg's user, and returns once it is Ready. At test cleanup it is stopped
// (if it still runs) and an error it returned fails the test.
func StartExtender(t testing.TB, ctx context.Context, cfg *rest.Config, o extender.Options) *Extender {
	t.Helper()
	x, err := localcluster.StartExtender(ctx, cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := x.Stop(); err != nil {
			t.Errorf("extender: %v", err)
		}
	})
	if err := x.WaitReady(ctx, time.Minute); err != nil {
		t.Fatalf("%v (under the RBAC of %s; Lease %s/%s when it elects)", err, cfg.Username, o.LeaderElectionNamespace, o.LeaderElectionID)
	}
	return x
}
