package reconciler

import (
	"testing"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// A key is urgent while a pod waits for it: its attach, or, for a
// single-node volume a pod wants on another node, its detach (a move). The
// urgency follows the states: it ends when the pod goes, and never comes
// from a volume several nodes may share.
func TestUrgent(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec *volume.Spec
		// wantedOn is where a pod wants the volume; it is attached on node1.
		wantedOn  string
		withdrawn bool
		node1     bool // want Urgent(key on node1)
		awaitedOn bool // want AwaitedOn(node1)
	}{
		{name: "wanted here: the attach", spec: specA, wantedOn: node1, node1: true},
		{name: "single-node volume wanted elsewhere: the detach of a move", spec: specA, wantedOn: node2, node1: true},
		{name: "and its withdraw write", spec: specA, wantedOn: node2, withdrawn: true, node1: true, awaitedOn: true},
		{name: "shared volume wanted elsewhere: no wait", spec: specX, wantedOn: node2, withdrawn: true},
		{name: "wanted nowhere: a teardown", spec: specA, withdrawn: true},
		{name: "wanted elsewhere under its other name", spec: specEBSInTree, wantedOn: node2, withdrawn: true, node1: true, awaitedOn: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			desired, actual := cache.NewDesiredState(), cache.NewActualState()
			for _, n := range []string{node1, node2} {
				actual.SetNode(n, cache.NodeInfo{Managed: true, Ready: true})
			}
			if tc.wantedOn != "" {
				want := tc.spec
				if tc.spec == specEBSInTree {
					// The pod elsewhere names the disk by its CSI name.
					want = &volume.Spec{Name: ebsCSI, Aliases: []volume.Name{ebsInTree}, Kind: volume.KindCSI,
						Driver: "ebs.csi.aws.com", VolumeHandle: "vol-ebs", PVName: "pv-ebs", SingleNode: true}
				}
				desired.SetPod(podA, tc.wantedOn, []*volume.Spec{want})
			}
			actual.Update(key(tc.spec, node1), true, func(a *cache.Attachment) {
				a.Kind, a.State, a.Spec, a.Withdrawn = tc.spec.Kind, cache.Attached, tc.spec, tc.withdrawn
			})
			r := New(desired, actual, nodestatus.NewRecord(actual), nil, nil, nil, Config{MaxWaitForUnmount: time.Minute})
			if got := r.Urgent(key(tc.spec, node1)); got != tc.node1 {
				t.Errorf("Urgent(%s on node1) = %v, want %v", tc.spec.Name, got, tc.node1)
			}
			if got := r.AwaitedOn(node1); got != tc.awaitedOn {
				t.Errorf("AwaitedOn(node1) = %v, want %v", got, tc.awaitedOn)
			}
		})
	}
}
