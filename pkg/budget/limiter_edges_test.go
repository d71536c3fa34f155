package budget

import (
	"context"
	"math/rand"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// poll waits, with a deadline, until cond holds.
func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// A worker holds one request at a time: a status writer (one at qps 20,
// statusWorkers) whose write at Other waits in the budget can't take up the
// move's withdraw write (Move) queued behind it in the status queue. While
// the burst's volume workers keep the budget busy at Attach (each VA
// create, 10 workers, as long as the burst lasts: 1,000 pods at qps 20 is
// 50 s), strict priority never serves the Other request, and the move
// waits for the whole burst: the inversion the ranks are there to remove,
// moved from the queue into the budget. No waiter may wait unboundedly
// (no starvation either way); here, 2 s.
func TestWorkerHeldAtOtherBlocksAMoveBehindIt(t *testing.T) {
	clk := newClock()
	l := NewWithClock(20, 1, clk)
	if !l.TryAccept() {
		t.Fatal("full bucket refused")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// Every grant, by whom.
	grants := make(chan string, 1000)
	// The burst's volume workers.
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l.Wait(WithPriority(ctx, Attach)) == nil {
				grants <- "attach"
			}
		}()
	}
	poll(t, "the burst's workers to wait", func() bool { return l.waiting() == 10 })
	// The status writer: a teardown's withdraw (Other), then the move's
	// (Move).
	wg.Add(1)
	go func() {
		defer wg.Done()
		if l.Wait(WithPriority(ctx, Other)) != nil {
			return
		}
		grants <- "other"
		if l.Wait(WithPriority(ctx, Move)) != nil {
			return
		}
		grants <- "move"
	}()
	poll(t, "the status writer to wait", func() bool { return l.waiting() == 11 })
	start := clk.Now()
	attaches := 0
	for step := 0; step < 200; step++ { // 10 s
		clk.Step(50 * time.Millisecond) // one token
		var who string
		select {
		case who = <-grants:
		case <-time.After(10 * time.Second):
			t.Fatal("a token was not served")
		}
		switch who {
		case "attach":
			attaches++
			poll(t, "the worker back in line", func() bool { return l.waiting() == 11 })
		case "other":
			poll(t, "the status writer's next request", func() bool { return l.waiting() == 11 })
		case "move":
			if d := clk.Since(start); d > 2*time.Second {
				t.Errorf("the move's write waited %v behind an Other request of the same worker", d)
			}
			return
		}
	}
	t.Errorf("the move's write, behind an Other request of the same worker, still waits after %v of a burst (%d attach requests served meanwhile)",
		clk.Since(start), attaches)
}

// A steady stream of new attaches that uses the whole budget must not
// starve a teardown (no starvation either way). Here the stream is exactly
// the budget (20 qps); a single Other request must still be served within
// a bound (here 5 s). (A stream of moves, all pods waiting for a volume
// that changes nodes, stays ahead of everything: PromoteAfter.)
func TestOtherNotStarvedByASteadyStream(t *testing.T) {
	clk := newClock()
	l := NewWithClock(20, 1, clk)
	if !l.TryAccept() {
		t.Fatal("full bucket refused")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var otherDone atomic.Bool
	go func() {
		if l.Wait(WithPriority(ctx, Other)) == nil {
			otherDone.Store(true)
		}
	}()
	poll(t, "the Other waiter", func() bool { return l.waiting() == 1 })
	var served atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for step := 0; step < 100 && !otherDone.Load(); step++ { // 5 s
		// One new request of the stream per token.
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.Wait(WithPriority(ctx, Attach)) == nil {
				served.Add(1)
			}
		}()
		poll(t, "the stream's request to wait", func() bool { return l.waiting() == 2 || otherDone.Load() })
		before := served.Load()
		clk.Step(50 * time.Millisecond)
		poll(t, "a token served", func() bool { return served.Load() > before || otherDone.Load() })
	}
	if !otherDone.Load() {
		t.Errorf("an Other request waited 5 s while a stream at the budget's rate was served (%d requests)", served.Load())
	}
}

// A request whose context is already done takes no token, as client-go's
// own limiter (x/time/rate's Wait checks the context first): a cancelled
// sync must not spend the budget of the requests that wait.
func TestCancelledContextTakesNoToken(t *testing.T) {
	l := NewWithClock(1, 1, newClock())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.Wait(ctx); err == nil {
		t.Error("Wait with a cancelled context returned nil (and took the token)")
	}
	if !l.TryAccept() {
		t.Error("a cancelled Wait spent the only token")
	}
}

// No token is made or lost whatever the waiters do: over a run of real
// time at a high rate, with waiters cancelled while waiting or just as they
// are granted, the tokens taken never exceed burst + qps * elapsed, and
// the bucket ends serving (no waiter stuck, no timer lost). Passes.
func TestTokensConservedUnderCancellation(t *testing.T) {
	const qps, burst = 2000, 5
	l := New(qps, burst)
	defer l.Stop()
	start := time.Now()
	var taken atomic.Int64
	var wg sync.WaitGroup
	stop := time.Now().Add(500 * time.Millisecond)
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(int64(i)))
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(WithPriority(context.Background(), rnd.Intn(3)), time.Duration(rnd.Intn(2000))*time.Microsecond)
				if l.Wait(ctx) == nil {
					taken.Add(1)
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if max := int64(burst + qps*elapsed.Seconds()); taken.Load() > max {
		t.Errorf("%d tokens taken in %v, at most %d", taken.Load(), elapsed, max)
	}
	// No lower bound on real time: on a loaded machine (and with
	// client-go's own limiter alike) the waiters' timeouts end most waits.
	if l.waiting() != 0 {
		t.Errorf("%d waiters left", l.waiting())
	}
	// Still serving.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.Wait(ctx); err != nil {
		t.Errorf("the bucket stopped serving: %v", err)
	}
}

// A very high rate (1e6) with burst 1 serves many waiters quickly and ends
// with no goroutine left behind (timers fire once and end).
func TestHighQPSBurstOne(t *testing.T) {
	before := runtime.NumGoroutine()
	l := New(1e6, 1)
	var wg sync.WaitGroup
	deadline := time.Now().Add(20 * time.Second)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				ctx, cancel := context.WithDeadline(context.Background(), deadline)
				err := l.Wait(ctx)
				cancel()
				if err != nil {
					t.Errorf("Wait: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	l.Stop()
	poll(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before+1 })
}

// After Stop the limiter still serves (Stop only stops the armed timer; a
// later waiter arms a new one).
func TestWaitAfterStop(t *testing.T) {
	clk := newClock()
	l := NewWithClock(10, 1, clk)
	if !l.TryAccept() {
		t.Fatal("full bucket refused")
	}
	done := make(chan error, 1)
	go func() { done <- l.Wait(context.Background()) }()
	waitFor(t, l, 1)
	l.Stop()
	// The waiter's timer is gone; a second waiter arms one.
	go func() { done <- l.Wait(context.Background()) }()
	waitFor(t, l, 2)
	clk.Step(100 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// The timer is armed again after the token is handed out.
	poll(t, "the timer armed for the next token", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.timer != nil
	})
	clk.Step(100 * time.Millisecond)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiter from before Stop was never served")
	}
}
