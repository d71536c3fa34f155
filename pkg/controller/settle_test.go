package controller

import (
	"errors"
	"slices"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// A detach the controller started whose outcome it does not know (its
// VolumeAttachment delete failed, raced another delete, or landed with its
// answer lost) while a pod on the same node wants the volume again, which
// kubelet lists in volumesInUse before it is attached: the detach is not
// finished (that waits for the volume to leave volumesInUse: never), its
// outcome is settled from what the API shows, not the informer's copy.

// settleWorld is the VolumeAttachment of claim-a (h1) on node-1, attached
// and listed in node status, that no pod wants: its detach starts at the
// first drain. node is node-1, as it is once pod-b, which wants the volume
// again, runs there: kubelet lists the volume in use.
type settleWorld struct {
	f    *fixture
	k    cache.Key
	name string
	// vol is what the listers hold but the VolumeAttachment.
	vol []runtime.Object
}

func newSettleWorld(t *testing.T, onDelete func(w *settleWorld) error) *settleWorld {
	t.Helper()
	w := &settleWorld{
		k:    cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"},
		name: volume.AttachmentName("h1", driver, "node-1"),
		vol:  []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), node("node-1", listsAttached(csiName("h1")))},
	}
	w.f = newFixture(t, append(w.vol, va("claim-a", "h1", "node-1"))...)
	deletes := 0
	w.f.client.PrependReactor("delete", "volumeattachments", func(k8stesting.Action) (bool, runtime.Object, error) {
		if deletes++; deletes > 1 {
			t.Errorf("VolumeAttachment %s deleted again", w.name)
		}
		return true, nil, onDelete(w)
	})
	w.f.syncFirst("node-1", []string{"h1"})
	w.f.drain()
	if deletes != 1 {
		t.Fatalf("detach not started: %d deletes", deletes)
	}
	return w
}

// checkUnknown fails unless the detach started and its outcome is unknown.
func (w *settleWorld) checkUnknown(t *testing.T) {
	t.Helper()
	if a, _ := w.f.c.actual.Get(w.k); a.DetachStarted.IsZero() || a.State == cache.Detaching {
		t.Fatalf("%+v: want a detach started, of unknown outcome", a)
	}
}

// podWantsItAgain: pod-b on node-1 wants the volume, kubelet lists it in
// use; the listers hold va (nil: no VolumeAttachment) as the informer shows
// it, maybe behind the API.
func (w *settleWorld) podWantsItAgain(t *testing.T, va *storagev1.VolumeAttachment) {
	t.Helper()
	objs := append(slices.Clone(w.vol), pod("pod-b", "node-1", "claim-a"),
		node("node-1", resourceVersion("20"), listsAttached(csiName("h1")), inUse(csiName("h1"))))
	if va != nil {
		objs = append(objs, va)
	}
	w.f.load(objs...)
	must(t, w.f.c.syncNode(w.f.ctx, "node-1"))
	must(t, w.f.c.syncPod(w.f.ctx, "default/pod-b"))
}

func (w *settleWorld) deleteFromAPI(t *testing.T) {
	t.Helper()
	must(t, w.f.client.Tracker().Delete(vaResource, "", w.name))
}

// The delete was refused (an admission webhook): the VolumeAttachment the
// API shows is not being deleted, and the informer shows it as it was. The
// volume is attached as before, and listed in node status again.
func TestDetachFailedBeforeLandingIsSettledAsAttached(t *testing.T) {
	w := newSettleWorld(t, func(w *settleWorld) error {
		return apierrors.NewForbidden(storagev1.Resource("volumeattachments"), w.name, errors.New("admission webhook denied the request"))
	})
	w.checkUnknown(t)
	w.f.reset()
	w.podWantsItAgain(t, va("claim-a", "h1", "node-1"))
	w.f.drain()
	if got := w.f.actualState(); !slices.Equal(got, []string{csiName("h1") + "@node-1 attached reported"}) {
		t.Errorf("actual state %v; want the volume attached and listed again (%v)", got, w.f.c.reconciler.Decide(w.k, epoch))
	}
	if !slices.Contains(w.f.writes(), "patch nodes/status node-1") {
		t.Errorf("writes %v: node status not written", w.f.writes())
	}
	if _, err := w.f.client.StorageV1().VolumeAttachments().Get(w.f.ctx, w.name, metav1.GetOptions{}); err != nil {
		t.Errorf("VolumeAttachment: %v", err)
	}
}

// The delete raced another one (someone deleted the object first, and the
// informer showed it while the call was on its way, as pod-b came): the
// detach is done, and the volume is attached anew.
func TestDetachThatRacedAnotherDeleteIsSettledAsDetached(t *testing.T) {
	w := newSettleWorld(t, func(w *settleWorld) error {
		w.deleteFromAPI(t)
		w.podWantsItAgain(t, nil)
		must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
		return apierrors.NewNotFound(storagev1.Resource("volumeattachments"), w.name)
	})
	if !slices.Contains(w.f.writes(), "create volumeattachments "+w.name) {
		t.Errorf("writes %v: the volume not attached anew (%v)", w.f.writes(), w.f.c.reconciler.Decide(w.k, epoch))
	}
	if got := w.f.actualState(); !slices.Equal(got, []string{csiName("h1") + "@node-1 uncertain"}) {
		t.Errorf("actual state %v; want the attach under way, not listed", got)
	}
}

// The delete landed and its answer was lost; the informer has not shown
// the deletion yet: its copy says attached. The API says gone: the volume
// is attached anew, and not listed until that attach is done.
func TestDetachWhoseAnswerWasLostIsSettledFromTheAPI(t *testing.T) {
	w := newSettleWorld(t, func(w *settleWorld) error {
		w.deleteFromAPI(t)
		return apierrors.NewTimeoutError("the answer was lost", 0)
	})
	w.checkUnknown(t)
	w.f.reset()
	w.podWantsItAgain(t, va("claim-a", "h1", "node-1"))
	w.f.drain()
	if !slices.Contains(w.f.writes(), "create volumeattachments "+w.name) {
		t.Errorf("writes %v: the volume not attached anew (%v)", w.f.writes(), w.f.c.reconciler.Decide(w.k, epoch))
	}
	if got := w.f.actualState(); !slices.Equal(got, []string{csiName("h1") + "@node-1 uncertain"}) {
		t.Errorf("actual state %v; want the attach under way, not listed", got)
	}
}

// The delete landed, its answer lost, and the attacher's finalizer holds
// the object, being deleted; the informer still shows it as it was. The
// volume is not listed while its detach is under way; once the object is
// gone, it is attached anew.
func TestDetachUnderWayIsWaitedForBeforeTheVolumeIsAttachedAgain(t *testing.T) {
	w := newSettleWorld(t, func(w *settleWorld) error {
		must(t, w.f.client.Tracker().Update(vaResource, va("claim-a", "h1", "node-1", vaDeleting), ""))
		return apierrors.NewTimeoutError("the answer was lost", 0)
	})
	w.checkUnknown(t)
	w.f.reset()
	w.podWantsItAgain(t, va("claim-a", "h1", "node-1"))
	w.f.drain()
	if d := w.f.c.reconciler.Decide(w.k, epoch); !strings.Contains(d.Reason, "detach from node node-1 is still in progress") {
		t.Errorf("decided %v; want a wait for the detach under way", d)
	}
	// The informer shows the deletion, then the object goes.
	w.podWantsItAgain(t, va("claim-a", "h1", "node-1", vaDeleting))
	must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
	w.f.drain()
	if got := w.f.actualState(); !slices.Equal(got, []string{csiName("h1") + "@node-1 detaching"}) {
		t.Errorf("actual state %v; want the detach under way, not listed", got)
	}
	if w := w.f.writes(); slices.ContainsFunc(w, func(s string) bool { return strings.HasPrefix(s, "create") }) {
		t.Errorf("writes %v: attached while its detach is under way", w)
	}
	w.deleteFromAPI(t)
	w.podWantsItAgain(t, nil)
	must(t, w.f.c.syncAttachment(w.f.ctx, w.name))
	w.f.drain()
	if !slices.Contains(w.f.writes(), "create volumeattachments "+w.name) {
		t.Errorf("writes %v: the volume not attached anew once its VolumeAttachment is gone (%v)", w.f.writes(), w.f.c.reconciler.Decide(w.k, epoch))
	}
}
