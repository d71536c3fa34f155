package sim

import (
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"time"
)

// The sweep: each seed runs a world of its own, its configuration drawn from
// the seed (SweepConfig) by a source apart from the run's, so that SIM_SEED=N
// replays the same world and the same run. The dangerous cases need a bigger
// world than DefaultConfig's: zones of four nodes or more to be disrupted by
// a partition with a node gone, several workers at once on one node, the
// deleted node's own max wait, no periodic sync to repair what was missed.
//
//	nodes              3 to 12
//	zones              1 to 3 (node i in zone i mod zones)
//	workers            1 to 10 volume workers
//	status-workers     1 to 3 node status writers
//	deleted-node-wait  nil (the max wait, 90s), 0s, 40s or 2m30s
//	zone-guard         on, or off on a fifth of the seeds (then I10 counts
//	                   what it would find instead of failing)
//	sync-period        1m, or off on a quarter of the seeds
//
// Node workers are 2, as the controller runs them.

// SweepConfig is the configuration of seed in the sweep.
func SweepConfig(seed int64) Config {
	r := rand.New(rand.NewSource(seed*7919 + 104729))
	cfg := DefaultConfig()
	cfg.Nodes = 3 + r.Intn(10)
	cfg.Zones = 1 + r.Intn(3)
	cfg.Workers = 1 + r.Intn(10)
	cfg.StatusWorkers = 1 + r.Intn(3)
	cfg.MaxWaitForUnmountDeletedNode = deletedNodeWaits[r.Intn(len(deletedNodeWaits))]
	cfg.ZoneGuardOff = r.Intn(5) == 0
	cfg.ZoneHoldUnchecked = cfg.ZoneGuardOff
	if r.Intn(4) == 0 {
		cfg.SyncPeriod = 0
	}
	return cfg
}

var deletedNodeWaits = []*time.Duration{nil, ptr(0), ptr(40 * time.Second), ptr(150 * time.Second)}

func ptr(d time.Duration) *time.Duration { return &d }

// Dimensions names the configuration's value on each dimension of the
// sweep, as Set reads them back ("nodes=7").
func (c Config) Dimensions() []string {
	wait := "nil"
	if c.MaxWaitForUnmountDeletedNode != nil {
		wait = c.MaxWaitForUnmountDeletedNode.String()
	}
	guard := "on"
	switch {
	case c.ZoneGuardOff && c.ZoneHoldUnchecked:
		guard = "off"
	case c.ZoneGuardOff:
		guard = "off-checked"
	}
	sync := "off"
	if c.SyncPeriod > 0 {
		sync = c.SyncPeriod.String()
	}
	return []string{
		"nodes=" + strconv.Itoa(c.Nodes),
		"zones=" + strconv.Itoa(c.Zones),
		"workers=" + strconv.Itoa(c.Workers),
		"status-workers=" + strconv.Itoa(c.StatusWorkers),
		"deleted-node-wait=" + wait,
		"zone-guard=" + guard,
		"sync-period=" + sync,
	}
}

// String is the configuration as a failure line and a trace print it.
func (c Config) String() string { return strings.Join(c.Dimensions(), " ") }

// Set changes the configuration as spec says: space-separated dimensions
// as Dimensions names them ("nodes=6 zones=1 sync-period=off").
// zone-guard=off runs without the guard and counts what I10 would find;
// zone-guard=off-checked checks I10 (it must then find violations).
func (c *Config) Set(spec string) error {
	for _, f := range strings.Fields(spec) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("configuration %q: want name=value", f)
		}
		var err error
		switch k {
		case "nodes":
			c.Nodes, err = strconv.Atoi(v)
		case "zones":
			c.Zones, err = strconv.Atoi(v)
			if err == nil && (c.Zones < 1 || c.Zones > len(zoneNames)) {
				err = fmt.Errorf("1 to %d zones", len(zoneNames))
			}
		case "workers":
			c.Workers, err = strconv.Atoi(v)
		case "status-workers":
			c.StatusWorkers, err = strconv.Atoi(v)
		case "deleted-node-wait":
			c.MaxWaitForUnmountDeletedNode = nil
			if v != "nil" {
				var d time.Duration
				d, err = time.ParseDuration(v)
				c.MaxWaitForUnmountDeletedNode = &d
			}
		case "zone-guard":
			switch v {
			case "on":
				c.ZoneGuardOff, c.ZoneHoldUnchecked = false, false
			case "off":
				c.ZoneGuardOff, c.ZoneHoldUnchecked = true, true
			case "off-checked":
				c.ZoneGuardOff, c.ZoneHoldUnchecked = true, false
			default:
				err = fmt.Errorf("on, off or off-checked")
			}
		case "sync-period":
			c.SyncPeriod = 0
			if v != "off" {
				c.SyncPeriod, err = time.ParseDuration(v)
			}
		default:
			err = fmt.Errorf("no such dimension")
		}
		if err != nil {
			return fmt.Errorf("configuration %q: %w", f, err)
		}
	}
	if c.Nodes < 1 || c.Workers < 1 || c.StatusWorkers < 1 {
		return fmt.Errorf("configuration %q: at least one node, worker and status worker", spec)
	}
	return nil
}
