package webhook

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

func TestOptionsFlags(t *testing.T) {
	o := DefaultOptions()
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--port=10250", "--cert-dir=/certs", "--config=/etc/gputopo/webhook.yaml", "--metrics-bind-address=0", "--health-probe-bind-address=:9000"}); err != nil {
		t.Fatal(err)
	}
	want := DefaultOptions()
	want.Port, want.CertDir, want.ConfigFile, want.MetricsBindAddress, want.HealthProbeBindAddress = 10250, "/certs", "/etc/gputopo/webhook.yaml", "0", ":9000"
	if diff := cmp.Diff(want, o); diff != "" {
		t.Errorf("options (-want +got):\n%s", diff)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("valid options: %v", err)
	}
	o.Port = 0
	if err := o.Validate(); err == nil {
		t.Error("port 0 accepted")
	}
}
