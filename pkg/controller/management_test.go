package controller

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Changes of a node's management, deletion and creation, in the orders the
// workers may see them: no volume a live pod wants is taken as unwanted,
// and every wait is woken.

func nodeUID(u string) nodeOpt { return func(n *v1.Node) { n.UID = types.UID(u) } }

// unmanagedNodeWithAttachment is node-1, unmanaged, with volume h1 (claim
// claim-b) attached there and no pod read: the key of h1 and the objects
// but the node are returned.
func unmanagedNodeWithAttachment(t *testing.T) (*fixture, cache.Key, []runtime.Object) {
	t.Helper()
	vol := []runtime.Object{csiPV("claim-b", "h1"), claim("claim-b"), va("claim-b", "h1", "node-1")}
	f := newFixture(t, append(vol, node("node-1", unmanaged))...)
	f.syncFirst("node-1", []string{"h1"})
	f.drain()
	f.reset()
	return f, cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}, vol
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A node deleted, its deletion synced, its pod read (the node gone: the pod
// wants nothing), then the node created again (its kubelet registers it:
// Ready, volumesInUse not reported yet): its attachment is not taken as
// unwanted before the pod is read again.
func TestNodeCreatedAgainHoldsItsAttachmentsUntilItsPodsAreRead(t *testing.T) {
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a"), va("claim-a", "h1", "node-1")}
	first := node("node-1", inUse(csiName("h1")))
	f := newFixture(t, append(vol, first)...)
	f.syncFirst("node-1", []string{"h1"}, "default/pod-a")
	f.drain()
	// Deleted.
	f.load(vol...)
	f.c.nodeDeleted(first)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	must(t, f.c.syncPod(f.ctx, "default/pod-a"))
	f.drain()
	f.reset()
	// Created again.
	f.load(append(vol, node("node-1", nodeUID("uid-2"), resourceVersion("30")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	d := f.c.reconciler.Decide(k, epoch)
	f.drain() // volume workers first: the pod worker is elsewhere
	if d.Action == "withdraw" || d.Action == "detach" {
		t.Errorf("live pod-a on managed node-1: %v before pod-a is read again", d)
	}
	for _, w := range f.writes() {
		if strings.HasPrefix(w, "delete volumeattachments") {
			t.Errorf("detached a volume live pod-a wants: %s", w)
		}
	}
}

// A node becomes managed; its pod is read (the handler queues pods first)
// while the facts still say unmanaged; a node status write's answer, which
// shows the annotation, comes before the node's sync: the sync still sees
// the change (it compares with what it read last), and the wanted volume is
// attached.
func TestStatusWriteBeforeTheNodeSyncAttachesItsWantedVolumes(t *testing.T) {
	vol := []runtime.Object{csiPV("claim-b", "h1"), claim("claim-b"), pod("pod-b", "node-1", "claim-b"),
		csiPV("claim-z", "h9"), va("claim-z", "h9", "node-1")}
	f := newFixture(t, append(vol, node("node-1", unmanaged))...)
	f.syncFirst("node-1", []string{"h9"}, "default/pod-b")
	for f.c.Process(f.ctx, QueueVolumes) {
	}
	f.reset()
	managedNode := node("node-1", resourceVersion("11"))
	must(t, f.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("nodes"), managedNode, ""))
	f.load(append(vol, managedNode)...)
	must(t, f.c.syncPod(f.ctx, "default/pod-b")) // queued by nodeChanged before the node key
	for f.c.Process(f.ctx, QueueVolumes) {
	}
	f.c.statusQueue.Add("node-1")
	f.c.Process(f.ctx, QueueNodeStatus)
	f.drain()
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.drain()
	found := false
	for _, w := range f.writes() {
		if w == "create volumeattachments "+volume.AttachmentName("h1", driver, "node-1") {
			found = true
		}
	}
	if !found {
		k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
		t.Errorf("h1 wanted by pod-b never attached; now decided %v; queued volumes %v after %v", f.c.reconciler.Decide(k, epoch), f.volumes.pending(), f.volumes.after)
	}
}

// A pod created while its node was unmanaged (its volume attached there)
// and not read yet when the node becomes managed: the node's sync marks it
// unread, and its attachment is not taken as unwanted.
func TestNodeBecomingManagedHoldsForAPodNotReadYet(t *testing.T) {
	f, k, vol := unmanagedNodeWithAttachment(t)
	// pod-b came (its add is queued, not read), then the node is managed.
	f.load(append(vol, pod("pod-b", "node-1", "claim-b"), node("node-1", resourceVersion("11")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	d := f.c.reconciler.Decide(k, epoch)
	f.drain()
	if d.Action == "withdraw" || d.Action == "detach" {
		t.Errorf("h1 of live pod-b (not read yet) on a node just managed: %v", d)
	}
}

// A node becomes managed while a pod there is not read yet: its facts keep
// saying unmanaged, and the node is looked at again a second later; the
// pod's read queues the node, whose facts then say managed. A terminated
// pod, or one read, does not hold it.
func TestNodeTurningManagedWaitsForItsPodsToBeRead(t *testing.T) {
	f, k, vol := unmanagedNodeWithAttachment(t)
	done := withPod(pod("pod-c", "node-1"), func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded })
	f.load(append(vol, pod("pod-b", "node-1", "claim-b"), done, node("node-1", resourceVersion("11")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	if n, _ := f.c.actual.Node("node-1"); n.Managed {
		t.Fatal("facts say managed while pod-b is not read")
	}
	if _, later := f.queues[QueueNodes].after["node-1"]; !later {
		t.Error("node-1 held, and not looked at again later")
	}
	f.reset()
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	if q := f.queued(QueueNodes); !slices.Contains(q, "node-1") {
		t.Errorf("queued nodes %v: the read of the last unread pod does not queue node-1", q)
	}
	must(t, f.c.syncNode(f.ctx, "node-1"))
	if n, _ := f.c.actual.Node("node-1"); !n.Managed {
		t.Error("every pod read (pod-c terminated), and the facts still say unmanaged")
	}
	if d := f.c.reconciler.Decide(k, epoch); d.Action != "nothing" || !d.Desired {
		t.Errorf("h1, attached and wanted by pod-b: %v", d)
	}
}

// A node that turns managed while the controller still reads every pod
// after its start (a controller asked to stop meanwhile reads no more of
// them): its facts say managed at once, since nothing is taken as unwanted
// before every pod is read, and it is not looked at again every second (a
// handoff would never see its queue empty).
func TestNodeTurningManagedWhilePodsAreReadAfterAStart(t *testing.T) {
	f, k, vol := unmanagedNodeWithAttachment(t)
	f.load(append(vol, pod("pod-b", "node-1", "claim-b"), node("node-1", resourceVersion("11")))...)
	f.c.desired.SetPartial(true)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	if n, _ := f.c.actual.Node("node-1"); !n.Managed {
		t.Error("facts say unmanaged while every pod is read anyway before anything is taken as unwanted")
	}
	if _, later := f.queues[QueueNodes].after["node-1"]; later {
		t.Error("node-1 looked at again later")
	}
	if d := f.c.reconciler.Decide(k, epoch); d.Action == "withdraw" || d.Action == "detach" {
		t.Errorf("h1, pod-b not read yet: %v", d)
	}
}

// A node made managed (version 11) whose own status write's answer
// (version 12) comes first: the answer marks the pod not read yet before
// the facts say managed, the sync of version 11, older than the answer,
// changes nothing, and the sync of version 12 still sees the change and
// marks the pod again.
func TestStatusWriteAnswerAndStaleSyncKeepTheChange(t *testing.T) {
	f, k, vol := unmanagedNodeWithAttachment(t)
	// pod-b created (its add queued, not read); the node made managed.
	f.load(append(vol, pod("pod-b", "node-1", "claim-b"), node("node-1", resourceVersion("11")))...)
	f.c.nodeWritten(f.ctx, node("node-1", resourceVersion("12")))
	if d := f.c.reconciler.Decide(k, epoch); d.Action == "withdraw" || d.Action == "detach" {
		t.Errorf("after the write's answer, before any node sync: %v", d)
	}
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.load(append(vol, pod("pod-b", "node-1", "claim-b"), node("node-1", resourceVersion("12")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	if d := f.c.reconciler.Decide(k, epoch); d.Action == "withdraw" || d.Action == "detach" {
		t.Errorf("pod-b not read yet, node just managed: decided %v", d)
	}
}

// The node's managed annotation removed and put back by someone else, each
// state seen first in the answer of a status write (the informer, which
// relisted, shows neither): a volume a pod there wants with no attachment
// on the node, decided "not managed" meanwhile, is attached once an answer
// says managed again. Nothing else wakes it: the node's sync, older than
// the answer, changes nothing, and reading the pod again changes nothing.
func TestManagementBackInAStatusAnswerWakesWantedVolumesNotAttached(t *testing.T) {
	objs := []runtime.Object{csiPV("claim-z", "h9"), claim("claim-z"), pod("pod-z", "node-1", "claim-z"), va("claim-z", "h9", "node-1"),
		csiPV("claim-b", "h1"), claim("claim-b")}
	f := newFixture(t, append(objs, node("node-1"))...)
	f.syncFirst("node-1", []string{"h9"}, "default/pod-z")
	answers := func(opts ...nodeOpt) {
		must(t, f.client.Tracker().Update(v1.SchemeGroupVersion.WithResource("nodes"), node("node-1", opts...), ""))
	}
	answers(unmanaged, resourceVersion("20"))
	f.drain()
	if n, _ := f.c.actual.Node("node-1"); n.Managed {
		t.Fatal("the answer of the status write does not say unmanaged")
	}
	// pod-b comes; its volume is decided while the facts say unmanaged.
	objs = append(objs, pod("pod-b", "node-1", "claim-b"))
	f.load(append(objs, node("node-1"))...)
	must(t, f.c.syncPod(f.ctx, "default/pod-b"))
	f.drain()
	f.reset()
	// Someone else writes the node's status; the controller's next write
	// answers managed.
	answers(resourceVersion("30"))
	f.c.status.Observe("node-1", nil, "")
	f.c.statusQueue.Add("node-1")
	f.drain()
	must(t, f.c.syncNode(f.ctx, "node-1"))
	for f.c.Process(f.ctx, QueuePods) {
	}
	f.drain()
	if w := f.writes(); !slices.Contains(w, "create volumeattachments "+volume.AttachmentName("h1", driver, "node-1")) {
		k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
		t.Errorf("writes %v: h1, wanted by pod-b, not attached; decided %v", w, f.c.reconciler.Decide(k, epoch))
	}
}

// The node's managed annotation removed and put back; the answer of a
// status write that changed nothing (no new version, no event) is the only
// one to show the removal, and the informer, which relisted, shows the
// node as it had it: managed, the same to its eyes. That update is synced
// all the same: the node's facts, from the answer, say otherwise, and
// nothing else would make them right.
func TestNodeUpdateTheInformerSeesAsTheSameIsSyncedWhenTheFactsDiffer(t *testing.T) {
	f := newFixture(t, node("node-1"))
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.c.nodeWritten(f.ctx, node("node-1", unmanaged, resourceVersion("20")))
	f.reset()
	f.c.nodeChanged(node("node-1"), node("node-1", resourceVersion("30")))
	if q := f.queued(QueueNodes); !slices.Contains(q, "node-1") {
		t.Errorf("queued nodes %v: node-1, unmanaged in its facts, managed in the update, not synced", q)
	}
	// A heartbeat that says what the facts hold is still left out.
	f.load(node("node-1", resourceVersion("30")))
	must(t, f.c.syncNode(f.ctx, "node-1"))
	f.reset()
	f.c.nodeChanged(node("node-1", resourceVersion("30")), node("node-1", resourceVersion("31")))
	if q := f.queued(QueueNodes); len(q) != 0 {
		t.Errorf("queued nodes %v for an update that changes nothing the controller reads", q)
	}
}

// A node's facts turn managed while the pod that wants a volume there is
// missing from the informer (deleted and created again under its name, the
// new one not read yet, and its want unchanged when it is): the volume,
// decided "not managed" meanwhile, is woken all the same. What is wanted
// there is the desired state's, not what the informer lists.
func TestNodeTurningManagedWakesWhatIsWantedThereWhateverTheInformerLists(t *testing.T) {
	objs := []runtime.Object{csiPV("claim-b", "h1"), claim("claim-b")}
	f := newFixture(t, append(objs, pod("pod-b", "node-1", "claim-b"), node("node-1"))...)
	f.syncFirst("node-1", nil, "default/pod-b")
	f.c.nodeWritten(f.ctx, node("node-1", unmanaged, resourceVersion("20")))
	f.drain()
	f.load(append(objs, node("node-1", resourceVersion("30")))...)
	f.reset()
	must(t, f.c.syncNode(f.ctx, "node-1"))
	k := cache.Key{Volume: volume.CSIName(driver, "h1"), Node: "node-1"}
	if q := f.queued(QueueVolumes); !slices.Contains(q, k.String()) {
		t.Errorf("queued volumes %v: %v, wanted by pod-b and decided while node-1 was unmanaged, not woken", q, k)
	}
}

// A node held unmanaged while its pods are read says so in /explain.
func TestExplainNodeWaitingForItsPods(t *testing.T) {
	f, k, vol := unmanagedNodeWithAttachment(t)
	f.load(append(vol, pod("pod-b", "node-1", "claim-b"), node("node-1", resourceVersion("11")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	want := "node node-1 is not managed by this controller (no volumes.kubernetes.io/controller-managed-attach-detach annotation) yet: the node turned managed, and 1 of its pods are not read yet"
	if e := f.c.Explain(k); e.Reason != want {
		t.Errorf("explained %q, want %q", e.Reason, want)
	}
}

// The desired volumes the metrics count are those of nodes that exist and
// are managed: a pod's want on a node that is not managed, or gone, is
// recorded but not counted.
func TestDesiredVolumesCountedOnManagedNodesOnly(t *testing.T) {
	vol := []runtime.Object{csiPV("claim-a", "h1"), claim("claim-a"), pod("pod-a", "node-1", "claim-a")}
	f := newFixture(t, append(vol, node("node-1", unmanaged))...)
	f.syncFirst("node-1", nil, "default/pod-a")
	count := func() int {
		byPlugin, _ := f.c.desired.Stats()
		n := 0
		for _, v := range byPlugin {
			n += v
		}
		return n
	}
	if n := count(); n != 0 {
		t.Errorf("unmanaged node: %d desired volumes counted, want 0", n)
	}
	f.load(append(vol, node("node-1", resourceVersion("11")))...)
	must(t, f.c.syncNode(f.ctx, "node-1"))
	if n := count(); n != 1 {
		t.Errorf("managed node: %d desired volumes counted, want 1", n)
	}
	f.load(vol...)
	f.c.nodeDeleted(node("node-1", resourceVersion("11")))
	must(t, f.c.syncNode(f.ctx, "node-1"))
	if n := count(); n != 0 {
		t.Errorf("deleted node: %d desired volumes counted, want 0", n)
	}
}
