package shadow

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
)

// ReadOnly refuses, at the HTTP transport of an API client, every request
// that is not a read (GET, HEAD, OPTIONS: get, list, watch, discovery). A
// refused request never leaves the process: it fails with an error, is
// logged, and is counted in
// attachdetach_controller_shadow_refused_writes_total{verb}. In shadow mode
// nothing should try to write; this is the guard that proves it.
type ReadOnly struct {
	logger  klog.Logger
	refused *prometheus.CounterVec
}

// NewReadOnly returns the guard, with its counter registered into reg (when
// not nil).
func NewReadOnly(logger klog.Logger, reg prometheus.Registerer) (*ReadOnly, error) {
	r := &ReadOnly{
		logger: logger.WithName("shadow"),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "attachdetach_controller_shadow_refused_writes_total",
			Help: "Shadow mode: API requests other than reads refused before they left the process, by HTTP method. Always 0 unless a write path was missed.",
		}, []string{"verb"}),
	}
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		r.refused.WithLabelValues(m)
	}
	if reg != nil {
		if err := reg.Register(r.refused); err != nil {
			return nil, fmt.Errorf("register shadow refused writes metric: %w", err)
		}
	}
	return r, nil
}

// Wrap returns a copy of config whose requests pass through the guard.
func (r *ReadOnly) Wrap(config *rest.Config) *rest.Config {
	config = rest.CopyConfig(config)
	config.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &readOnlyTransport{guard: r, next: rt} })
	return config
}

type readOnlyTransport struct {
	guard *ReadOnly
	next  http.RoundTripper
}

func (t *readOnlyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return t.next.RoundTrip(req)
	}
	if req.Body != nil {
		_ = req.Body.Close()
	}
	t.guard.refused.WithLabelValues(strings.ToUpper(req.Method)).Inc()
	t.guard.logger.Error(nil, "Refused a write in shadow mode", "method", req.Method, "path", req.URL.Path)
	return nil, fmt.Errorf("shadow mode writes nothing: refused %s %s", req.Method, req.URL.Path)
}
