package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// CachedGatherer gathers at most once per interval, however many scrapes
// come: a scrape that arrives within the interval of the last gather gets
// its result, and concurrent scrapes wait for one gather instead of running
// one each. A gather walks the caches under their read locks (about 60 ms
// at 100,000 volumes, BenchmarkDesiredStateStats and
// BenchmarkActualStateStats), which the workers' writes wait for: a flood of
// scrapes must not turn that into a lock held all the time.
type CachedGatherer struct {
	inner    prometheus.Gatherer
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	last time.Time
	mfs  []*dto.MetricFamily
	err  error
}

var _ prometheus.Gatherer = (*CachedGatherer)(nil)

// NewCachedGatherer wraps g.
func NewCachedGatherer(g prometheus.Gatherer, interval time.Duration) *CachedGatherer {
	return &CachedGatherer{inner: g, interval: interval, now: time.Now}
}

// Gather returns the last result if it is younger than the interval, else
// gathers. The families are shared between callers: promhttp only reads
// them.
func (c *CachedGatherer) Gather() ([]*dto.MetricFamily, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); c.last.IsZero() || now.Sub(c.last) >= c.interval {
		c.mfs, c.err = c.inner.Gather()
		c.last = now
	}
	return c.mfs, c.err
}
