package controller

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

func TestSyncNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		// before, when set, is the node the controller synced first.
		before *v1.Node
		// attached are the handles attached to node-1 before the sync.
		attached []string
		objects  []runtime.Object
		// deleted, when set, is the node's last state as the informer's
		// delete carries it.
		deleted *v1.Node
		key     string

		wantFacts                         string
		wantPods, wantVolumes, wantStatus []string
	}{
		{
			name:      "new node: its facts are recorded",
			objects:   []runtime.Object{node("node-1"), pod("pod-b", "node-2")},
			key:       "node-1",
			wantFacts: "exists,managed,ready inUse=[]",
		},
		{
			// Its sync is queued again by the pod's read, and a second later.
			name:      "new node with a pod not read yet: its facts say unmanaged until the pod is read",
			objects:   []runtime.Object{node("node-1"), pod("pod-a", "node-1"), pod("pod-b", "node-2")},
			key:       "node-1",
			wantFacts: "exists,ready inUse=[]",
		},
		{
			name:      "known node, nothing changed: nothing queued",
			before:    node("node-1"),
			attached:  []string{"h1"},
			objects:   []runtime.Object{node("node-1", resourceVersion("11")), pod("pod-a", "node-1")},
			key:       "node-1",
			wantFacts: "exists,managed,ready inUse=[]",
		},
		{
			name:        "node turns NotReady: its attachments are queued",
			before:      node("node-1"),
			attached:    []string{"h1"},
			objects:     []runtime.Object{node("node-1", notReady, resourceVersion("11"))},
			key:         "node-1",
			wantFacts:   "exists,managed inUse=[]",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "out-of-service taint: its attachments are queued",
			before:      node("node-1", notReady),
			attached:    []string{"h1"},
			objects:     []runtime.Object{node("node-1", notReady, outOfService, resourceVersion("11"))},
			key:         "node-1",
			wantFacts:   "exists,managed,out-of-service inUse=[]",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:        "one volume unmounted: only its attachment is queued",
			before:      node("node-1", inUse(csiName("h1"), csiName("h2"))),
			attached:    []string{"h1", "h2"},
			objects:     []runtime.Object{node("node-1", inUse(csiName("h2")), resourceVersion("11"))},
			key:         "node-1",
			wantFacts:   "exists,managed,ready inUse=[" + csiName("h2") + "]",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:     "deleted node: what it had mounted last is kept, its attachments are queued",
			before:   node("node-1"),
			attached: []string{"h1"},
			objects:  []runtime.Object{pod("pod-a", "node-1")},
			// Mounted in an update the controller never synced.
			deleted:     node("node-1", inUse(csiName("h1")), resourceVersion("11")),
			key:         "node-1",
			wantFacts:   "managed inUse=[" + csiName("h1") + "]",
			wantVolumes: []string{key("h1", "node-1")},
			wantStatus:  []string{"node-1"},
		},
		{
			name:       "node status lists a volume the controller did not write: the status is rewritten",
			objects:    []runtime.Object{node("node-1", listsAttached(csiName("h9")))},
			key:        "node-1",
			wantFacts:  "exists,managed,ready inUse=[]",
			wantStatus: []string{"node-1"},
		},
		{
			name:     "stale node object, older than the one the controller knows: skipped",
			before:   node("node-1", resourceVersion("20")),
			attached: []string{"h1"},
			// Older than the controller's own status write's answer: its
			// readiness and its volumesAttached are both out of date.
			objects:   []runtime.Object{node("node-1", notReady, listsAttached(csiName("h9")), resourceVersion("15"))},
			key:       "node-1",
			wantFacts: "exists,managed,ready inUse=[]",
		},
		{
			name:      "node becomes managed with a pod not read yet: its facts say unmanaged until the pod is read",
			before:    node("node-1", unmanaged),
			objects:   []runtime.Object{node("node-1", resourceVersion("11")), pod("pod-a", "node-1")},
			key:       "node-1",
			wantFacts: "exists,ready inUse=[]",
		},
		{
			name:      "node becomes managed, a terminated pod on it: its facts say managed",
			before:    node("node-1", unmanaged),
			objects:   []runtime.Object{node("node-1", resourceVersion("11")), withPod(pod("pod-a", "node-1"), phase(v1.PodFailed))},
			key:       "node-1",
			wantFacts: "exists,managed,ready inUse=[]",
		},
		{
			name:      "node gone before the controller ever read it: nothing known",
			objects:   []runtime.Object{pod("pod-a", "node-1")},
			key:       "node-1",
			wantFacts: "unknown",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.objects...)
			if tc.before != nil {
				f.load(tc.before)
				if err := f.c.syncNode(f.ctx, tc.key); err != nil {
					t.Fatalf("first sync: %v", err)
				}
			}
			for _, h := range tc.attached {
				f.c.actual.Update(cache.Key{Volume: volume.CSIName(driver, h), Node: "node-1"}, true, func(a *cache.Attachment) {
					a.State = cache.Attached
					a.Kind = volume.KindCSI
				})
			}
			f.load(tc.objects...)
			if tc.deleted != nil {
				f.c.nodeDeleted(tc.deleted)
			}
			f.reset()
			if err := f.c.syncNode(f.ctx, tc.key); err != nil {
				t.Fatalf("syncNode: %v", err)
			}
			if got := f.nodeFacts(tc.key); got != tc.wantFacts {
				t.Errorf("node facts: got %q, want %q", got, tc.wantFacts)
			}
			checkList(t, "pods queued", f.queued(QueuePods), tc.wantPods)
			checkList(t, "volume keys queued", f.queued(QueueVolumes), tc.wantVolumes)
			checkList(t, "node status queued", f.queued(QueueNodeStatus), tc.wantStatus)
			checkList(t, "API writes", f.writes(), nil)
		})
	}
}

// A node that becomes managed: the handler queues its pods before the node
// itself, so a pod may be read again, and its volume looked at, while the
// node's facts still say unmanaged (nothing to do). The node's sync then
// looks at that volume again, or nothing would: reading the pod again
// changes nothing.
func TestNodeBecomingManagedWakesItsWantedVolumes(t *testing.T) {
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a")}
	f := newFixture(t, append(vol, node("node-1", unmanaged))...)
	if err := f.c.syncNode(f.ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	if err := f.c.syncPod(f.ctx, "default/pod-a"); err != nil {
		t.Fatal(err)
	}
	if f.c.reconciler.Wanted(k) {
		t.Fatalf("%v wanted on an unmanaged node", k)
	}
	f.load(append(vol, node("node-1", resourceVersion("11")))...)
	if err := f.c.syncPod(f.ctx, "default/pod-a"); err != nil {
		t.Fatal(err)
	}
	// The pod's read, its node's facts saying unmanaged and the informer
	// managed, queues the node.
	checkList(t, "nodes queued by the pod's read", f.queued(QueueNodes), []string{"node-1"})
	for f.c.Process(f.ctx, QueueVolumes) {
		if f.volumes.Len() == 0 {
			break
		}
	}
	checkList(t, "API writes before the node's sync", f.writes(), nil)
	f.reset()
	if err := f.c.syncNode(f.ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	checkList(t, "volume keys queued by the node's sync", f.queued(QueueVolumes), []string{key("h1", "node-1")})
	f.drain()
	checkList(t, "API writes after the node's sync", f.writes(), []string{
		"create volumeattachments " + volume.AttachmentName("h1", driver, "node-1")})
}

// A node that stops being managed: its pod read through the handler before
// the node's facts say so still wants its volume, which is not taken as
// unwanted where the controller still acts (no withdraw, no start of the
// max wait for unmount).
func TestPodReadOnNodeGoingUnmanagedTakesNothingAway(t *testing.T) {
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a"), va("claim-a", "h1", "node-1")}
	f := newFixture(t, append(vol, node("node-1"))...)
	f.syncFirst("node-1", []string{"h1"}, "default/pod-a")
	f.drain()
	f.reset()
	f.load(append(vol, node("node-1", unmanaged, resourceVersion("11")))...)
	if err := f.c.syncPod(f.ctx, "default/pod-a"); err != nil {
		t.Fatal(err)
	}
	if d := f.c.reconciler.Decide(k, epoch); d.Action != "nothing" || !d.Desired {
		t.Errorf("%v after its pod was read on a node going unmanaged: %v, want it wanted, nothing to do", k, d)
	}
	f.volumes.Add(k)
	f.drain()
	checkList(t, "API writes", f.writes(), nil)
	f.checkNotUnwanted(k, "after the reads")
}

// A node that becomes managed with a volume attached and a pod created
// while it was not: the pod was read then, so the volume is wanted from the
// first look, and an attachment no pod wants is detached (once its kubelet
// has had time to report what it mounted: reconciler.KubeletReportGrace).
func TestNodeBecomingManagedKeepsWhatItsPodsWant(t *testing.T) {
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	orphan := cache.Key{Volume: volume.CSIName(driver, "h9"), Node: "node-1"}
	vol := []runtime.Object{csiPV("claim-b", "h1"), claim("claim-b"), pod("pod-b", "node-1", "claim-b"), va("claim-b", "h1", "node-1"),
		csiPV("claim-z", "h9"), va("claim-z", "h9", "node-1")}
	f := newFixture(t, append(vol, node("node-1", unmanaged))...)
	if err := f.c.syncNode(f.ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h9"} {
		if err := f.c.syncAttachment(f.ctx, volume.AttachmentName(h, driver, "node-1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.c.syncPod(f.ctx, "default/pod-b"); err != nil {
		t.Fatal(err)
	}
	f.drain()
	f.reset()
	f.load(append(vol, node("node-1", resourceVersion("11")))...)
	if err := f.c.syncNode(f.ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	f.checkNotUnwanted(k, "once the node is managed")
	f.drain()
	f.pastReportGrace()
	for _, w := range f.writes() {
		if strings.HasPrefix(w, "delete") && w != "delete volumeattachments "+volume.AttachmentName("h9", driver, "node-1") {
			t.Errorf("write: %s, want only the orphan's detach", w)
		}
	}
	if a, ok := f.c.actual.Get(orphan); ok && a.DetachStarted.IsZero() {
		t.Errorf("%v: no detach started", orphan)
	}
	if d := f.c.reconciler.Decide(k, epoch); d.Action != "nothing" || !d.Desired {
		t.Errorf("%v: %v; want it wanted, nothing to do", k, d)
	}
}

// A pod read while its node was unmanaged keeps the node's attachments
// once the node is managed again, whether a node status write's answer or
// the node's sync says managed first.
func TestPodReadWhileUnmanagedHoldsTheNodeManagedAgain(t *testing.T) {
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	vol := []runtime.Object{csiPV("claim-b", "h1"), claim("claim-b"), pod("pod-b", "node-1", "claim-b"), va("claim-b", "h1", "node-1")}
	f := newFixture(t, append(vol, node("node-1", unmanaged))...)
	f.syncFirst("node-1", []string{"h1"}, "default/pod-b")
	managedNode := node("node-1", resourceVersion("11"))
	if err := f.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("nodes"), managedNode, ""); err != nil {
		t.Fatal(err)
	}
	f.load(append(vol, managedNode)...)
	f.reset()
	f.c.statusQueue.Add("node-1")
	f.c.Process(f.ctx, QueueNodeStatus)
	if err := f.c.syncNode(f.ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	f.drain()
	if d := f.c.reconciler.Decide(k, epoch); d.Action != "nothing" || !d.Desired {
		t.Errorf("%v before its pod is read again: %v, want it wanted, nothing to do", k, d)
	}
	f.checkNotUnwanted(k, "before its pod is read again")
	if err := f.c.syncPod(f.ctx, "default/pod-b"); err != nil {
		t.Fatal(err)
	}
	f.drain()
	for _, w := range f.writes() {
		if strings.HasPrefix(w, "delete") {
			t.Errorf("write: %s", w)
		}
	}
	if !f.c.desired.Wanted(k) {
		t.Errorf("%v not wanted once its pod is read on the managed node", k)
	}
}

// A pod read while its node is missing from the lister, the node's sync
// not done yet: its volume is not taken as unwanted on the strength of
// that read; once the node's deletion is synced, the deleted node's rules
// apply.
func TestPodReadWhileItsNodeIsMissingTakesNothingAway(t *testing.T) {
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a"), va("claim-a", "h1", "node-1")}
	f := newFixture(t, append(vol, node("node-1"))...)
	f.syncFirst("node-1", []string{"h1"}, "default/pod-a")
	f.drain()
	f.load(vol...)
	f.reset()
	if err := f.c.syncPod(f.ctx, "default/pod-a"); err != nil {
		t.Fatal(err)
	}
	f.drain()
	checkList(t, "API writes", f.writes(), nil)
	f.checkNotUnwanted(k, "after the reads")
	f.reset()
	if err := f.c.syncNode(f.ctx, "node-1"); err != nil {
		t.Fatal(err)
	}
	if q := f.volumes.addedNames(); !slices.Contains(q, k.String()) {
		t.Errorf("volume keys queued by the node's deletion: %v, want %v among them", q, k)
	}
	if d := f.c.reconciler.Decide(k, epoch); strings.Contains(d.Reason, "read while it was unmanaged") {
		t.Errorf("%v once the node's deletion is synced: %v, still waiting for the pod", k, d)
	}
}
