package metrics

import (
	"context"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// ClientMetrics are client-go's request metrics: how many API requests the
// controller made, by verb and result, and how long they took.
type ClientMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	limiter  *prometheus.HistogramVec
}

// NewClientMetrics registers client-go's request metrics into reg.
func NewClientMetrics(reg prometheus.Registerer) (*ClientMetrics, error) {
	m := &ClientMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_requests_total",
			Help: "Number of HTTP requests, partitioned by status code, method, and host."}, []string{"code", "method", "host"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_request_duration_seconds",
			Help:    "Request latency in seconds. Broken down by verb, and host.",
			Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}}, []string{"verb", "host"}),
		limiter: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "rest_client_rate_limiter_duration_seconds",
			Help:    "Client side rate limiter latency in seconds. Broken down by verb, and host.",
			Buckets: []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0}}, []string{"verb", "host"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.latency, m.limiter} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Install hands the metrics to client-go. client-go keeps them process-wide
// and takes only the first set it is given.
func (m *ClientMetrics) Install() {
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestResult:      resultAdapter{m.requests},
		RequestLatency:     latencyAdapter{m.latency},
		RateLimiterLatency: latencyAdapter{m.limiter},
	})
}

type resultAdapter struct{ v *prometheus.CounterVec }

func (r resultAdapter) Increment(_ context.Context, code, method, host string) {
	r.v.WithLabelValues(code, method, host).Inc()
}

type latencyAdapter struct{ v *prometheus.HistogramVec }

func (l latencyAdapter) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	l.v.WithLabelValues(verb, u.Host).Observe(d.Seconds())
}
