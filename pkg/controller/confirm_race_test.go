package controller

import (
	"errors"
	"slices"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The controller's create of node-1's VolumeAttachment of h1, a
// ReadWriteOnce volume, times out: the API server has the request and may
// still carry it out (a slow admission webhook, a slow etcd). node-1 goes
// NotReady with h1 in use, pod-a goes, and pod-b on node-2 wants h1. A GET
// that finds no VolumeAttachment on node-1 then proves nothing: the create
// may land after it. h1 is held on node-1, as any attachment that may be
// mounted there, and never attached to node-2 while node-1's may land.
func TestCreateInFlightIsNotTakenForNothingAttached(t *testing.T) {
	name1 := volume.AttachmentName("h1", driver, "node-1")
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a")}
	objs := append(vol, pod("pod-a", "node-1", "claim-a"), node("node-1"), node("node-2"))
	f := newFixture(t, objs...)
	var inFlight *storagev1.VolumeAttachment
	f.client.PrependReactor("create", "volumeattachments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		o := a.(k8stesting.CreateAction).GetObject().(*storagev1.VolumeAttachment)
		if o.Name != name1 || inFlight != nil {
			return false, nil, nil
		}
		inFlight = o.DeepCopy()
		return true, nil, apierrors.NewTimeoutError("request did not complete within the allowed duration", 0)
	})
	f.syncFirst("node-1", nil, "default/pod-a")
	must(t, f.c.syncNode(f.ctx, "node-2"))
	k1 := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	if err := f.c.syncVolume(f.ctx, k1); err == nil || inFlight == nil {
		t.Fatalf("attach on node-1: %v; want the create's timeout", err)
	}
	// node-1 stops reporting, h1 in use; pod-a goes, pod-b comes.
	objs = append(vol, pod("pod-b", "node-2", "claim-a"), node("node-1", notReady, inUse(csiName("h1"))), node("node-2"))
	f.load(objs...)
	must(t, f.client.Tracker().Update(nodesGVR, node("node-1", notReady, inUse(csiName("h1"))), ""))
	must(t, f.c.syncNode(f.ctx, "node-1"))
	must(t, f.c.syncPod(f.ctx, "default/pod-a"))
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	// node-1's key, queued by pod-a's going, is synced first.
	must(t, f.c.syncVolume(f.ctx, k1))
	f.drain()
	// The create lands, and the external-attacher attaches it; its event
	// is read.
	inFlight.UID = "uid-late"
	inFlight.Status.Attached = true
	must(t, f.client.Tracker().Add(inFlight))
	f.load(append(objs, inFlight)...)
	must(t, f.c.syncAttachment(f.ctx, name1))
	f.drain()
	vas, err := f.client.Tracker().List(vaResource, storagev1.SchemeGroupVersion.WithKind("VolumeAttachment"), "")
	must(t, err)
	var on []string
	for _, va := range vas.(*storagev1.VolumeAttachmentList).Items {
		on = append(on, va.Spec.NodeName)
	}
	if slices.Contains(on, "node-1") && slices.Contains(on, "node-2") {
		t.Errorf("writes %v: h1, ReadWriteOnce, has VolumeAttachments on %v", f.writes(), on)
	}
	if _, ok := f.c.actual.Get(k1); !ok {
		t.Error("node-1's attachment, its create in flight, not on record")
	}
	if d := f.c.reconciler.Decide(k1, f.clock.Now()); d.Action != reconciler.Wait {
		t.Errorf("node-1: decided %v, want the max wait for unmount", d)
	}
}

// As TestCreateInFlightIsNotTakenForNothingAttached, with the create
// refused by the API (an admission webhook's denial): nothing of it will
// land, so the GET that finds no VolumeAttachment on node-1 proves nothing
// is attached there, and h1 goes to node-2 at once.
func TestRefusedCreateIsTakenForNothingAttached(t *testing.T) {
	name1 := volume.AttachmentName("h1", driver, "node-1")
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a")}
	objs := append(vol, pod("pod-a", "node-1", "claim-a"), node("node-1"), node("node-2"))
	f := newFixture(t, objs...)
	f.client.PrependReactor("create", "volumeattachments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.CreateAction).GetObject().(*storagev1.VolumeAttachment).Name != name1 {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(vaResource.GroupResource(), name1, errors.New("denied by webhook"))
	})
	f.syncFirst("node-1", nil, "default/pod-a")
	must(t, f.c.syncNode(f.ctx, "node-2"))
	k1 := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	if err := f.c.syncVolume(f.ctx, k1); err == nil {
		t.Fatal("attach on node-1 succeeded; want the create's refusal")
	}
	objs = append(vol, pod("pod-b", "node-2", "claim-a"), node("node-1", notReady, inUse(csiName("h1"))), node("node-2"))
	f.load(objs...)
	must(t, f.client.Tracker().Update(nodesGVR, node("node-1", notReady, inUse(csiName("h1"))), ""))
	must(t, f.c.syncNode(f.ctx, "node-1"))
	must(t, f.c.syncPod(f.ctx, "default/pod-a"))
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	f.reset()
	must(t, f.c.syncVolume(f.ctx, k1))
	f.drain()
	if w := f.writes(); !slices.Contains(w, "create volumeattachments "+volume.AttachmentName("h1", driver, "node-2")) {
		t.Errorf("writes %v: h1 not attached to node-2; node-1: %v", w, f.c.reconciler.Decide(k1, f.clock.Now()))
	}
}

// After a restart, node-1 (not Ready, h1 in use) names h1 attached in its
// status, and no VolumeAttachment of it is seen; pod-b on node-2 wants h1,
// ReadWriteOnce. The GET of node-1's VolumeAttachment finds none, and right
// after its answer someone creates one there (an admin, another
// controller), which the informer shows before the controller looks at
// its lister. That object is not the one the GET found gone: it is seen,
// taken as holding h1 on node-1, and h1 is not attached to node-2 while it
// is there.
func TestObjectCreatedAfterTheConfirmGetIsSeen(t *testing.T) {
	name1 := volume.AttachmentName("h1", driver, "node-1")
	objs := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-b", "node-2", "claim-a"),
		node("node-1", notReady, inUse(csiName("h1")), listsAttached(csiName("h1"))), node("node-2")}
	f := newFixture(t, objs...)
	late := va("claim-a", "h1", "node-1")
	gets := 0
	f.client.PrependReactor("get", "volumeattachments", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetAction).GetName() != name1 {
			return false, nil, nil
		}
		gets++
		if gets > 1 {
			return false, nil, nil
		}
		// Its answer is on its way when the object is created and the
		// informer shows it.
		must(t, f.client.Tracker().Add(late))
		f.load(append(objs, late)...)
		return true, nil, apierrors.NewNotFound(vaResource.GroupResource(), name1)
	})
	must(t, f.c.Recover(f.ctx))
	f.drain()
	must(t, f.c.syncAttachment(f.ctx, name1))
	f.drain()
	if gets == 0 {
		t.Fatal("node-1's VolumeAttachment never read from the API")
	}
	if w := f.writes(); slices.Contains(w, "create volumeattachments "+volume.AttachmentName("h1", driver, "node-2")) {
		t.Errorf("writes %v: h1, ReadWriteOnce, attached to node-2 while %s (created after the GET) holds it on node-1", w, name1)
	}
	if a, ok := f.c.actual.Get(cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}); !ok || a.AttachmentUID != string(late.UID) {
		t.Errorf("node-1's attachment %+v (on record %v): want the object created after the GET", a, ok)
	}
}

// A VolumeAttachment of h1 on node-1 that someone else creates after the
// controller forgot its own attachment there (confirm found none) is taken
// as holding h1 there once its event is read: pod-b on node-2 waits.
func TestObjectCreatedAfterConfirmHoldsTheVolume(t *testing.T) {
	name1 := volume.AttachmentName("h1", driver, "node-1")
	objs := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"),
		node("node-1", notReady, inUse(csiName("h1")), listsAttached(csiName("h1"))), node("node-2")}
	f := newFixture(t, objs...)
	must(t, f.c.Recover(f.ctx))
	f.drain()
	k1 := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	if _, ok := f.c.actual.Get(k1); ok {
		t.Fatalf("node-1's attachment still on record: %v", f.c.reconciler.Decide(k1, f.clock.Now()))
	}
	late := va("claim-a", "h1", "node-1")
	must(t, f.client.Tracker().Add(late))
	objs = append(objs, late, pod("pod-b", "node-2", "claim-a"))
	f.load(objs...)
	must(t, f.c.syncAttachment(f.ctx, name1))
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	f.reset()
	f.drain()
	k2 := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-2"}
	if d := f.c.reconciler.Decide(k2, f.clock.Now()); d.Action != reconciler.Blocked {
		t.Errorf("node-2: decided %v, want blocked by node-1", d)
	}
	if w := f.writes(); slices.Contains(w, "create volumeattachments "+volume.AttachmentName("h1", driver, "node-2")) {
		t.Errorf("writes %v: h1 attached to node-2 while node-1 holds it", w)
	}
}
