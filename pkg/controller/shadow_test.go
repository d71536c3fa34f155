package controller

import (
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/shadow"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// newShadowFixture is a fixture in shadow mode with a grace period of 0:
// every disagreement is reported at its first sync.
func newShadowFixture(t *testing.T, objs ...runtime.Object) (*fixture, *shadow.Tracker) {
	t.Helper()
	tracker, err := shadow.NewTracker(0, epoch, nil)
	if err != nil {
		t.Fatal(err)
	}
	return newFixtureWith(t, func(c *Config) { c.Shadow = tracker }, objs...), tracker
}

// openDisagreements lists the open disagreements: "kind volume@node".
func openDisagreements(t *shadow.Tracker) []string {
	var out []string
	for _, d := range t.Summary().Oldest {
		out = append(out, fmt.Sprintf("%s %s@%s", d.Kind, d.Volume, d.Node))
	}
	slices.Sort(out)
	return out
}

// TestShadow: in shadow mode, the state the cluster shows is compared with
// what the controller would do, and nothing is written, whatever it finds.
func TestShadow(t *testing.T) {
	pv := csiPV("claim-a", "h1")
	h1 := csiName("h1") + "@node-1"
	ebs := v1.Volume{Name: "ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-1"}}}
	ebsVA := &storagev1.VolumeAttachment{}
	{
		spec := v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "ebs.csi.aws.com", VolumeHandle: "vol-1"}}}
		ebsVA.Name = volume.AttachmentName("vol-1", "ebs.csi.aws.com", "node-1")
		ebsVA.UID = "uid-ebs"
		ebsVA.Spec = storagev1.VolumeAttachmentSpec{Attacher: "ebs.csi.aws.com", NodeName: "node-1",
			Source: storagev1.VolumeAttachmentSource{InlineVolumeSpec: &spec}}
		ebsVA.Status.Attached = true
	}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    []string
	}{
		{
			name: "attached and wanted: agreement",
			objects: []runtime.Object{node("node-1", listsAttached(csiName("h1"))), pv, claim("claim-a"),
				va("claim-a", "h1", "node-1"), pod("pod-a", "node-1", "claim-a")},
		},
		{
			name:    "wanted, nothing attaches it: would attach",
			objects: []runtime.Object{node("node-1"), pv, claim("claim-a"), pod("pod-a", "node-1", "claim-a")},
			want:    []string{"would-attach " + h1},
		},
		{
			name: "wanted, the cluster is attaching it: agreement",
			objects: []runtime.Object{node("node-1"), pv, claim("claim-a"), pod("pod-a", "node-1", "claim-a"),
				va("claim-a", "h1", "node-1", notAttached)},
		},
		{
			name:    "attached, wanted by no pod, not mounted: would detach",
			objects: []runtime.Object{node("node-1", listsAttached(csiName("h1"))), pv, va("claim-a", "h1", "node-1")},
			want:    []string{"would-detach " + h1},
		},
		{
			name: "attached, wanted by no pod, mounted: both wait",
			objects: []runtime.Object{node("node-1", listsAttached(csiName("h1")), inUse(csiName("h1"))), pv,
				va("claim-a", "h1", "node-1")},
		},
		{
			name: "being detached while mounted on a healthy node: would wait for unmount",
			objects: []runtime.Object{node("node-1", inUse(csiName("h1"))), pv,
				va("claim-a", "h1", "node-1", vaDeleting)},
			want: []string{"would-wait-for-unmount " + h1},
		},
		{
			name:    "being detached, not mounted: agreement",
			objects: []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1", vaDeleting)},
		},
		{
			name: "in-tree volume listed in node status, wanted: agreement",
			objects: []runtime.Object{node("node-1", listsAttached(iscsiName)),
				withPod(pod("pod-i", "node-1"), inlineVolume(iscsiVolume))},
		},
		{
			name:    "in-tree volume listed in node status, wanted by no pod: would detach",
			objects: []runtime.Object{node("node-1", listsAttached(iscsiName))},
			want:    []string{"would-detach " + iscsiName + "@node-1"},
		},
		{
			name: "ReadWriteOnce volume the cluster attached to two nodes: would not attach, on either",
			objects: []runtime.Object{node("node-1"), node("node-2"), pv, claim("claim-a"),
				va("claim-a", "h1", "node-1"), va("claim-a", "h1", "node-2"),
				pod("pod-a", "node-1", "claim-a"), pod("pod-b", "node-2", "claim-a")},
			want: []string{"would-not-attach " + h1, "would-not-attach " + csiName("h1") + "@node-2"},
		},
		{
			name: "migratable volume the cluster attached through CSI on a node without CSINode: would not attach",
			objects: []runtime.Object{node("node-1", listsAttached("kubernetes.io/csi/ebs.csi.aws.com^vol-1")), ebsVA,
				withPod(pod("pod-e", "node-1"), inlineVolume(ebs))},
			want: []string{"would-not-attach kubernetes.io/aws-ebs/vol-1@node-1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, tracker := newShadowFixture(t, tc.objects...)
			if err := f.c.Recover(f.ctx); err != nil {
				t.Fatalf("Recover: %v", err)
			}
			f.drain()
			checkList(t, "open disagreements", openDisagreements(tracker), tc.want)
			checkList(t, "API writes", f.writes(), nil)
			checkList(t, "events", f.takeEvents(), nil)
		})
	}
}

// TestShadowClusterDetachesMountedVolume: a volume the cluster detaches
// while it is mounted on a healthy node is one we would have kept. It stays
// reported after the cluster has forgotten it, until the node unmounts it:
// for a CSI volume (its VolumeAttachment deleted, then gone) and for an
// in-tree one (node.status.volumesAttached stops listing it).
func TestShadowClusterDetachesMountedVolume(t *testing.T) {
	pv := csiPV("claim-a", "h1")
	for _, tc := range []struct {
		name string
		key  cache.Key
		// attached, detaching, detached, unmounted: the cluster's steps.
		attached, detaching, detached, unmounted []runtime.Object
	}{
		{
			name:      "CSI",
			key:       cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"},
			attached:  []runtime.Object{node("node-1", inUse(csiName("h1")), listsAttached(csiName("h1"))), pv, va("claim-a", "h1", "node-1")},
			detaching: []runtime.Object{node("node-1", inUse(csiName("h1")), resourceVersion("11")), pv, va("claim-a", "h1", "node-1", vaDeleting)},
			detached:  []runtime.Object{node("node-1", inUse(csiName("h1")), resourceVersion("11")), pv},
			unmounted: []runtime.Object{node("node-1", resourceVersion("12")), pv},
		},
		{
			name:      "in-tree",
			key:       cache.Key{Volume: iscsiName, Node: "node-1"},
			attached:  []runtime.Object{node("node-1", inUse(iscsiName), listsAttached(iscsiName))},
			detaching: []runtime.Object{node("node-1", inUse(iscsiName), resourceVersion("11"))},
			detached:  []runtime.Object{node("node-1", inUse(iscsiName), resourceVersion("11"))},
			unmounted: []runtime.Object{node("node-1", resourceVersion("12"))},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, tracker := newShadowFixture(t, tc.attached...)
			if err := f.c.Recover(f.ctx); err != nil {
				t.Fatal(err)
			}
			f.drain()
			checkList(t, "open disagreements, attached and mounted", openDisagreements(tracker), nil)
			want := []string{fmt.Sprintf("%s %s@%s", shadow.WouldWaitForUnmount, tc.key.Volume, tc.key.Node)}
			// Each step is delivered as the informers would: the objects
			// change, their syncs run, the workers drain the queues.
			step := func(objs []runtime.Object) {
				t.Helper()
				f.load(objs...)
				if err := f.c.syncNode(f.ctx, "node-1"); err != nil {
					t.Fatal(err)
				}
				if err := f.c.syncAttachment(f.ctx, volume.AttachmentName("h1", driver, "node-1")); err != nil {
					t.Fatal(err)
				}
				f.drain()
			}
			step(tc.detaching)
			checkList(t, "open disagreements, being detached while mounted", openDisagreements(tracker), want)
			step(tc.detached)
			checkList(t, "open disagreements, detached while mounted", openDisagreements(tracker), want)
			if _, ok := f.volumes.after[tc.key]; !ok {
				t.Fatalf("%s not queued to be looked at again: nothing of the cluster's is left to wake it", tc.key)
			}
			step(tc.unmounted)
			f.c.volumeQueue.Add(tc.key) // the timer fires
			f.drain()
			checkList(t, "open disagreements, unmounted", openDisagreements(tracker), nil)
			if closed := tracker.Summary().Closed; len(closed) != 1 || closed[0].Kind != shadow.WouldWaitForUnmount {
				t.Errorf("closed disagreements %+v, want the would-wait-for-unmount one", closed)
			}
			checkList(t, "API writes", f.writes(), nil)
		})
	}
}
