package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// ControlPlane is a running etcd + kube-apiserver with gputopo's CRDs.
type ControlPlane struct {
	Env *envtest.Environment
	// Config is an admin (system:masters) connection.
	Config *rest.Config
	Scheme *runtime.Scheme
	// Dir holds kubeconfigs, configs and logs; removed by Stop.
	Dir string
}

// Options tune StartControlPlane.
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

// StartControlPlane starts etcd and kube-apiserver from BinDir through
// envtest and installs gputopo's CRDs.
func StartControlPlane(opts Options) (*ControlPlane, error) {
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := Binary(b); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "gputopo-cp-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
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
		return nil, fmt.Errorf("start control plane (etcd, kube-apiserver from %s): %w", BinDir(), err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	return &ControlPlane{Env: env, Config: cfg, Scheme: scheme, Dir: dir}, nil
}

// Stop stops kube-apiserver and etcd and removes Dir.
func (cp *ControlPlane) Stop() error {
	err := cp.Env.Stop()
	_ = os.RemoveAll(cp.Dir)
	if err != nil {
		return fmt.Errorf("stop control plane: %w", err)
	}
	return nil
}

// UserConfig returns a rest.Config for a user authenticated by client
// certificate; authorization is the apiserver's real RBAC (groups such as
// "system:masters" grant everything).
func (cp *ControlPlane) UserConfig(user string, groups ...string) (*rest.Config, error) {
	u, err := cp.Env.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return nil, fmt.Errorf("add user %s: %w", user, err)
	}
	cfg := rest.CopyConfig(u.Config())
	cfg.QPS, cfg.Burst = 500, 1000
	return cfg, nil
}

// Kubeconfig writes a kubeconfig for a user authenticated by client
// certificate into Dir and returns its path.
func (cp *ControlPlane) Kubeconfig(user string, groups ...string) (string, error) {
	u, err := cp.Env.ControlPlane.AddUser(envtest.User{Name: user, Groups: groups}, nil)
	if err != nil {
		return "", fmt.Errorf("add user %s: %w", user, err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("kubeconfig for %s: %w", user, err)
	}
	p := filepath.Join(cp.Dir, sanitize(user)+".kubeconfig")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		return "", fmt.Errorf("write kubeconfig: %w", err)
	}
	return p, nil
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' {
			return r
		}
		return '_'
	}, s)
}
