//go:build integration

package extender_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	schedconfigv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/internal/localcluster"
	"github.com/gputopo/gputopo/test/harness"
)

// A system is gputopo deciding under a real scheduler, in one of its two
// modes; the tests that run in both drive it through this.
type system interface {
	// gauges are the deciding core's ledger gauges (its /metrics).
	gauges(t *testing.T) map[string]float64
	// kill SIGKILLs the process that holds the ledger: the extender, or
	// gputopo-scheduler in plugin mode.
	kill(t *testing.T)
	// restart starts that process again and returns once it decides.
	restart(t *testing.T)
	// tail is the last lines of the scheduler's log.
	tail() string
}

// modes are the two front ends of the decision core.
var modes = []struct {
	name  string
	start func(t *testing.T, e *env) system
}{
	{"extender", startExtenderSystem},
	{"plugin", startPluginSystem},
}

// eachMode runs f once per mode, each on its own control plane.
func eachMode(t *testing.T, nodes int, f func(t *testing.T, e *env, s system)) {
	eachModeOn(t, func(t *testing.T) *env { return newEnv(t, nodes) }, f)
}

// eachModeOn is eachMode on the control planes mk starts.
func eachModeOn(t *testing.T, mk func(t *testing.T) *env, f func(t *testing.T, e *env, s system)) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			e := mk(t)
			f(t, e, m.start(t, e))
		})
	}
}

// extenderSystem is the gputopo extender binary called by the real
// kube-scheduler with the chart's profile.
type extenderSystem struct {
	e          *env
	kubeconfig string
	port       int
	n          int
	x          *extenderProcess
	sched      *harness.Decider
	// flags are the extender's extra flags.
	flags []string
}

func startExtenderSystem(t *testing.T, e *env) system { return startExtenderSystemWith(t, e) }

// startExtenderSystemWith is startExtenderSystem with extra extender
// flags.
func startExtenderSystemWith(t *testing.T, e *env, flags ...string) system {
	t.Helper()
	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	s := &extenderSystem{e: e, kubeconfig: e.cp.Kubeconfig(t, extenderUser), port: port, flags: flags}
	s.restart(t)
	s.sched = e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModeExtender, ExtenderURL: s.x.url()})
	return s
}

func (s *extenderSystem) gauges(t *testing.T) map[string]float64 { return ledgerGauges(t, s.x) }

func (s *extenderSystem) kill(t *testing.T) { sigkill(t, s.x.Process) }

// sigkill SIGKILLs p and fails the test if it still runs.
func sigkill(t *testing.T, p *harness.Process) {
	t.Helper()
	p.Kill()
	if exited, _ := p.Exited(); !exited {
		t.Fatalf("%s still running after SIGKILL", p.Name)
	}
}

func (s *extenderSystem) restart(t *testing.T) {
	t.Helper()
	s.n++
	s.x = startExtenderProcess(t, "extender-"+strconv.Itoa(s.n), s.kubeconfig, s.port, s.flags...)
	waitProcessReady(t, s.x)
}

func (s *extenderSystem) tail() string { return s.sched.Tail(30) }

// pluginSystem is gputopo-scheduler (make gputopo-scheduler) with the
// chart's plugin profile, as the scheduler's identity with the extender's
// ClusterRole, as the chart binds it in plugin mode.
type pluginSystem struct {
	e     *env
	sched *harness.Decider
}

func startPluginSystem(t *testing.T, e *env) system {
	t.Helper()
	if err := localcluster.GrantExtenderRole(harness.Context(t), e.cp.Client, harness.SchedulerUser); err != nil {
		t.Fatal(err)
	}
	s := &pluginSystem{e: e, sched: e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin})}
	harness.WaitCore(t, s.sched, localcluster.TotalGPUs(e.totalGPUs()))
	return s
}

func (s *pluginSystem) gauges(t *testing.T) map[string]float64 {
	t.Helper()
	g, err := s.sched.CoreGauges()
	if err != nil {
		t.Fatalf("gputopo-scheduler's ledger: %v", err)
	}
	return g
}

func (s *pluginSystem) kill(t *testing.T) { sigkill(t, s.sched.Process) }

func (s *pluginSystem) restart(t *testing.T) {
	t.Helper()
	if err := s.sched.Restart(); err != nil {
		t.Fatal(err)
	}
	harness.WaitCore(t, s.sched, localcluster.TotalGPUs(s.e.totalGPUs()))
}

func (s *pluginSystem) tail() string { return s.sched.Tail(30) }

func fmtGauges(g map[string]float64) string {
	return "total=" + strconv.Itoa(int(g["total"])) + " free=" + strconv.Itoa(int(g["free"])) +
		" held=" + strconv.Itoa(int(g["held"])) + " reserved=" + strconv.Itoa(int(g["reserved"]))
}

// pluginReplica is gputopo-scheduler with leader election on, for the
// failover test, once its core has every node's GPUs.
func pluginReplica(t *testing.T, e *env, name string) *harness.Decider {
	t.Helper()
	d := e.cp.StartDecider(t, harness.DeciderOptions{Mode: harness.ModePlugin, Name: name,
		Configure: func(cfg *schedconfigv1.KubeSchedulerConfiguration) {
			cfg.LeaderElection.LeaderElect = ptr.To(true)
			cfg.LeaderElection.ResourceNamespace = metav1.NamespaceDefault
			cfg.LeaderElection.ResourceName = "gputopo-scheduler-test"
			cfg.LeaderElection.LeaseDuration = metav1.Duration{Duration: 4 * time.Second}
			cfg.LeaderElection.RenewDeadline = metav1.Duration{Duration: 3 * time.Second}
			cfg.LeaderElection.RetryPeriod = metav1.Duration{Duration: 500 * time.Millisecond}
		}})
	harness.WaitCore(t, d, localcluster.TotalGPUs(len(e.nodes)*gpusPerNode))
	return d
}

// TestPluginLeaderFailover runs two gputopo-scheduler replicas with leader
// election, as the chart does in plugin mode, and SIGKILLs the leader in
// the middle of a storm. The standby's core has followed the cluster all
// along; once it holds the Lease it binds the rest: no GPU goes to two
// live pods, and its ledger ends equal to the pods.
func TestPluginLeaderFailover(t *testing.T) {
	e := newEnv(t, 4)
	ctx := harness.Context(t)
	if err := localcluster.GrantExtenderRole(harness.Context(t), e.cp.Client, harness.SchedulerUser); err != nil {
		t.Fatal(err)
	}
	// The chart's Role for the scheduler's own Lease.
	const lease = "gputopo-scheduler-test"
	rules := []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{lease}, Verbs: []string{"get", "update"}},
	}
	if _, err := e.cp.Clientset.RbacV1().Roles(metav1.NamespaceDefault).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: lease}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cp.Clientset.RbacV1().RoleBindings(metav1.NamespaceDefault).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: lease},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: lease},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: harness.SchedulerUser}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	total := len(e.nodes) * gpusPerNode

	leader := pluginReplica(t, e, "gputopo-scheduler-a")
	var holder string
	harness.Poll(t, time.Minute, "replica a to hold the Lease", func() (bool, string) {
		l, err := e.cp.Clientset.CoordinationV1().Leases(metav1.NamespaceDefault).Get(ctx, lease, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		holder = ptr.Deref(l.Spec.HolderIdentity, "")
		return holder != "", "no holder"
	})
	standby := pluginReplica(t, e, "gputopo-scheduler-b")

	// The storm comes in two waves. The first asks for fewer GPUs than
	// there are, and the leader is killed as soon as it holds one: binds
	// are then in flight. The second is created after the kill, so the
	// standby has GPUs left to bind whatever the leader finished before
	// it died (in plugin mode it can bind the whole first wave between
	// two looks at its metrics).
	pods := stormPods("failover", total)
	first, second := pods[:total/4], pods[total/4:]
	created := make(chan error, 1)
	go func() { created <- createAllErr(ctx, e, first) }()
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		g, err := leader.CoreGauges()
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmtGauges(g)
		return g["held"]+g["reserved"] >= 1, nil
	}); err != nil {
		t.Fatalf("timed out waiting for the storm to start: %s", last)
	}
	leader.Kill()
	before := boundGPUs(listPods(t, e))
	if before == total {
		t.Errorf("every GPU was bound before the leader was killed: the test did not kill it mid-storm")
	}
	t.Logf("leader (%s) killed with %d of %d GPUs bound", holder, before, total)
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	if err := createAllErr(ctx, e, second); err != nil {
		t.Fatal(err)
	}
	harness.Poll(t, 3*time.Minute, "the standby to bind every GPU", func() (bool, string) {
		n := boundGPUs(listPods(t, e))
		return n == total, fmt.Sprintf("%d of %d GPUs bound (%d before the failover)", n, total, before)
	})
	l, err := e.cp.Clientset.CoordinationV1().Leases(metav1.NamespaceDefault).Get(ctx, lease, metav1.GetOptions{})
	if err != nil || ptr.Deref(l.Spec.HolderIdentity, "") == holder {
		t.Errorf("Lease holder after failover %v (err %v); want the standby, not %s", l.Spec.HolderIdentity, err, holder)
	}
	auditPods(t, listPods(t, e))
	harness.Poll(t, 30*time.Second, "the standby's ledger to match the pods", func() (bool, string) {
		g, err := standby.CoreGauges()
		if err != nil {
			return false, err.Error()
		}
		return g["held"] == float64(total) && g["free"] == 0 && g["reserved"] == 0, fmtGauges(g)
	})
	if t.Failed() {
		t.Logf("standby log:\n%s", standby.Tail(30))
	}
}
