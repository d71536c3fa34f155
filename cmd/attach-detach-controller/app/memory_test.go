package app

import (
	"context"
	"sync"
	"testing"
	"time"
)

const mib = 1 << 20

func TestReleaserShouldRelease(t *testing.T) {
	r := &releaser{quiet: 8 * mib, minSlack: 32 * mib}
	for _, c := range []struct {
		name      string
		prev, cur memSample
		want      bool
	}{
		{"quiet, twice the live heap held", memSample{}, memSample{allocs: mib, live: 90 * mib, retained: 180 * mib}, true},
		{"busy", memSample{}, memSample{allocs: 50 * mib, live: 90 * mib, retained: 180 * mib}, false},
		{"quiet, little held beyond the live heap", memSample{}, memSample{allocs: mib, live: 90 * mib, retained: 110 * mib}, false},
		{"quiet, small process", memSample{}, memSample{allocs: mib, live: 10 * mib, retained: 30 * mib}, false},
		{"quiet, slack under a quarter of a large live heap", memSample{}, memSample{allocs: mib, live: 1000 * mib, retained: 1200 * mib}, false},
		{"nothing counted yet", memSample{}, memSample{}, false},
	} {
		if got := r.shouldRelease(c.prev, c.cur); got != c.want {
			t.Errorf("%s: shouldRelease = %v, want %v", c.name, got, c.want)
		}
	}
}

// fakeRuntime is a heap that a burst left at twice its live size, until
// released.
type fakeRuntime struct {
	mu       sync.Mutex
	s        memSample
	releases int
}

func (f *fakeRuntime) sample() memSample {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.allocs += mib // quiet: a MiB a period
	return f.s
}

func (f *fakeRuntime) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases++
	f.s.retained = f.s.live + 4*mib
}

func (f *fakeRuntime) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.releases
}

// TestReleaserRun: a quiet process holding much free memory gives it back
// once, not again while nothing grows; Run returns when ctx ends.
func TestReleaserRun(t *testing.T) {
	f := &fakeRuntime{s: memSample{live: 90 * mib, retained: 180 * mib}}
	r := &releaser{period: time.Millisecond, quiet: 8 * mib, minSlack: 32 * mib, release: f.release, sample: f.sample}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for f.count() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if f.count() != 1 {
		t.Fatalf("released %d times, want 1", f.count())
	}
	// Many more quiet periods: nothing more to give back.
	for range 50 {
		f.sample()
	}
	time.Sleep(20 * time.Millisecond) //nolint:forbidigo // periods passing, not a result awaited
	if n := f.count(); n != 1 {
		t.Errorf("released %d times while nothing grew, want 1", n)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}
