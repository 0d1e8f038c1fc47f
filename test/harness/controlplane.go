package harness

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
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
}

// Options tune Start.
type Options struct {
	// WebhookInstallOptions, when set, makes envtest generate serving certs
	// and install webhook configurations pointing at a local server.
	WebhookInstallOptions *envtest.WebhookInstallOptions
	// APIServerArgs are extra kube-apiserver flags (name -> values).
	APIServerArgs map[string][]string
}

// Scheme returns a scheme with the built-in types and gputopo's.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// Start starts etcd and kube-apiserver from BinDir, installs gputopo's CRDs
// and registers the teardown in t.Cleanup. It fails the test with a message
// saying how to build the binaries when they are missing.
func Start(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := Binary(b); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := os.MkdirTemp("", "gputopo-cp-")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	scheme := Scheme()
	env := &envtest.Environment{
		BinaryAssetsDirectory:    BinDir(),
		CRDDirectoryPaths:        []string{CRDDir()},
		ErrorIfCRDPathMissing:    true,
		Scheme:                   scheme,
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	if opts.WebhookInstallOptions != nil {
		env.WebhookInstallOptions = *opts.WebhookInstallOptions
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	for k, v := range opts.APIServerArgs {
		args.Set(k, v...)
	}
	cfg, err := env.Start()
	if err != nil {
		_ = os.RemoveAll(dir)
		t.Fatalf("start control plane (etcd, kube-apiserver from %s): %v", BinDir(), err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stop control plane: %v", err)
		}
		_ = os.RemoveAll(dir)
	})
	cfg.QPS, cfg.Burst = 500, 1000
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return &ControlPlane{Env: env, Config: cfg, Client: c, Clientset: cs, Scheme: scheme, Dir: dir}
}

// Kubeconfig writes a kubeconfig for a user authenticated by client
// certificate and returns its path. Authorization is the apiserver's real
// RBAC: pass groups such as "system:masters" to grant everything.
func (cp *ControlPlane) Kubeconfig(t testing.TB, user string, groups ...string) string {
	t.Helper()
	u, err := cp.Env.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		t.Fatalf("add user %s: %v", user, err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		t.Fatalf("kubeconfig for %s: %v", user, err)
	}
	p := filepath.Join(cp.Dir, sanitize(user)+".kubeconfig")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatalf("write kubeconfig: %v", err)
	}
	return p
}

// UserConfig returns a rest.Config for a user authenticated by client
// certificate.
func (cp *ControlPlane) UserConfig(t testing.TB, user string, groups ...string) *rest.Config {
	t.Helper()
	u, err := cp.Env.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		t.Fatalf("add user %s: %v", user, err)
	}
	cfg := rest.CopyConfig(u.Config())
	cfg.QPS, cfg.Burst = 500, 1000
	return cfg
}

func sanitize(s string) string {
	out := []rune(s)
	for i, r := range out {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			out[i] = '_'
		}
	}
	return string(out)
}

// Context returns a context cancelled at test cleanup.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}
