package extender

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
)

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(o *Options)
		wantErr string
	}{
		{"defaults are valid", func(*Options) {}, ""},
		{"cert without key", func(o *Options) { o.TLSCertFile = "c.pem" }, "must be given together"},
		{"client CA without TLS", func(o *Options) { o.ClientCAFile = "ca.pem" }, "needs --tls-cert-file"},
		{"allowed client names without a client CA", func(o *Options) {
			o.TLSCertFile, o.TLSPrivateKeyFile, o.ClientAllowedNames = "c.pem", "k.pem", []string{"gputopo-scheduler"}
		}, "--client-allowed-names needs --client-ca-file"},
		{"an empty allowed client name", func(o *Options) {
			o.TLSCertFile, o.TLSPrivateKeyFile, o.ClientCAFile, o.ClientAllowedNames = "c.pem", "k.pem", "ca.pem", []string{"gputopo-scheduler", ""}
		}, "a name is empty"},
		{"allowed client names with a client CA", func(o *Options) {
			o.TLSCertFile, o.TLSPrivateKeyFile, o.ClientCAFile, o.ClientAllowedNames = "c.pem", "k.pem", "ca.pem", []string{"gputopo-scheduler"}
		}, ""},
		{"renew deadline not below lease", func(o *Options) { o.LeaderElect, o.RenewDeadline = true, 20*time.Second }, "must be shorter"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			tc.mutate(&o)
			err := o.Validate()
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestKubeAPIRateLimits(t *testing.T) {
	o := NewOptions()
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	o.AddFlags(fs)
	if o.KubeAPIQPS != DefaultKubeAPIQPS || o.KubeAPIBurst != DefaultKubeAPIBurst {
		t.Fatalf("defaults qps %g burst %d, want %d and %d", o.KubeAPIQPS, o.KubeAPIBurst, DefaultKubeAPIQPS, DefaultKubeAPIBurst)
	}
	if err := fs.Parse([]string{"--kube-api-qps=200", "--kube-api-burst=400"}); err != nil {
		t.Fatal(err)
	}
	base := &rest.Config{Host: "https://api", QPS: 5, Burst: 10}
	got := withRateLimits(base, o)
	if got.QPS != 200 || got.Burst != 400 {
		t.Errorf("with flags: qps %g burst %d, want 200 and 400", got.QPS, got.Burst)
	}
	if base.QPS != 5 || base.Burst != 10 || got == base {
		t.Errorf("withRateLimits changed the caller's config: qps %g burst %d", base.QPS, base.Burst)
	}
	o.KubeAPIQPS, o.KubeAPIBurst = 0, 0
	if got := withRateLimits(base, o); got.QPS != 5 || got.Burst != 10 {
		t.Errorf("0 must keep the config's limits: qps %g burst %d", got.QPS, got.Burst)
	}
	for _, bad := range []func(*Options){func(o *Options) { o.KubeAPIQPS = -1 }, func(o *Options) { o.KubeAPIBurst = -1 }} {
		o := NewOptions()
		bad(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--kube-api-") {
			t.Errorf("Validate of a negative limit = %v, want an error naming the flag", err)
		}
	}
}
