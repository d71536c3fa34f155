package sim

import (
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The sweep's first seeds reach every value of every dimension, and each of
// the faults timed against what the controller knows (faults.go) happens.
func TestSweepReachesItsFaults(t *testing.T) {
	const seeds = 120
	values := map[string]bool{}
	stats := map[string]int{}
	results, stop := runSeeds(1, seeds, 2, SweepConfig)
	defer stop()
	for res := range results {
		for _, d := range res.Config.Dimensions() {
			values[d] = true
		}
		for k, v := range res.Stats {
			stats[k] += v
		}
	}
	var want []string
	for i := 3; i <= 12; i++ {
		want = append(want, "nodes="+strconv.Itoa(i))
	}
	for i := 1; i <= 10; i++ {
		want = append(want, "workers="+strconv.Itoa(i))
	}
	want = append(want, "zones=1", "zones=2", "zones=3", "status-workers=1", "status-workers=3",
		"deleted-node-wait=nil", "deleted-node-wait=0s", "deleted-node-wait=40s", "deleted-node-wait=2m30s",
		"zone-guard=on", "zone-guard=off", "sync-period=1m0s", "sync-period=off")
	for _, v := range want {
		if !values[v] {
			t.Errorf("%d seeds of the sweep never ran %s", seeds, v)
		}
	}
	faults := []string{faultOutage}
	for _, f := range sweepFaults {
		faults = append(faults, f.stat)
	}
	for _, f := range faults {
		if stats[f] == 0 {
			t.Errorf("%d seeds of the sweep: no %q", seeds, f)
		} else {
			t.Logf("%s: %d", f, stats[f])
		}
	}
}

// A seed of the sweep replays exactly: the same configuration, the same run.
func TestSweepReplaysExactly(t *testing.T) {
	for _, seed := range []int64{5, 297} {
		a, b := SweepConfig(seed), SweepConfig(seed)
		if a.String() != b.String() {
			t.Fatalf("seed %d: configurations %s and %s", seed, a, b)
		}
		a.Trace, b.Trace = true, true
		ra, rb := Run(seed, a), Run(seed, b)
		if !slices.Equal(ra.Trace, rb.Trace) {
			t.Fatalf("seed %d (%s): traces differ", seed, a)
		}
		if !strings.Contains(ra.Trace[0], a.String()) {
			t.Errorf("seed %d: the trace starts %q, not with the configuration", seed, ra.Trace[0])
		}
	}
	var c Config
	if err := c.Set(SweepConfig(9).String()); err != nil || c.String() != SweepConfig(9).String() {
		t.Errorf("configuration %s read back as %s (%v)", SweepConfig(9), c, err)
	}
}
