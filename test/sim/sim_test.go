package sim

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestSimulation runs SIM_SEEDS seeds (default 200) from SIM_FIRST_SEED
// (default 1), or the one seed SIM_SEED with its whole trace. It stops at the
// first seed that breaks an invariant, unless SIM_KEEP_GOING is set: then it
// runs every seed and tallies the violations by invariant. SIM_PARALLEL runs
// that many seeds at once (each seed alone is as deterministic). SIM_EXPLAIN
// names a PV whose explanation by the controller is traced after each step.
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
	// SIM_ZONE_GUARD=off runs the controller without its zone disruption
	// guard (TestZoneGuardIsNeeded).
	cfg.ZoneGuardOff = os.Getenv("SIM_ZONE_GUARD") == "off"
	cfg.Explain = os.Getenv("SIM_EXPLAIN")
	keepGoing := os.Getenv("SIM_KEEP_GOING") != ""
	totals := map[string]int{}
	tallies := map[string]*tally{}
	steps, failed := 0, 0
	results, stop := runSeeds(int64(first), n, envInt(t, "SIM_PARALLEL", 1), cfg)
	defer stop()
	for res := range results {
		steps += res.Steps
		for k, v := range res.Stats {
			totals[k] += v
		}
		if len(res.Violations) > 0 || cfg.Trace {
			if !keepGoing || cfg.Trace {
				for _, line := range res.Trace {
					t.Log(line)
				}
			}
		}
		if len(res.Violations) == 0 {
			continue
		}
		if !keepGoing {
			t.Fatalf("seed %d, step %d: %s\nreplay: SIM_SEED=%d make test-sim", res.Seed, res.Steps, strings.Join(res.Violations, "; "), res.Seed)
		}
		failed++
		t.Logf("seed %d, step %d: %s", res.Seed, res.Steps, strings.Join(res.Violations, "; "))
		inv, _, _ := strings.Cut(res.Violations[0], ":")
		for _, k := range []string{inv, "  " + shape(res.Violations[0])} {
			x := tallies[k]
			if x == nil {
				x = &tally{first: res.Seed, nth: int(res.Seed) - first + 1, msg: res.Violations[0]}
				tallies[k] = x
			}
			x.seeds = append(x.seeds, res.Seed)
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
	invs := make([]string, 0, len(tallies))
	for k := range tallies {
		invs = append(invs, k)
	}
	slices.Sort(invs)
	// Each invariant, then the shapes of its violations.
	order := func(k string) string {
		if strings.HasPrefix(k, " ") {
			return strings.TrimSpace(k)[:2] + "1" + k
		}
		return k + "0"
	}
	slices.SortFunc(invs, func(a, b string) int { return strings.Compare(order(a), order(b)) })
	for _, inv := range invs {
		x := tallies[inv]
		if strings.HasPrefix(inv, " ") {
			fmt.Fprintf(&b, "\n    %d seeds, first %d: %s\n      seeds: %v", len(x.seeds), x.first, strings.TrimSpace(inv), x.seeds[:min(len(x.seeds), 30)])
			continue
		}
		fmt.Fprintf(&b, "\n  violations %s: %d seeds, first seed %d (the %dth run): %s\n    seeds: %v",
			inv, len(x.seeds), x.first, x.nth, x.msg, x.seeds[:min(len(x.seeds), 30)])
	}
	t.Logf("simulation: %d seeds from %d, %d steps, %d with violations%s", n, first, steps, failed, b.String())
	if failed > 0 {
		t.Errorf("%d of %d seeds broke an invariant", failed, n)
	}
}

// shape is a violation's text with its names and numbers left out: the
// seeds that broke an invariant the same way share one.
func shape(v string) string {
	inv, v, _ := strings.Cut(v, ":")
	for _, re := range shapes {
		v = re.re.ReplaceAllString(v, re.with)
	}
	return inv + ":" + v
}

var shapes = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`kubernetes\.io/[^\s\]]+`), "V"},
	{regexp.MustCompile(`\b(rwo-0|rwo-1|rwop|rwx|rwo-rox|iscsi|ebs)\b`), "V"},
	{regexp.MustCompile(`\bnode-\d+`), "N"},
	{regexp.MustCompile(`\b(N, )+N\b`), "N..."},
	{regexp.MustCompile(`[0-9][0-9hms.]*`), "#"},
}

// tally is what the seeds that broke one invariant have in common: the
// first (and how many seeds were run to find it) and its violation.
type tally struct {
	first int64
	nth   int
	msg   string
	seeds []int64
}

// runSeeds runs n seeds from first, parallel at a time, and hands their
// results over in seed order until stop is called.
func runSeeds(first int64, n, parallel int, cfg Config) (results <-chan Result, stop func()) {
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
				slots[i] <- Run(first+int64(i), cfg)
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
