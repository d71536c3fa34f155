package controller

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// After a restart, node-1 (not Ready, its kubelet down with h1 still
// listed in use) names h1 attached in its status, and no VolumeAttachment
// of it exists (a third party deleted it: the external-attacher unpublished
// the volume before the object went). pod-b on node-2 wants h1, a
// ReadWriteOnce volume. Nothing is attached on node-1, so nothing holds the
// volume there for the max wait for unmount: the API is asked, says none,
// and h1 is attached to node-2 at once, with nothing deleted; node-1's
// status is written again.
func TestNothingAttachedOnAnUnhealthyNodeHoldsNoVolume(t *testing.T) {
	objs := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-b", "node-2", "claim-a"),
		node("node-1", notReady, inUse(csiName("h1")), listsAttached(csiName("h1"))), node("node-2")}
	f := newFixture(t, objs...)
	must(t, f.c.Recover(f.ctx))
	f.drain()
	w := f.writes()
	if !slices.Contains(w, "create volumeattachments "+volume.AttachmentName("h1", driver, "node-2")) {
		k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
		t.Errorf("writes %v: h1 not attached to node-2 for pod-b; node-1: %v", w, f.c.reconciler.Decide(k, f.clock.Now()))
	}
	if slices.ContainsFunc(w, func(w string) bool { return strings.HasPrefix(w, "delete volumeattachments") }) {
		t.Errorf("writes %v: a delete, while no VolumeAttachment existed", w)
	}
	if !slices.Contains(w, "patch nodes/status node-1") {
		t.Errorf("writes %v: node-1's status, which lists h1, not written again", w)
	}
	if _, ok := f.c.actual.Get(cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}); ok {
		t.Error("h1 still on record on node-1")
	}
}
