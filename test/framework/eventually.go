package framework

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often Eventually, Poll and Consistently check their
// condition.
const PollInterval = 100 * time.Millisecond

// Eventually calls cond every PollInterval until it returns true and fails
// the test if that does not happen within timeout. An error from cond fails
// the test at once: return (false, nil) for states worth waiting out, such
// as NotFound. format and args say what the test waits for. Call it from
// the test's goroutine.
func Eventually(t testing.TB, timeout time.Duration, cond func() (bool, error), format string, args ...any) {
	t.Helper()
	done, err := poll(t.Context(), timeout, cond)
	if err != nil {
		t.Fatal(fmt.Errorf("wait for %s: %w", fmt.Sprintf(format, args...), err))
	}
	if !done {
		t.Fatalf("wait for %s: not true after %s", fmt.Sprintf(format, args...), timeout)
	}
}

// Poll calls cond every PollInterval until it returns true (Poll returns
// true) or timeout passes (false), for a caller that builds its own failure
// message. An error from cond fails the test at once.
func Poll(t testing.TB, timeout time.Duration, cond func() (bool, error)) bool {
	t.Helper()
	done, err := poll(t.Context(), timeout, cond)
	if err != nil {
		t.Fatal(err)
	}
	return done
}

func poll(ctx context.Context, timeout time.Duration, cond func() (bool, error)) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(PollInterval)
	defer ticker.Stop()
	for {
		done, err := cond()
		if err != nil || done {
			return done, err
		}
		select {
		case <-ctx.Done():
			return false, nil
		case <-ticker.C:
		}
	}
}

// Consistently calls check every PollInterval for d and fails the test at
// its first error: a "this stays so" assertion, whose error says what
// changed. format and args say what should stay so.
func Consistently(t testing.TB, d time.Duration, check func() error, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	ticker := time.NewTicker(PollInterval)
	defer ticker.Stop()
	for {
		if err := check(); err != nil {
			t.Fatal(fmt.Errorf("expected %s for %s: %w", fmt.Sprintf(format, args...), d, err))
		}
		if !time.Now().Before(deadline) {
			return
		}
		select {
		case <-t.Context().Done():
			t.Fatal(fmt.Errorf("check that %s: %w", fmt.Sprintf(format, args...), t.Context().Err()))
		case <-ticker.C:
		}
	}
}
