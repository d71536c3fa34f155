package sim

import (
	"strings"
	"testing"
)

// Without the zone disruption guard, partitions lead to forced detaches of
// the nodes of a disrupted zone, which I10 finds: the model exercises the
// guard, and the invariant can fail, in the small world and, zone by zone,
// in one of three zones.
func TestZoneGuardIsNeeded(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		// otherZone: I10 must be found in a zone other than "a".
		otherZone bool
	}{
		{"one zone", "default zone-guard=off-checked", false},
		{"three zones", "nodes=12 zones=3 zone-guard=off-checked", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgOf, err := configs(tc.config)
			if err != nil {
				t.Fatal(err)
			}
			for seed := int64(1); seed <= 300; seed++ {
				res := Run(seed, cfgOf(seed))
				for _, v := range res.Violations {
					if strings.HasPrefix(v, "I10:") && (!tc.otherZone || !strings.Contains(v, `zone "a"`)) {
						t.Logf("seed %d without the guard (%s): %s", seed, res.Config, v)
						return
					}
				}
			}
			t.Fatalf("300 seeds without the zone disruption guard (%s) broke no I10: partitions do not reach forced detaches", tc.config)
		})
	}
}
