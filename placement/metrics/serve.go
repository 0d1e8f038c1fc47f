package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"
)

// Handler serves m's registry at /metrics and readiness at /readyz: 200
// once notReady says "", else 503 with its reason. In the plugin build
// the metrics port is the core's only one, and /readyz is the scheduler
// pods' readiness.
func Handler(m *Metrics, notReady func() string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) { ServeReady(w, notReady()) })
	return mux
}

// ServeReady answers a readiness probe: 200 "ok" for an empty reason,
// else 503 with it.
func ServeReady(w http.ResponseWriter, reason string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if reason != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, reason)
		return
	}
	_, _ = io.WriteString(w, "ok")
}

// Serve listens on addr ("0" or "": not at all) and serves h until ctx
// ends; it returns the address it listens on.
func Serve(ctx context.Context, addr string, h http.Handler) (string, error) {
	if addr == "0" || addr == "" {
		return "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "metrics server stopped", "address", ln.Addr().String())
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(sctx)
	}()
	return ln.Addr().String(), nil
}
