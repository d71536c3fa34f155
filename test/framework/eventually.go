package framework

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often Eventually checks its condition.
const PollInterval = 100 * time.Millisecond

// Eventually calls cond every PollInterval until it returns true and fails
// the test if that does not happen within timeout. An error from cond fails
// the test at once: return (false, nil) for states worth waiting out, such
// as NotFound. msgAndArgs, if given, is a format string and its arguments
// that say what the test waited for. Call it from the test's goroutine.
func Eventually(t testing.TB, timeout time.Duration, cond func() (bool, error), msgAndArgs ...any) {
	t.Helper()
	what := "condition"
	if len(msgAndArgs) > 0 {
		if format, ok := msgAndArgs[0].(string); ok {
			what = fmt.Sprintf(format, msgAndArgs[1:]...)
		} else {
			what = fmt.Sprint(msgAndArgs...)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	ticker := time.NewTicker(PollInterval)
	defer ticker.Stop()
	for {
		done, err := cond()
		if err != nil {
			t.Fatal(fmt.Errorf("wait for %s: %w", what, err))
		}
		if done {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("wait for %s: not true after %s", what, timeout)
		case <-ticker.C:
		}
	}
}
