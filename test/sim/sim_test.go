package sim

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSimulation runs SIM_SEEDS seeds (default 200) from SIM_FIRST_SEED
// (default 1), or the one seed SIM_SEED with its whole trace.
func TestSimulation(t *testing.T) {
	cfg := DefaultConfig()
	first, n := envInt(t, "SIM_FIRST_SEED", 1), envInt(t, "SIM_SEEDS", 200)
	if seed := os.Getenv("SIM_SEED"); seed != "" {
		first, n = envInt(t, "SIM_SEED", 0), 1
		cfg.Trace = true
	}
	if v := os.Getenv("SIM_STEPS"); v != "" {
		cfg.Steps = envInt(t, "SIM_STEPS", 0)
	}
	totals := map[string]int{}
	steps := 0
	for seed := int64(first); seed < int64(first+n); seed++ {
		res := Run(seed, cfg)
		steps += res.Steps
		for k, v := range res.Stats {
			totals[k] += v
		}
		if len(res.Violations) > 0 || cfg.Trace {
			for _, line := range res.Trace {
				t.Log(line)
			}
		}
		if len(res.Violations) > 0 {
			t.Fatalf("seed %d, step %d: %s\nreplay: SIM_SEED=%d make test-sim", seed, res.Steps, strings.Join(res.Violations, "; "), seed)
		}
	}
	var keys []string
	for k := range totals {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "\n  %-40s %d", k, totals[k])
	}
	t.Logf("simulation: %d seeds from %d, %d steps, 0 violations%s", n, first, steps, b.String())
}

// A seed replays exactly: same choices, same trace.
func TestSimulationReplaysExactly(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Trace = true
	for _, seed := range []int64{7, 42} {
		a, b := Run(seed, cfg), Run(seed, cfg)
		if !slices.Equal(a.Trace, b.Trace) {
			for i := range min(len(a.Trace), len(b.Trace)) {
				if a.Trace[i] != b.Trace[i] {
					t.Fatalf("seed %d: traces differ at line %d:\n%s\n%s\nbefore:\n%s", seed, i, a.Trace[i], b.Trace[i], strings.Join(a.Trace[max(0, i-8):i], "\n"))
				}
			}
			t.Fatalf("seed %d: traces of %d and %d lines", seed, len(a.Trace), len(b.Trace))
		}
		if len(a.Trace) < cfg.Steps {
			t.Fatalf("seed %d: only %d trace lines", seed, len(a.Trace))
		}
	}
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}
