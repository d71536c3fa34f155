package shadow

import (
	"strings"
	"testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func TestCompare(t *testing.T) {
	k := cache.Key{Volume: "kubernetes.io/csi/d^h", Node: "n1"}
	desired := func(a reconciler.Action, reason string, pending string) Observation {
		return Observation{Decision: reconciler.Decision{Key: k, Action: a, Reason: reason, Desired: true,
			Spec: &volume.Spec{Name: k.Volume, Pending: pending}}}
	}
	unwanted := func(a reconciler.Action, reason, force, wait string) Observation {
		return Observation{Decision: reconciler.Decision{Key: k, Action: a, Reason: reason, Force: force}, Wait: wait}
	}
	attached := Cluster{State: Attached, Reported: true}
	tests := []struct {
		name     string
		o        Observation
		c        Cluster
		held     Kind
		want     Kind
		wantOurs string
	}{
		{name: "both attached", o: desired(reconciler.Nothing, "attached", ""), c: attached},
		{name: "the cluster attaches", o: desired(reconciler.Attach, "attach in progress", ""), c: Cluster{State: Attaching}},
		{name: "neither wanted nor attached", o: unwanted(reconciler.Nothing, "neither wanted nor attached", "", ""), c: Cluster{State: NotAttached}},
		{name: "we would attach", o: desired(reconciler.Attach, "not attached yet", ""), c: Cluster{State: NotAttached},
			want: WouldAttach, wantOurs: "attach: not attached yet"},
		{name: "neither attaches a volume held elsewhere", o: desired(reconciler.Blocked, "exclusively attached to node n2", ""), c: Cluster{State: NotAttached}},
		{name: "the cluster attached what we hold back", o: desired(reconciler.Nothing, "attached as kubernetes.io/csi/ebs.csi.aws.com^vol-1", "waiting for CSINode n1"),
			c: Cluster{State: Attached, Name: "kubernetes.io/csi/ebs.csi.aws.com^vol-1"}, want: WouldNotAttach, wantOurs: "blocked: waiting for CSINode n1"},
		{name: "the cluster attaches what we hold back", o: desired(reconciler.Attach, "attach in progress", "waiting for CSINode n1"),
			c: Cluster{State: Attaching}, want: WouldNotAttach},
		{name: "the cluster attached a single-node volume to a second node", o: func() Observation {
			o := desired(reconciler.Nothing, "attached", "")
			o.HeldElsewhere = []cache.Key{{Volume: k.Volume, Node: "n2"}}
			return o
		}(), c: attached, want: WouldNotAttach, wantOurs: "blocked: volume is already exclusively attached to node n2"},
		{name: "a single-node volume held elsewhere, not attached here: both wait", o: func() Observation {
			o := desired(reconciler.Blocked, "volume is already exclusively attached to node n2", "")
			o.HeldElsewhere = []cache.Key{{Volume: k.Volume, Node: "n2"}}
			return o
		}(), c: Cluster{State: NotAttached}},
		{name: "we would detach", o: unwanted(reconciler.Withdraw, "no pod wants it", "", ""), c: attached,
			want: WouldDetach, wantOurs: "withdraw: no pod wants it"},
		{name: "we would force a detach", o: unwanted(reconciler.Withdraw, "no pod wants it", reconciler.ForceTimeout, ""), c: attached,
			want: WouldDetach, wantOurs: "(forced: timeout)"},
		{name: "both detach", o: unwanted(reconciler.Wait, "detach in progress", "", ""), c: Cluster{State: Detaching}},
		{name: "both wait for the unmount", o: unwanted(reconciler.Wait, "still mounted", "", "still mounted on node n1"), c: attached},
		{name: "the cluster detaches a mounted volume", o: unwanted(reconciler.Wait, "detach in progress", "", "still mounted on unhealthy node n1; forced detach in 5m0s"),
			c: Cluster{State: Detaching}, want: WouldWaitForUnmount, wantOurs: "wait: still mounted on unhealthy node n1"},
		{name: "the cluster force-detaches in a disrupted zone", o: unwanted(reconciler.Wait, "forced detach held", "",
			`still mounted on unhealthy node n1; forced detach held: zone "a" is disrupted: 8 of 10 nodes not ready, threshold 55%`),
			c: Cluster{State: Detaching}, want: WouldWaitForUnmount, wantOurs: `forced detach held: zone "a" is disrupted`},
		{name: "the cluster detached a mounted volume", o: unwanted(reconciler.Nothing, "neither wanted nor attached", "", "still mounted on node n1"),
			c: Cluster{State: NotAttached}, held: WouldWaitForUnmount, want: WouldWaitForUnmount},
		{name: "a volume gone that was never ours to keep", o: unwanted(reconciler.Nothing, "neither wanted nor attached", "", "still mounted on node n1"),
			c: Cluster{State: NotAttached}},
		{name: "the cluster detached, we would have by now", o: unwanted(reconciler.Nothing, "neither wanted nor attached", "", ""),
			c: Cluster{State: NotAttached}, held: WouldWaitForUnmount},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := Compare(tc.o, tc.c, tc.held)
			if v.Kind != tc.want {
				t.Fatalf("kind = %q, want %q (%+v)", v.Kind, tc.want, v)
			}
			if !strings.Contains(v.Ours, tc.wantOurs) {
				t.Errorf("ours = %q, want it to contain %q", v.Ours, tc.wantOurs)
			}
			if v.Cluster != tc.c.String() {
				t.Errorf("cluster = %q, want %q", v.Cluster, tc.c.String())
			}
		})
	}
}
