package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Edge cases of node deletions, restarts, zone health and attaches nobody
// acts on. Each test drives the controller through its syncs and the fake
// API as the workers and informers would, and checks what a user sees: the
// VolumeAttachments deleted or created, the decisions' actions, the events
// and the metrics.

var nodesGVR = v1.SchemeGroupVersion.WithResource("nodes")

// deletedAttachments lists the VolumeAttachments deleted since the last reset.
func (f *fixture) deletedAttachments() []string {
	var out []string
	for _, w := range f.writes() {
		if name, ok := strings.CutPrefix(w, "delete volumeattachments "); ok {
			out = append(out, name)
		}
	}
	return out
}

// createdAttachments lists the VolumeAttachments created since the last
// reset, once per create.
func (f *fixture) createdAttachments() []string {
	var out []string
	for _, w := range f.writes() {
		if name, ok := strings.CutPrefix(w, "create volumeattachments "); ok {
			out = append(out, name)
		}
	}
	return out
}

// fireTimers adds to their queue the items of every queue whose AddAfter
// delay is at most elapsed, as their timers would once that much time has
// passed, and forgets those timers. It reports how many it fired.
func (f *fixture) fireTimers(elapsed time.Duration) int {
	n := 0
	for k, d := range f.volumes.after {
		if d <= elapsed {
			delete(f.volumes.after, k)
			f.volumes.Add(k)
			n++
		}
	}
	for _, q := range f.queues {
		for k, d := range q.after {
			if d <= elapsed {
				delete(q.after, k)
				q.Add(k)
				n++
			}
		}
	}
	return n
}

// pendingTimers lists the AddAfter calls recorded by every queue since the
// last reset and not fired, "queue item after".
func (f *fixture) pendingTimers() []string {
	var out []string
	for k, d := range f.volumes.after {
		out = append(out, fmt.Sprintf("%s %v %v", QueueVolumes, k, d))
	}
	for name, q := range f.queues {
		for k, d := range q.after {
			out = append(out, fmt.Sprintf("%s %v %v", name, k, d))
		}
	}
	slices.Sort(out)
	return out
}

// lookAt syncs the volume key k, and what that sync queued, as the workers
// would.
func (f *fixture) lookAt(k cache.Key) {
	f.t.Helper()
	f.volumes.Add(k)
	f.drain()
}

// lookAtEverything queues every key the actual state holds and drains.
func (f *fixture) lookAtEverything() {
	f.t.Helper()
	for _, k := range f.c.actual.Keys() {
		f.volumes.Add(k)
	}
	f.drain()
}

// eventsWith returns the events that contain word.
func eventsWith(events []string, word string) []string {
	var out []string
	for _, e := range events {
		if strings.Contains(e, word) {
			out = append(out, e)
		}
	}
	return out
}

// zoneGuard configures the zone guard with the documented defaults (55%, 3
// nodes) and the max waits for unmount given.
func zoneGuard(maxWait time.Duration, deletedNodeWait *time.Duration) func(*Config) {
	return func(c *Config) {
		c.Reconciler.UnhealthyZoneThreshold, c.Reconciler.UnhealthyZoneMinNodes = 0.55, 3
		c.Reconciler.MaxWaitForUnmount = maxWait
		c.Reconciler.MaxWaitForUnmountDeletedNode = deletedNodeWait
	}
}

func csiKey(handle, node string) cache.Key {
	return cache.Key{Volume: volume.CSIName(driver, handle), Node: node}
}

func vaNameOf(handle, node string) string { return volume.AttachmentName(handle, driver, node) }

// A restart during a partition: zone a lost three nodes (a2..a4), deleted
// by automation while the controller was down, and two more (a0, a1) are
// NotReady with their volumes mounted; zone b's three nodes are all
// NotReady. The deleted nodes' VolumeAttachments remain. Counting the
// deletions, zone a is disrupted (5 of 7 not ready): the forced detaches
// of a0 and a1 are held after the max wait, as they would be had the
// controller run through the deletions (a deletion counts for the max wait
// for unmount on a deleted node, 20 minutes here, from the start at the
// latest). The deleted nodes' own zone can't be read any more: their
// volumes are not force-detached while a zone they may have been in (b) is
// disrupted.
func TestRestartDuringPartitionCountsNodesDeletedBefore(t *testing.T) {
	deletedNodeWait := 20 * time.Minute
	var objs []runtime.Object
	attached := func(h, n string) {
		objs = append(objs, csiPV("claim-"+h, h), va("claim-"+h, h, n))
	}
	for i := range 7 {
		n, h := fmt.Sprintf("a%d", i), fmt.Sprintf("ha%d", i)
		switch {
		case i < 2:
			objs = append(objs, node(n, zone("a"), notReady, inUse(csiName(h))))
			attached(h, n)
		case i < 5:
			attached(h, n) // no Node: deleted before the start
		default:
			objs = append(objs, node(n, zone("a")))
		}
	}
	for i := range 3 {
		n, h := fmt.Sprintf("b%d", i), fmt.Sprintf("hb%d", i)
		objs = append(objs, node(n, zone("b"), notReady, inUse(csiName(h))))
		attached(h, n)
	}
	f := newFixtureWith(t, zoneGuard(6*time.Minute, &deletedNodeWait), objs...)
	must(t, f.c.Recover(f.ctx))
	f.drain()
	if got := f.deletedAttachments(); len(got) != 0 {
		t.Fatalf("detached at the start: %v", got)
	}

	// The max wait of the NotReady nodes passes.
	f.clock.Step(6*time.Minute + time.Second)
	f.fireTimers(6*time.Minute + time.Second)
	f.lookAtEverything()
	if got := f.deletedAttachments(); len(got) != 0 {
		t.Errorf("after the max wait for unmount: detached %v, want nothing (zone a counts its 3 deleted nodes: 5 of 7 not ready)", got)
	}
	for _, n := range []string{"a0", "a1"} {
		k := csiKey("h"+n, n)
		if d := f.c.reconciler.Decide(k, f.clock.Now()); d.Action != reconciler.Wait || !strings.Contains(d.Reason, "held") {
			t.Errorf("%v after the max wait: %v, want its forced detach held by its zone", k, d)
		}
	}

	// The deleted nodes' max wait passes; zone b is still disrupted.
	f.clock.Step(deletedNodeWait - 6*time.Minute)
	f.fireTimers(deletedNodeWait)
	f.lookAtEverything()
	for _, name := range f.deletedAttachments() {
		for _, n := range []string{"a2", "a3", "a4"} {
			if name == vaNameOf("h"+n, n) {
				t.Errorf("after the deleted nodes' max wait: %s's volume detached, want it held while zone b, where it may have been, is disrupted", n)
			}
		}
	}
	for _, n := range []string{"a2", "a3", "a4"} {
		k := csiKey("h"+n, n)
		if d := f.c.reconciler.Decide(k, f.clock.Now()); d.Action == reconciler.Detach || d.Action == reconciler.Withdraw {
			t.Errorf("%v after the deleted nodes' max wait: %v, want no forced detach", k, d)
		}
	}
}

// A relist delivers a node's deletion as a tombstone; then the answer of a
// status write that landed on the node just before its deletion is read,
// newer than the informer's last copy. The node stays deleted: its volume,
// which no pod wants any more, is detached once the max wait for unmount
// on a deleted node has passed, instead of waiting for a kubelet that is
// gone (for ever when nothing else looks at the node again).
func TestLateStatusAnswerDoesNotBringADeletedNodeBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		// deletedNodeWait is MaxWaitForUnmountDeletedNode.
		deletedNodeWait time.Duration
	}{
		{name: "deleted node waits the max wait for unmount", deletedNodeWait: 6 * time.Minute},
		{name: "deleted node's volumes detached at once", deletedNodeWait: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := csiKey("h1", "node-1")
			vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), va("claim-a", "h1", "node-1")}
			last := node("node-1", inUse(csiName("h1")))
			f := newFixtureWith(t, func(c *Config) { c.Reconciler.MaxWaitForUnmountDeletedNode = &tc.deletedNodeWait },
				append(vol, last, pod("pod-a", "node-1", "claim-a"))...)
			f.syncFirst("node-1", []string{"h1"}, "default/pod-a")
			f.drain()
			f.reset()

			// The pod and the node go; the relist finds the node gone and
			// its handler queues the node, synced at once.
			f.load(vol...)
			must(t, f.client.Tracker().Delete(nodesGVR, "", "node-1"))
			f.c.nodeDeleted(toolscache.DeletedFinalStateUnknown{Key: "node-1", Obj: last})
			for f.c.Process(f.ctx, QueueNodes) {
			}
			must(t, f.c.syncPod(f.ctx, "default/pod-a"))
			// Then the answer of a status write made before the deletion,
			// before the volume's key is looked at.
			answer := node("node-1", inUse(csiName("h1")), resourceVersion("12"))
			for _, key := range f.c.nodeWritten(f.ctx, answer) {
				f.volumes.Add(key)
			}
			f.drain()
			if n, ok := f.c.actual.Node("node-1"); ok && n.Exists {
				t.Errorf("node-1 after a late status answer: exists (ready %v, in use %v), want it deleted", n.Ready, n.InUse)
			}

			f.clock.Step(tc.deletedNodeWait + time.Second)
			f.fireTimers(tc.deletedNodeWait + time.Second)
			f.lookAt(k)
			d := f.c.reconciler.Decide(k, f.clock.Now())
			if got := f.deletedAttachments(); !slices.Equal(got, []string{vaNameOf("h1", "node-1")}) {
				t.Errorf("after the max wait for unmount on a deleted node: detached %v, want h1's; decision: %v", got, d)
			}
			if strings.Contains(d.Reason, "waiting for kubelet to unmount") {
				t.Errorf("decision %v: waiting for the kubelet of a deleted node", d)
			}
		})
	}
}

// A zone is disrupted partly by deleted nodes: a0 NotReady, a1 and a2
// deleted a minute later, 3 of 5. a0's forced detach, due after its max
// wait, is held until the deletions stop counting. Then the zone recovers,
// and a0, still NotReady, gets the max wait again from then
// (docs/operations.md, "Disrupted zones") even when its key is decided
// before any node sync has looked at the zone.
func TestZoneRecoveredByExpiringDeletionsGivesAFreshMaxWait(t *testing.T) {
	const maxWait = 6 * time.Minute
	k0 := csiKey("h0", "a0")
	vol := []runtime.Object{csiPV("claim-0", "h0"), va("claim-0", "h0", "a0")}
	nodes := func(opts map[int][]nodeOpt, gone ...int) []runtime.Object {
		var out []runtime.Object
		for i := range 5 {
			if slices.Contains(gone, i) {
				continue
			}
			out = append(out, node(fmt.Sprintf("a%d", i), append([]nodeOpt{zone("a")}, opts[i]...)...))
		}
		return out
	}
	mounted := map[int][]nodeOpt{0: {inUse(csiName("h0"))}}
	f := newFixtureWith(t, zoneGuard(maxWait, nil), append(vol, nodes(mounted)...)...)
	for i := range 5 {
		f.syncFirst(fmt.Sprintf("a%d", i), nil)
	}
	must(t, f.c.syncAttachment(f.ctx, vaNameOf("h0", "a0")))
	f.drain()

	// a0 goes NotReady, its volume still mounted and wanted by no pod.
	down := map[int][]nodeOpt{0: {inUse(csiName("h0")), notReady, resourceVersion("11")}}
	f.load(append(vol, nodes(down)...)...)
	must(t, f.c.syncNode(f.ctx, "a0"))
	f.drain()

	// A minute later a1 and a2 are deleted.
	f.clock.Step(time.Minute)
	f.load(append(vol, nodes(down, 1, 2)...)...)
	for _, n := range []string{"a1", "a2"} {
		must(t, f.client.Tracker().Delete(nodesGVR, "", n))
		f.c.nodeDeleted(node(n, zone("a"), resourceVersion("11")))
		must(t, f.c.syncNode(f.ctx, n))
	}
	f.drain()
	if got := eventsWith(f.takeEvents(), "ZoneDisrupted"); len(got) != 1 {
		t.Errorf("ZoneDisrupted events %q, want one", got)
	}

	// a0's max wait passes: held until the deletions stop counting.
	f.clock.Step(maxWait - time.Minute)
	f.lookAt(k0)
	d := f.c.reconciler.Decide(k0, f.clock.Now())
	if d.Action != reconciler.Wait || !strings.Contains(d.Reason, "held") || d.After <= 0 {
		t.Fatalf("after a0's max wait: %v (look again after %v), want the forced detach held until the deletions stop counting", d, d.After)
	}

	// The deletions stop counting; the held key's timer fires before any
	// node sync looks at the zone.
	f.clock.Step(d.After)
	f.fireTimers(d.After)
	f.lookAt(k0)
	if got := f.deletedAttachments(); len(got) != 0 {
		t.Errorf("when the zone recovered: detached %v at once, want a fresh max wait for a0", got)
	}
	if d := f.c.reconciler.Decide(k0, f.clock.Now()); d.Action == reconciler.Detach || d.Action == reconciler.Withdraw {
		t.Errorf("when the zone recovered: %v, want a fresh max wait", d)
	}
	recovered := f.clock.Now()

	// The node syncs queued for a second later run too; the fresh max wait
	// runs out.
	f.clock.Step(time.Second)
	f.fireTimers(maxWait + time.Second)
	f.drain()
	f.clock.SetTime(recovered.Add(maxWait - time.Second))
	f.lookAt(k0)
	if got := f.deletedAttachments(); len(got) != 0 {
		t.Errorf("a second before the fresh max wait ends: detached %v", got)
	}
	f.clock.SetTime(recovered.Add(maxWait + 2*time.Second))
	f.fireTimers(maxWait)
	f.lookAt(k0)
	if got := f.deletedAttachments(); !slices.Equal(got, []string{vaNameOf("h0", "a0")}) {
		t.Errorf("after the fresh max wait: detached %v, want a0's; decision: %v", got, f.c.reconciler.Decide(k0, f.clock.Now()))
	}
}

// Three of five nodes of a zone are drained and deleted (a scale-down):
// the zone counts as disrupted while the deletions count. Their volumes are
// detached meanwhile and the deleted nodes are forgotten. Once the
// deletions stop counting, the looks scheduled for then find the zone
// recovered: the gauge drops to 0 and a ZoneRecovered event says so.
func TestZoneDisruptedByDeletionsRecoversAfterTheirVolumesAreGone(t *testing.T) {
	const maxWait = 6 * time.Minute
	var vols, pods []runtime.Object
	for i := range 3 {
		c, h, n := fmt.Sprintf("claim-%d", i), fmt.Sprintf("h%d", i), fmt.Sprintf("a%d", i)
		vols = append(vols, csiPV(c, h), claim(c), va(c, h, n))
		pods = append(pods, pod("pod-"+n, n, c))
	}
	nodes := func(from int) []runtime.Object {
		var out []runtime.Object
		for i := from; i < 5; i++ {
			out = append(out, node(fmt.Sprintf("a%d", i), zone("a")))
		}
		return out
	}
	f := newFixtureWith(t, zoneGuard(maxWait, nil), slices.Concat(vols, pods, nodes(0))...)
	for i := range 5 {
		n := fmt.Sprintf("a%d", i)
		var handles, podKeys []string
		if i < 3 {
			handles, podKeys = []string{fmt.Sprintf("h%d", i)}, []string{"default/pod-" + n}
		}
		f.syncFirst(n, handles, podKeys...)
	}
	f.drain()
	f.reset()

	// The pods go, the nodes are drained (nothing mounted) and deleted.
	f.load(slices.Concat(vols, nodes(3))...)
	for i := range 3 {
		n := fmt.Sprintf("a%d", i)
		must(t, f.client.Tracker().Delete(nodesGVR, "", n))
		f.c.nodeDeleted(node(n, zone("a"), resourceVersion("11")))
		must(t, f.c.syncNode(f.ctx, n))
		must(t, f.c.syncPod(f.ctx, "default/pod-"+n))
	}
	f.drain()
	if got := f.deletedAttachments(); len(got) != 3 {
		t.Fatalf("detached %v, want the 3 volumes of the deleted nodes (nothing mounted there)", got)
	}
	if got := testutil.ToFloat64(f.c.cfg.Metrics.DisruptedZones); got != 1 {
		t.Fatalf("disrupted zones %v after 3 of 5 nodes were deleted, want 1", got)
	}
	// The external-attacher detaches them: the VolumeAttachments go.
	f.load(nodes(3)...)
	for i := range 3 {
		must(t, f.c.syncAttachment(f.ctx, vaNameOf(fmt.Sprintf("h%d", i), fmt.Sprintf("a%d", i))))
	}
	f.drain()
	if keys := f.c.actual.Keys(); len(keys) != 0 {
		t.Fatalf("attachments left: %v", keys)
	}
	f.takeEvents()

	// The deletions stop counting: what was scheduled for then runs.
	f.clock.Step(maxWait + time.Second)
	if f.fireTimers(maxWait+time.Second) == 0 {
		t.Errorf("nothing scheduled to look at the zone when its deletions stop counting; timers: %v", f.pendingTimers())
	}
	f.drain()
	if got := testutil.ToFloat64(f.c.cfg.Metrics.DisruptedZones); got != 0 {
		t.Errorf("disrupted zones %v once the deletions stopped counting (2 of 2 nodes ready), want 0", got)
	}
	if got := eventsWith(f.takeEvents(), "ZoneRecovered"); len(got) != 1 {
		t.Errorf("ZoneRecovered events %q, want one", got)
	}
}

// With MaxWaitForUnmountDeletedNode 0, a volume whose VolumeAttachment is
// read, and decided, before its node's first sync is not taken for a
// volume of a deleted node: the node exists (its sync is still queued),
// Ready, with the volume mounted. Nothing is withdrawn or detached, and once
// the node is read the volume stays: wanted by its pod, or mounted.
func TestVolumeOfANodeNotReadYetIsNotTakenForADeletedNodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  bool
		// wantAfter is the decision once the node is read.
		wantAfter reconciler.Action
	}{
		{name: "a pod wants it", pod: true, wantAfter: reconciler.Nothing},
		{name: "no pod wants it, the node has it mounted", wantAfter: reconciler.Wait},
	} {
		t.Run(tc.name, func(t *testing.T) {
			zero := time.Duration(0)
			k := csiKey("h1", "node-1")
			objs := []runtime.Object{node("node-1", inUse(csiName("h1"))), csiPV("claim-a", "h1"), claim("claim-a"),
				va("claim-a", "h1", "node-1")}
			if tc.pod {
				objs = append(objs, pod("pod-a", "node-1", "claim-a"))
			}
			f := newFixtureWith(t, func(c *Config) { c.Reconciler.MaxWaitForUnmountDeletedNode = &zero }, objs...)
			// The informer's events in the order they came: the
			// VolumeAttachment, the pod, then (queued behind) the node.
			must(t, f.c.syncAttachment(f.ctx, vaNameOf("h1", "node-1")))
			if tc.pod {
				must(t, f.c.syncPod(f.ctx, "default/pod-a"))
			}
			if d := f.c.reconciler.Decide(k, f.clock.Now()); d.Action == reconciler.Detach || d.Action == reconciler.Withdraw {
				t.Errorf("before the node's first sync: %v, want no detach", d)
			}
			for f.c.Process(f.ctx, QueueVolumes) {
			}
			if got := f.deletedAttachments(); len(got) != 0 {
				t.Errorf("before the node's first sync: detached %v", got)
			}
			if a, _ := f.c.actual.Get(k); a.Withdrawn {
				t.Errorf("before the node's first sync: withdrawn from node-1's status")
			}

			must(t, f.c.syncNode(f.ctx, "node-1"))
			f.drain()
			if got := f.deletedAttachments(); len(got) != 0 {
				t.Errorf("after the node's sync: detached %v", got)
			}
			if d := f.c.reconciler.Decide(k, f.clock.Now()); d.Action != tc.wantAfter {
				t.Errorf("after the node's sync: %v, want %s", d, tc.wantAfter)
			}
		})
	}
}

// kube-controller-manager gives up waiting for a CSI attach after 2
// minutes (pkg/volume/csi: csiTimeout) and says so in a FailedAttachVolume
// event: "timed out waiting for external-attacher of <driver> CSI driver
// to attach volume <handle>". A VolumeAttachment nobody acts on (no
// external-attacher serves the driver) stays unattached with no error: the
// controller looks again after 2 minutes and tells the pod, once.
func TestAttachNobodyActsOnIsReportedAfterTwoMinutes(t *testing.T) {
	k := csiKey("h1", "node-1")
	objs := []runtime.Object{node("node-1"), csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a")}
	f := newFixture(t, objs...)
	f.syncFirst("node-1", nil, "default/pod-a")
	f.drain()
	if got := f.createdAttachments(); !slices.Equal(got, []string{vaNameOf("h1", "node-1")}) {
		t.Fatalf("created %v, want h1's VolumeAttachment", got)
	}
	f.load(append(objs, va("claim-a", "h1", "node-1", notAttached))...)
	must(t, f.c.syncAttachment(f.ctx, vaNameOf("h1", "node-1")))
	f.drain()
	if got := eventsWith(f.takeEvents(), "FailedAttachVolume"); len(got) != 0 {
		t.Errorf("warnings while the attach is young: %q", got)
	}
	if d, ok := f.volumes.after[k]; !ok || d <= 0 || d > 2*time.Minute {
		t.Errorf("look again at %v scheduled after %v (scheduled: %v), want within 2m; timers: %v", k, d, ok, f.pendingTimers())
	}

	f.clock.Step(2*time.Minute + time.Second)
	f.fireTimers(2*time.Minute + time.Second)
	f.lookAt(k)
	want := "timed out waiting for external-attacher of csi.example.com CSI driver to attach volume h1"
	events := f.takeEvents()
	if got := eventsWith(events, want); len(got) != 1 || !strings.HasPrefix(got[0], "Warning FailedAttachVolume ") {
		t.Errorf("events after 2m1s %q, want one Warning FailedAttachVolume saying %q", events, want)
	}
}

// Recovery reads the nodes in name order. A zone of 10 nodes whose 3
// NotReady ones sort first is never disrupted (3 of 10): the restart posts
// no ZoneDisrupted or ZoneRecovered, and those nodes' volumes are
// force-detached after the max wait as usual.
func TestRestartDoesNotReportAHealthyZoneDisrupted(t *testing.T) {
	var objs []runtime.Object
	for i := range 10 {
		n, h := fmt.Sprintf("a%d", i), fmt.Sprintf("h%d", i)
		if i < 3 {
			objs = append(objs, node(n, zone("a"), notReady, inUse(csiName(h))), csiPV("claim-"+h, h), va("claim-"+h, h, n))
			continue
		}
		objs = append(objs, node(n, zone("a")))
	}
	f := newFixtureWith(t, zoneGuard(6*time.Minute, nil), objs...)
	must(t, f.c.Recover(f.ctx))
	f.drain()
	events := f.takeEvents()
	if got := slices.Concat(eventsWith(events, "ZoneDisrupted"), eventsWith(events, "ZoneRecovered")); len(got) != 0 {
		t.Errorf("events of a restart in a zone with 3 of 10 nodes not ready: %q, want none", got)
	}
	if got := testutil.ToFloat64(f.c.cfg.Metrics.DisruptedZones); got != 0 {
		t.Errorf("disrupted zones %v, want 0", got)
	}

	f.clock.Step(6*time.Minute + time.Second)
	f.fireTimers(6*time.Minute + time.Second)
	f.lookAtEverything()
	var want []string
	for i := range 3 {
		want = append(want, vaNameOf(fmt.Sprintf("h%d", i), fmt.Sprintf("a%d", i)))
	}
	got := f.deletedAttachments()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after the max wait: detached %v, want %v", got, want)
	}
}

// The VolumeAttachment the controller created is deleted by someone else
// before the informer ever showed it (its events lost in a relist): no
// event will come. The attach is not left "in progress" until a periodic
// sync: a look is scheduled, and it creates the VolumeAttachment again.
func TestVolumeAttachmentDeletedBeforeItWasSeenIsCreatedAgain(t *testing.T) {
	objs := []runtime.Object{node("node-1"), csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a")}
	f := newFixture(t, objs...)
	f.syncFirst("node-1", nil, "default/pod-a")
	f.drain()
	name := vaNameOf("h1", "node-1")
	if got := f.createdAttachments(); !slices.Equal(got, []string{name}) {
		t.Fatalf("created %v, want h1's VolumeAttachment", got)
	}
	must(t, f.client.Tracker().Delete(vaResource, "", name))

	// Whatever wakes the attach under way: a timer of its volume key or
	// of its VolumeAttachment.
	timers := f.pendingTimers()
	_, byKey := f.volumes.after[csiKey("h1", "node-1")]
	_, byName := f.queues[QueueVolumeAttachments].after[name]
	if !byKey && !byName {
		t.Errorf("nothing scheduled to look again at the attach under way; timers: %v", timers)
	}
	var longest time.Duration
	for _, d := range f.volumes.after {
		longest = max(longest, d)
	}
	for _, q := range f.queues {
		for _, d := range q.after {
			longest = max(longest, d)
		}
	}
	f.clock.Step(longest + time.Second)
	f.fireTimers(longest + time.Second)
	f.drain()
	if got := f.createdAttachments(); !slices.Equal(got, []string{name, name}) {
		t.Errorf("created %v after what was scheduled ran (timers %v), want h1's VolumeAttachment created again", got, timers)
	}
}

// A status write finds the node gone (the API answers 404) before the
// informer shows the deletion; the informer's copy, older than what a
// status answer showed since (kubelet mounted h1), is synced afterwards.
// That copy must not bring the node back with its old volumesInUse: h1,
// mounted as far as the newest answer says, is not detached at once.
func TestStaleNodeCopyAfterAStatusWriteFoundTheNodeGone(t *testing.T) {
	k1 := csiKey("h1", "node-1")
	vols := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), va("claim-a", "h1", "node-1"),
		csiPV("claim-b", "h2"), claim("claim-b"), va("claim-b", "h2", "node-1")}
	stale := node("node-1")
	f := newFixture(t, slices.Concat(vols, []runtime.Object{stale, pod("pod-a", "node-1", "claim-a"), pod("pod-b", "node-1", "claim-b")})...)
	f.syncFirst("node-1", []string{"h1", "h2"}, "default/pod-a", "default/pod-b")
	f.drain()
	// The answer of a status write: kubelet has mounted h1.
	f.c.nodeWritten(f.ctx, node("node-1", resourceVersion("20"), inUse(csiName("h1")),
		listsAttached(csiName("h1"), csiName("h2"))))
	f.reset()

	// Both pods go, then the node; the informer shows neither the node's
	// deletion nor the update of rv 20. h2's withdrawal finds the node gone.
	f.load(append(vols, stale)...)
	must(t, f.c.syncPod(f.ctx, "default/pod-a"))
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	must(t, f.client.Tracker().Delete(nodesGVR, "", "node-1"))
	f.drain()
	if got := f.deletedAttachments(); slices.Contains(got, vaNameOf("h1", "node-1")) {
		t.Fatalf("h1 detached while kubelet had it mounted: %v", got)
	}
	if n, ok := f.c.actual.Node("node-1"); !slices.Contains(f.writes(), "patch nodes/status node-1") || (ok && n.Exists) {
		t.Fatalf("no status write found node-1 gone: writes %v", f.writes())
	}

	// The informer's copy of rv 10 is synced (an event queued before).
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.drain()
	if got := f.deletedAttachments(); slices.Contains(got, vaNameOf("h1", "node-1")) {
		t.Errorf("h1 detached at once after a stale copy of the gone node was read: %v; decision: %v", got, f.c.reconciler.Decide(k1, f.clock.Now()))
	}
	if n, ok := f.c.actual.Node("node-1"); ok && n.Exists {
		t.Errorf("node-1 exists again (ready %v, in use %v) after a stale copy was read, its status write having found it gone", n.Ready, n.InUse)
	}
}

// Someone else deletes a VolumeAttachment just before the controller's own
// detach, whose delete then finds it gone while the lister still shows it:
// the CSI mechanism remembers the object as gone, so that the cached copy
// is not taken for attached. Once the informer's deletion is synced, no
// cached copy remains: nothing is remembered of the object any more, or
// every such race would be remembered for ever.
func TestGoneVolumeAttachmentIsForgottenOnceItsDeletionIsSynced(t *testing.T) {
	name := vaNameOf("h1", "node-1")
	objs := []runtime.Object{node("node-1"), csiPV("claim-a", "h1"), va("claim-a", "h1", "node-1")}
	f := newFixture(t, objs...)
	f.syncFirst("node-1", []string{"h1"})
	must(t, f.client.Tracker().Delete(vaResource, "", name))
	f.drain()
	if got := f.deletedAttachments(); !slices.Equal(got, []string{name}) {
		t.Fatalf("detached %v, want the orphan's delete", got)
	}
	if !f.c.csi.Gone(name, types.UID("uid-"+name)) {
		t.Fatalf("the delete that found %s gone is not remembered while the lister shows it", name)
	}

	f.load(objs[:2]...)
	must(t, f.c.syncAttachment(f.ctx, name))
	f.drain()
	if f.c.csi.Gone(name, types.UID("uid-"+name)) {
		t.Errorf("%s still remembered as gone after its deletion was synced (the lister no longer shows it)", name)
	}
}
