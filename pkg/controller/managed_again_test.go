package controller

import (
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// A node managed again: its kubelet, which attached volumes by itself
// until then, may have mounted one without reporting it in use yet (it
// mounts as soon as the volume is attached, and reports at its next status
// update), for a pod the informer does not show yet. The node version
// that carries the annotation back says nothing of that mount: the volume
// is not taken as unwanted and unmounted on its word. Once kubelet has
// had time to report (reconciler.KubeletReportGrace), a volume it does
// not list, wanted by no pod, is detached.
func TestNodeManagedAgainWaitsForItsKubeletToReport(t *testing.T) {
	f, k, vol := unmanagedNodeWithAttachment(t)
	// The annotation is back; pod-b, which uses h1 (its kubelet created
	// the VolumeAttachment and mounted it), is not in the informer yet.
	f.load(append(vol, node("node-1", resourceVersion("11")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.drain()
	if w := f.writes(); slices.ContainsFunc(w, func(w string) bool { return strings.HasPrefix(w, "delete volumeattachments") }) {
		t.Errorf("writes %v: h1, maybe mounted for a pod not read yet, detached as soon as node-1 is managed again", w)
	}
	f.checkNotUnwantedYet(k)
	if after, ok := f.volumes.after[k]; !ok || after != reconciler.KubeletReportGrace {
		t.Errorf("%v looked at again after %v (queued later: %v), want after %v", k, after, ok, reconciler.KubeletReportGrace)
	}
	// Its kubelet never lists h1, and no pod wants it: once the grace
	// is over, it is taken as unwanted.
	f.pastReportGrace()
	if a, _ := f.c.actual.Get(k); !a.Withdrawn {
		t.Errorf("after the grace: %v, want withdrawn for its detach", f.c.reconciler.Decide(k, f.clock.Now()))
	}
}

// pastReportGrace lets reconciler.KubeletReportGrace pass, fires the
// volume keys' timers and drains the queues: a node managed again takes a
// volume it does not list in use as unmounted from then.
func (f *fixture) pastReportGrace() {
	f.t.Helper()
	f.clock.Step(reconciler.KubeletReportGrace)
	for k, d := range f.volumes.after {
		if d <= reconciler.KubeletReportGrace {
			delete(f.volumes.after, k)
			f.volumes.Add(k)
		}
	}
	f.drain()
}

// checkNotUnwantedYet fails if the attachment at k was withdrawn from node
// status for a detach.
func (f *fixture) checkNotUnwantedYet(k cache.Key) {
	f.t.Helper()
	if a, _ := f.c.actual.Get(k); a.Withdrawn || !a.DetachStarted.IsZero() {
		f.t.Errorf("%v: withdrawn %v, detach started %v; want neither", k, a.Withdrawn, a.DetachStarted)
	}
}

// A volume mounted on a node, its detach wanted since long ago; the node
// loses the controller-managed annotation, a pod there uses the volume
// meanwhile (the controller does not count what pods want on a node it
// does not manage), and the node comes back managed, not Ready, with the
// volume in use. The max wait for unmount before a forced detach counts
// from when the node is managed again, not from when the detach was first
// wanted: the volume was in use all along.
func TestNodeManagedAgainGetsTheMaxWaitAfresh(t *testing.T) {
	vol := []runtime.Object{csiPV("claim-b", "h1"), claim("claim-b"), va("claim-b", "h1", "node-1")}
	f := newFixture(t, append(vol, node("node-1", inUse(csiName("h1"))))...)
	f.syncFirst("node-1", []string{"h1"})
	f.drain()
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	if a, _ := f.c.actual.Get(k); !a.DetachWanted.Equal(epoch) {
		t.Fatalf("detach wanted since %v, want %v", a.DetachWanted, epoch)
	}
	f.load(append(vol, node("node-1", unmanaged, inUse(csiName("h1")), resourceVersion("11")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.drain()
	f.clock.Step(time.Hour)
	again := f.clock.Now()
	f.load(append(vol, node("node-1", notReady, inUse(csiName("h1")), resourceVersion("12")))...)
	f.reset()
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.drain()
	for _, w := range f.writes() {
		if strings.HasPrefix(w, "delete volumeattachments") {
			t.Errorf("forced detach of h1, in use, as soon as node-1 is managed again: %s", w)
		}
	}
	d := f.c.reconciler.Decide(k, again)
	if d.Action != reconciler.Wait || d.After != 6*time.Minute {
		t.Errorf("decided %v (after %v), want a wait of the whole max wait for unmount (6m)", d, d.After)
	}
	if d := f.c.reconciler.Decide(k, again.Add(6*time.Minute)); d.Action != reconciler.Withdraw || d.Force != reconciler.ForceTimeout {
		t.Errorf("the max wait over since node-1 is managed again: decided %v (force %q), want a forced withdraw", d, d.Force)
	}
}

// The controller restarts within KubeletReportGrace of node-1 being
// managed again: its kubelet attached and mounted h1 by itself for pod-b,
// whose containers have stopped (it is being deleted, its volumes not torn
// down yet), and the node version that carries the annotation back does
// not list h1 in use. The new process has no memory of the node's turn:
// taken at its word, the node has nothing mounted, and h1 is detached
// from under the mount (kube-controller-manager takes what it recovers as
// mounted until the node's next update).
func TestRestartWithinTheReportGraceDetachesNothingMounted(t *testing.T) {
	t.Skip("open: a restart within KubeletReportGrace of a node managed again forgets the grace; a volume mounted but not yet reported is detached")
	vol := []runtime.Object{csiPV("claim-b", "h1"), claim("claim-b"), va("claim-b", "h1", "node-1"),
		withPod(pod("pod-b", "node-1", "claim-b"), deleting, containersStopped)}
	f := newFixture(t, append(vol, node("node-1"))...)
	must(t, f.c.Recover(f.ctx))
	f.drain()
	if w := f.writes(); slices.ContainsFunc(w, func(w string) bool { return strings.HasPrefix(w, "delete volumeattachments") }) {
		t.Errorf("writes %v: h1, maybe mounted and not reported yet, detached at the start", w)
	}
}
