package reconciler

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// ebsSpec is EBS volume vol-1 as a node names it: in-tree under the
// spelling id, or migrated (CSI); either way one disk.
func ebsSpec(id string, kind volume.Kind) *volume.Spec {
	inTree, csi := volume.Name("kubernetes.io/aws-ebs/"+id), volume.CSIName("ebs.csi.aws.com", "vol-1")
	s := &volume.Spec{Name: inTree, Aliases: []volume.Name{csi}, Kind: kind, PluginName: "kubernetes.io/aws-ebs",
		Driver: "ebs.csi.aws.com", VolumeHandle: "vol-1", SingleNode: true, PVName: "pv-ebs"}
	if kind == volume.KindCSI {
		s.Name, s.Aliases, s.Migrated = csi, []volume.Name{inTree}, true
	}
	return s
}

// A move ranks Move whatever the names of the volume on its two nodes: an
// in-tree handoff, one disk spelled two ways, migrated on one node only,
// and an old attachment whose spec is not known (recovered from node
// status after a restart) under the name the new node knows as an alias.
// And Decide blocks the new key in each (the rank is only ordering; the
// exclusivity is Decide's).
func TestRankOfAMoveUnderEveryName(t *testing.T) {
	for _, tc := range []struct {
		name     string
		old, new *volume.Spec
		nilSpec  bool // the old attachment's spec is unknown
	}{
		{name: "in-tree handoff", old: ebsSpec("vol-1", volume.KindInTree), new: ebsSpec("vol-1", volume.KindInTree)},
		{name: "in-tree, spelled two ways", old: ebsSpec("aws://us-east-1a/vol-1", volume.KindInTree), new: ebsSpec("vol-1", volume.KindInTree)},
		{name: "migrated on the new node only", old: ebsSpec("vol-1", volume.KindInTree), new: ebsSpec("vol-1", volume.KindCSI)},
		{name: "migrated on the old node only", old: ebsSpec("vol-1", volume.KindCSI), new: ebsSpec("vol-1", volume.KindInTree)},
		{name: "old attachment's spec unknown", old: ebsSpec("vol-1", volume.KindInTree), new: ebsSpec("vol-1", volume.KindCSI), nilSpec: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{MaxWaitForUnmount: time.Minute})
			for _, n := range []string{node1, node2} {
				e.actual.SetNode(n, cache.NodeInfo{Managed: true, Exists: true, Ready: true}, time.Time{})
			}
			old, moved := key(tc.old, node1), key(tc.new, node2)
			e.actual.Update(old, true, func(a *cache.Attachment) {
				a.Kind, a.State = tc.old.Kind, cache.Attached
				if !tc.nilSpec {
					a.Spec = tc.old
				}
			})
			e.status.Recover(node1, []v1.AttachedVolume{{Name: v1.UniqueVolumeName(tc.old.Name)}})
			e.desired.SetPod(podB, node2, []*volume.Spec{tc.new})
			if d := e.r.Decide(moved, e.now); d.Action != Blocked {
				t.Fatalf("Decide(new) = %s (%s), want blocked", d.Action, d.Reason)
			}
			if got := e.r.Rank(old); got != budget.Move {
				t.Errorf("Rank(old) = %d, want Move", got)
			}
			if got := e.r.Rank(moved); got != budget.Move {
				t.Errorf("Rank(new) = %d, want Move", got)
			}
			if _, err := e.r.Sync(context.Background(), moved); err != nil {
				t.Fatal(err)
			}
			if !e.desired.Waited(moved) {
				t.Error("the new key is not marked")
			}
			// Withdrawn on the old node: its write is the move's first step.
			if _, err := e.r.Sync(context.Background(), old); err != nil {
				t.Fatal(err)
			}
			if a, _ := e.actual.Get(old); !a.Withdrawn {
				t.Fatalf("old not withdrawn: %+v", a)
			}
			if got := e.r.NodeRank(node1); got != budget.Move {
				t.Errorf("NodeRank(old node) = %d, want Move", got)
			}
			// Gone from the old node, attached on the new one, not listed
			// yet: the announcement is the move's last step.
			e.actual.Delete(old)
			if got := e.r.Rank(moved); got != budget.Move {
				t.Errorf("Rank(new), old gone = %d, want Move", got)
			}
			e.actual.Update(moved, true, func(a *cache.Attachment) { a.Kind, a.State, a.Spec = tc.new.Kind, cache.Attached, tc.new })
			if got := e.r.NodeRank(node2); got != budget.Move {
				t.Errorf("NodeRank(new node), attached, not listed = %d, want Move", got)
			}
		})
	}
}

// Two pods on two nodes want one ReadWriteOnce volume (a Deployment of two
// replicas on one RWO claim): one never gets it. Its key stays Move for as
// long as its pod lives, and the holder's too; neither makes a request
// (Blocked, Nothing), and neither node's status write is raised by it: the
// permanent rank costs nothing but its place in the queue. A rule, kept.
func TestRankOfAConflictThatNeverEnds(t *testing.T) {
	e := newEnv(t, Config{MaxWaitForUnmount: time.Minute})
	for _, n := range []string{node1, node2} {
		e.actual.SetNode(n, cache.NodeInfo{Managed: true, Exists: true, Ready: true, InUse: map[volume.Name]bool{specA.Name: true}}, time.Time{})
	}
	holder, loser := key(specA, node1), key(specA, node2)
	e.actual.Update(holder, true, func(a *cache.Attachment) {
		a.Kind, a.State, a.Spec, a.AttachmentName, a.AttachmentUID = specA.Kind, cache.Attached, specA, vaNameA, "uid-va"
	})
	e.status.Recover(node1, []v1.AttachedVolume{{Name: v1.UniqueVolumeName(specA.Name)}})
	e.desired.SetPod(podA, node1, []*volume.Spec{specA})
	e.desired.SetPod(podB, node2, []*volume.Spec{specA})
	for range 3 {
		for _, k := range []cache.Key{holder, loser} {
			res, err := e.r.Sync(context.Background(), k)
			if err != nil || res.WriteNodeStatus || len(res.Wake) > 0 || res.RequeueAfter > 0 {
				t.Fatalf("Sync(%s) = %+v, %v; want nothing", k, res, err)
			}
		}
	}
	if len(e.calls) > 0 {
		t.Errorf("calls: %v", e.calls)
	}
	if got := e.r.Rank(loser); got != budget.Move {
		t.Errorf("Rank(loser) = %d, want Move (documents the permanent rank)", got)
	}
	if got := e.r.Rank(holder); got != budget.Attach {
		t.Errorf("Rank(holder) = %d, want Attach: wanted and listed where it is", got)
	}
	for _, n := range []string{node1, node2} {
		if got := e.r.NodeRank(n); got == budget.Move {
			t.Errorf("NodeRank(%s) = Move: a conflict that never ends raises a node's status writes", n)
		}
	}
}

// A restart mid-move loses the mark (it is in memory only): once the old
// attachment is gone, nothing in either state says the volume moves, and
// the rest of the move (attach, announcement) ranks as a new attach. This
// documents the loss (ordering only; a restart mid-move is rare): if it
// changes, the mark has become derivable.
func TestRankAfterARestartMidMove(t *testing.T) {
	desired, actual := cache.NewDesiredState(), cache.NewActualState()
	for _, n := range []string{node1, node2} {
		actual.SetNode(n, cache.NodeInfo{Managed: true, Exists: true, Ready: true}, time.Time{})
	}
	desired.SetPod(podB, node2, []*volume.Spec{specA})
	r := New(desired, actual, nodestatus.NewRecord(actual), nil, nil, nil, Config{MaxWaitForUnmount: time.Minute})
	if got := r.Rank(key(specA, node2)); got != budget.Attach {
		t.Errorf("Rank(moved) after a restart, old attachment gone = %d; documented as Attach", got)
	}
}

// The mark goes with the desired entry on every path that removes it: the
// pod deleted, the pod re-created on another node under the same name, the
// pod's volume replaced by another (its spec renamed: a PV re-bound), the
// node's pods all gone. None leaks.
func TestMarkDoesNotLeak(t *testing.T) {
	d := cache.NewDesiredState()
	k := key(specA, node2)
	d.SetPod(podB, node2, []*volume.Spec{specA})
	d.MarkWaited(k)
	// Re-created under the same name with a new UID, same node: same move.
	d.SetPod(cache.PodRef{Namespace: podB.Namespace, Name: podB.Name, UID: "uid-b2"}, node2, []*volume.Spec{specA})
	if !d.Waited(k) {
		t.Error("the mark went with a pod re-created on the same node (the move still waits)")
	}
	// The spec renamed (another volume): the old entry goes, with its mark.
	d.SetPod(cache.PodRef{Namespace: podB.Namespace, Name: podB.Name, UID: "uid-b2"}, node2, []*volume.Spec{specB})
	if d.Waited(k) || len(d.WaitedOn(node2)) != 0 {
		t.Errorf("the mark outlived its entry: %v", d.WaitedOn(node2))
	}
	// Moved to another node under the same name.
	d.SetPod(podB, node2, []*volume.Spec{specA})
	d.MarkWaited(k)
	d.SetPod(podB, node1, []*volume.Spec{specA})
	if len(d.WaitedOn(node2)) != 0 {
		t.Errorf("the mark outlived the pod's move: %v", d.WaitedOn(node2))
	}
	// Marking a key nobody wants records nothing.
	d.MarkWaited(key(specX, node2))
	if len(d.WaitedOn(node2)) != 0 {
		t.Errorf("a key with no entry was marked: %v", d.WaitedOn(node2))
	}
}

// The cost of a shared volume's key grows with the nodes that want it
// (BenchmarkRankSharedVolume): awaited walks every desired key of the
// volume to ask whether it is single-node, which no key of a shared volume
// is. At 5,000 nodes one Rank is milliseconds, under the work queue's lock,
// and a DaemonSet's teardown ranks 5,000 keys several times each. The
// attachment's spec could say at once that the volume is shared.
func TestRankOfASharedVolumeDoesNotGrowWithItsNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	cost := func(n int) time.Duration {
		desired, actual := cache.NewDesiredState(), cache.NewActualState()
		for i := range n {
			node := nodeName(i)
			actual.SetNode(node, cache.NodeInfo{Exists: true, Managed: true, Ready: true}, time.Time{})
			actual.Update(key(specX, node), true, func(a *cache.Attachment) { a.State, a.Kind, a.Spec = cache.Attached, specX.Kind, specX })
			if i > 0 {
				desired.SetPod(cache.PodRef{Namespace: "ds", Name: node, UID: node}, node, []*volume.Spec{specX})
			}
		}
		r := New(desired, actual, nodestatus.NewRecord(actual), nil, nil, nil, Config{MaxWaitForUnmount: time.Minute})
		k := key(specX, nodeName(0))
		res := testing.Benchmark(func(b *testing.B) {
			for b.Loop() {
				r.Rank(k)
			}
		})
		return time.Duration(res.NsPerOp())
	}
	small, large := cost(50), cost(5000)
	if large > 10*small {
		t.Errorf("Rank of a shared volume's unwanted key: %v at 50 nodes, %v at 5,000", small, large)
	}
}

func nodeName(i int) string { return fmt.Sprintf("node-%05d", i) }
