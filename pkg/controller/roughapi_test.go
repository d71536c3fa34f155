package controller

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The API as it is: objects deleted by someone else and created again
// under the same name, relists that deliver tombstones, answers of the
// controller's own writes that are the first to show a change, calls that
// fail. Each test fails without the rule it names.

var vaResource = storagev1.SchemeGroupVersion.WithResource("volumeattachments")

// A single-node volume's VolumeAttachment, failing on node-1 while a pod on
// node-2 waits, is deleted by someone else; node-1's key creates it again
// before the deletion is synced, and the lister has not shown the new
// object yet. The UID on record named the object deleted: the deletion's
// sync must not take the new one for gone, or node-2 attaches the volume
// too.
func TestVolumeAttachmentCreatedAgainIsNotTakenForGone(t *testing.T) {
	name := volume.AttachmentName("h1", driver, "node-1")
	objs := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a"),
		pod("pod-b", "node-2", "claim-a"), node("node-1"), node("node-2")}
	f := newFixture(t, append(objs, va("claim-a", "h1", "node-1", attachError("disk busy")))...)
	f.syncFirst("node-1", []string{"h1"}, "default/pod-a")
	must(t, f.c.syncNode(f.ctx, "node-2"))
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	f.drain()
	f.reset()

	must(t, f.client.Tracker().Delete(vaResource, "", name))
	f.load(objs...)
	k1 := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	must(t, f.c.syncVolume(f.ctx, k1))
	if w := f.writes(); !slices.Contains(w, "create volumeattachments "+name) {
		t.Fatalf("writes %v: node-1's VolumeAttachment not created again", w)
	}
	must(t, f.c.syncAttachment(f.ctx, name))
	// node-2's worker takes its key before node-1's.
	must(t, f.c.syncVolume(f.ctx, cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-2"}))
	f.drain()
	other := volume.AttachmentName("h1", driver, "node-2")
	if w := f.writes(); slices.Contains(w, "create volumeattachments "+other) {
		t.Errorf("writes %v: the ReadWriteOnce volume was attached to node-2 while node-1's attach is under way", w)
	}
	if _, ok := f.c.actual.Get(k1); !ok {
		t.Error("node-1's attach under way is no longer on record")
	}
}

// A relist finds a node gone: its tombstone holds the informer's last
// copy, from before kubelet mounted the volume of a pod deleted meanwhile.
// What the node had mounted is unknown: the volume waits the max wait for
// unmount, not detached at once.
func TestNodeGoneInARelistMayHaveAnythingMounted(t *testing.T) {
	stale := node("node-1")
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), va("claim-a", "h1", "node-1")}
	f := newFixture(t, append(vol, stale, pod("pod-a", "node-1", "claim-a"))...)
	f.syncFirst("node-1", []string{"h1"}, "default/pod-a")
	f.drain()
	f.reset()

	f.load(vol...)
	f.c.nodeDeleted(toolscache.DeletedFinalStateUnknown{Key: "node-1", Obj: stale})
	must(t, f.c.syncNode(f.ctx, "node-1"))
	must(t, f.c.syncPod(f.ctx, "default/pod-a"))
	f.drain()
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	for _, w := range f.writes() {
		if w == "delete volumeattachments "+volume.AttachmentName("h1", driver, "node-1") {
			t.Fatalf("detached at once a volume the node may still have mounted: %v", f.writes())
		}
	}
	if d := f.c.reconciler.Decide(k, f.clock.Now()); d.Action != reconciler.Wait || d.After <= 0 {
		t.Errorf("decision %v, want a wait for the max wait for unmount", d)
	}
	// The max wait passes: the volume is detached.
	f.clock.Step(7 * time.Minute)
	f.volumes.Add(k)
	f.drain()
	if w := f.writes(); !slices.Contains(w, "delete volumeattachments "+volume.AttachmentName("h1", driver, "node-1")) {
		t.Errorf("writes %v: not detached after the max wait", w)
	}
}

// The node's managed annotation is removed and put back by someone else;
// the answers of the controller's own status writes are the first to show
// each state, and the informer, which relisted, shows neither change. The
// node's pods marked unread meanwhile are read again: a volume no pod
// wants any more is detached (once its kubelet has had time to report
// what it mounted: reconciler.KubeletReportGrace), instead of waiting
// forever for a read that nothing queued.
func TestManagementSeenFirstInStatusAnswersLeavesNoPodUnread(t *testing.T) {
	vols := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), va("claim-a", "h1", "node-1"),
		csiPV("claim-b", "h2"), claim("claim-b"), va("claim-b", "h2", "node-1")}
	podA := pod("pod-a", "node-1", "claim-a")
	f := newFixture(t, append(vols, podA, pod("pod-b", "node-1", "claim-b"), node("node-1", inUse(csiName("h1"), csiName("h2"))))...)
	f.syncFirst("node-1", []string{"h1", "h2"}, "default/pod-a", "default/pod-b")
	f.drain()
	f.reset()

	written := func(rv string, opts ...nodeOpt) {
		n := node("node-1", append(opts, resourceVersion(rv), inUse(csiName("h1"), csiName("h2")))...)
		f.c.nodeWritten(f.ctx, n)
	}
	written("20", unmanaged)
	written("30")
	f.load(append(vols, podA, node("node-1", resourceVersion("30"), inUse(csiName("h1"), csiName("h2"))))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	must(t, f.c.syncPod(f.ctx, "default/pod-b")) // deleted
	for f.c.Process(f.ctx, QueuePods) {
	}
	// kubelet unmounts pod-b's volume.
	f.load(append(vols, podA, node("node-1", resourceVersion("40"), inUse(csiName("h1"))))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	for f.c.Process(f.ctx, QueuePods) {
	}
	f.drain()
	f.pastReportGrace()
	if w := f.writes(); !slices.Contains(w, "delete volumeattachments "+volume.AttachmentName("h2", driver, "node-1")) {
		k := cache.Key{Volume: volume.CSIName(driver, "h2"), Node: "node-1"}
		t.Errorf("writes %v: pod-b's volume not detached: %v", w, f.c.reconciler.Decide(k, f.clock.Now()))
	}
	f.checkNotUnwanted(cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}, "while pod-a runs")
}

// A forced detach from a NotReady node fails; the node comes back Ready,
// the volume still mounted. The retry is decided again: nothing is deleted
// while kubelet has the volume mounted, and the detach finishes once it
// unmounts.
func TestFailedForcedDetachIsDecidedAgain(t *testing.T) {
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), va("claim-a", "h1", "node-1")}
	name := volume.AttachmentName("h1", driver, "node-1")
	f := newFixture(t, append(vol, node("node-1", notReady, inUse(csiName("h1"))))...)
	fail, deletes := true, 0
	f.client.PrependReactor("delete", "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail {
			return true, nil, errors.New("etcd unavailable")
		}
		deletes++
		return false, nil, nil
	})
	f.syncFirst("node-1", []string{"h1"})
	f.drain()
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	f.clock.Step(7 * time.Minute)
	f.volumes.Add(k)
	f.drain()
	if a, _ := f.c.actual.Get(k); a.DetachStarted.IsZero() || !slices.Contains(f.writes(), "delete volumeattachments "+name) {
		t.Fatalf("forced detach not tried: %+v, writes %v", a, f.writes())
	}

	fail = false
	f.load(append(vol, node("node-1", resourceVersion("20"), inUse(csiName("h1"))))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.volumes.Add(k) // the retry
	f.drain()
	if deletes != 0 {
		t.Fatalf("deleted the VolumeAttachment of a volume mounted on a Ready node: %v", f.c.reconciler.Decide(k, f.clock.Now()))
	}

	f.load(append(vol, node("node-1", resourceVersion("30")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.drain()
	if deletes != 1 {
		t.Errorf("%d deletes once kubelet unmounted, want 1: %v", deletes, f.c.reconciler.Decide(k, f.clock.Now()))
	}
}

// A relist shows the VolumeAttachment whose delete the controller started
// gone and another of that name (someone created it again) as one update:
// the detach of the one before is over, and none of this one has started.
func TestVolumeAttachmentOfANewUIDEndsTheDetachOfTheOld(t *testing.T) {
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), node("node-1")}
	f := newFixture(t, append(vol, va("claim-a", "h1", "node-1"))...)
	f.syncFirst("node-1", []string{"h1"})
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	f.c.actual.Update(k, false, func(a *cache.Attachment) {
		a.State, a.Withdrawn, a.DetachStarted = cache.Detaching, true, epoch
	})
	f.load(append(vol, va("claim-a", "h1", "node-1", func(a *storagev1.VolumeAttachment) { a.UID = "uid-new" }))...)
	must(t, f.c.syncAttachment(f.ctx, volume.AttachmentName("h1", driver, "node-1")))
	if a, _ := f.c.actual.Get(k); a.State != cache.Attached || !a.DetachStarted.IsZero() || a.Withdrawn {
		t.Errorf("%+v: want the new object attached, no detach started", a)
	}
}

// node-1's VolumeAttachment of a single-node volume, created by the
// controller, is deleted by someone else before any event of it is read;
// node-1's key creates it again. The informer, behind, then shows the first
// object and its deletion: neither is the object now there. The deletion's
// sync must not take the record for gone, or node-2, whose pod waits,
// attaches the volume too.
func TestOlderVolumeAttachmentSeenAfterTheCreateIsNotTakenForIt(t *testing.T) {
	name := volume.AttachmentName("h1", driver, "node-1")
	objs := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a"),
		pod("pod-b", "node-2", "claim-a"), node("node-1"), node("node-2")}
	f := newFixture(t, objs...)
	uids := 0
	f.client.PrependReactor("create", "volumeattachments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		uids++
		a.(k8stesting.CreateAction).GetObject().(metav1.Object).SetUID(types.UID(fmt.Sprintf("uid-%d", uids)))
		return false, nil, nil
	})
	f.syncFirst("node-1", nil, "default/pod-a")
	must(t, f.c.syncNode(f.ctx, "node-2"))
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	k1 := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	must(t, f.c.syncVolume(f.ctx, k1))
	first, err := f.client.StorageV1().VolumeAttachments().Get(f.ctx, name, metav1.GetOptions{})
	must(t, err)
	must(t, f.client.Tracker().Delete(vaResource, "", name))
	must(t, f.c.syncVolume(f.ctx, k1))
	if w := f.writes(); !slices.Contains(w, "create volumeattachments "+name) || uids != 2 {
		t.Fatalf("writes %v: node-1's VolumeAttachment not created again", w)
	}
	// The informer shows the first object, then its deletion.
	f.load(append(objs, first)...)
	must(t, f.c.syncAttachment(f.ctx, name))
	f.load(objs...)
	must(t, f.c.syncAttachment(f.ctx, name))
	if _, ok := f.c.actual.Get(k1); !ok {
		t.Fatal("node-1's attach under way is no longer on record")
	}
	f.reset()
	must(t, f.c.syncVolume(f.ctx, cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-2"}))
	f.drain()
	if w := f.writes(); slices.Contains(w, "create volumeattachments "+volume.AttachmentName("h1", driver, "node-2")) {
		t.Errorf("writes %v: the ReadWriteOnce volume was attached to node-2 while node-1's attach is under way", w)
	}
}

// The detach of a volume no pod wants has started (its delete call is on
// its way, and deletes whatever object is under the name then) when
// another VolumeAttachment of that name is seen, attached: someone created
// it again. The detach is not taken as over: the volume stays out of every
// node status report until it is finished, or kubelet could mount what the
// delete on its way detaches.
func TestVolumeAttachmentOfANewUIDDuringADetachCallKeepsItStarted(t *testing.T) {
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), node("node-1")}
	f := newFixture(t, append(vol, va("claim-a", "h1", "node-1"))...)
	f.syncFirst("node-1", []string{"h1"})
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	f.c.actual.Update(k, false, func(a *cache.Attachment) { a.Withdrawn = true })
	if !f.c.status.BeginDetach(k, epoch) {
		t.Fatal("detach not started")
	}
	f.load(append(vol, va("claim-a", "h1", "node-1", func(a *storagev1.VolumeAttachment) { a.UID = "uid-new" }))...)
	must(t, f.c.syncAttachment(f.ctx, volume.AttachmentName("h1", driver, "node-1")))
	if a, _ := f.c.actual.Get(k); a.DetachStarted.IsZero() || !a.Withdrawn {
		t.Errorf("detach started %v, withdrawn %v; want both", a.DetachStarted, a.Withdrawn)
	}
	if list, _ := f.c.status.Begin("node-1"); len(list) != 0 {
		t.Errorf("node report %v lists the volume whose detach is on its way", list)
	}
}

// The detach of a volume no pod wants has started (its delete call is on
// its way) when its VolumeAttachment is seen gone, then another of that
// name, attached: someone deleted the first and created it again. The
// delete on its way deletes whatever is under the name: the record is not
// dropped as detached, and the volume stays out of every node status
// report until that detach is finished.
func TestVolumeAttachmentGoneDuringADetachCallKeepsItStarted(t *testing.T) {
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), node("node-1")}
	f := newFixture(t, append(vol, va("claim-a", "h1", "node-1"))...)
	f.syncFirst("node-1", []string{"h1"})
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	f.c.actual.Update(k, false, func(a *cache.Attachment) { a.Withdrawn = true })
	if !f.c.status.BeginDetach(k, epoch) {
		t.Fatal("detach not started")
	}
	name := volume.AttachmentName("h1", driver, "node-1")
	f.load(vol...)
	must(t, f.c.syncAttachment(f.ctx, name))
	if a, ok := f.c.actual.Get(k); !ok || a.DetachStarted.IsZero() {
		t.Fatalf("on record %v, detach started %v: want the detach on its way kept", ok, a.DetachStarted)
	}
	f.load(append(vol, va("claim-a", "h1", "node-1", func(a *storagev1.VolumeAttachment) { a.UID = "uid-new" }))...)
	must(t, f.c.syncAttachment(f.ctx, name))
	if list, _ := f.c.status.Begin("node-1"); len(list) != 0 {
		t.Errorf("node report %v lists the volume whose detach is on its way", list)
	}
}

// The deletion of a VolumeAttachment the controller created, whose event it
// has not read, is confirmed with the API; while that answer (gone) is on
// its way, the volume's worker creates the object again. The answer
// predates that create: the record is not dropped as detached, or a pod on
// another node gets the single-node volume too.
func TestGoneAnswerOlderThanTheControllersCreateDropsNothing(t *testing.T) {
	name := volume.AttachmentName("h1", driver, "node-1")
	objs := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a"), node("node-1")}
	f := newFixture(t, objs...)
	f.syncFirst("node-1", nil, "default/pod-a")
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	must(t, f.c.syncVolume(f.ctx, k))
	must(t, f.client.Tracker().Delete(vaResource, "", name))
	f.reset()
	f.client.PrependReactor("get", "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
		// The volume's worker creates it again while the answer is on
		// its way, and records its create's answer.
		f.c.actual.Update(k, false, func(a *cache.Attachment) { a.AttachmentUID, a.CreatedUID = "", "uid-again" })
		return true, nil, apierrors.NewNotFound(storagev1.Resource("volumeattachments"), name)
	})
	must(t, f.c.syncAttachment(f.ctx, name))
	if _, ok := f.c.actual.Get(k); !ok {
		t.Error("the attach created again is no longer on record")
	}
	if q := f.queued(QueueVolumeAttachments); !slices.Contains(q, name) {
		t.Errorf("queued VolumeAttachments %v: %s not looked at again", q, name)
	}
}

// A CSI volume known from node status alone (its VolumeAttachment never
// seen), that no pod wants: its detach deletes the object under the
// volume's name, which someone had created meanwhile (the lister has not
// shown it yet). The object's create and deletion then reach one sync:
// that sync must find the record by the object's name, or nothing ever
// ends the detach.
func TestDetachOfAVolumeKnownFromNodeStatusEndsWhenItsObjectGoes(t *testing.T) {
	name := volume.AttachmentName("h1", driver, "node-1")
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	n := node("node-1", listsAttached(csiName("h1")))
	f := newFixture(t, n)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.c.actual.Update(k, true, func(a *cache.Attachment) {
		a.Kind, a.PluginName = volume.KindCSI, volume.CSIPluginName
	})
	f.c.status.Recover("node-1", []v1.AttachedVolume{{Name: v1.UniqueVolumeName(k.Volume)}})
	must(t, f.client.Tracker().Add(va("claim-a", "h1", "node-1")))
	f.volumes.Add(k)
	f.drain()
	if w := f.writes(); !slices.Contains(w, "delete volumeattachments "+name) {
		t.Fatalf("writes %v: no detach", w)
	}
	if _, err := f.client.StorageV1().VolumeAttachments().Get(f.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("VolumeAttachment still there after its delete: %v", err)
	}
	must(t, f.c.syncAttachment(f.ctx, name))
	f.drain()
	if a, ok := f.c.actual.Get(k); ok {
		t.Errorf("the object is gone, and the detach is still on record: %+v; decided %v", a, f.c.reconciler.Decide(k, epoch))
	}
}

// A ReadWriteOnce volume's VolumeAttachment on node-0 is read while its
// PersistentVolume is missing (deleted by an admin who removed its
// finalizers): it can't be identified, and nothing is recorded. The PV is
// created again and a pod on node-1 wants it; its key is decided before the
// VolumeAttachment is read again. The attach to node-1 must wait: the volume
// may still be attached to node-0.
func TestUnidentifiedVolumeAttachmentHoldsASingleNodeVolume(t *testing.T) {
	name := volume.AttachmentName("h1", driver, "node-0")
	nodes := []runtime.Object{node("node-0"), node("node-1"), va("claim-a", "h1", "node-0")}
	f := newFixture(t, nodes...)
	must(t, f.c.syncNode(f.ctx, "node-0"))
	must(t, f.c.syncNode(f.ctx, "node-1"))
	must(t, f.c.syncAttachment(f.ctx, name))
	if keys := f.c.actual.Keys(); len(keys) != 0 {
		t.Fatalf("an attachment of a missing PV was recorded: %v", keys)
	}
	f.load(append(nodes, csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-b", "node-1", "claim-a"))...)
	f.reset()
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	f.drain()
	other := volume.AttachmentName("h1", driver, "node-1")
	if w := f.writes(); slices.Contains(w, "create volumeattachments "+other) {
		t.Errorf("writes %v: attached to node-1 while node-0's VolumeAttachment, not read again yet, may hold it", w)
	}
	// Read again, the VolumeAttachment is identified: node-1 waits for its
	// detach, as for any other.
	must(t, f.c.syncAttachment(f.ctx, name))
	f.drain()
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	if d := f.c.reconciler.Decide(k, epoch); d.Action != reconciler.Blocked {
		t.Errorf("once node-0's VolumeAttachment is read: %v, want blocked", d)
	}
}
