package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
)

// Options are the process-level settings of `gputopo webhook`; policy lives
// in the WebhookConfiguration file.
type Options struct {
	// Host the webhook server binds to. Default "" (all addresses).
	Host string
	// Port the webhook server listens on. Default 9443.
	Port int
	// CertDir holds the serving certificate and key, as cert-manager
	// writes them into a mounted Secret; changed files are picked up
	// without a restart. Default "/tmp/k8s-webhook-server/serving-certs".
	CertDir string
	// CertName is the certificate file in CertDir. Default "tls.crt".
	CertName string
	// KeyName is the key file in CertDir. Default "tls.key".
	KeyName string
	// ConfigFile is the WebhookConfiguration file; empty uses the defaults.
	ConfigFile string
	// MetricsBindAddress serves Prometheus metrics; "0" disables it.
	// Default ":8080".
	MetricsBindAddress string
	// HealthProbeBindAddress serves /healthz and /readyz; "0" disables it.
	// Default ":8081".
	HealthProbeBindAddress string
}

// DefaultOptions returns the defaults the flags start from.
func DefaultOptions() Options {
	return Options{
		Port:                   crwebhook.DefaultPort,
		CertDir:                "/tmp/k8s-webhook-server/serving-certs",
		CertName:               "tls.crt",
		KeyName:                "tls.key",
		MetricsBindAddress:     ":8080",
		HealthProbeBindAddress: ":8081",
	}
}

// AddFlags binds the options to flags; each flag's default is the
// option's current value.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Host, "host", o.Host, "address the webhook server binds to (empty: all)")
	fs.IntVar(&o.Port, "port", o.Port, "port the webhook server listens on")
	fs.StringVar(&o.CertDir, "cert-dir", o.CertDir, "directory holding the serving certificate and key (reloaded when they change)")
	fs.StringVar(&o.CertName, "cert-name", o.CertName, "serving certificate file name in --cert-dir")
	fs.StringVar(&o.KeyName, "key-name", o.KeyName, "serving key file name in --cert-dir")
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "webhook configuration file (YAML or JSON, kind WebhookConfiguration); empty: defaults")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, "address of the metrics endpoint; 0 disables it")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", o.HealthProbeBindAddress, "address of /healthz and /readyz; 0 disables it")
}

// Validate reports invalid options.
func (o Options) Validate() error {
	var errs []error
	if o.Port < 1 || o.Port > 65535 {
		errs = append(errs, fmt.Errorf("--port %d: must be between 1 and 65535", o.Port))
	}
	if o.CertDir == "" {
		errs = append(errs, errors.New("--cert-dir: must name the directory holding the serving certificate"))
	}
	return errors.Join(errs...)
}

// NewManager builds a controller-runtime manager serving the webhook: a
// TLS server whose certificate is watched and reloaded on rotation
// (certwatcher, through CertDir/CertName/KeyName), metadata-only caches of
// Namespaces and Jobs for the handlers, metrics and health probes. It is
// Ready once the server listens and the caches have synced.
func NewManager(cfg configv1alpha1.WebhookConfiguration, restConfig *rest.Config, opts Options) (manager.Manager, error) {
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("webhook config: %w", errs.ToAggregate())
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("build scheme: %w", err)
	}
	server := crwebhook.NewServer(crwebhook.Options{
		Host: opts.Host, Port: opts.Port,
		CertDir: opts.CertDir, CertName: opts.CertName, KeyName: opts.KeyName,
	})
	mgr, err := manager.New(restConfig, manager.Options{
		Scheme:                 scheme,
		WebhookServer:          server,
		Metrics:                metricsserver.Options{BindAddress: opts.MetricsBindAddress},
		HealthProbeBindAddress: opts.HealthProbeBindAddress,
		LeaderElection:         false, // every replica answers admission requests
	})
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	if err := Setup(mgr, cfg); err != nil {
		return nil, err
	}
	return mgr, nil
}

// Setup registers the handlers on mgr's webhook server, reading through
// mgr's cache, and adds health checks.
func Setup(mgr manager.Manager, cfg configv1alpha1.WebhookConfiguration) error {
	ctx := context.Background()
	// Asking for the informers now starts them with the manager, so the
	// first admission request does not wait for a sync.
	for _, gvk := range []metav1.GroupVersionKind{metav1.GroupVersionKind(namespaceGVK), metav1.GroupVersionKind(jobGVK)} {
		obj := &metav1.PartialObjectMetadata{}
		obj.APIVersion, obj.Kind = metav1.GroupVersion{Group: gvk.Group, Version: gvk.Version}.String(), gvk.Kind
		if _, err := mgr.GetCache().GetInformer(ctx, obj); err != nil {
			return fmt.Errorf("informer for %s: %w", gvk.Kind, err)
		}
	}
	reader := mgr.GetCache()
	server := mgr.GetWebhookServer()
	// Claims and their templates are read whole, from the API server,
	// for claim pods only: a cache would hold every claim's spec.
	server.Register(PathMutatePod, &admission.Webhook{Handler: NewPodMutator(cfg, reader).ReadClaimsWith(mgr.GetAPIReader())})
	server.Register(PathMutateJob, &admission.Webhook{Handler: NewJobMutator(cfg, reader)})
	server.Register(PathValidatePod, &admission.Webhook{Handler: NewPodValidator(cfg, reader)})

	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return fmt.Errorf("add healthz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("webhook-server", server.StartedChecker()); err != nil {
		return fmt.Errorf("add readyz check: %w", err)
	}
	if err := mgr.AddReadyzCheck("caches", cacheSynced(mgr.GetCache())); err != nil {
		return fmt.Errorf("add readyz check: %w", err)
	}
	return nil
}

func cacheSynced(c cache.Cache) healthz.Checker {
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("namespace and job caches have not synced")
		}
		return nil
	}
}

// Run serves the webhook until ctx is cancelled.
func Run(ctx context.Context, cfg configv1alpha1.WebhookConfiguration, restConfig *rest.Config, opts Options) error {
	mgr, err := NewManager(cfg, restConfig, opts)
	if err != nil {
		return err
	}
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("run webhook: %w", err)
	}
	return nil
}
