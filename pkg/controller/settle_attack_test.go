package controller

import (
	"errors"
	"slices"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// A settled detach against a VolumeAttachment someone else (a second
// attach/detach controller, an admin) deleted and created again under the
// same name, with a new UID, while the informer is behind: the settle's GET
// is the first to show the new object, and the informer then delivers the
// old one's deletion before the new one's creation. That deletion says
// nothing of the new object: the record must not go, or a pod on another
// node attaches the ReadWriteOnce volume there too.

// createdAgain is node-1's VolumeAttachment of claim-a as someone else
// creates it again under the same name, with a new UID.
func createdAgain(opts ...vaOpt) *storagev1.VolumeAttachment {
	return va("claim-a", "h1", "node-1", append(opts, func(a *storagev1.VolumeAttachment) { a.UID = "uid-created-again" })...)
}

// newCreatedAgainWorld: the controller's delete of the VolumeAttachment of
// claim-a on node-1 lands, its answer lost; someone creates the object
// again (again); pod-b on node-1 wants the volume, and the informer still
// shows the object deleted. node-2 exists, wanted by nobody yet.
func newCreatedAgainWorld(t *testing.T, again *storagev1.VolumeAttachment) *settleWorld {
	t.Helper()
	w := newSettleWorld(t, func(w *settleWorld) error {
		w.deleteFromAPI(t)
		must(t, w.f.client.Tracker().Create(vaResource, again.DeepCopy(), ""))
		return apierrors.NewTimeoutError("the answer was lost", 0)
	})
	w.checkUnknown(t)
	w.vol = append(w.vol, node("node-2"))
	w.f.reset()
	w.podWantsItAgain(t, va("claim-a", "h1", "node-1"))
	must(t, w.f.c.syncNode(w.f.ctx, "node-2"))
	w.f.drain()
	return w
}

// theOldOneGoes: the informer delivers the deletion of the object the
// controller deleted; the new one's creation is still on its way. pod-c on
// node-2 wants the ReadWriteOnce volume too.
func (w *settleWorld) theOldOneGoes(t *testing.T) {
	t.Helper()
	objs := append(slices.Clone(w.vol), pod("pod-b", "node-1", "claim-a"), pod("pod-c", "node-2", "claim-a"),
		node("node-1", resourceVersion("20"), listsAttached(csiName("h1")), inUse(csiName("h1"))))
	w.f.load(objs...)
	must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
	must(t, w.f.c.syncPod(w.f.ctx, "default/pod-c"))
	// node-2's worker takes its key before node-1's.
	must(t, w.f.c.syncVolume(w.f.ctx, cache.Key{Volume: w.k.Volume, Node: "node-2"}))
	w.f.drain()
}

func (w *settleWorld) checkNotOnNode2(t *testing.T) {
	t.Helper()
	other := volume.AttachmentName("h1", driver, "node-2")
	if writes := w.f.writes(); slices.Contains(writes, "create volumeattachments "+other) {
		t.Errorf("writes %v: the ReadWriteOnce volume was attached to node-2 while node-1 holds it (%s)", writes, w.name)
	}
	if _, ok := w.f.c.actual.Get(w.k); !ok {
		t.Errorf("node-1's attachment is no longer on record; its VolumeAttachment exists (actual state %v)", w.f.actualState())
	}
	k2 := cache.Key{Volume: w.k.Volume, Node: "node-2"}
	if d := w.f.c.reconciler.Decide(k2, epoch); !strings.Contains(d.Reason, "already exclusively attached to node node-1") {
		t.Errorf("node-2 decided %v; want blocked by node-1", d)
	}
}

// Created again, attached: the settle finds it attached and lists it.
func TestSettledAsAttachedToAnObjectCreatedAgainSurvivesTheOldOnesDeletion(t *testing.T) {
	w := newCreatedAgainWorld(t, createdAgain())
	if a, _ := w.f.c.actual.Get(w.k); a.State != cache.Attached || a.AttachmentUID != "uid-created-again" {
		t.Fatalf("%+v: want attached, the object created again on record", a)
	}
	w.theOldOneGoes(t)
	w.checkNotOnNode2(t)
	if got := w.f.actualState(); !slices.Equal(got, []string{csiName("h1") + "@node-1 attached reported"}) {
		t.Errorf("actual state %v; want node-1's attachment listed in its status throughout", got)
	}
	// The informer shows the object created again: it is the one on record.
	w.f.reset()
	w.f.load(append(slices.Clone(w.vol), createdAgain(), pod("pod-b", "node-1", "claim-a"), pod("pod-c", "node-2", "claim-a"),
		node("node-1", resourceVersion("20"), listsAttached(csiName("h1")), inUse(csiName("h1"))))...)
	must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
	w.f.drain()
	if a, _ := w.f.c.actual.Get(w.k); a.CreatedUID != "" || a.State != cache.Attached {
		t.Errorf("%+v: want attached, no object awaiting its event", a)
	}
	if writes := w.f.writes(); len(writes) > 0 {
		t.Errorf("writes %v; want none", writes)
	}
}

// Created again and being deleted (its creator detaches it): the settle
// waits for that detach; until it is read done, the volume may be attached
// to node-1.
func TestSettledAsDetachingAnObjectCreatedAgainSurvivesTheOldOnesDeletion(t *testing.T) {
	w := newCreatedAgainWorld(t, createdAgain(vaDeleting))
	if a, _ := w.f.c.actual.Get(w.k); a.State != cache.Detaching || a.AttachmentUID != "uid-created-again" {
		t.Fatalf("%+v: want detaching, the object created again on record", a)
	}
	w.theOldOneGoes(t)
	w.checkNotOnNode2(t)
	// The informer shows the object created again, being deleted; then
	// its creator's detach ends, and the informer shows it gone. The
	// volume is attached to one node anew.
	world := append(slices.Clone(w.vol), pod("pod-b", "node-1", "claim-a"), pod("pod-c", "node-2", "claim-a"),
		node("node-1", resourceVersion("20"), listsAttached(csiName("h1")), inUse(csiName("h1"))))
	w.f.load(append(slices.Clone(world), createdAgain(vaDeleting))...)
	must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
	w.f.drain()
	if a, _ := w.f.c.actual.Get(w.k); a.CreatedUID != "" || a.State != cache.Detaching {
		t.Errorf("%+v: want detaching, no object awaiting its event", a)
	}
	w.deleteFromAPI(t)
	w.f.reset()
	w.f.load(world...)
	must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
	w.f.drain()
	var creates []string
	for _, s := range w.f.writes() {
		if strings.HasPrefix(s, "create volumeattachments ") {
			creates = append(creates, s)
		}
	}
	if len(creates) != 1 {
		t.Errorf("writes %v; want the volume attached anew to one node", w.f.writes())
	}
}

// The settle reads an object being deleted that the informer never shows:
// someone created it again after the controller's delete landed and the
// informer read that deletion, and it is created and gone within a watch
// outage, which the relist after it does not show. No informer event will
// say it is gone: the periodic sync (Resync) finds the attachment with no
// VolumeAttachment in the lister and asks the API. (With the periodic sync
// off, nothing wakes the key: a known limit.)
func TestSettledAsDetachingAnObjectNeverShownIsWokenByThePeriodicSync(t *testing.T) {
	w := newSettleWorld(t, func(w *settleWorld) error {
		w.deleteFromAPI(t)
		return apierrors.NewTimeoutError("the answer was lost", 0)
	})
	// The informer reads the deletion: the detach stays started, its
	// object on record no longer named.
	w.f.load(w.vol...)
	must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
	w.checkUnknown(t)
	must(t, w.f.client.Tracker().Create(vaResource, createdAgain(vaDeleting), ""))
	w.f.reset()
	w.podWantsItAgain(t, nil)
	w.f.drain()
	if a, _ := w.f.c.actual.Get(w.k); a.State != cache.Detaching || a.AttachmentUID != "uid-created-again" {
		t.Fatalf("%+v: want detaching, the object read from the API on record", a)
	}
	if writes := w.f.writes(); slices.ContainsFunc(writes, func(s string) bool { return strings.Contains(s, "volumeattachments") }) {
		t.Fatalf("writes %v; want no VolumeAttachment written while the object is being deleted", writes)
	}
	// It goes; the informer never shows it.
	w.deleteFromAPI(t)
	w.f.reset()
	w.f.c.Resync(w.f.ctx)
	for w.f.c.Process(w.f.ctx, QueueVolumeAttachments) {
	}
	w.f.drain()
	if !slices.Contains(w.f.writes(), "create volumeattachments "+w.name) {
		t.Errorf("writes %v: the volume not attached anew once its VolumeAttachment is gone (%v)", w.f.writes(), w.f.c.reconciler.Decide(w.k, epoch))
	}
}

// An informer event older than the delete (the object as it was before it)
// arrives after the settle read the object being deleted: it says nothing
// new, and the volume is neither taken for attached nor listed again.
func TestSettledAsDetachingIgnoresAnEventOlderThanTheDelete(t *testing.T) {
	w := newSettleWorld(t, func(w *settleWorld) error {
		must(t, w.f.client.Tracker().Update(vaResource, va("claim-a", "h1", "node-1", vaDeleting), ""))
		return apierrors.NewTimeoutError("the answer was lost", 0)
	})
	w.f.reset()
	w.podWantsItAgain(t, va("claim-a", "h1", "node-1"))
	w.f.drain()
	if a, _ := w.f.c.actual.Get(w.k); a.State != cache.Detaching {
		t.Fatalf("%+v: want detaching", a)
	}
	// The informer's copy, from before the delete, is synced again (a
	// resync, or a relist that delivers it as it was).
	must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
	w.f.drain()
	if got := w.f.actualState(); !slices.Equal(got, []string{csiName("h1") + "@node-1 detaching"}) {
		t.Errorf("actual state %v; want the detach under way, not listed", got)
	}
	for _, s := range w.f.writes() {
		if strings.HasPrefix(s, "create") || strings.HasPrefix(s, "delete") {
			t.Errorf("writes %v: want no VolumeAttachment written while its detach is under way", w.f.writes())
		}
	}
}

// pod-b, which wants the volume again, goes while the settle reads the
// VolumeAttachment: the answer (not being deleted: attached) is recorded,
// but the volume is not listed again for nobody; it is detached once its
// kubelet no longer lists it in use.
func TestPodGoneDuringTheSettleLeavesTheVolumeToItsDetach(t *testing.T) {
	w := newSettleWorld(t, func(w *settleWorld) error {
		return apierrors.NewForbidden(storagev1.Resource("volumeattachments"), w.name, errors.New("admission webhook denied the request"))
	})
	w.f.reset()
	gets := 0
	w.f.client.PrependReactor("get", "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
		if gets++; gets == 1 {
			// pod-b goes while the API answers.
			w.f.load(append(slices.Clone(w.vol), va("claim-a", "h1", "node-1"),
				node("node-1", resourceVersion("20"), inUse(csiName("h1"))))...)
			must(t, w.f.c.syncPod(w.f.ctx, "default/pod-b"))
		}
		return false, nil, nil
	})
	w.podWantsItAgain(t, va("claim-a", "h1", "node-1"))
	w.f.drain()
	if gets == 0 {
		t.Fatal("the detach was not settled")
	}
	if got := w.f.actualState(); !slices.Equal(got, []string{csiName("h1") + "@node-1 attached"}) {
		t.Errorf("actual state %v; want attached, not listed", got)
	}
	if d := w.f.c.reconciler.Decide(w.k, epoch); d.Action != reconciler.Wait || !strings.Contains(d.Reason, "still mounted") {
		t.Errorf("decided %v; want a wait for kubelet to unmount it", d)
	}
	for _, a := range w.f.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && strings.Contains(string(p.GetPatch()), csiName("h1")) {
			t.Errorf("node status patch %s lists the volume nobody wants", p.GetPatch())
		}
	}
	// Its kubelet no longer lists it in use: the detach goes on.
	w.f.load(append(slices.Clone(w.vol), va("claim-a", "h1", "node-1"), node("node-1", resourceVersion("30")))...)
	must(t, w.f.c.syncNode(w.f.ctx, "node-1"))
	if d := w.f.c.reconciler.Decide(w.k, epoch); d.Action != reconciler.Detach {
		t.Errorf("decided %v; want the detach", d)
	}
	if !slices.Contains(w.f.queued(QueueVolumes), key("h1", "node-1")) {
		t.Errorf("queued %v: the key not queued by the unmount", w.f.queued(QueueVolumes))
	}
}
