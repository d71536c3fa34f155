package controller

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// moveWorld: a ReadWriteOnce volume attached to node-a and listed there,
// its pod on node-a; node-b managed and empty.
func moveWorld(t *testing.T) (*fixture, []runtime.Object) {
	t.Helper()
	base := []runtime.Object{
		node("node-a", listsAttached(csiName("h1"))), node("node-b"),
		claim("c1"), csiPV("c1", "h1"), va("c1", "h1", "node-a"),
	}
	f := newFixture(t, append(slices.Clone(base), pod("p1", "node-a", "c1"))...)
	f.syncFirst("node-a", []string{"h1"}, "default/p1")
	if err := f.c.syncNode(f.ctx, "node-b"); err != nil {
		t.Fatal(err)
	}
	f.drain()
	f.reset()
	return f, base
}

// A move's detach (or its node's withdraw write) queued before the pod
// that waits for it appeared was ranked Other when it was added, and the
// queue ranks an item only when it is added (priorityQueue.Push/Touch).
// When the pod on the new node appears and finds the volume held on the old
// node (Blocked, Elsewhere), nothing adds the old node's key or status write
// again: they keep their place among the teardowns (Other), behind every
// new attach of a burst, while the move waits for them. Issue 36: "a key
// that a wanted key waits for is as urgent as the wanted key, for as long
// as that one waits"; rule 12: the change that makes it so (the pod
// elsewhere) must reach the queue. Under a burst the old pod's key is
// still queued when the StatefulSet's new pod is bound: the common case.
//
// touch adds every key of the volume, on every node that holds it; the
// blocked key's sync adds the old node's status write again
// (Result.Awaited), whose rank (the move's first step) would otherwise stay
// Other.
func TestBlockedMoveReranksWhatItWaitsFor(t *testing.T) {
	oldKey := key("h1", "node-a")
	k := func(n string) cache.Key { return cache.Key{Volume: volume.CSIName(driver, "h1"), Node: n} }

	t.Run("the old node's key, still queued", func(t *testing.T) {
		f, base := moveWorld(t)
		// The old pod goes: its key is queued, at Other.
		f.load(base...)
		if err := f.c.syncPod(f.ctx, "default/p1"); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(f.volumes.pending(), k("node-a")) {
			t.Fatalf("the old node's key is not queued: %v", f.volumes.pending())
		}
		if r := f.c.reconciler.Rank(k("node-a")); r != budget.Other {
			t.Fatalf("Rank(old) before the new pod = %d, want Other", r)
		}
		f.volumes.added = map[cache.Key]bool{}
		// The new pod on node-b: its key finds the volume on node-a.
		f.load(append(slices.Clone(base), pod("p2", "node-b", "c1"))...)
		if err := f.c.syncPod(f.ctx, "default/p2"); err != nil {
			t.Fatal(err)
		}
		if err := f.c.syncKey(f.ctx, k("node-b")); err != nil {
			t.Fatal(err)
		}
		if r := f.c.reconciler.Rank(k("node-a")); r != budget.Move {
			t.Fatalf("Rank(old) once the new pod waits = %d, want Move", r)
		}
		if added := f.queued(QueueVolumes); !slices.Contains(added, oldKey) {
			t.Errorf("added since the new pod came: %v; want %s added again, so that the queue ranks it Move (it stays queued at Other)", added, oldKey)
		}
	})

	t.Run("the old node's withdraw write, still queued", func(t *testing.T) {
		f, base := moveWorld(t)
		f.load(base...)
		if err := f.c.syncPod(f.ctx, "default/p1"); err != nil {
			t.Fatal(err)
		}
		// The old key withdraws: node-a's status write is queued, at Other.
		if err := f.c.syncKey(f.ctx, k("node-a")); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(f.queues[QueueNodeStatus].pending(), "node-a") {
			t.Fatalf("node-a's write is not queued: %v (actual %v)", f.queues[QueueNodeStatus].pending(), f.actualState())
		}
		if r := f.c.reconciler.NodeRank("node-a"); r != budget.Other {
			t.Fatalf("NodeRank(node-a) before the new pod = %d, want Other", r)
		}
		f.queues[QueueNodeStatus].added = map[string]bool{}
		f.load(append(slices.Clone(base), pod("p2", "node-b", "c1"))...)
		if err := f.c.syncPod(f.ctx, "default/p2"); err != nil {
			t.Fatal(err)
		}
		if err := f.c.syncKey(f.ctx, k("node-b")); err != nil {
			t.Fatal(err)
		}
		if r := f.c.reconciler.NodeRank("node-a"); r != budget.Move {
			t.Fatalf("NodeRank(node-a) once the new pod waits = %d, want Move", r)
		}
		if added := f.queued(QueueNodeStatus); !slices.Contains(added, "node-a") {
			t.Errorf("status writes added since the new pod came: %v; want node-a added again, so that the queue ranks its write Move (it stays queued at Other)", added)
		}
	})
}
