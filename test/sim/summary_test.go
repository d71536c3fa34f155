package sim

import (
	"cmp"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// summary tallies the results of a run of seeds: the stats, the violations
// by invariant and by shape, and seeds, violations and the sweep's faults by
// configuration (each dimension's value apart: "nodes=7").
type summary struct {
	first         int64
	steps, failed int
	totals        map[string]int
	tallies       map[string]*tally
	dims          map[string]*dimTally
	dimOrder      []string
}

// dimTally is what the seeds of one value of one dimension did.
type dimTally struct {
	seeds, failed int
	invariants    map[string]int
	faults        map[string]int
}

func newSummary(first int64) *summary {
	return &summary{first: first, totals: map[string]int{}, tallies: map[string]*tally{}, dims: map[string]*dimTally{}}
}

func (s *summary) add(res Result) {
	s.steps += res.Steps
	for k, v := range res.Stats {
		s.totals[k] += v
	}
	var inv string
	if len(res.Violations) > 0 {
		s.failed++
		inv, _, _ = strings.Cut(res.Violations[0], ":")
		for _, k := range []string{inv, "  " + shape(res.Violations[0])} {
			x := s.tallies[k]
			if x == nil {
				x = &tally{first: res.Seed, nth: int(res.Seed-s.first) + 1, msg: res.Violations[0], config: res.Config.String()}
				s.tallies[k] = x
			}
			x.seeds = append(x.seeds, res.Seed)
		}
	}
	for _, d := range res.Config.Dimensions() {
		x := s.dims[d]
		if x == nil {
			x = &dimTally{invariants: map[string]int{}, faults: map[string]int{}}
			s.dims[d] = x
			s.dimOrder = append(s.dimOrder, d)
		}
		x.seeds++
		if inv != "" {
			x.failed++
			x.invariants[inv]++
		}
		for _, f := range sweepFaults {
			x.faults[f.stat] += res.Stats[f.stat]
		}
	}
}

// String is the summary's text: every stat, then each invariant broken
// with the shapes of its violations, then the configurations.
func (s *summary) String() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(s.totals)) {
		fmt.Fprintf(&b, "\n  %-40s %d", k, s.totals[k])
	}
	// Each invariant, then the shapes of its violations.
	order := func(k string) string {
		if strings.HasPrefix(k, " ") {
			return strings.TrimSpace(k)[:2] + "1" + k
		}
		return k + "0"
	}
	invs := slices.SortedFunc(maps.Keys(s.tallies), func(a, b string) int { return strings.Compare(order(a), order(b)) })
	for _, inv := range invs {
		x := s.tallies[inv]
		if strings.HasPrefix(inv, " ") {
			fmt.Fprintf(&b, "\n    %d seeds, first %d (the %dth run; %s): %s\n      seeds: %v", len(x.seeds), x.first, x.nth, x.config,
				strings.TrimSpace(inv), x.seeds[:min(len(x.seeds), 30)])
			continue
		}
		fmt.Fprintf(&b, "\n  violations %s: %d seeds, first seed %d (the %dth run): %s\n    seeds: %v",
			inv, len(x.seeds), x.first, x.nth, x.msg, x.seeds[:min(len(x.seeds), 30)])
	}
	if len(s.dims) > 1 || s.failed > 0 {
		b.WriteString("\n  config (each value of each dimension): seeds, seeds with violations (by their first invariant); the sweep's faults")
	}
	slices.SortStableFunc(s.dimOrder, compareDimensions)
	for _, d := range s.dimOrder {
		x := s.dims[d]
		var invs, faults []string
		for _, inv := range slices.Sorted(maps.Keys(x.invariants)) {
			invs = append(invs, fmt.Sprintf("%s %d", inv, x.invariants[inv]))
		}
		for _, f := range sweepFaults {
			if f.sub {
				faults[len(faults)-1] += fmt.Sprintf(" (%d %s)", x.faults[f.stat], f.short)
				continue
			}
			faults = append(faults, fmt.Sprintf("%s %d", f.short, x.faults[f.stat]))
		}
		v := ""
		if len(invs) > 0 {
			v = " (" + strings.Join(invs, ", ") + ")"
		}
		fmt.Fprintf(&b, "\n    config %-24s %6d seeds, %4d with violations%s; %s", d, x.seeds, x.failed, v, strings.Join(faults, ", "))
	}
	return b.String()
}

// compareDimensions orders dimensions as Config.Dimensions lists them, and
// the values of one by number or duration where they are ones.
func compareDimensions(a, b string) int {
	ka, va, _ := strings.Cut(a, "=")
	kb, vb, _ := strings.Cut(b, "=")
	if ka != kb {
		names := DefaultConfig().Dimensions()
		at := func(k string) int {
			return slices.IndexFunc(names, func(n string) bool { return strings.HasPrefix(n, k+"=") })
		}
		return at(ka) - at(kb)
	}
	rank := func(v string) float64 {
		if n, err := strconv.Atoi(v); err == nil {
			return float64(n)
		}
		if d, err := time.ParseDuration(v); err == nil {
			return d.Seconds()
		}
		return -1
	}
	if c := cmp.Compare(rank(va), rank(vb)); c != 0 {
		return c
	}
	return strings.Compare(va, vb)
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
	first  int64
	nth    int
	msg    string
	config string
	seeds  []int64
}
