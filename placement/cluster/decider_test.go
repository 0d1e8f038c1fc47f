package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
)

// deciderPair is two cores on one clientset (one cluster), each with its
// decider, as two gputopo schedulers side by side.
func deciderPair(t *testing.T) (a, b *Runtime) {
	t.Helper()
	cs := fake.NewClientset()
	mk := func(id, mode string) *Runtime {
		cfg := configv1alpha1.DefaultExtenderConfiguration()
		cfg.BindTimeout.Duration = 200 * time.Millisecond
		x, err := New(nil, cs, Options{Core: placement.Options{Config: cfg}, Identity: id, Mode: mode,
			// Short, but with room for a renewal to be late on a loaded
			// machine (the race detector, test packages in parallel):
			// a renewal that misses RenewDeadline loses the Lease.
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond,
			DeciderLeaseNamespace: DefaultDeciderLeaseNamespace})
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	return mk("first", "extender"), mk("second", "plugin")
}

func TestOneDeciderPerClusterAndTheOtherNamesIt(t *testing.T) {
	a, b := deciderPair(t)
	ctxA, stopA := context.WithCancel(context.Background())
	defer stopA()
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()

	// Before its election starts, a core decides nothing.
	if msg := a.decider.Load().refusal(); !strings.Contains(msg, "acquiring the decider Lease kube-system/gputopo-decider-nvidia.com-gpu") {
		t.Errorf("refusal before the election = %q, want it to say the Lease is being acquired", msg)
	}
	a.startDecider(ctxA)
	waitFor(t, func() bool { return a.decider.Load().refusal() == "" })

	b.startDecider(ctxB)
	waitFor(t, func() bool {
		return strings.Contains(b.decider.Load().refusal(), `decided by another gputopo scheduler, "first (extender mode, scheduler gputopo-scheduler)"`)
	})
	time.Sleep(2 * b.opts.LeaseDuration)
	msg := b.decider.Load().refusal()
	for _, want := range []string{
		"GPUs of " + string(v1alpha1.ResourceGPU) + ` are decided by another gputopo scheduler, "first (extender mode, scheduler gputopo-scheduler)"`,
		"holds the decider Lease kube-system/gputopo-decider-nvidia.com-gpu",
		`this one ("second (plugin mode, scheduler gputopo-scheduler)") waits`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("the second core's refusal while the first renews = %q\nwant it to say %q", msg, want)
		}
	}
	if a.decider.Load().refusal() != "" {
		t.Errorf("the first core stopped deciding while it renews its Lease")
	}

	// The first stops (released on cancel): the second takes over, and
	// the first decides nothing any more.
	stopA()
	<-a.decider.Load().done
	waitFor(t, func() bool { return b.decider.Load().refusal() == "" })
	if a.decider.Load().refusal() == "" {
		t.Errorf("the stopped core still decides")
	}
}

func TestDeciderLeaseNameFollowsTheResource(t *testing.T) {
	for res, want := range map[string]string{
		"nvidia.com/gpu":  "gputopo-decider-nvidia.com-gpu",
		"example.com/GPU": "gputopo-decider-example.com-gpu",
		"vendor.io/a_b":   "gputopo-decider-vendor.io-a-b",
	} {
		got := DeciderLeaseName(res)
		if got != want {
			t.Errorf("DeciderLeaseName(%q) = %q, want %q", res, got, want)
		}
		if err := ValidDeciderLeaseName(got); err != nil {
			t.Errorf("DeciderLeaseName(%q) = %q is no valid Lease name: %v", res, got, err)
		}
	}
}

func TestAShadowDecidesNothingAndNeedsNoLease(t *testing.T) {
	x, err := New(nil, fake.NewClientset(), Options{DecidesNothing: true})
	if err != nil {
		t.Fatal(err)
	}
	if d := x.decider.Load(); d != nil {
		t.Errorf("a shadow extender has a decider %+v; it never binds", d)
	}
}

// A core that wins the Lease but cannot rebuild its ledger must not keep
// it: it releases the Lease, so another scheduler takes over instead of
// every GPU pod waiting on a holder that decides nothing.
func TestADeciderThatCannotRebuildReleasesTheLease(t *testing.T) {
	a, b := deciderPair(t)
	// a lists pods through a client that fails; the Lease is shared.
	shared := b.client.(*fake.Clientset)
	broken := &fake.Clientset{}
	broken.AddReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcdserver: request timed out")
	})
	broken.AddReactor("*", "*", k8stesting.ObjectReaction(shared.Tracker()))
	a.client = broken
	a.decider.Store(newDecider(a, "extender"))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	a.startDecider(ctx)
	waitFor(t, func() bool {
		l, err := shared.CoordinationV1().Leases(DefaultDeciderLeaseNamespace).Get(ctx, DeciderLeaseName("nvidia.com/gpu"), metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil
	})
	b.startDecider(ctx)
	waitFor(t, func() bool { return b.decider.Load().refusal() == "" })
	if msg := a.decider.Load().refusal(); msg == "" {
		t.Errorf("the core whose rebuild fails decides")
	}
}

// waitFor polls cond until it holds, for at most 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("condition not met: %v", err)
	}
}
