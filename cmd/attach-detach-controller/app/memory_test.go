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
	// left is what a release leaves held beyond the live heap.
	left uint64
	// busy: the next sample counts a burst of allocation.
	busy bool
}

func (f *fakeRuntime) sample() memSample {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.allocs += mib // quiet: a MiB a period
	if f.busy {
		f.busy = false
		f.s.allocs += 100 * mib
		f.s.retained = 2 * f.s.live
	}
	return f.s
}

func (f *fakeRuntime) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases++
	f.s.retained = f.s.live + max(f.left, 4*mib)
}

func (f *fakeRuntime) work() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.busy = true
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

// TestReleaserReleasesOncePerBusySpell: a release that leaves much held
// beyond the live heap (spans part free, the runtime's own structures, as
// at 100,000 volumes) is not made again every quiet period, each a full
// collection, but once more only after the controller was busy again.
func TestReleaserReleasesOncePerBusySpell(t *testing.T) {
	f := &fakeRuntime{s: memSample{live: 900 * mib, retained: 1800 * mib}, left: 400 * mib}
	r := &releaser{period: time.Millisecond, quiet: 8 * mib, minSlack: 32 * mib, release: f.release, sample: f.sample}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	waitReleases := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for f.count() < n && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if f.count() != n {
			t.Fatalf("released %d times, want %d", f.count(), n)
		}
	}
	waitReleases(1)
	time.Sleep(30 * time.Millisecond) //nolint:forbidigo // quiet periods passing, not a result awaited
	if n := f.count(); n != 1 {
		t.Fatalf("released %d times over quiet periods after a release that left 400 MiB free, want 1", n)
	}
	f.work()
	waitReleases(2)
	cancel()
	<-done
}
