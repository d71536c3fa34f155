// Package budget is the controller's API budget (--kube-api-qps,
// --kube-api-burst): a token bucket, as client-go's, whose waiting requests
// are served by the priority of the work they are for, then in arrival
// order. A queue that hands out a move's detach before a burst of new
// attaches gains nothing if the detach's request then waits behind every
// request the burst's workers already wait with: the priority reaches the
// budget too.
package budget

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
)

// Priorities: a lower number is served first.
const (
	// Move: a pod waits for a volume that changes nodes (its detach on the
	// old node, the withdrawal from that node's status, its attach on the
	// new node and the new node's status write).
	Move = 0
	// Attach: a pod waits for a new attach or its node's status write.
	// Requests made with no priority in their context count as this.
	Attach = 1
	// Other: no pod waits (a detach no move waits for, a periodic look).
	Other = 2
)

type priorityKey struct{}

// WithPriority returns ctx whose requests wait for the budget at priority p.
func WithPriority(ctx context.Context, p int) context.Context {
	return WithPriorityFunc(ctx, func() int { return p })
}

// WithPriorityFunc returns ctx whose requests wait for the budget at the
// priority p says, asked again each time a token is handed out: the work
// a request is for may become more urgent while it waits (a pod comes to
// wait for it). p must not wait for anything a request may be made under
// (the controller's caches hold their locks for no request): every token
// waits for it.
func WithPriorityFunc(ctx context.Context, p func() int) context.Context {
	return context.WithValue(ctx, priorityKey{}, p)
}

// PriorityOf returns the priority ctx's requests wait at now.
func PriorityOf(ctx context.Context) int {
	return priorityFunc(ctx)()
}

func priorityFunc(ctx context.Context) func() int {
	if p, ok := ctx.Value(priorityKey{}).(func() int); ok {
		return p
	}
	return func() int { return Attach }
}

// Limiter is a token bucket of qps tokens a second, holding at most burst,
// full at the start. Wait takes a token at once when one is there and
// nobody waits; otherwise the waiters take the tokens as they come, the
// lowest priority number first (counting PromoteAfter), then the first to
// wait.
type Limiter struct {
	qps   float64
	burst float64
	clock clock.WithDelayedExecution

	mu      sync.Mutex
	tokens  float64
	last    time.Time
	waiters []*waiter
	seq     uint64
	// timer hands the next token out to the first waiter; armed while
	// somebody waits.
	timer clock.Timer
	// due is when the armed timer fires.
	due time.Time
}

var _ flowcontrol.RateLimiter = (*Limiter)(nil)

// New returns a Limiter of qps tokens a second and burst at most (at least
// one).
func New(qps float32, burst int) *Limiter {
	return NewWithClock(qps, burst, clock.RealClock{})
}

// NewWithClock is New on clk.
func NewWithClock(qps float32, burst int, clk clock.WithDelayedExecution) *Limiter {
	b := float64(max(burst, 1))
	return &Limiter{qps: float64(qps), burst: b, clock: clk, tokens: b, last: clk.Now()}
}

type waiter struct {
	priority func() int
	seq      uint64
	since    time.Time
	// granted is closed once the waiter holds its token.
	granted chan struct{}
}

// PromoteAfter is how long a request of a priority after Attach waits
// before it is served as one of the next lower priority number, and again
// after each further PromoteAfter, up to Attach: work of every priority
// keeps going while new attaches take the whole budget (a teardown under a
// stream of new pods), a little later than it would in arrival order. A
// move's requests stay ahead of all others, however long those waited (at
// a low --kube-api-qps, every waiting request waits longer than this).
const PromoteAfter = time.Second

// rank is the priority w is served at now.
func (w *waiter) rank(now time.Time) int {
	p := w.priority()
	if p <= Attach {
		return p
	}
	return max(Attach, p-int(now.Sub(w.since)/PromoteAfter))
}

// firstLocked returns the index of the waiter served next among those
// ranked: the lowest rank, then the first to wait; -1 when none is. A few
// dozen wait at most (one per worker).
func (l *Limiter) firstLocked(ranks map[*waiter]int) int {
	best, bestRank := -1, 0
	for i, w := range l.waiters {
		r, ok := ranks[w]
		if !ok {
			continue
		}
		if best < 0 || r < bestRank || (r == bestRank && w.seq < l.waiters[best].seq) {
			best, bestRank = i, r
		}
	}
	return best
}

func (l *Limiter) removeLocked(i int) {
	l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
}

// refillLocked adds the tokens earned since the last refill.
func (l *Limiter) refillLocked() {
	now := l.clock.Now()
	if d := now.Sub(l.last); d > 0 {
		l.tokens = min(l.burst, l.tokens+d.Seconds()*l.qps)
	}
	l.last = now
}

// Wait takes a token, waiting for it at ctx's priority (WithPriority,
// WithPriorityFunc); it returns ctx's error, and takes nothing, when ctx is
// done first.
func (l *Limiter) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.mu.Lock()
	l.refillLocked()
	if len(l.waiters) == 0 && l.tokens >= 1 {
		l.tokens--
		l.mu.Unlock()
		return nil
	}
	w := &waiter{priority: priorityFunc(ctx), seq: l.seq, since: l.last, granted: make(chan struct{})}
	l.seq++
	l.waiters = append(l.waiters, w)
	l.armLocked()
	l.mu.Unlock()

	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.waiters, w); i >= 0 {
		l.removeLocked(i)
	} else {
		// Granted meanwhile: the token goes back, to the next waiter.
		l.tokens = min(l.burst, l.tokens+1)
		l.armLocked()
	}
	return ctx.Err()
}

// armLocked arms the timer for when the next token is there, while
// somebody waits. The tokens are handed out by the timer's function alone
// (fire).
func (l *Limiter) armLocked() {
	if len(l.waiters) == 0 || l.qps <= 0 {
		return
	}
	l.refillLocked()
	var wait time.Duration
	if l.tokens < 1 {
		wait = time.Duration(math.Ceil((1 - l.tokens) / l.qps * float64(time.Second)))
	}
	due := l.last.Add(wait)
	if l.timer != nil && !l.due.After(due) {
		return
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.due = due
	l.timer = l.clock.AfterFunc(wait, l.fire)
}

// fire hands the tokens there are to the first waiters. Their priorities
// are asked outside the Limiter's lock, so that a new request never waits
// for them to be read; one that came to wait meanwhile is served from the
// next time on.
func (l *Limiter) fire() {
	l.mu.Lock()
	l.timer = nil
	waiting := slices.Clone(l.waiters)
	l.mu.Unlock()

	now := l.clock.Now()
	ranks := make(map[*waiter]int, len(waiting))
	for _, w := range waiting {
		ranks[w] = w.rank(now)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	l.refillLocked()
	for l.tokens >= 1 {
		i := l.firstLocked(ranks)
		if i < 0 {
			break
		}
		w := l.waiters[i]
		l.removeLocked(i)
		l.tokens--
		close(w.granted)
	}
	l.armLocked()
}

// Accept takes a token, waiting as long as it takes.
func (l *Limiter) Accept() { _ = l.Wait(context.Background()) }

// TryAccept takes a token if one is there and nobody waits.
func (l *Limiter) TryAccept() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refillLocked()
	if len(l.waiters) == 0 && l.tokens >= 1 {
		l.tokens--
		return true
	}
	return false
}

// QPS returns the tokens earned a second.
func (l *Limiter) QPS() float32 { return float32(l.qps) }

// Stop stops the timer; waiters still waiting wait for their context.
func (l *Limiter) Stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}
