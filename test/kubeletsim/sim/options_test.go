package sim

import (
	"flag"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func parse(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	o := NewOptions()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return o, o.Validate()
}

func TestOptions(t *testing.T) {
	o, err := parse(t, "--nodes=3", "--node-prefix=sim-",
		"--csi-drivers", "mock.csi.example.com=mock.csi.example.com, ebs.csi.aws.com",
		"--migrated-plugins", "kubernetes.io/aws-ebs,kubernetes.io/gce-pd",
		"--csinode-delay=2s", "--node-labels", "topology.kubernetes.io/zone=a, tier=db")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"topology.kubernetes.io/zone": "a", "tier": "db"}; !maps.Equal(o.NodeLabels, want) {
		t.Errorf("node labels = %v, want %v", o.NodeLabels, want)
	}
	wantDrivers := []Driver{{Name: "mock.csi.example.com", NodeID: "mock.csi.example.com"}, {Name: "ebs.csi.aws.com"}}
	if !slices.Equal(o.CSIDrivers, wantDrivers) {
		t.Errorf("drivers = %v, want %v", o.CSIDrivers, wantDrivers)
	}
	if !slices.Equal(o.MigratedPlugins, []string{"kubernetes.io/aws-ebs", "kubernetes.io/gce-pd"}) {
		t.Errorf("migrated = %v", o.MigratedPlugins)
	}
	if got := NodeName(o.NodePrefix, 2); got != "sim-2" {
		t.Errorf("NodeName = %s", got)
	}
	if d, ok := o.csiNodes(); !ok || d != 2*time.Second {
		t.Errorf("csiNodes = %v, %v", d, ok)
	}
	if id := nodeID(o.CSIDrivers[1], "sim-0"); id == "sim-0" || id != nodeID(o.CSIDrivers[1], "sim-0") || id == nodeID(o.CSIDrivers[1], "sim-1") {
		t.Errorf("nodeID = %q: empty gives the driver's own stable ID of the node, not its name", id)
	}
	if nodeID(o.CSIDrivers[0], "sim-0") != "mock.csi.example.com" {
		t.Error("nodeID: the configured one")
	}
	if d := NewOptions(); !slices.Equal(d.MigratedPlugins, AllMigratedPlugins) || d.StatusUpdateFrequency != 10*time.Second {
		t.Errorf("defaults: migrated %v, status update frequency %v; want kubelet v1.37's", d.MigratedPlugins, d.StatusUpdateFrequency)
	}
}

func TestOptionsCSINodes(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		delay  time.Duration
		create bool
	}{
		{nil, 0, true},
		{[]string{"--csinode-delay=-1s"}, 0, false},
		{[]string{"--no-csinode"}, 0, false},
		{[]string{"--no-csinode", "--csinode-delay=1s"}, 0, false},
	} {
		o, err := parse(t, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := o.csiNodes(); d != tc.delay || ok != tc.create {
			t.Errorf("%v: csiNodes = %v, %v; want %v, %v", tc.args, d, ok, tc.delay, tc.create)
		}
	}
}

func TestOptionsInvalid(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--nodes=0"}, "--nodes"},
		{[]string{"--node-prefix=Bad_"}, "--node-prefix"},
		{[]string{"--csi-drivers=a.b,a.b"}, "given twice"},
		{[]string{"--csi-drivers==id"}, "no name"},
		{[]string{"--migrated-plugins=kubernetes.io/iscsi"}, "not a migratable"},
		{[]string{"--workers=0"}, "--workers"},
		{[]string{"--node-status-update-frequency=0s"}, "--node-status-update-frequency"},
		{[]string{"--driver-registration-delay=-1s"}, "--driver-registration-delay"},
		{[]string{"--node-labels=zone"}, "not key=value"},
		{[]string{"--node-labels=zone=a b"}, "--node-labels: invalid label"},
		{[]string{"--node-labels=-zone=a"}, "--node-labels: invalid label"},
	} {
		_, err := parse(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}
