//go:build integration

package nodeagent_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/nodeagent/nvmlsim"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

// countingTransport counts the requests that change something.
type countingTransport struct {
	next   http.RoundTripper
	writes *atomic.Int64
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodGet {
		c.writes.Add(1)
	}
	return c.next.RoundTrip(r)
}

// idleWrites runs n publishers (one simulated node each, fixtures in turn)
// for five minutes of agent time, one Sync per simulated second, and
// returns the API writes they made.
func idleWrites(t *testing.T, cp *harness.ControlPlane, prefix string, n int, always bool) int64 {
	t.Helper()
	ctx := context.Background()
	var writes atomic.Int64
	cfg := rest.CopyConfig(cp.UserConfig(t, agentUser))
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{next: rt, writes: &writes} })
	c, err := client.New(cfg, client.Options{Scheme: cp.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	fixtures := machine.Fixtures()
	pubs := make([]*nodeagent.Publisher, n)
	for i := range pubs {
		name := fmt.Sprintf("%s-%02d", prefix, i)
		if err := cp.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatalf("create node %s: %v", name, err)
		}
		sim := nvmlsim.New(fixtures[i%len(fixtures)], name)
		src := nodeagent.NewNVMLSource(sim.NVML(), logr.Discard(), nil)
		pubs[i] = nodeagent.NewPublisher(c, src, nodeagent.PublisherOptions{NodeName: name, Always: always}, nil, logr.Discard())
	}
	start := time.Now()
	for s := 0; s <= 300; s++ {
		now := start.Add(time.Duration(s) * time.Second)
		for _, p := range pubs {
			if err := p.Sync(ctx, now, false); err != nil {
				t.Fatalf("sync at %ds: %v", s, err)
			}
		}
	}
	for i := range pubs {
		obj := &v1alpha1.NodeGPUTopology{}
		if err := cp.Client.Get(ctx, client.ObjectKey{Name: fmt.Sprintf("%s-%02d", prefix, i)}, obj); err != nil {
			t.Fatal(err)
		}
		if len(obj.Status.GPUs) == 0 || len(obj.Status.Telemetry) == 0 {
			t.Fatalf("node %s: published %d GPUs and %d telemetry entries; want both", obj.Name, len(obj.Status.GPUs), len(obj.Status.Telemetry))
		}
	}
	return writes.Load()
}

// Fifty simulated idle nodes over five minutes: with the thresholds each
// node writes at start (create + status) and at the topology refresh, 150
// writes in all; without them every 30 s telemetry read is a write.
func TestPublisherWriteVolume50IdleNodes(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	for _, obj := range []client.Object{
		rbacClusterRole.DeepCopy(), rbacBinding.DeepCopy(),
	} {
		if err := cp.Client.Create(context.Background(), obj); err != nil {
			t.Fatal(err)
		}
	}
	const nodes = 50
	throttled := idleWrites(t, cp, "idle", nodes, false)
	always := idleWrites(t, cp, "chatty", nodes, true)
	t.Logf("API writes by %d idle nodes over 5 minutes of agent time: %d with thresholds, %d writing every telemetry read (%.1fx)",
		nodes, throttled, always, float64(always)/float64(throttled))
	if throttled != 3*nodes {
		t.Errorf("writes with thresholds: %d, want %d (create, first status, refresh at 5 min per node)", throttled, 3*nodes)
	}
	if want := int64(nodes * (1 + 11)); always != want {
		t.Errorf("writes without thresholds: %d, want %d (create and 11 telemetry writes per node)", always, want)
	}
}
