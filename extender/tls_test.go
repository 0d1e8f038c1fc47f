package extender

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

var serial int64 = 100

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue signs a leaf certificate for cn: a serving certificate for
// 127.0.0.1 when server is true, else a client certificate. It returns the
// certificate and key as PEM, and the certificate's serial number.
func (ca *testCA) issue(t *testing.T, cn string, server bool) (certPEM, keyPEM []byte, sn int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), serial
}

// issueClient signs a client certificate for cn that lists exactly ekus
// as its extended key usages (none when empty), as a CA that is careless
// with usages might.
func (ca *testCA) issueClient(t *testing.T, cn string, ekus ...x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  ekus,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, path string, data []byte, mtime time.Time) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// An explicit modification time: two writes within the file system's
	// timestamp granularity must still look different to the reloader.
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
}

// serveTLS runs the extender's verbs on its own TLS listener (listenAPI,
// as Start does) on a free loopback port and returns the address.
func serveTLS(t *testing.T, x *Extender) string {
	t.Helper()
	x.opts.BindAddress, x.opts.Port = "127.0.0.1", 0
	ln, err := x.listenAPI()
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := &http.Server{Handler: x.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// tlsClient trusts ca and presents cert/key when given, even when the
// server's list of acceptable CAs does not name its issuer (Go's client
// would otherwise send none). Each request uses a new connection, so a
// handshake sees the server's current certificate.
func tlsClient(t *testing.T, ca *testCA, certPEM, keyPEM []byte) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if certPEM != nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	tr := &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// TestTLSClientCertificates: with --client-ca-file the verbs need a client
// certificate signed by that CA; the probes answer without one (kubelet
// presents none); a certificate from another CA fails the handshake.
func TestTLSClientCertificates(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "gputopo test CA")
	other := newTestCA(t, "someone else's CA")
	srvCert, srvKey, _ := ca.issue(t, "gputopo-extender", true)
	cliCert, cliKey, _ := ca.issue(t, "kube-scheduler", false)
	strangerCert, strangerKey, _ := other.issue(t, "kube-scheduler", false)
	now := time.Now()
	for name, data := range map[string][]byte{"tls.crt": srvCert, "tls.key": srvKey, "ca.crt": ca.pem} {
		writeFile(t, filepath.Join(dir, name), data, now)
	}

	x, _ := newTestExtender(t, nil)
	x.opts.TLSCertFile, x.opts.TLSPrivateKeyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	x.opts.ClientCAFile = filepath.Join(dir, "ca.crt")
	base := "https://" + serveTLS(t, x)
	body := mustJSON(t, extenderv1.ExtenderArgs{Pod: makePod("p").obj(), NodeNames: &[]string{"a"}})

	type result struct {
		Status int    // 0: the request failed before an HTTP answer
		Body   string // a substring of the answer or of the error
	}
	do := func(c *http.Client, method, path string) result {
		var resp *http.Response
		var err error
		if method == http.MethodPost {
			resp, err = c.Post(base+path, "application/json", strings.NewReader(body))
		} else {
			resp, err = c.Get(base + path)
		}
		if err != nil {
			return result{Body: err.Error()}
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return result{Status: resp.StatusCode, Body: string(b)}
	}
	withCert := tlsClient(t, ca, cliCert, cliKey)
	withoutCert := tlsClient(t, ca, nil, nil)
	stranger := tlsClient(t, ca, strangerCert, strangerKey)

	for _, tc := range []struct {
		name       string
		client     *http.Client
		method     string
		path       string
		wantStatus int
		wantBody   string
	}{
		{"filter with a client certificate", withCert, http.MethodPost, "/filter", 200, `"NodeNames":["a"]`},
		{"prioritize with a client certificate", withCert, http.MethodPost, "/scheduler/prioritize", 200, `"Host":"a"`},
		{"filter without a client certificate", withoutCert, http.MethodPost, "/filter", 401, "client certificate signed by the configured client CA is required"},
		{"bind without a client certificate", withoutCert, http.MethodPost, "/scheduler/bind", 401, "client certificate"},
		{"preempt without a client certificate", withoutCert, http.MethodPost, "/scheduler/preempt", 401, "client certificate"},
		{"healthz without a client certificate", withoutCert, http.MethodGet, "/healthz", 200, "ok"},
		{"readyz without a client certificate", withoutCert, http.MethodGet, "/readyz", 200, "ok"},
		// Refused in the handshake: no HTTP answer. With TLS 1.3 the
		// client learns it as a bad-certificate alert or as a broken
		// connection when it writes the request.
		{"filter with a certificate of another CA", stranger, http.MethodPost, "/filter", 0, ""},
		{"healthz with a certificate of another CA", stranger, http.MethodGet, "/healthz", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := do(tc.client, tc.method, tc.path)
			if got.Status != tc.wantStatus || !strings.Contains(got.Body, tc.wantBody) {
				t.Errorf("%s %s = %d %q; want %d containing %q", tc.method, tc.path, got.Status, got.Body, tc.wantStatus, tc.wantBody)
			}
		})
	}

	// Plain HTTP on the TLS port gets no verb served.
	resp, err := http.Post("http://"+strings.TrimPrefix(base, "https://")+"/filter", "application/json", strings.NewReader(body))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP filter on the TLS port = 200 %s, want refused", b)
		}
	}
}

// TestTLSClientCertificateUsageAndName: a certificate of the client CA
// calls the verbs only when it is a client certificate (extended key
// usage clientAuth listed) and, with --client-allowed-names, carries an
// allowed common name. Go's handshake alone refuses a leaf whose usages
// exclude client auth, but lets through one with no extended key usage
// or with "any"; the verbs refuse those with 401. A CN not allowed gets
// 403 naming the allowed ones. Every refusal is counted.
func TestTLSClientCertificateUsageAndName(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "gputopo test CA")
	srvCert, srvKey, _ := ca.issue(t, "gputopo-extender", true)
	now := time.Now()
	for name, data := range map[string][]byte{"tls.crt": srvCert, "tls.key": srvKey, "ca.crt": ca.pem} {
		writeFile(t, filepath.Join(dir, name), data, now)
	}
	body := mustJSON(t, extenderv1.ExtenderArgs{Pod: makePod("p").obj(), NodeNames: &[]string{"a"}})
	bind := mustJSON(t, extenderv1.ExtenderBindingArgs{PodName: "p", PodNamespace: "default", PodUID: "uid-p", Node: "a"})
	client := func(ekus ...x509.ExtKeyUsage) func(cn string) *http.Client {
		return func(cn string) *http.Client {
			c, k := ca.issueClient(t, cn, ekus...)
			return tlsClient(t, ca, c, k)
		}
	}
	clientAuth := client(x509.ExtKeyUsageClientAuth)
	noEKU := client()
	anyEKU := client(x509.ExtKeyUsageAny)
	serverOnly := client(x509.ExtKeyUsageServerAuth)
	both := client(x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)

	for _, tc := range []struct {
		name       string
		allowed    []string
		client     *http.Client
		path, body string
		wantStatus int    // 0: refused in the handshake
		wantBody   string // substring of the answer
		wantCount  string // error_type counted, "" none
	}{
		{"client auth, no allowed names: filter", nil, clientAuth("anyone"), "/filter", body, 200, `"NodeNames":["a"]`, ""},
		{"no extended key usage: filter", nil, noEKU("gputopo-scheduler"), "/filter", body, 401, "does not list the extended key usage client auth", "unauthorized"},
		{"no extended key usage: bind", nil, noEKU("gputopo-scheduler"), "/scheduler/bind", bind, 401, "client auth (clientAuth)", "unauthorized"},
		{"extended key usage any: filter", nil, anyEKU("gputopo-scheduler"), "/scheduler/filter", body, 401, "client auth", "unauthorized"},
		{"server auth only: refused by the handshake", nil, serverOnly("gputopo-scheduler"), "/filter", body, 0, "", ""},
		{"allowed CN: filter", []string{"gputopo-scheduler"}, clientAuth("gputopo-scheduler"), "/scheduler/filter", body, 200, `"NodeNames":["a"]`, ""},
		{"allowed CN with server auth too: prioritize", []string{"gputopo-scheduler"}, both("gputopo-scheduler"), "/prioritize", body, 200, `"Host":"a"`, ""},
		{"second allowed CN: filter", []string{"gputopo-scheduler", "other-scheduler"}, clientAuth("other-scheduler"), "/filter", body, 200, `"NodeNames":["a"]`, ""},
		{"CN not allowed: filter", []string{"gputopo-scheduler"}, clientAuth("kube-scheduler"), "/filter", body, 403, `CN "kube-scheduler" is not allowed to call the verbs; --client-allowed-names allows "gputopo-scheduler"`, "forbidden"},
		{"CN not allowed: bind", []string{"gputopo-scheduler", "b"}, clientAuth("intruder"), "/scheduler/bind", bind, 403, `allows "gputopo-scheduler", "b"`, "forbidden"},
		{"allowed CN without client auth: bind", []string{"gputopo-scheduler"}, noEKU("gputopo-scheduler"), "/bind", bind, 401, "client auth", "unauthorized"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, _ := newTestExtender(t, nil)
			x.opts.TLSCertFile, x.opts.TLSPrivateKeyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
			x.opts.ClientCAFile, x.opts.ClientAllowedNames = filepath.Join(dir, "ca.crt"), tc.allowed
			base := "https://" + serveTLS(t, x)
			resp, err := tc.client.Post(base+tc.path, "application/json", strings.NewReader(tc.body))
			status, got := 0, ""
			if err != nil {
				got = err.Error()
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				status, got = resp.StatusCode, string(b)
				var refusal struct{ Error string }
				if status != http.StatusOK && json.Unmarshal(b, &refusal) == nil {
					got = refusal.Error
				}
			}
			if status != tc.wantStatus || !strings.Contains(got, tc.wantBody) {
				t.Fatalf("POST %s = %d %q; want %d containing %q", tc.path, status, got, tc.wantStatus, tc.wantBody)
			}
			if tc.wantCount == "" {
				return
			}
			phase := strings.TrimPrefix(strings.TrimPrefix(tc.path, "/scheduler"), "/")
			if n := metricValue(t, x, "gputopo_extender_errors_total", "phase", phase, "error_type", tc.wantCount); n != 1 {
				t.Errorf("gputopo_extender_errors_total{phase=%q,error_type=%q} = %v, want 1", phase, tc.wantCount, n)
			}
		})
	}
}

// TestTLSCertificateReload: a serving certificate replaced on disk (as
// cert-manager rotates it) is served to the next connection without a
// restart; a half-written replacement keeps the last good pair in service.
func TestTLSCertificateReload(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "gputopo test CA")
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	cert1, key1, sn1 := ca.issue(t, "gputopo-extender", true)
	cert2, key2, sn2 := ca.issue(t, "gputopo-extender", true)
	t0 := time.Now().Add(-time.Minute)
	writeFile(t, keyFile, key1, t0)
	writeFile(t, certFile, cert1, t0)

	x, _ := newTestExtender(t, nil)
	x.opts.TLSCertFile, x.opts.TLSPrivateKeyFile = certFile, keyFile
	addr := serveTLS(t, x)
	client := tlsClient(t, ca, nil, nil)
	served := func() int64 {
		t.Helper()
		resp, err := client.Get("https://" + addr + "/healthz")
		if err != nil {
			t.Fatalf("GET /healthz: %v", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /healthz = %d", resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}

	if got := served(); got != sn1 {
		t.Fatalf("serving certificate %d, want the first one, %d", got, sn1)
	}
	writeFile(t, keyFile, key2, t0.Add(time.Second))
	writeFile(t, certFile, cert2, t0.Add(time.Second))
	if got := served(); got != sn2 {
		t.Errorf("after replacing the files: serving certificate %d, want the new one, %d", got, sn2)
	}
	// Mid-rotation: the certificate file is not a certificate yet.
	writeFile(t, certFile, []byte("-----BEGIN CERTIFICATE-----\ntruncated"), t0.Add(2*time.Second))
	if got := served(); got != sn2 {
		t.Errorf("with a half-written certificate file: serving %d, want the last good one, %d", got, sn2)
	}
}

// TestTLSBadFiles: unreadable or mismatched files are errors at start that
// name the flag, not a server that fails every handshake.
func TestTLSBadFiles(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, "gputopo test CA")
	cert, key, _ := ca.issue(t, "gputopo-extender", true)
	_, otherKey, _ := ca.issue(t, "gputopo-extender", true)
	now := time.Now()
	files := map[string][]byte{"tls.crt": cert, "tls.key": key, "other.key": otherKey, "ca.crt": ca.pem, "junk.pem": []byte("not PEM")}
	for name, data := range files {
		writeFile(t, filepath.Join(dir, name), data, now)
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	for _, tc := range []struct {
		name               string
		cert, key, client  string
		wantErrContains    string
		wantErrIsNotExists bool
	}{
		{name: "missing certificate file", cert: p("absent.crt"), key: p("tls.key"), wantErrContains: "--tls-cert-file", wantErrIsNotExists: true},
		{name: "key of another certificate", cert: p("tls.crt"), key: p("other.key"), wantErrContains: "load TLS key pair"},
		{name: "client CA file that is not PEM", cert: p("tls.crt"), key: p("tls.key"), client: p("junk.pem"), wantErrContains: "--client-ca-file"},
		{name: "missing client CA file", cert: p("tls.crt"), key: p("tls.key"), client: p("absent.pem"), wantErrContains: "--client-ca-file", wantErrIsNotExists: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x, _ := newTestExtender(t, nil)
			x.opts.BindAddress, x.opts.Port = "127.0.0.1", 0
			x.opts.TLSCertFile, x.opts.TLSPrivateKeyFile, x.opts.ClientCAFile = tc.cert, tc.key, tc.client
			ln, err := x.listenAPI()
			if err == nil {
				ln.Close()
				t.Fatal("listenAPI succeeded, want an error")
			}
			if !strings.Contains(err.Error(), tc.wantErrContains) || errors.Is(err, os.ErrNotExist) != tc.wantErrIsNotExists {
				t.Errorf("error %q (not-exist %v); want it to contain %q (not-exist %v)", err, errors.Is(err, os.ErrNotExist), tc.wantErrContains, tc.wantErrIsNotExists)
			}
		})
	}
}

// TestTLSClientCARotation: a client CA replaced on disk (cert-manager
// renewing its CA) is used for the next handshake without a restart: the
// new CA's clients are let in, the old CA's are shut out.
func TestTLSClientCARotation(t *testing.T) {
	dir := t.TempDir()
	ca1 := newTestCA(t, "gputopo CA 1")
	ca2 := newTestCA(t, "gputopo CA 2")
	srvCert, srvKey, _ := ca1.issue(t, "gputopo-extender", true)
	cli1Cert, cli1Key, _ := ca1.issue(t, "kube-scheduler", false)
	cli2Cert, cli2Key, _ := ca2.issue(t, "kube-scheduler", false)
	t0 := time.Now().Add(-time.Minute)
	writeFile(t, filepath.Join(dir, "tls.crt"), srvCert, t0)
	writeFile(t, filepath.Join(dir, "tls.key"), srvKey, t0)
	caFile := filepath.Join(dir, "ca.crt")
	writeFile(t, caFile, ca1.pem, t0)

	x, _ := newTestExtender(t, nil)
	x.opts.TLSCertFile, x.opts.TLSPrivateKeyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	x.opts.ClientCAFile = caFile
	base := "https://" + serveTLS(t, x)
	body := mustJSON(t, extenderv1.ExtenderArgs{Pod: makePod("p").obj(), NodeNames: &[]string{"a"}})
	filter := func(certPEM, keyPEM []byte) string {
		t.Helper()
		c := tlsClient(t, ca1, certPEM, keyPEM)
		resp, err := c.Post(base+"/filter", "application/json", strings.NewReader(body))
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		return resp.Status
	}
	if got := filter(cli1Cert, cli1Key); got != "200 OK" {
		t.Fatalf("client of CA 1 before rotation: %s; want 200 OK", got)
	}
	// Refused in the handshake: no HTTP status comes back.
	refused := func(got string) bool { return !strings.HasPrefix(got, "200") && !strings.HasPrefix(got, "401") }
	if got := filter(cli2Cert, cli2Key); !refused(got) {
		t.Fatalf("client of CA 2 before rotation: %s; want refused", got)
	}
	writeFile(t, caFile, ca2.pem, t0.Add(time.Second))
	if got := filter(cli2Cert, cli2Key); got != "200 OK" {
		t.Errorf("client of CA 2 after rotation: %s; want 200 OK", got)
	}
	if got := filter(cli1Cert, cli1Key); !refused(got) {
		t.Errorf("client of CA 1 after rotation: %s; want refused", got)
	}
	writeFile(t, caFile, []byte("-----BEGIN CERTIFICATE-----\ntruncated"), t0.Add(2*time.Second))
	if got := filter(cli2Cert, cli2Key); got != "200 OK" {
		t.Errorf("with a half-written CA file: %s; want the last good CA in use", got)
	}
}
