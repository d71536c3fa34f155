package controller

import (
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// recorded is an attachment of handle on node-1 the controller knew before
// the sync.
type recorded struct {
	handle string
	state  cache.State
	// uid is the UID of the VolumeAttachment the controller saw; empty
	// when it created it and has not seen it yet.
	uid string
	// detachStarted: the controller has deleted the VolumeAttachment.
	detachStarted bool
}

func TestSyncAttachment(t *testing.T) {
	pv := csiPV("claim-a", "h1")
	name := volume.AttachmentName("h1", driver, "node-1")
	for _, tc := range []struct {
		name    string
		before  []recorded
		objects []runtime.Object
		// inAPI are objects the API holds and the listers do not show yet.
		inAPI []runtime.Object
		key   string
		// again: the key was synced once already with these objects.
		again bool

		wantActual              []string
		wantVolumes, wantStatus []string
	}{
		{
			name:        "attached VolumeAttachment: the volume is attached",
			objects:     []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1")},
			key:         name,
			wantActual:  []string{csiName("h1") + "@node-1 attached"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "VolumeAttachment not attached yet: uncertain",
			objects:     []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1", notAttached)},
			key:         name,
			wantActual:  []string{csiName("h1") + "@node-1 uncertain"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "attach error: uncertain, with the driver's error",
			before:      []recorded{{handle: "h1", state: cache.Uncertain, uid: "uid-" + name}},
			objects:     []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1", attachError("disk is busy"))},
			key:         name,
			wantActual:  []string{csiName("h1") + "@node-1 uncertain attachError=disk is busy"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "VolumeAttachment being deleted: detaching",
			before:      []recorded{{handle: "h1", state: cache.Attached, uid: "uid-" + name}},
			objects:     []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1", vaDeleting)},
			key:         name,
			wantActual:  []string{csiName("h1") + "@node-1 detaching"},
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:       "the same VolumeAttachment again: nothing queued",
			again:      true,
			objects:    []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1")},
			key:        name,
			wantActual: []string{csiName("h1") + "@node-1 attached"},
		},
		{
			name:        "VolumeAttachment seen before is gone: the volume is detached",
			before:      []recorded{{handle: "h1", state: cache.Detaching, uid: "uid-" + name, detachStarted: true}},
			objects:     []runtime.Object{node("node-1"), pv},
			key:         name,
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name: "VolumeAttachment created by the controller and never seen is not in the lister but in the API: " +
				"the record stays",
			before:      []recorded{{handle: "h1", state: cache.Uncertain}},
			objects:     []runtime.Object{node("node-1"), pv},
			inAPI:       []runtime.Object{va("claim-a", "h1", "node-1", notAttached)},
			key:         name,
			wantActual:  []string{csiName("h1") + "@node-1 uncertain"},
			wantVolumes: []string{key("h1", "node-1")},
		},
		{
			// An attached record whose object was never seen (its UID
			// cleared by a create that found it existing) is not left
			// attached forever when it goes.
			name:        "VolumeAttachment never seen, gone from the API too: the volume is detached",
			before:      []recorded{{handle: "h1", state: cache.Attached}},
			objects:     []runtime.Object{node("node-1"), pv},
			key:         name,
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:       "unknown VolumeAttachment gone: nothing to do",
			objects:    []runtime.Object{node("node-1"), pv},
			key:        name,
			wantActual: nil,
		},
		{
			name:    "VolumeAttachment of a node the controller does not know is recorded (it counts for single-node volumes)",
			objects: []runtime.Object{pv, va("claim-a", "h1", "node-x")},
			key:     volume.AttachmentName("h1", driver, "node-x"),
			wantActual: []string{
				csiName("h1") + "@node-x attached",
			},
			wantVolumes: []string{key("h1", "node-x")},
			wantStatus:  []string{"node-x"},
		},
		{
			name:   "informer event older than the controller's delete: still detaching, not attached again",
			before: []recorded{{handle: "h1", state: cache.Detaching, uid: "uid-" + name, detachStarted: true}},
			// The object as it was before the delete.
			objects:    []runtime.Object{node("node-1"), pv, va("claim-a", "h1", "node-1")},
			key:        name,
			wantActual: []string{csiName("h1") + "@node-1 detaching"},
		},
		{
			name:    "VolumeAttachment of an unknown PV, never recorded: left alone",
			objects: []runtime.Object{node("node-1"), va("claim-a", "h1", "node-1")},
			key:     name,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, append(tc.objects, tc.inAPI...)...)
			f.load(tc.objects...)
			for _, r := range tc.before {
				k := cache.Key{Volume: volume.CSIName(driver, r.handle), Node: "node-1"}
				f.c.actual.Update(k, true, func(a *cache.Attachment) {
					a.State = r.state
					a.Kind = volume.KindCSI
					a.AttachmentName = volume.AttachmentName(r.handle, driver, "node-1")
					a.AttachmentUID = r.uid
					if r.detachStarted {
						a.Withdrawn = true
						a.DetachStarted = epoch.Add(-time.Second)
					}
				})
			}
			if tc.again {
				if err := f.c.syncAttachment(f.ctx, tc.key); err != nil {
					t.Fatalf("first sync: %v", err)
				}
				f.reset()
			}
			if err := f.c.syncAttachment(f.ctx, tc.key); err != nil {
				t.Fatalf("syncAttachment: %v", err)
			}
			checkList(t, "actual state", f.actualState(), tc.wantActual)
			checkList(t, "volume keys queued", f.queued(QueueVolumes), tc.wantVolumes)
			checkList(t, "node status queued", f.queued(QueueNodeStatus), tc.wantStatus)
			checkList(t, "API writes", f.writes(), nil)
		})
	}
}

// A VolumeAttachment whose PV is missing is left alone; the PV created
// again, bound to no claim yet (the claim is gone, or not bound again yet),
// makes it identifiable: it is synced again and recorded, so that a
// handoff waits for its attach and a detach can find it.
func TestAttachmentOfAPVCreatedAgainIsSyncedAgain(t *testing.T) {
	attachment := va("claim-a", "h1", "node-1", attachError("timeout"))
	f := newFixture(t, attachment, node("node-1"))
	must(t, f.c.syncAttachment(f.ctx, attachment.Name))
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	if _, ok := f.c.actual.Get(k); ok {
		t.Fatalf("%v recorded with its PV missing", k)
	}
	f.reset()
	pv := csiPV("claim-a", "h1")
	pv.Spec.ClaimRef = nil
	f.load(attachment, node("node-1"), pv)
	f.c.pvChanged(pv)
	if q := f.queued(QueueVolumeAttachments); !slices.Contains(q, attachment.Name) {
		t.Fatalf("queued VolumeAttachments %v after its PV came back, want %s", q, attachment.Name)
	}
	must(t, f.c.syncAttachment(f.ctx, attachment.Name))
	if a, ok := f.c.actual.Get(k); !ok || a.State != cache.Uncertain {
		t.Errorf("%v after its PV came back: %+v (recorded %v), want an attach under way", k, a, ok)
	}
}
