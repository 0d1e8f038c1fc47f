//go:build integration

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/extender"
	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

// replica is one of several extender replicas behind a Service.
type replica struct {
	name string
	x    *localcluster.Extender
	ft   *faultTransport
	url  *url.URL
}

// service stands in for the extender's Service on extPort: it routes each
// request to a Ready replica, as endpoints follow readiness probes, and
// answers 503 when none is Ready.
func (e *env) service(t *testing.T, replicas []*replica) func() {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(e.extPort))
	if err != nil {
		t.Fatalf("listen on the extender's address: %v", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, rp := range replicas {
			if rp.x.Ready() {
				proxy := httputil.NewSingleHostReverseProxy(rp.url)
				proxy.ErrorLog = log.New(io.Discard, "", 0) // a crashed replica's cut requests are expected
				proxy.ServeHTTP(w, r)
				return
			}
		}
		http.Error(w, "no ready extender replica", http.StatusServiceUnavailable)
	})}
	go func() { _ = srv.Serve(lis) }()
	return func() { _ = srv.Close() }
}

// leaderFailover replaces the single extender by two replicas with leader
// election behind a Service, starts a burst of pods and crashes the
// leader in the middle of it: the standby must take over and no GPU may
// go to two pods.
func (e *env) leaderFailover(t *testing.T, train *corev1.Pod) {
	ctx := context.Background()
	e.stopExtender(t)
	var replicas []*replica
	for _, name := range []string{"replica-a", "replica-b"} {
		port, err := harness.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		x, ft := e.newExtender(t, extender.Options{
			Port: port, LeaderElect: true, LeaderElectionNamespace: metav1.NamespaceDefault,
			LeaderElectionID: "gputopo-extender-e2e", LeaderElectionIdentity: name,
			LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
		})
		u, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(port))
		replicas = append(replicas, &replica{name: name, x: x, ft: ft, url: u})
		if len(replicas) == 1 {
			e.waitExtenderReady(t, x) // a leads
		}
	}
	leader, standby := replicas[0], replicas[1]
	defer func() {
		_ = leader.x.Stop()
		_ = standby.x.Stop()
	}()
	closeService := e.service(t, replicas)
	defer closeService()
	e.ext = leader.x
	t.Logf("injected: two extender replicas with leader election (%s leads) behind one address", leader.name)

	free := nodeGPUs - len(harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs))
	var names []string
	for i := range free {
		names = append(names, fmt.Sprintf("burst-%d", i))
	}
	// The leader crashes right after the apiserver wrote the burst's third
	// Binding, before it replies: it reaches the apiserver no more (its
	// Lease is not released) and stops serving.
	fault := newBindFault(killAfterWrite)
	fault.skip = 2
	defer fault.free()
	e.injectBindFault(fault)
	for _, n := range names {
		e.create(t, gpuPod(nsTeam, n, 1))
	}
	select {
	case <-fault.hit:
	case <-time.After(time.Minute):
		t.Fatal("the burst never reached its third Binding")
	}
	if standby.x.Ready() {
		t.Errorf("%s is Ready while %s holds the Lease; only the leader may serve", standby.name, leader.name)
	}
	bound := 0
	for _, name := range names {
		if e.getPod(t, nsTeam, name).Spec.NodeName != "" {
			bound++
		}
	}
	_ = leader.x.Stop()
	fault.free()
	t.Logf("injected: leader %s crashed after writing the burst's third Binding, before replying; %d of %d burst pods bound then", leader.name, bound, len(names))

	harness.Poll(t, time.Minute, "the standby to take over", func() (bool, string) {
		return standby.x.Ready(), "standby not Ready"
	})
	e.ext = standby.x
	t.Logf("checked: %s took over", standby.name)
	var taken []string
	for _, name := range names {
		p := e.waitPod(t, gpuPod(nsTeam, name, 1), 2*time.Minute, name+" to run", isRunning)
		got := harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs)
		for _, u := range got {
			if slices.Contains(taken, u) || slices.Contains(harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs), u) {
				t.Errorf("GPU %s issued twice (pod %s)", u, name)
			}
		}
		taken = append(taken, got...)
	}
	t.Logf("checked: all %d burst pods run on distinct GPUs", len(names))
	e.audit(t)
	e.deletePods(t, nsTeam, names...)

	_ = standby.x.Stop()
	closeService()
	if err := e.waitPortFree(ctx); err != nil {
		t.Fatal(err)
	}
	e.startExtender(t)
	t.Logf("injected: back to one extender")
}

// waitPortFree waits until nothing listens on extPort.
func (e *env) waitPortFree(ctx context.Context) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(e.extPort))
		if err != nil {
			return false, nil
		}
		return true, l.Close()
	})
	if wait.Interrupted(err) {
		return errors.New("the extender's port stayed busy")
	}
	return err
}

// schedulerKilledMidBurst (plugin mode) SIGKILLs gputopo-scheduler, whose
// core holds the deciding ledger, as soon as a burst of 1-GPU pods starts
// binding, and starts it again: the new process rebuilds its ledger from
// the pods, and every burst pod runs on a GPU no other live pod holds.
func (e *env) schedulerKilledMidBurst(t *testing.T, train *corev1.Pod) {
	taken := harness.PodGPUs(t, train, v1alpha1.AnnotationAssignedGPUs)
	var names []string
	for i := range nodeGPUs - len(taken) {
		names = append(names, fmt.Sprintf("burst-%d", i))
	}
	created := make(chan error, 1)
	go func() {
		var errs []error
		for _, n := range names {
			errs = append(errs, e.cp.Client.Create(context.Background(), gpuPod(nsTeam, n, 1)))
		}
		created <- errors.Join(errs...)
	}()
	err := wait.PollUntilContextTimeout(context.Background(), 2*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		g, err := e.sched.CoreGauges()
		return err == nil && g["held"]+g["reserved"] > float64(len(taken)), nil
	})
	if err != nil {
		t.Fatalf("the burst never started binding: %v", err)
	}
	e.sched.Kill()
	if err := <-created; err != nil {
		t.Fatalf("create the burst: %v", err)
	}
	bound := 0
	for _, name := range names {
		if e.getPod(t, nsTeam, name).Spec.NodeName != "" {
			bound++
		}
	}
	t.Logf("injected: gputopo-scheduler SIGKILLed with %d of %d burst pods bound", bound, len(names))
	e.startScheduler(t, false)
	for _, name := range names {
		p := e.waitPod(t, gpuPod(nsTeam, name, 1), 2*time.Minute, name+" to run", isRunning)
		for _, u := range harness.PodGPUs(t, p, v1alpha1.AnnotationAssignedGPUs) {
			if slices.Contains(taken, u) {
				t.Errorf("GPU %s issued twice (pod %s)", u, name)
			}
			taken = append(taken, u)
		}
	}
	t.Logf("checked: all %d burst pods run on distinct GPUs after the restart", len(names))
	e.audit(t)
	e.deletePods(t, nsTeam, names...)
}
