package budget

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
)

// asyncClock runs the functions of AfterFunc in their own goroutine, as the
// real clock does (the fake clock runs them under its own lock).
type asyncClock struct{ *clocktesting.FakeClock }

func (c asyncClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	return c.FakeClock.AfterFunc(d, func() { go f() })
}

func newClock() asyncClock { return asyncClock{clocktesting.NewFakeClock(time.Unix(1000, 0))} }

// waiting returns how many wait for a token.
func (l *Limiter) waiting() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.waiters)
}

// waitFor blocks until n wait.
func waitFor(t *testing.T, l *Limiter, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for l.waiting() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters, want %d", l.waiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// The tokens of a bucket with waiters go to the lowest priority number
// first, then to the first to wait; a token is handed out once.
func TestLimiterServesByPriority(t *testing.T) {
	clk := newClock()
	l := NewWithClock(10, 1, clk) // a token every 100 ms
	if !l.TryAccept() {
		t.Fatal("a full bucket refused its first token")
	}
	if l.TryAccept() {
		t.Fatal("an empty bucket gave a token")
	}
	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	start := func(name string, p int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Wait(WithPriority(context.Background(), p)); err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			mu.Lock()
			got = append(got, name)
			mu.Unlock()
		}()
	}
	// One at a time, so that the order of arrival is known.
	arrivals := []struct {
		name string
		p    int
	}{{"other-1", Other}, {"attach-1", Attach}, {"other-2", Other}, {"attach-2", Attach}, {"move-1", Move}}
	for i, a := range arrivals {
		start(a.name, a.p)
		waitFor(t, l, i+1)
	}
	for i := range arrivals {
		clk.Step(100 * time.Millisecond)
		waitFor(t, l, len(arrivals)-i-1)
		// The token goes to one waiter only.
		mu.Lock()
		n := len(got)
		mu.Unlock()
		for n != i+1 {
			time.Sleep(time.Millisecond)
			mu.Lock()
			n = len(got)
			mu.Unlock()
		}
	}
	wg.Wait()
	if want := []string{"move-1", "attach-1", "attach-2", "other-1", "other-2"}; !slices.Equal(got, want) {
		t.Errorf("served %v, want %v", got, want)
	}
}

// A waiter whose context ends takes nothing and leaves: the next waiter
// gets the token; a context with no priority waits as Attach.
func TestLimiterWaitCancelled(t *testing.T) {
	clk := newClock()
	l := NewWithClock(1, 1, clk)
	if err := l.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(WithPriority(context.Background(), Move))
	errs := make(chan error, 2)
	go func() { errs <- l.Wait(ctx) }()
	waitFor(t, l, 1)
	go func() { errs <- l.Wait(context.Background()) }()
	waitFor(t, l, 2)
	cancel()
	if err := <-errs; err == nil {
		t.Fatal("a cancelled wait took a token")
	}
	waitFor(t, l, 1)
	clk.Step(time.Second)
	if err := <-errs; err != nil {
		t.Fatalf("the remaining waiter: %v", err)
	}
	if PriorityOf(context.Background()) != Attach {
		t.Errorf("no priority waits as %d, want Attach", PriorityOf(context.Background()))
	}
}

// The bucket refills at qps up to burst, and a caller finding a token and
// nobody waiting takes it at once.
func TestLimiterRefill(t *testing.T) {
	clk := newClock()
	l := NewWithClock(2, 3, clk)
	for i := range 3 {
		if !l.TryAccept() {
			t.Fatalf("token %d of a full bucket of 3 refused", i)
		}
	}
	if l.TryAccept() {
		t.Fatal("a fourth token")
	}
	clk.Step(10 * time.Second) // 20 tokens earned, 3 kept
	for i := range 3 {
		if err := l.Wait(context.Background()); err != nil {
			t.Fatalf("token %d after the refill: %v", i, err)
		}
	}
	if l.TryAccept() {
		t.Fatal("the bucket held more than its burst")
	}
}

// A request that waits PromoteAfter is served as one of the next priority:
// a teardown keeps going under a stream of new attaches that would take
// the whole budget.
func TestLimiterPromotesWhoWaits(t *testing.T) {
	clk := newClock()
	tick := PromoteAfter / 2
	l := NewWithClock(float32(time.Second)/float32(tick), 1, clk) // a token every tick
	if !l.TryAccept() {
		t.Fatal("a full bucket refused its first token")
	}
	served := make(chan string, 3)
	wait := func(name string, p int) {
		go func() {
			if err := l.Wait(WithPriority(context.Background(), p)); err == nil {
				served <- name
			}
		}()
	}
	wait("detach", Other)
	waitFor(t, l, 1)
	wait("attach-1", Attach)
	waitFor(t, l, 2)
	clk.Step(tick)
	if got := <-served; got != "attach-1" {
		t.Fatalf("first served %s, want attach-1", got)
	}
	wait("attach-2", Attach)
	waitFor(t, l, 2)
	clk.Step(tick)
	if got := <-served; got != "detach" {
		t.Fatalf("after %v served %s, want the detach that waited that long", PromoteAfter, got)
	}
	clk.Step(tick)
	if got := <-served; got != "attach-2" {
		t.Fatalf("then served %s, want attach-2", got)
	}
}
