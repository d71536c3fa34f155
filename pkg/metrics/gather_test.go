package metrics

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

type countingGatherer struct{ n atomic.Int32 }

func (g *countingGatherer) Gather() ([]*dto.MetricFamily, error) {
	g.n.Add(1)
	time.Sleep(time.Millisecond) // a gather takes time: concurrent callers overlap
	return []*dto.MetricFamily{{}}, nil
}

var _ prometheus.Gatherer = (*countingGatherer)(nil)

func TestCachedGathererFlood(t *testing.T) {
	inner := &countingGatherer{}
	c := NewCachedGatherer(inner, time.Hour)
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			mfs, err := c.Gather()
			if err != nil || len(mfs) != 1 {
				t.Errorf("Gather: %v, %d families", err, len(mfs))
			}
		})
	}
	wg.Wait()
	if n := inner.n.Load(); n != 1 {
		t.Fatalf("200 concurrent scrapes gathered %d times, want 1", n)
	}
}

func TestCachedGathererInterval(t *testing.T) {
	inner := &countingGatherer{}
	c := NewCachedGatherer(inner, 5*time.Second)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	for _, step := range []struct {
		advance time.Duration
		want    int32
	}{{0, 1}, {time.Second, 1}, {4 * time.Second, 2}, {4 * time.Second, 2}, {2 * time.Second, 3}} {
		now = now.Add(step.advance)
		if _, err := c.Gather(); err != nil {
			t.Fatal(err)
		}
		if n := inner.n.Load(); n != step.want {
			t.Fatalf("after +%s: %d gathers, want %d", step.advance, n, step.want)
		}
	}
}
