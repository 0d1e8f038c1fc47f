package localcluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
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
	// PodReachableIP, when set, makes kube-apiserver serve and advertise on
	// this host address instead of 127.0.0.1, with a serving certificate
	// for it and for the kubernetes Service's ClusterIP (KubernetesIP):
	// pods on the node then reach it through the Service, as in-cluster
	// clients do (with kube-proxy), with the service account tokens the
	// ServiceAccount admission plugin (on in this mode) mounts.
	PodReachableIP string
}

// KubernetesIP is the ClusterIP of the kubernetes Service: the first
// address of envtest's service range 10.0.0.0/24.
const KubernetesIP = "10.0.0.1"

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
	if opts.PodReachableIP != "" {
		if err := servePodReachable(env.ControlPlane.GetAPIServer(), filepath.Join(dir, "apiserver-pki"), opts.PodReachableIP); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
		args.Set("advertise-address", opts.PodReachableIP)
		// Every address: pods connect to PodReachableIP (through the
		// Service), the tests' clients to 127.0.0.1.
		args.Set("bind-address", "0.0.0.0")
		// Pods run for real: they get their service account tokens
		// (envtest turns the ServiceAccount admission plugin off).
		args.Disable("disable-admission-plugins")
	}
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

// servePodReachable makes api listen on ip with a serving certificate for
// ip, KubernetesIP, 127.0.0.1 and the Service's DNS names, signed by a CA
// of its own (written as ca.crt), and the service-account signing key
// envtest would otherwise write beside its own certificate.
func servePodReachable(api *envtest.APIServer, certDir, ip string) error {
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return fmt.Errorf("apiserver cert dir: %w", err)
	}
	ips := []net.IP{net.ParseIP(ip), net.ParseIP(KubernetesIP), net.ParseIP("127.0.0.1")}
	if ips[0] == nil {
		return fmt.Errorf("PodReachableIP %q is not an IP address", ip)
	}
	dns := []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	// GenerateSelfSignedCertKey returns the serving certificate followed by
	// the CA that signed it.
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(ip, ips, dns)
	if err != nil {
		return fmt.Errorf("apiserver serving certificate: %w", err)
	}
	serving, rest := pem.Decode(certPEM)
	if serving == nil || len(rest) == 0 {
		return errors.New("apiserver serving certificate: no CA after the certificate")
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("service account key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"apiserver.crt": certPEM,
		"apiserver.key": keyPEM,
		"ca.crt":        rest,
		"sa-signer.key": pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"sa-signer.crt": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(certDir, name), b, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	api.CertDir = certDir
	api.SecureServing.ListenAddr.Address = ip
	api.SecureServing.CA = rest
	return nil
}

// CAFile is the CA that signed kube-apiserver's serving certificate when it
// serves pods (Options.PodReachableIP); empty otherwise.
func (cp *ControlPlane) CAFile() string {
	p := filepath.Join(cp.Dir, "apiserver-pki", "ca.crt")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
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
