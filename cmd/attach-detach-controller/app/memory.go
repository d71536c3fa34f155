package app

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"k8s.io/klog/v2"
)

// The Go runtime keeps the memory a burst of work left behind: after a
// collection the heap may grow to twice what is live before the next one
// (GOGC=100), and the scavenger returns to the system only what lies above
// that goal. A controller that is quiet most of the time would hold, for
// hours, about twice its state: at 10,000 volumes some 90 MiB of garbage
// beside 90 MiB of caches. releaser gives it back once the work is over:
// when a period passes with almost no allocation and the process holds
// much more heap than was live at the last collection, it collects and
// returns the free memory (debug.FreeOSMemory), once per busy spell. The
// cost is one collection each time the controller goes quiet (about 0.4 s
// of CPU at 10,000 volumes); the peak, during the work, is unchanged.
type releaser struct {
	// period is how often the allocation rate is looked at.
	period time.Duration
	// quiet is the most a period may allocate and still count as quiet.
	quiet uint64
	// minSlack is the least free memory worth a collection to return.
	minSlack uint64
	// release collects and returns free memory (debug.FreeOSMemory).
	release func()
	// sample looks at the runtime (readRuntime).
	sample func() memSample
}

func newReleaser() *releaser {
	return &releaser{
		period:   10 * time.Second,
		quiet:    8 << 20,
		minSlack: 32 << 20,
		release:  debug.FreeOSMemory,
		sample:   readRuntime,
	}
}

const (
	metricAllocs   = "/gc/heap/allocs:bytes"
	metricLive     = "/gc/heap/live:bytes"
	metricTotal    = "/memory/classes/total:bytes"
	metricReleased = "/memory/classes/heap/released:bytes"
)

// memSample is what one look at the runtime sees.
type memSample struct {
	allocs, live, retained uint64
}

// readRuntime reads the runtime's metrics: no stop of the world, unlike
// runtime.ReadMemStats.
func readRuntime() memSample {
	s := []metrics.Sample{{Name: metricAllocs}, {Name: metricLive}, {Name: metricTotal}, {Name: metricReleased}}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return memSample{allocs: v(0), live: v(1), retained: v(2) - v(3)}
}

// shouldRelease says whether the period from prev to cur was quiet and
// left enough free memory to be worth returning: more than minSlack and
// more than a quarter of the live heap.
func (r *releaser) shouldRelease(prev, cur memSample) bool {
	if cur.allocs-prev.allocs > r.quiet || cur.retained <= cur.live {
		return false
	}
	slack := cur.retained - cur.live
	return slack > r.minSlack && slack > cur.live/4
}

// Run looks every period until ctx is cancelled.
func (r *releaser) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(r.period)
	defer t.Stop()
	prev := r.sample()
	// released: a release was made and no busy period came since. What a
	// release leaves may still look worth returning (spans part free,
	// the runtime's own structures: at 100,000 volumes about a third of
	// the live heap), and returning it again would cost a full collection
	// every period, for nothing.
	released := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := r.sample()
		if cur.allocs-prev.allocs > r.quiet {
			released = false
		}
		if !released && r.shouldRelease(prev, cur) {
			released = true
			r.release()
			after := r.sample()
			logger.V(2).Info("Quiet: returned free memory", "retainedMiB", cur.retained>>20, "nowMiB", after.retained>>20,
				"liveMiB", after.live>>20)
			cur = after
		}
		prev = cur
	}
}
