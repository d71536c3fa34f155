package app

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// parse applies args to the defaults and validates them.
func parse(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	o := NewOptions()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	gate := featuregate.NewFeatureGate()
	if err := logsapi.AddFeatureGates(gate); err != nil {
		t.Fatal(err)
	}
	return o, o.Validate(gate)
}

func TestPolicyFlags(t *testing.T) {
	tests := []flagTest{
		{name: "defaults", check: func(o *Options) bool {
			return o.CSIMigration == "per-node" && o.MaxWaitForUnmountDeletedNode == nil
		}},
		{name: "csi migration completed", args: []string{"--csi-migration=completed"},
			check: func(o *Options) bool { return o.CSIMigration == "completed" }},
		{name: "csi migration per-node", args: []string{"--csi-migration", "per-node"},
			check: func(o *Options) bool { return o.CSIMigration == "per-node" }},
		{name: "csi migration unknown", args: []string{"--csi-migration=upstream"},
			wantErr: `--csi-migration must be one of per-node, completed, got "upstream"`},
		{name: "csi migration empty", args: []string{"--csi-migration="},
			wantErr: `--csi-migration must be one of per-node, completed, got ""`},
		{name: "deleted-node wait 0", args: []string{"--max-wait-for-unmount-deleted-node=0s"},
			check: func(o *Options) bool {
				return o.MaxWaitForUnmountDeletedNode != nil && *o.MaxWaitForUnmountDeletedNode == 0
			}},
		{name: "deleted-node wait 30s", args: []string{"--max-wait-for-unmount-deleted-node", "30s", "--max-wait-for-unmount=2m"},
			check: func(o *Options) bool {
				return *o.MaxWaitForUnmountDeletedNode == 30*time.Second && o.MaxWaitForUnmount == 2*time.Minute
			}},
		{name: "deleted-node wait negative", args: []string{"--max-wait-for-unmount-deleted-node=-1s"},
			wantErr: "--max-wait-for-unmount-deleted-node must not be negative, got -1s"},
		{name: "deleted-node wait not a duration", args: []string{"--max-wait-for-unmount-deleted-node=soon"},
			wantErr: `invalid argument "soon" for "--max-wait-for-unmount-deleted-node" flag`},
	}
	runFlagTests(t, tests)
}

func TestShadowFlags(t *testing.T) {
	tests := []flagTest{
		{name: "off by default", check: func(o *Options) bool { return !o.Shadow && o.ShadowGracePeriod == time.Minute }},
		{name: "with a Lease of its own", args: []string{"--shadow", "--leader-elect-resource-name=attach-detach-controller-shadow", "--shadow-grace-period=20s"},
			check: func(o *Options) bool { return o.Shadow && o.ShadowGracePeriod == 20*time.Second }},
		{name: "without leader election", args: []string{"--shadow", "--leader-elect=false"},
			check: func(o *Options) bool { return o.Shadow }},
		{name: "on the controller's Lease", args: []string{"--shadow"},
			wantErr: `--shadow with --leader-elect needs a Lease of its own, not the controller's "attach-detach-controller"`},
		{name: "grace period too short", args: []string{"--shadow", "--leader-elect=false", "--shadow-grace-period=500ms"},
			wantErr: "--shadow-grace-period must be at least 1s, got 500ms"},
	}
	runFlagTests(t, tests)
}

// flagTest is a command line and what it must give: options that check
// accepts, or an error containing wantErr.
type flagTest struct {
	name    string
	args    []string
	check   func(*Options) bool
	wantErr string
}

func runFlagTests(t *testing.T, tests []flagTest) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parse(t, tc.args...)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error = %v, want one containing %q", err, tc.wantErr)
				}
			case err != nil:
				t.Errorf("unexpected error: %v", err)
			case !tc.check(o):
				t.Errorf("options not as expected: %+v", o)
			}
		})
	}
}

func TestStatusWorkersFollowTheBudget(t *testing.T) {
	for qps, want := range map[float32]int{0.5: 1, 20: 1, 50: 1, 80: 2, 200: 5, 400: 10, 5000: 10} {
		if got := statusWorkers(qps); got != want {
			t.Errorf("statusWorkers(%v) = %d, want %d", qps, got, want)
		}
	}
}

func TestZoneDisruptionFlags(t *testing.T) {
	tests := []flagTest{
		{name: "defaults", check: func(o *Options) bool {
			return o.UnhealthyZoneThreshold == 0.55 && o.UnhealthyZoneMinNodes == 3 && o.zoneThreshold() == 0.55
		}},
		{name: "set", args: []string{"--unhealthy-zone-threshold=0.7", "--unhealthy-zone-min-nodes=5"},
			check: func(o *Options) bool { return o.zoneThreshold() == 0.7 && o.UnhealthyZoneMinNodes == 5 }},
		{name: "off", args: []string{"--disable-zone-disruption-guard"},
			check: func(o *Options) bool { return o.zoneThreshold() == 0 }},
		{name: "threshold 0", args: []string{"--unhealthy-zone-threshold=0"},
			wantErr: "--unhealthy-zone-threshold must be greater than 0 and at most 1, got 0"},
		{name: "threshold above 1", args: []string{"--unhealthy-zone-threshold=1.5"},
			wantErr: "--unhealthy-zone-threshold must be greater than 0 and at most 1, got 1.5"},
		{name: "min nodes 0", args: []string{"--unhealthy-zone-min-nodes=0"},
			wantErr: "--unhealthy-zone-min-nodes must be at least 1, got 0"},
	}
	runFlagTests(t, tests)
}
