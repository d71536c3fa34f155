package controller

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

// lockedQueue is a testQueue safe for the concurrent syncs of several
// workers.
type lockedQueue[T comparable] struct {
	mu sync.Mutex
	q  *testQueue[T]
}

var _ workqueue.TypedRateLimitingInterface[string] = (*lockedQueue[string])(nil)

func newLockedQueue[T comparable]() *lockedQueue[T] { return &lockedQueue[T]{q: newTestQueue[T]()} }

func (l *lockedQueue[T]) locked(fn func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fn()
}

func (l *lockedQueue[T]) Add(x T) { l.locked(func() { l.q.Add(x) }) }
func (l *lockedQueue[T]) Len() (n int) {
	l.locked(func() { n = l.q.Len() })
	return n
}
func (l *lockedQueue[T]) Get() (x T, quit bool) {
	l.locked(func() { x, quit = l.q.Get() })
	return x, quit
}
func (l *lockedQueue[T]) Done(T)                        {}
func (l *lockedQueue[T]) ShutDown()                     {}
func (l *lockedQueue[T]) ShutDownWithDrain()            {}
func (l *lockedQueue[T]) ShuttingDown() bool            { return false }
func (l *lockedQueue[T]) AddAfter(x T, d time.Duration) { l.locked(func() { l.q.AddAfter(x, d) }) }
func (l *lockedQueue[T]) AddRateLimited(x T)            { l.locked(func() { l.q.AddRateLimited(x) }) }
func (l *lockedQueue[T]) Forget(x T)                    { l.locked(func() { l.q.Forget(x) }) }
func (l *lockedQueue[T]) NumRequeues(x T) (n int) {
	l.locked(func() { n = l.q.NumRequeues(x) })
	return n
}

// The node workers sync the nodes of one zone at once while they all go
// NotReady, then all come back. Whatever the interleaving, what the
// controller records of the zone follows its health: disrupted once (one
// ZoneDisrupted event, the gauge at 1) when they are down, recovered once
// (one ZoneRecovered event, the gauge at 0) when they are back. A health
// computed before another worker's change and recorded after it would
// leave a stale "not disrupted" (or "disrupted"), or post extra events and
// record a recovery that did not happen. The interleaving is the
// scheduler's: one round seldom hits the race, ten thousand rounds of 24
// nodes on 16 workers (about a second; longer with -race) nearly always
// do when the health is computed apart from its record.
func TestConcurrentNodeSyncsRecordTheZonesHealth(t *testing.T) {
	const nodes, workers, rounds = 24, 16, 10000
	events := record.NewFakeRecorder(4 * rounds * nodes)
	f := newFixtureWith(t, func(c *Config) {
		c.Reconciler.UnhealthyZoneThreshold, c.Reconciler.UnhealthyZoneMinNodes = 0.55, 3
		c.Recorder = events
		c.NewQueue = func(string) workqueue.TypedRateLimitingInterface[string] { return newLockedQueue[string]() }
		c.NewKeyQueue = func(string) workqueue.TypedRateLimitingInterface[cache.Key] { return newLockedQueue[cache.Key]() }
	})
	f.events = events
	load := func(round int, down bool) {
		var objs []runtime.Object
		for i := range nodes {
			opts := []nodeOpt{zone("a"), resourceVersion(fmt.Sprint(100 + round))}
			if down {
				opts = append(opts, notReady)
			}
			objs = append(objs, node(fmt.Sprintf("a%02d", i), opts...))
		}
		f.load(objs...)
	}
	load(0, false)
	for i := range nodes {
		must(t, f.c.syncNode(f.ctx, fmt.Sprintf("a%02d", i)))
	}
	f.takeEvents()

	for round := 1; round <= rounds; round++ {
		down := round%2 == 1
		load(round, down)
		work := make(chan string, nodes)
		for i := range nodes {
			work <- fmt.Sprintf("a%02d", i)
		}
		close(work)
		start := make(chan struct{})
		errs := make(chan error, nodes)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				<-start
				for name := range work {
					if err := f.c.syncNode(f.ctx, name); err != nil {
						errs <- err
					}
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// What the syncs queued runs too, as the workers would run it.
		for f.c.Process(f.ctx, QueueNodes) || f.c.Process(f.ctx, QueueVolumes) || f.c.Process(f.ctx, QueueNodeStatus) {
		}

		want, wantEvent := 0.0, "ZoneRecovered"
		if down {
			want, wantEvent = 1, "ZoneDisrupted"
		}
		got := f.takeEvents()
		if g := testutil.ToFloat64(f.c.cfg.Metrics.DisruptedZones); g != want {
			t.Fatalf("round %d (nodes down: %v): disrupted zones %v, want %v; events %q", round, down, g, want, got)
		}
		if len(got) != 1 || !strings.Contains(got[0], wantEvent) {
			t.Fatalf("round %d (nodes down: %v): events %q, want one %s", round, down, got, wantEvent)
		}
	}
}
