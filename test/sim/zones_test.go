package sim

import (
	"strings"
	"testing"
)

// Without the zone disruption guard, partitions lead to forced detaches of
// the nodes of a disrupted zone, which I10 finds: the model exercises the
// guard, and the invariant can fail.
func TestZoneGuardIsNeeded(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ZoneGuardOff = true
	for seed := int64(1); seed <= 300; seed++ {
		res := Run(seed, cfg)
		for _, v := range res.Violations {
			if strings.HasPrefix(v, "I10:") {
				t.Logf("seed %d without the guard: %s", seed, v)
				return
			}
		}
	}
	t.Fatal("300 seeds without the zone disruption guard broke no I10: partitions do not reach forced detaches")
}
