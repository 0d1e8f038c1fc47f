//go:build integration

package chart

import (
	"net/url"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gputopo/gputopo/test/harness"
)

// secretFile says which Secret and key the file at p of container ctr
// reads: the Secret volume mounted at p's directory. ok is false when p is
// not in a mounted Secret.
func secretFile(spec corev1.PodSpec, ctr corev1.Container, p string) (secret, key string, ok bool) {
	for _, m := range ctr.VolumeMounts {
		if m.MountPath != path.Dir(p) || m.SubPath != "" {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				return v.Secret.SecretName, path.Base(p), true
			}
		}
	}
	return "", "", false
}

// certificateSpec reads the parts of a rendered cert-manager Certificate
// that a CA signs from, as the harness issues them.
func certificateSpec(t testing.TB, objs []*unstructured.Unstructured, name string) (secretName string, spec harness.LeafSpec, issuer map[string]string) {
	t.Helper()
	c := find(t, objs, "Certificate", name)
	secretName, _, _ = unstructured.NestedString(c.Object, "spec", "secretName")
	spec.CommonName, _, _ = unstructured.NestedString(c.Object, "spec", "commonName")
	spec.DNSNames, _, _ = unstructured.NestedStringSlice(c.Object, "spec", "dnsNames")
	spec.Usages, _, _ = unstructured.NestedStringSlice(c.Object, "spec", "usages")
	issuer, _, _ = unstructured.NestedStringMap(c.Object, "spec", "issuerRef")
	return secretName, spec, issuer
}

// checkExtenderTLS: with extender.tls.enabled, every file the extender,
// the shadow and kube-scheduler are told to read is a key of the Secret
// of the right Certificate; the scheduler calls a URL whose host the
// extender's certificate names, presents a client certificate and checks
// the extender against the CA of its own Secret; the extender demands a
// client certificate of that CA; probes speak HTTPS. Without it nothing
// of this is rendered and everything speaks plain HTTP.
func checkExtenderTLS(t *testing.T, r release, w want, objs []*unstructured.Unstructured) {
	fn := r.fullname()
	var ext, sched appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-extender"), &ext)
	into(t, find(t, objs, "Deployment", fn+"-scheduler"), &sched)
	extCtr := ext.Spec.Template.Spec.Containers[0]
	opts := extenderOptions(t, "serving extender", extCtr.Args)
	schedCfg, err := harness.ParseSchedulerConfig(configData(t, objs, fn+"-scheduler", "config.yaml"))
	if err != nil {
		t.Fatalf("scheduler ConfigMap: %v", err)
	}
	schedExt := schedCfg.Extenders[0]
	wantScheme := strings.ToUpper(scheme(w))
	for _, p := range []*corev1.Probe{extCtr.ReadinessProbe, extCtr.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || string(p.HTTPGet.Scheme) != wantScheme {
			t.Errorf("extender probe %s, want scheme %s", mustYAML(p), wantScheme)
		}
	}

	if !w.tls {
		for _, name := range []string{fn + "-extender", fn + "-scheduler-client"} {
			if slices.ContainsFunc(ofKind(objs, "Certificate"), func(u *unstructured.Unstructured) bool { return u.GetName() == name }) {
				t.Errorf("extender.tls.enabled is false, yet Certificate %s is rendered", name)
			}
		}
		if opts.TLSCertFile != "" || opts.ClientCAFile != "" || opts.ShadowCAFile != "" {
			t.Errorf("extender.tls.enabled is false, yet the extender args %q turn on TLS", extCtr.Args)
		}
		if schedExt.EnableHTTPS || schedExt.TLSConfig != nil || !strings.HasPrefix(schedExt.URLPrefix, "http://") {
			t.Errorf("extender.tls.enabled is false, yet the scheduler calls %s (enableHTTPS %v, tlsConfig %s)", schedExt.URLPrefix, schedExt.EnableHTTPS, mustYAML(schedExt.TLSConfig))
		}
		return
	}

	servingSecret, serving, servingIssuer := certificateSpec(t, objs, fn+"-extender")
	clientSecret, client, clientIssuer := certificateSpec(t, objs, fn+"-scheduler-client")
	wantIssuer := map[string]string{"name": w.issuerName, "kind": w.issuerKind, "group": "cert-manager.io"}
	for what, got := range map[string]map[string]string{"extender serving": servingIssuer, "scheduler client": clientIssuer} {
		if diff := cmp.Diff(wantIssuer, got); diff != "" {
			t.Errorf("%s certificate issuerRef (-want +got):\n%s", what, diff)
		}
	}
	if !slices.Contains(serving.Usages, "server auth") || slices.Contains(serving.Usages, "client auth") {
		t.Errorf("extender certificate usages %q, want server auth only", serving.Usages)
	}
	if !slices.Contains(client.Usages, "client auth") || slices.Contains(client.Usages, "server auth") {
		t.Errorf("scheduler certificate usages %q, want client auth only", client.Usages)
	}
	// The extender lets in the scheduler's certificate by its CN, and no
	// other name the CA might sign.
	if client.CommonName == "" || !slices.Equal(opts.ClientAllowedNames, []string{client.CommonName}) {
		t.Errorf("extender --client-allowed-names %q, want exactly the scheduler certificate's commonName %q", opts.ClientAllowedNames, client.CommonName)
	}
	wantDNS := serviceDNSNames(fn+"-extender", r.namespace)
	if w.shadow {
		wantDNS = append(wantDNS, serviceDNSNames(fn+"-extender-shadow", r.namespace)...)
	}
	if diff := cmp.Diff(wantDNS, serving.DNSNames); diff != "" {
		t.Errorf("extender certificate dnsNames (-want +got):\n%s", diff)
	}

	// The extender serves its Secret's pair and takes its ca.crt as the
	// client CA.
	for flag, want := range map[string][2]string{
		"--tls-cert-file":        {opts.TLSCertFile, "tls.crt"},
		"--tls-private-key-file": {opts.TLSPrivateKeyFile, "tls.key"},
		"--client-ca-file":       {opts.ClientCAFile, "ca.crt"},
	} {
		if s, k, ok := secretFile(ext.Spec.Template.Spec, extCtr, want[0]); !ok || s != servingSecret || k != want[1] {
			t.Errorf("extender %s=%q reads Secret %q key %q, want %s of Secret %s", flag, want[0], s, k, want[1], servingSecret)
		}
	}

	// The scheduler calls https://<a name of the certificate>, presents
	// its client Secret's pair and trusts that Secret's CA.
	u, err := url.Parse(schedExt.URLPrefix)
	if err != nil || u.Scheme != "https" || !slices.Contains(serving.DNSNames, u.Hostname()) || !schedExt.EnableHTTPS {
		t.Errorf("scheduler calls %q (enableHTTPS %v); want https to a DNS name of the extender certificate %q", schedExt.URLPrefix, schedExt.EnableHTTPS, serving.DNSNames)
	}
	tc := schedExt.TLSConfig
	if tc == nil || tc.Insecure || tc.ServerName != "" || len(tc.CertData)+len(tc.KeyData)+len(tc.CAData) != 0 {
		t.Fatalf("scheduler tlsConfig = %s; want files of the client Secret, verification on", mustYAML(tc))
	}
	schedCtr := sched.Spec.Template.Spec.Containers[0]
	for field, want := range map[string][2]string{"certFile": {tc.CertFile, "tls.crt"}, "keyFile": {tc.KeyFile, "tls.key"}, "caFile": {tc.CAFile, "ca.crt"}} {
		if s, k, ok := secretFile(sched.Spec.Template.Spec, schedCtr, want[0]); !ok || s != clientSecret || k != want[1] {
			t.Errorf("scheduler tlsConfig.%s=%q reads Secret %q key %q, want %s of Secret %s", field, want[0], s, k, want[1], clientSecret)
		}
	}

	if !w.shadow {
		return
	}
	// The serving extender mirrors over https to a name of the same
	// certificate, verified with the Secret's CA; the shadow serves that
	// certificate.
	su, err := url.Parse(opts.ShadowURL)
	if err != nil || su.Scheme != "https" || !slices.Contains(serving.DNSNames, su.Hostname()) {
		t.Errorf("serving extender mirrors to %q; want https to a DNS name of the extender certificate", opts.ShadowURL)
	}
	if s, k, ok := secretFile(ext.Spec.Template.Spec, extCtr, opts.ShadowCAFile); !ok || s != servingSecret || k != "ca.crt" {
		t.Errorf("serving extender --shadow-ca-file=%q reads Secret %q key %q, want ca.crt of %s", opts.ShadowCAFile, s, k, servingSecret)
	}
	var shadow appsv1.Deployment
	into(t, find(t, objs, "Deployment", fn+"-extender-shadow"), &shadow)
	shCtr := shadow.Spec.Template.Spec.Containers[0]
	shOpts := extenderOptions(t, "shadow extender", shCtr.Args)
	for flag, want := range map[string][2]string{"--tls-cert-file": {shOpts.TLSCertFile, "tls.crt"}, "--tls-private-key-file": {shOpts.TLSPrivateKeyFile, "tls.key"}} {
		if s, k, ok := secretFile(shadow.Spec.Template.Spec, shCtr, want[0]); !ok || s != servingSecret || k != want[1] {
			t.Errorf("shadow %s=%q reads Secret %q key %q, want %s of Secret %s", flag, want[0], s, k, want[1], servingSecret)
		}
	}
	if p := shCtr.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("shadow readiness probe %s, want HTTPS", mustYAML(p))
	}
}

// serviceDNSNames are the four names a Service is reached by.
func serviceDNSNames(svc, ns string) []string {
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}
