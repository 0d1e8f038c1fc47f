package extender

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/cluster"
)

// Options are the extender's per-deployment settings (flags). Decisions are
// shaped by the ExtenderConfiguration file instead.
type Options struct {
	// BindAddress is the IP the verbs and probes listen on; default all.
	BindAddress string
	// Port for the verbs, /healthz and /readyz. Default 8080; 0 picks a free
	// port (see Extender.APIAddr).
	Port int
	// MetricsBindAddress serves /metrics; "0" turns it off. Default :9090.
	MetricsBindAddress string
	// ConfigFile is an ExtenderConfiguration; empty uses the defaults.
	ConfigFile string
	// Config, when set, is used instead of ConfigFile (in-process use).
	Config *configv1alpha1.ExtenderConfiguration

	// TLSCertFile and TLSPrivateKeyFile turn on HTTPS for the verbs.
	TLSCertFile, TLSPrivateKeyFile string
	// ClientCAFile makes the verbs require a client certificate signed by
	// this CA (kube-scheduler's extender tlsConfig can present one) and
	// issued for client authentication (extended key usage clientAuth).
	ClientCAFile string
	// ClientAllowedNames, with ClientCAFile, are the subject common names
	// a client certificate may carry to call the verbs, as
	// kube-apiserver's --requestheader-allowed-names: the chart gives the
	// CN of gputopo-scheduler's certificate. Empty: any CN the CA signed.
	ClientAllowedNames []string

	// SchedulerNames are the kube-scheduler profiles that call this
	// extender; bind refuses pods addressed to any other scheduler.
	// Default [gputopo-scheduler].
	SchedulerNames []string

	// LeaderElect runs Lease-based leader election: only the holder is
	// Ready and serves.
	LeaderElect bool
	// LeaderElectionNamespace and LeaderElectionID name the Lease.
	LeaderElectionNamespace, LeaderElectionID string
	// LeaderElectionIdentity defaults to hostname_random.
	LeaderElectionIdentity string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election
	// (defaults 15s, 10s, 2s, as kube-scheduler's).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// DeciderLeaseNamespace and DeciderLeaseName name the cluster-wide
	// Lease the deciding replica must hold to decide GPU pods (one gputopo
	// scheduler per GPU resource per cluster, decider.go). Defaults
	// kube-system and DeciderLeaseName(resource). Two schedulers on
	// disjoint GPU nodes may use different names; sharing nodes, they
	// must not.
	DeciderLeaseNamespace, DeciderLeaseName string

	// ShadowURL, when set, mirrors every sampled filter and prioritize
	// request, with this extender's answer, to an extender running with
	// Shadow, in the background (see docs/rollout.md).
	ShadowURL string
	// ShadowSampleRate is the fraction of pods (by UID) mirrored, 0..1.
	// Default 1.
	ShadowSampleRate float64
	// ShadowTimeout bounds one mirrored request. Default 2s.
	ShadowTimeout time.Duration
	// ShadowCAFile verifies an https ShadowURL; empty uses the system
	// roots.
	ShadowCAFile string

	// Shadow makes this extender compare mirrored decisions with its own
	// and never bind.
	Shadow bool

	// ShadowLogSampleRate is the fraction of pods (by UID) whose differing
	// decisions are logged, 0..1; metrics count all. Default 0.1.
	ShadowLogSampleRate float64

	// KubeAPIQPS and KubeAPIBurst bound the client's requests to the API
	// server (Bindings, pod reads, events, the Lease). Default 50 and 100,
	// as kube-scheduler's clientConnection: client-go's own 5 and 10 are
	// too few for a bind per pod in a burst, and a bind that waits on the
	// client's rate limiter past bindTimeout fails. 0 keeps the rest
	// config's values (the in-process build uses kube-scheduler's).
	KubeAPIQPS   float32
	KubeAPIBurst int
}

// Option defaults.
const (
	DefaultPort                    = 8080
	DefaultMetricsBindAddress      = ":9090"
	DefaultLeaderElectionNamespace = "gputopo-system"
	DefaultLeaderElectionID        = "gputopo-extender"
	DefaultKubeAPIQPS              = 50
	DefaultKubeAPIBurst            = 100
)

// NewOptions returns the defaults.
func NewOptions() Options {
	o := Options{Port: DefaultPort, MetricsBindAddress: DefaultMetricsBindAddress, ShadowSampleRate: 1, ShadowLogSampleRate: 0.1,
		KubeAPIQPS: DefaultKubeAPIQPS, KubeAPIBurst: DefaultKubeAPIBurst}
	o.setDefaults()
	return o
}

func (o *Options) setDefaults() {
	if len(o.SchedulerNames) == 0 {
		o.SchedulerNames = []string{v1alpha1.DefaultSchedulerName}
	}
	if o.LeaderElectionNamespace == "" {
		o.LeaderElectionNamespace = DefaultLeaderElectionNamespace
	}
	if o.LeaderElectionID == "" {
		o.LeaderElectionID = DefaultLeaderElectionID
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = 10 * time.Second
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = 2 * time.Second
	}
	if o.ShadowTimeout == 0 {
		o.ShadowTimeout = 2 * time.Second
	}
	if o.DeciderLeaseNamespace == "" {
		o.DeciderLeaseNamespace = cluster.DefaultDeciderLeaseNamespace
	}
}

// AddFlags registers the options' flags, with the current values as
// defaults (call on NewOptions()).
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.BindAddress, "bind-address", o.BindAddress, "IP address for the verbs, /healthz and /readyz (empty: all interfaces)")
	fs.IntVar(&o.Port, "port", o.Port, "port for /filter, /prioritize, /bind (also under /scheduler/), /healthz and /readyz")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", o.MetricsBindAddress, `address for /metrics; "0" turns it off`)
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "path of an ExtenderConfiguration (config.gputopo.io/v1alpha1); empty uses the documented defaults")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", o.TLSCertFile, "serving certificate (PEM); with --tls-private-key-file turns on HTTPS, reloaded when the file changes")
	fs.StringVar(&o.TLSPrivateKeyFile, "tls-private-key-file", o.TLSPrivateKeyFile, "serving private key (PEM)")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", o.ClientCAFile, "CA bundle (PEM); when set the verbs require a client certificate it signed for client authentication (extended key usage clientAuth; probes need none)")
	fs.StringSliceVar(&o.ClientAllowedNames, "client-allowed-names", o.ClientAllowedNames, "with --client-ca-file: subject common names (comma-separated) a client certificate may carry to call the verbs; empty allows any the CA signed")
	fs.StringSliceVar(&o.SchedulerNames, "scheduler-name", o.SchedulerNames, "kube-scheduler profile that calls this extender (repeatable); bind refuses pods whose schedulerName is not one of them")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "run Lease-based leader election; only the leader is Ready and serves")
	fs.StringVar(&o.LeaderElectionNamespace, "leader-election-namespace", o.LeaderElectionNamespace, "namespace of the leader election Lease")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", o.LeaderElectionID, "name of the leader election Lease")
	fs.DurationVar(&o.LeaseDuration, "leader-elect-lease-duration", o.LeaseDuration, "how long a standby waits before taking an unrenewed Lease")
	fs.DurationVar(&o.RenewDeadline, "leader-elect-renew-deadline", o.RenewDeadline, "how long the leader retries renewing before it stops serving")
	fs.DurationVar(&o.RetryPeriod, "leader-elect-retry-period", o.RetryPeriod, "interval between leader election attempts")
	fs.StringVar(&o.DeciderLeaseNamespace, "decider-lease-namespace", o.DeciderLeaseNamespace, "namespace of the cluster-wide Lease the deciding replica holds: one gputopo scheduler decides a GPU resource per cluster")
	fs.StringVar(&o.DeciderLeaseName, "decider-lease-name", o.DeciderLeaseName, "name of the decider Lease; empty: gputopo-decider-<resource with / as ->; only schedulers whose GPU nodes are disjoint may use different names")
	fs.StringVar(&o.ShadowURL, "shadow-url", o.ShadowURL, "base URL of an extender running with --shadow; sampled filter and prioritize requests and their answers are mirrored there in the background, never delaying scheduling")
	fs.Float64Var(&o.ShadowSampleRate, "shadow-sample-rate", o.ShadowSampleRate, "fraction of pods (by UID, 0..1) whose requests are mirrored to --shadow-url")
	fs.DurationVar(&o.ShadowTimeout, "shadow-timeout", o.ShadowTimeout, "timeout of one mirrored request")
	fs.StringVar(&o.ShadowCAFile, "shadow-ca-file", o.ShadowCAFile, "CA bundle (PEM) to verify an https --shadow-url; empty uses the system roots")
	fs.BoolVar(&o.Shadow, "shadow", o.Shadow, "run as a shadow: take mirrored decisions at POST /shadow, compare them with this extender's own, export the differences (metrics, log, GET /shadow/decisions) and never bind")
	fs.Float32Var(&o.KubeAPIQPS, "kube-api-qps", o.KubeAPIQPS, "queries per second to the API server (Bindings, pod reads, events); 0 keeps the kubeconfig's")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", o.KubeAPIBurst, "burst of requests to the API server above --kube-api-qps; 0 keeps the kubeconfig's")
	fs.Float64Var(&o.ShadowLogSampleRate, "shadow-log-sample-rate", o.ShadowLogSampleRate, "with --shadow: fraction of pods (by UID, 0..1) whose differing decisions are logged; metrics count every one")
}

// Validate checks flag combinations.
func (o *Options) Validate() error {
	if (o.TLSCertFile == "") != (o.TLSPrivateKeyFile == "") {
		return fmt.Errorf("--tls-cert-file and --tls-private-key-file must be given together")
	}
	if o.ClientCAFile != "" && o.TLSCertFile == "" {
		return fmt.Errorf("--client-ca-file needs --tls-cert-file and --tls-private-key-file: client certificates only exist over TLS")
	}
	if len(o.ClientAllowedNames) > 0 && o.ClientCAFile == "" {
		return fmt.Errorf("--client-allowed-names needs --client-ca-file: names are read from verified client certificates")
	}
	for _, n := range o.ClientAllowedNames {
		if strings.TrimSpace(n) == "" {
			return fmt.Errorf("--client-allowed-names %q: a name is empty", strings.Join(o.ClientAllowedNames, ","))
		}
	}
	if o.DeciderLeaseName != "" {
		if err := cluster.ValidDeciderLeaseName(o.DeciderLeaseName); err != nil {
			return err
		}
	}
	if msgs := validation.IsDNS1123Label(o.DeciderLeaseNamespace); o.DeciderLeaseNamespace != "" && len(msgs) > 0 {
		return fmt.Errorf("--decider-lease-namespace %q: %s", o.DeciderLeaseNamespace, strings.Join(msgs, "; "))
	}
	if o.Port < 0 || o.Port > 65535 {
		return fmt.Errorf("--port %d: must be 0..65535", o.Port)
	}
	if o.ShadowSampleRate < 0 || o.ShadowSampleRate > 1 {
		return fmt.Errorf("--shadow-sample-rate %g: must be between 0 and 1", o.ShadowSampleRate)
	}
	if o.ShadowLogSampleRate < 0 || o.ShadowLogSampleRate > 1 {
		return fmt.Errorf("--shadow-log-sample-rate %g: must be between 0 and 1", o.ShadowLogSampleRate)
	}
	if o.KubeAPIQPS < 0 {
		return fmt.Errorf("--kube-api-qps %g: must be 0 (the kubeconfig's) or positive", o.KubeAPIQPS)
	}
	if o.KubeAPIBurst < 0 {
		return fmt.Errorf("--kube-api-burst %d: must be 0 (the kubeconfig's) or positive", o.KubeAPIBurst)
	}
	if o.ShadowTimeout < 0 {
		return fmt.Errorf("--shadow-timeout %s: must be positive", o.ShadowTimeout)
	}
	if o.Shadow && o.ShadowURL != "" {
		return fmt.Errorf("--shadow and --shadow-url exclude each other: a shadow does not mirror further")
	}
	if o.Shadow && o.LeaderElect {
		return fmt.Errorf("--shadow and --leader-elect exclude each other: a shadow never binds, so every replica may answer")
	}
	if o.ShadowCAFile != "" && o.ShadowURL == "" {
		return fmt.Errorf("--shadow-ca-file needs --shadow-url")
	}
	if o.LeaderElect && o.RenewDeadline >= o.LeaseDuration {
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be shorter than --leader-elect-lease-duration (%s)", o.RenewDeadline, o.LeaseDuration)
	}
	return nil
}

// Run builds and runs the extender until ctx ends (nil) or it fails,
// including losing the Lease (ErrLeadershipLost).
func Run(ctx context.Context, restCfg *rest.Config, o Options) error {
	o.setDefaults()
	if err := o.Validate(); err != nil {
		return err
	}
	x, err := New(restCfg, o)
	if err != nil {
		return err
	}
	return x.Start(ctx)
}

// coreOptions are the decision core's settings of these options.
func (o *Options) coreOptions(cfg *configv1alpha1.ExtenderConfiguration, obs placement.Observer) cluster.Options {
	return cluster.Options{
		Core:                  placement.Options{Config: cfg, SchedulerNames: o.SchedulerNames, Observer: obs},
		Mode:                  "extender",
		Identity:              o.LeaderElectionIdentity,
		LeaseDuration:         o.LeaseDuration,
		RenewDeadline:         o.RenewDeadline,
		RetryPeriod:           o.RetryPeriod,
		DeciderLeaseNamespace: o.DeciderLeaseNamespace,
		DeciderLeaseName:      o.DeciderLeaseName,
		DecidesNothing:        o.Shadow,
	}
}
