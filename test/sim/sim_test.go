package sim

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSimulation runs SIM_SEEDS seeds (default 200) from SIM_FIRST_SEED
// (default 1), or the one seed SIM_SEED with its whole trace. Each seed runs
// the world of the sweep it draws (SweepConfig); SIM_CONFIG=default runs
// DefaultConfig's one world instead, and SIM_CONFIG="nodes=6 zones=1" fixes
// dimensions of the sweep ("default nodes=6": of the default world). It
// stops at the first seed that breaks an invariant, unless SIM_KEEP_GOING is
// set: then it runs every seed and tallies the violations by invariant, by
// shape and by configuration. SIM_PARALLEL runs that many seeds at once
// (each seed alone is as deterministic). SIM_EXPLAIN names a PV whose
// explanation by the controller is traced after each step.
func TestSimulation(t *testing.T) {
	spec := os.Getenv("SIM_CONFIG")
	configOf, err := configs(spec)
	if err != nil {
		t.Fatalf("SIM_CONFIG=%q: %v", spec, err)
	}
	first, n := envInt(t, "SIM_FIRST_SEED", 1), envInt(t, "SIM_SEEDS", 200)
	trace := false
	if seed := os.Getenv("SIM_SEED"); seed != "" {
		first, n = envInt(t, "SIM_SEED", 0), 1
		trace = true
	}
	steps := envInt(t, "SIM_STEPS", 0)
	// SIM_ZONE_GUARD=off runs the controller without its zone disruption
	// guard, I10 checked (TestZoneGuardIsNeeded).
	guardOff := os.Getenv("SIM_ZONE_GUARD") == "off"
	explain := os.Getenv("SIM_EXPLAIN")
	cfgOf := func(seed int64) Config {
		cfg := configOf(seed)
		cfg.Trace, cfg.Explain = trace, explain
		if steps > 0 {
			cfg.Steps = steps
		}
		if guardOff {
			cfg.ZoneGuardOff, cfg.ZoneHoldUnchecked = true, false
		}
		return cfg
	}
	replay := "SIM_SEED=%d make test-sim"
	if spec != "" {
		replay = "SIM_CONFIG='" + spec + "' " + replay
	}
	keepGoing := os.Getenv("SIM_KEEP_GOING") != ""
	sum := newSummary(int64(first))
	results, stop := runSeeds(int64(first), n, envInt(t, "SIM_PARALLEL", 1), cfgOf)
	defer stop()
	for res := range results {
		sum.add(res)
		if len(res.Violations) > 0 || trace {
			if !keepGoing || trace {
				for _, line := range res.Trace {
					t.Log(line)
				}
			}
		}
		if len(res.Violations) == 0 {
			continue
		}
		if !keepGoing {
			t.Fatalf("seed %d (%s), step %d: %s\nreplay: "+replay, res.Seed, res.Config, res.Steps, strings.Join(res.Violations, "; "), res.Seed)
		}
		t.Logf("seed %d (%s), step %d: %s", res.Seed, res.Config, res.Steps, strings.Join(res.Violations, "; "))
	}
	t.Logf("simulation: %d seeds from %d, %d steps, %d with violations%s", n, first, sum.steps, sum.failed, sum)
	if sum.failed > 0 {
		t.Errorf("%d of %d seeds broke an invariant", sum.failed, n)
	}
}

// configs returns the configuration of each seed as SIM_CONFIG says.
func configs(spec string) (func(seed int64) Config, error) {
	base := SweepConfig
	fields := strings.Fields(spec)
	if len(fields) > 0 && fields[0] == "default" {
		base = func(int64) Config { return DefaultConfig() }
		fields = fields[1:]
	}
	rest := strings.Join(fields, " ")
	cfg := base(1)
	if err := cfg.Set(rest); err != nil {
		return nil, err
	}
	return func(seed int64) Config {
		cfg := base(seed)
		_ = cfg.Set(rest) // checked above
		return cfg
	}, nil
}

// runSeeds runs n seeds from first, parallel at a time, each in its
// configuration, and hands their results over in seed order until stop is
// called.
func runSeeds(first int64, n, parallel int, cfgOf func(seed int64) Config) (results <-chan Result, stop func()) {
	out := make(chan Result)
	done := make(chan struct{})
	parallel = max(1, parallel)
	slots := make([]chan Result, n)
	for i := range slots {
		slots[i] = make(chan Result, 1)
	}
	sem := make(chan struct{}, parallel)
	go func() {
		for i := range n {
			select {
			case sem <- struct{}{}:
			case <-done:
				return
			}
			go func() {
				slots[i] <- Run(first+int64(i), cfgOf(first+int64(i)))
				<-sem
			}()
		}
	}()
	go func() {
		defer close(out)
		for i := range n {
			var res Result
			select {
			case res = <-slots[i]:
			case <-done:
				return
			}
			select {
			case out <- res:
			case <-done:
				return
			}
		}
	}()
	return out, func() { close(done) }
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
