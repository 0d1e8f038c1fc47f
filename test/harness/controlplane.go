package harness

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/gputopo/gputopo/internal/localcluster"
)

// ControlPlane is a running etcd + kube-apiserver with gputopo's CRDs.
type ControlPlane struct {
	Env *envtest.Environment
	// Config is an admin (system:masters) connection.
	Config *rest.Config
	// Client is a controller-runtime client with gputopo's types registered.
	Client client.Client
	// Clientset is a typed client-go clientset.
	Clientset kubernetes.Interface
	Scheme    *runtime.Scheme
	// Dir is a temp dir for kubeconfigs and configs, removed at cleanup.
	Dir string

	local *localcluster.ControlPlane
}

var setLogger sync.Once

// Options tune Start.
type Options = localcluster.Options

// Scheme returns a scheme with the built-in types and gputopo's.
func Scheme() *runtime.Scheme { return localcluster.Scheme() }

// Start starts etcd and kube-apiserver from BinDir, installs gputopo's CRDs
// and registers the teardown in t.Cleanup. It fails the test with a message
// saying how to build the binaries when they are missing.
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	// controller-runtime logs through klog, as in the gputopo binary;
	// otherwise it prints a warning with a stack trace on first use.
	setLogger.Do(func() { ctrllog.SetLogger(klog.NewKlogr()) })
	local, err := localcluster.StartControlPlane(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := local.Stop(); err != nil {
			t.Log(err)
		}
	})
	c, err := client.New(local.Config, client.Options{Scheme: local.Scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	cs, err := kubernetes.NewForConfig(local.Config)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return &ControlPlane{Env: local.Env, Config: local.Config, Client: c, Clientset: cs, Scheme: local.Scheme, Dir: local.Dir, local: local}
}

// Kubeconfig writes a kubeconfig for a user authenticated by client
// certificate and returns its path. Authorization is the apiserver's real
// RBAC: pass groups such as "system:masters" to grant everything.
func (cp *ControlPlane) Kubeconfig(t testing.TB, user string, groups ...string) string {
	t.Helper()
	p, err := cp.local.Kubeconfig(user, groups...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// UserConfig returns a rest.Config for a user authenticated by client
// certificate.
func (cp *ControlPlane) UserConfig(t testing.TB, user string, groups ...string) *rest.Config {
	t.Helper()
	cfg, err := cp.local.UserConfig(user, groups...)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// Context returns a context cancelled at test cleanup.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// Poll checks cond every 200ms until it holds, failing the test after
// timeout with what it waited for and cond's last message.
func Poll(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		ok, msg := cond()
		last = msg
		return ok, nil
	})
	if err != nil {
		t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, last)
	}
}
