package sim

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// queue is a rate-limited work queue with the semantics the controller
// relies on (an item is processed by one worker at a time; an item added
// while processed is processed again after; AddAfter and AddRateLimited wait
// on the simulated clock), whose next item the scheduler chooses.
type queue[T comparable] struct {
	s    *Sim
	name string

	mu         sync.Mutex
	dirty      map[T]bool
	since      map[T]time.Time // when a dirty item was added
	processing map[T]bool
	delayed    map[T]time.Time
	failures   map[T]int
	next       *T
	shutdown   bool
}

var _ workqueue.TypedRateLimitingInterface[string] = (*queue[string])(nil)

func newQueue[T comparable](s *Sim, name string) *queue[T] {
	return &queue[T]{s: s, name: name, dirty: map[T]bool{}, since: map[T]time.Time{}, processing: map[T]bool{}, delayed: map[T]time.Time{}, failures: map[T]int{}}
}

func (q *queue[T]) Add(x T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.addLocked(x)
}

func (q *queue[T]) addLocked(x T) {
	if !q.dirty[x] {
		q.since[x] = q.s.clock.Now()
	}
	q.dirty[x] = true
}

// oldestReady is when the longest-waiting item a worker may take was added.
func (q *queue[T]) oldestReady() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var first time.Time
	for x := range q.dirty {
		if at := q.since[x]; !q.processing[x] && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	return first, !first.IsZero()
}

// ready returns the items a worker may take now, sorted (map order must not
// decide anything).
func (q *queue[T]) ready() []T {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []T
	for x := range q.dirty {
		if !q.processing[x] {
			out = append(out, x)
		}
	}
	slices.SortFunc(out, func(a, b T) int { return compareText(fmt.Sprint(a), fmt.Sprint(b)) })
	return out
}

func compareText(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// take makes x the item the next Get returns.
func (q *queue[T]) take(x T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.next = &x
}

func (q *queue[T]) Get() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var zero T
	if q.shutdown || q.next == nil {
		return zero, true
	}
	x := *q.next
	q.next = nil
	delete(q.dirty, x)
	delete(q.since, x)
	q.processing[x] = true
	return x, false
}

func (q *queue[T]) Done(x T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.processing, x)
}

func (q *queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.dirty)
}

func (q *queue[T]) AddAfter(x T, d time.Duration) {
	if d <= 0 {
		q.Add(x)
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	at := q.s.clock.Now().Add(d)
	if old, ok := q.delayed[x]; !ok || at.Before(old) {
		q.delayed[x] = at
	}
}

// AddRateLimited waits as the controller's retry policy does: 500 ms
// doubling, capped at 2 min 2 s.
func (q *queue[T]) AddRateLimited(x T) {
	q.mu.Lock()
	n := q.failures[x]
	q.failures[x]++
	q.mu.Unlock()
	d := 500 * time.Millisecond
	for range n {
		if d *= 2; d > 122*time.Second {
			d = 122 * time.Second
			break
		}
	}
	q.AddAfter(x, d)
}

func (q *queue[T]) Forget(x T) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.failures, x)
}

func (q *queue[T]) NumRequeues(x T) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.failures[x]
}

func (q *queue[T]) ShutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.shutdown = true
}

func (q *queue[T]) ShutDownWithDrain() { q.ShutDown() }

func (q *queue[T]) ShuttingDown() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.shutdown
}

// nextTimer is the earliest delayed item's time.
func (q *queue[T]) nextTimer() (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var first time.Time
	for _, at := range q.delayed {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, !first.IsZero()
}

// fire adds the delayed items that are due.
func (q *queue[T]) fire(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for x, at := range q.delayed {
		if !at.After(now) {
			delete(q.delayed, x)
			q.addLocked(x)
		}
	}
}

// idle: nothing to do now or later.
func (q *queue[T]) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.dirty) == 0 && len(q.delayed) == 0 && len(q.processing) == 0
}

// runnable is what the scheduler needs of a queue, whatever its item type.
type runnable interface {
	queueName() string
	readyNames() []string
	takeAt(i int) string
	nextTimer() (time.Time, bool)
	fire(now time.Time)
	idle() bool
	oldestReady() (time.Time, bool)
	Len() int
}

func (q *queue[T]) queueName() string { return q.name }

func (q *queue[T]) readyNames() []string {
	r := q.ready()
	out := make([]string, len(r))
	for i, x := range r {
		out[i] = fmt.Sprint(x)
	}
	return out
}

func (q *queue[T]) takeAt(i int) string {
	r := q.ready()
	q.take(r[i])
	return fmt.Sprint(r[i])
}
