//go:build integration

package e2e

import (
	"bytes"
	"context"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/webhook"
)

// newServingCert returns a fresh CA and a serving certificate it signed
// for the loopback addresses, all PEM, and the certificate's DER.
func newServingCert(t *testing.T) (caPEM, certPEM, keyPEM []byte, leaf []byte) {
	t.Helper()
	ca := harness.NewCA(t, "gputopo-e2e-rotated-ca")
	certPEM, keyPEM = ca.Issue(t, harness.LeafSpec{
		CommonName: "gputopo-webhook", DNSNames: []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}, Usages: []string{"server auth"},
	})
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("issued certificate is not PEM")
	}
	return ca.PEM, certPEM, keyPEM, block.Bytes
}

// setCABundle sets the caBundle of every gputopo webhook, as cert-manager's
// CA injector does.
func (e *env) setCABundle(t *testing.T, bundle []byte) {
	t.Helper()
	ctx := context.Background()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m := &admissionregistrationv1.MutatingWebhookConfigurationList{}
		if err := e.cp.Client.List(ctx, m); err != nil {
			return err
		}
		for i := range m.Items {
			for j := range m.Items[i].Webhooks {
				m.Items[i].Webhooks[j].ClientConfig.CABundle = bundle
			}
			if err := e.cp.Client.Update(ctx, &m.Items[i]); err != nil {
				return err
			}
		}
		v := &admissionregistrationv1.ValidatingWebhookConfigurationList{}
		if err := e.cp.Client.List(ctx, v); err != nil {
			return err
		}
		for i := range v.Items {
			for j := range v.Items[i].Webhooks {
				v.Items[i].Webhooks[j].ClientConfig.CABundle = bundle
			}
			if err := e.cp.Client.Update(ctx, &v.Items[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("set webhook caBundle: %v", err)
	}
}

// certReplaced rotates the webhook's serving certificate to one from a
// new CA, the way cert-manager does: the new CA joins the bundle, the
// Secret's files change under the running server, the old CA leaves.
// The server must pick the new files up without a restart and the
// apiserver must keep reaching it.
func (e *env) certReplaced(t *testing.T, _ *corev1.Pod) {
	ctx := context.Background()
	wio := e.cp.Env.WebhookInstallOptions
	caPEM, certPEM, keyPEM, leaf := newServingCert(t)
	e.setCABundle(t, append(append([]byte(nil), wio.LocalServingCAData...), caPEM...))
	dir := wio.LocalServingCertDir
	for name, b := range map[string][]byte{"tls.key": keyPEM, "tls.crt": certPEM} {
		tmp := filepath.Join(dir, "."+name+".new")
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("injected: serving certificate and key in %s replaced by ones from a new CA (bundle: old and new CA)", dir)
	harness.Poll(t, time.Minute, "the webhook to serve the new certificate", func() (bool, string) {
		got, err := e.servedCert()
		if err != nil {
			return false, err.Error()
		}
		return bytes.Equal(got, leaf), "still the old certificate"
	})
	t.Logf("checked: the running webhook serves the new certificate")

	e.setCABundle(t, caPEM)
	t.Logf("injected: the old CA removed from the bundle")
	harness.Poll(t, time.Minute, "the apiserver to reach the webhook with only the new CA", func() (bool, string) {
		probe := gpuPod(nsTeam, "after-rotation", 1)
		if err := e.cp.Client.Create(ctx, probe, client.DryRunAll); err != nil {
			return false, err.Error()
		}
		return probe.Spec.SchedulerName == v1alpha1.DefaultSchedulerName, "not mutated"
	})
	spoof := gpuPod(nsTeam, "spoof-after-rotation", 1)
	spoof.Annotations = map[string]string{v1alpha1.AnnotationAssignedGPUs: e.sim.UUIDs()[0]}
	denied(t, "assigned-gpus after the rotation", e.cp.Client.Create(ctx, spoof, client.DryRunAll), protectedAssigned, webhook.WebhookValidatePod)
	t.Logf("checked: pods are mutated and validated through the new certificate")
}
