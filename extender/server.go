package extender

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gputopo/gputopo/placement/metrics"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// Handler serves the verbs at /filter, /prioritize, /bind and /preempt, the same under
// /scheduler/ (the prefix the design's users configured), and /healthz and
// /readyz.
func (x *Extender) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, prefix := range []string{"", "/scheduler"} {
		mux.HandleFunc("POST "+prefix+"/filter", x.verb(phaseFilter, x.serveFilter))
		mux.HandleFunc("POST "+prefix+"/prioritize", x.verb(phasePrioritize, x.servePrioritize))
		mux.HandleFunc("POST "+prefix+"/bind", x.verb(phaseBind, x.serveBind))
		mux.HandleFunc("POST "+prefix+"/preempt", x.verb(phasePreempt, x.servePreempt))
	}
	if x.opts.Shadow {
		mux.HandleFunc("POST "+ShadowPath, x.verb(phaseShadow, x.serveShadow))
		mux.HandleFunc("GET "+ShadowDecisionsPath, x.serveShadowDecisions)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok")
	})
	mux.HandleFunc("GET /readyz", x.serveReadyz)
	return mux
}

// serveReadyz answers 200 once the core decides (informers synced, ledger
// rebuilt, leading), else 503 with the reason.
func (x *Extender) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	metrics.ServeReady(w, x.notReadyReason())
}

// MetricsHandler serves the extender's registry, and /readyz.
func (x *Extender) MetricsHandler() http.Handler { return metrics.Handler(x.metrics, x.notReadyReason) }

func (x *Extender) notReadyReason() string { return x.core.NotReady() }

// httpError is a request the extender refuses before deciding anything.
type httpError struct {
	status int
	kind   string
	msg    string
}

func (e *httpError) Error() string { return e.msg }

// verb wraps a verb's handler with readiness, client-certificate,
// body-size and latency handling. The handler returns the value to encode
// as the response, or an *httpError.
func (x *Extender) verb(phase string, h func(ctx context.Context, body io.Reader) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		defer func() { x.metrics.Latency(phase, time.Since(start)) }()
		var resp any
		var err error
		switch he := x.authorizeClient(r.TLS); {
		case he != nil:
			err = he
		case x.notReadyReason() != "":
			err = &httpError{http.StatusServiceUnavailable, errNotReady, x.notReadyReason()}
		default:
			ctx := klog.NewContext(r.Context(), x.log.WithValues("phase", phase))
			resp, err = h(ctx, http.MaxBytesReader(w, r.Body, x.cfg.MaxRequestBytes))
		}
		if err != nil {
			var he *httpError
			if !errors.As(err, &he) {
				he = &httpError{http.StatusInternalServerError, "internal", err.Error()}
			}
			x.metrics.Error(phase, he.kind)
			x.log.V(2).Info("extender request refused", "phase", phase, "status", he.status, "reason", he.msg)
			writeJSON(w, he.status, errorBody(phase, he.msg))
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

// errorBody is the verb's own result type carrying the error, so a client
// that decodes it regardless of status still finds a message.
func errorBody(phase, msg string) any {
	switch phase {
	case phaseFilter:
		return &extenderv1.ExtenderFilterResult{Error: msg}
	case phaseBind:
		return &extenderv1.ExtenderBindingResult{Error: msg}
	}
	return map[string]string{"error": msg}
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufPool.Put(buf)
	if err := json.NewEncoder(buf).Encode(v); err != nil {
		http.Error(w, "encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// decodeJSON decodes one JSON value, mapping an oversized body to 413 and
// anything else malformed to 400.
func decodeJSON(body io.Reader, v any) error {
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &httpError{http.StatusRequestEntityTooLarge, errTooLarge, fmt.Sprintf("request body over %d bytes; raise maxRequestBytes in the ExtenderConfiguration or use nodeCacheCapable: true", tooBig.Limit)}
		}
		return &httpError{http.StatusBadRequest, errDecode, "malformed request: " + err.Error()}
	}
	if dec.More() {
		return &httpError{http.StatusBadRequest, errDecode, "malformed request: unexpected data after the JSON object"}
	}
	return nil
}

// DecodeExtenderArgs decodes and checks a filter or prioritize request: a
// pod and either node names or nodes are required.
func DecodeExtenderArgs(body io.Reader) (*extenderv1.ExtenderArgs, error) {
	var args extenderv1.ExtenderArgs
	if err := decodeJSON(body, &args); err != nil {
		return nil, err
	}
	switch {
	case args.Pod == nil:
		return nil, &httpError{http.StatusBadRequest, errBadRequest, "malformed request: Pod is required"}
	case args.NodeNames == nil && args.Nodes == nil:
		return nil, &httpError{http.StatusBadRequest, errBadRequest, "malformed request: one of NodeNames (nodeCacheCapable: true) or Nodes is required"}
	}
	return &args, nil
}

// DecodeBindingArgs decodes and checks a bind request.
func DecodeBindingArgs(body io.Reader) (*extenderv1.ExtenderBindingArgs, error) {
	var args extenderv1.ExtenderBindingArgs
	if err := decodeJSON(body, &args); err != nil {
		return nil, err
	}
	var missing []string
	if args.PodName == "" {
		missing = append(missing, "PodName")
	}
	if args.PodNamespace == "" {
		missing = append(missing, "PodNamespace")
	}
	if args.PodUID == "" {
		missing = append(missing, "PodUID")
	}
	if args.Node == "" {
		missing = append(missing, "Node")
	}
	if len(missing) > 0 {
		return nil, &httpError{http.StatusBadRequest, errBadRequest, fmt.Sprintf("malformed request: %v required", missing)}
	}
	return &args, nil
}

func (x *Extender) serveFilter(ctx context.Context, body io.Reader) (any, error) {
	args, err := DecodeExtenderArgs(body)
	if err != nil {
		return nil, err
	}
	res := x.Filter(ctx, args)
	x.mirrorFilter(args, res)
	return res, nil
}

func (x *Extender) servePrioritize(ctx context.Context, body io.Reader) (any, error) {
	args, err := DecodeExtenderArgs(body)
	if err != nil {
		return nil, err
	}
	track := x.mirror.wants(args)
	list, top, err := x.prioritize(ctx, args, track)
	if err != nil {
		return nil, &httpError{http.StatusBadRequest, errBadRequest, err.Error()}
	}
	if track {
		x.mirrorPrioritize(args, list, top)
	}
	return &list, nil
}

// DecodePreemptionArgs decodes and checks a preempt request: a pod and
// its candidate nodes' victims, by UID (nodeCacheCapable) or as pods.
func DecodePreemptionArgs(body io.Reader) (*extenderv1.ExtenderPreemptionArgs, error) {
	var args extenderv1.ExtenderPreemptionArgs
	if err := decodeJSON(body, &args); err != nil {
		return nil, err
	}
	if args.Pod == nil {
		return nil, &httpError{http.StatusBadRequest, errBadRequest, "malformed request: Pod is required"}
	}
	return &args, nil
}

func (x *Extender) servePreempt(ctx context.Context, body io.Reader) (any, error) {
	args, err := DecodePreemptionArgs(body)
	if err != nil {
		return nil, err
	}
	res, err := x.Preempt(ctx, args)
	if err != nil {
		return nil, &httpError{http.StatusBadRequest, errBadRequest, err.Error()}
	}
	return res, nil
}

func (x *Extender) serveBind(ctx context.Context, body io.Reader) (any, error) {
	if x.opts.Shadow {
		return nil, &httpError{http.StatusForbidden, errBadRequest, "this extender runs with --shadow and never binds; point kube-scheduler's bindVerb at the serving extender"}
	}
	args, err := DecodeBindingArgs(body)
	if err != nil {
		return nil, err
	}
	return x.Bind(ctx, args), nil
}

// nodeNames lists the candidate nodes of a request in either mode.
func nodeNames(args *extenderv1.ExtenderArgs) []string {
	if args.NodeNames != nil {
		return *args.NodeNames
	}
	names := make([]string, len(args.Nodes.Items))
	for i := range args.Nodes.Items {
		names[i] = args.Nodes.Items[i].Name
	}
	return names
}

// filteredNodes returns the Node objects of passed, for clients that sent
// full nodes.
func filteredNodes(args *extenderv1.ExtenderArgs, passed []string) *corev1.NodeList {
	keep := make(map[string]bool, len(passed))
	for _, n := range passed {
		keep[n] = true
	}
	out := &corev1.NodeList{Items: make([]corev1.Node, 0, len(passed))}
	for i := range args.Nodes.Items {
		if keep[args.Nodes.Items[i].Name] {
			out.Items = append(out.Items, args.Nodes.Items[i])
		}
	}
	return out
}

func (x *Extender) requireClientCert() bool { return x.opts.ClientCAFile != "" }

// authorizeClient decides whether the client of a verb call may call the
// verbs, from its connection's TLS state; nil when it may (or when no
// client CA is configured).
//
// The handshake has verified the certificate against the client CA, but
// Go's verification (x509.Certificate.Verify with KeyUsages clientAuth,
// as crypto/tls asks) accepts a leaf that lists no extended key usage at
// all, or "any", as good for every usage: a serving certificate issued
// without usages by the same CA would be let in. So the leaf must list
// clientAuth itself (401 otherwise), and, with --client-allowed-names,
// carry one of those common names (403 otherwise).
func (x *Extender) authorizeClient(cs *tls.ConnectionState) *httpError {
	if !x.requireClientCert() {
		return nil
	}
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return &httpError{http.StatusUnauthorized, errUnauthorized, "a client certificate signed by the configured client CA is required"}
	}
	leaf := cs.VerifiedChains[0][0]
	cn := leaf.Subject.CommonName
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return &httpError{http.StatusUnauthorized, errUnauthorized, fmt.Sprintf(
			"the client certificate (CN %q) does not list the extended key usage client auth (clientAuth); a certificate without it, or with no extended key usage at all, is not accepted as a client's", cn)}
	}
	if allowed := x.opts.ClientAllowedNames; len(allowed) > 0 && !slices.Contains(allowed, cn) {
		return &httpError{http.StatusForbidden, errForbidden, fmt.Sprintf(
			"the client certificate's CN %q is not allowed to call the verbs; --client-allowed-names allows %s", cn, quoteAll(allowed))}
	}
	return nil
}

// quoteAll lists names quoted and comma-separated.
func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// tlsConfig serves the certificate (reloaded when the files change, as
// cert-manager rotates them) and, with a client CA, verifies client
// certificates when given. Probes carry no certificate, so the verbs check
// for a verified one themselves.
func (x *Extender) tlsConfig() (*tls.Config, error) {
	if x.opts.TLSCertFile == "" || x.opts.TLSPrivateKeyFile == "" {
		return nil, errors.New("--tls-cert-file and --tls-private-key-file must be given together")
	}
	r := keyPair(x.opts.TLSCertFile, x.opts.TLSPrivateKeyFile)
	if _, err := r.get(); err != nil {
		return nil, err
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.get() }}
	if x.opts.ClientCAFile != "" {
		ca := caBundle(x.opts.ClientCAFile)
		pool, err := ca.get()
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.VerifyClientCertIfGiven
		// Each handshake verifies against the CA file as it is now, so a
		// rotated CA (cert-manager renewing its CA Secret) takes effect
		// without a restart.
		base := tc.Clone()
		tc.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			pool, err := ca.get()
			if err != nil {
				return nil, err
			}
			c := base.Clone()
			c.ClientCAs = pool
			return c, nil
		}
	}
	return tc, nil
}

func tlsListener(ln net.Listener, tc *tls.Config) net.Listener { return tls.NewListener(ln, tc) }

// reloaded is a value read from a file (a key pair, a CA bundle), read
// again on the next handshake after the file's modification time
// changes. A read that fails keeps the last good value, so that a rotation
// half-written (cert-manager writes the files one by one) never stops
// the server; only the first read's error is returned. It is checked on
// every handshake rather than by a file watch (controller-runtime's
// certwatcher, which the webhook uses): a rotated file is served to the
// very next connection, and a CA bundle, which certwatcher does not
// watch, reloads the same way.
type reloaded[T any] struct {
	// flag names the file in errors; file is the one whose modification
	// time is watched.
	flag, file string
	read       func() (T, error)
	mu         sync.Mutex
	val        T
	ok         bool
	modTime    time.Time
}

func (r *reloaded[T]) get() (T, error) {
	st, err := os.Stat(r.file)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil && r.ok && st.ModTime().Equal(r.modTime) {
		return r.val, nil
	}
	var v T
	if err != nil {
		err = fmt.Errorf("stat %s: %w", r.flag, err)
	} else {
		v, err = r.read()
	}
	if err != nil {
		if r.ok {
			return r.val, nil // mid-rotation: keep the last good one
		}
		return v, err
	}
	r.val, r.ok, r.modTime = v, true, st.ModTime()
	return v, nil
}

// keyPair reads --tls-cert-file and --tls-private-key-file.
func keyPair(certFile, keyFile string) *reloaded[*tls.Certificate] {
	return &reloaded[*tls.Certificate]{flag: "--tls-cert-file", file: certFile, read: func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load TLS key pair: %w", err)
		}
		return &c, nil
	}}
}

// caBundle reads --client-ca-file.
func caBundle(file string) *reloaded[*x509.CertPool] {
	return &reloaded[*x509.CertPool]{flag: "--client-ca-file", file: file, read: func() (*x509.CertPool, error) {
		pem, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("read --client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca-file %s holds no PEM certificate", file)
		}
		return pool, nil
	}}
}
