package reconciler

import (
	"context"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// A key's rank follows who waits for it: a new attach is Attach; for a
// single-node volume a pod wants on another node, its detach (and the
// status write that withdraws it) and the attach there are Move; a
// teardown, or a volume several nodes may share, is Other.
func TestRank(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec *volume.Spec
		// wantedOn is where a pod wants the volume; it is attached on node1.
		wantedOn  string
		withdrawn bool
		node1     int // want Rank(key on node1)
		node2     int // want Rank(key on node2)
		status1   int // want NodeRank(node1)
	}{
		{name: "wanted here: the attach", spec: specA, wantedOn: node1, node1: budget.Attach, node2: budget.Other, status1: budget.Attach},
		{name: "single-node volume wanted elsewhere: the detach of a move", spec: specA, wantedOn: node2,
			node1: budget.Move, node2: budget.Move, status1: budget.Attach},
		{name: "and its withdraw write", spec: specA, wantedOn: node2, withdrawn: true,
			node1: budget.Move, node2: budget.Move, status1: budget.Move},
		{name: "shared volume wanted elsewhere: no wait", spec: specX, wantedOn: node2, withdrawn: true,
			node1: budget.Other, node2: budget.Attach, status1: budget.Other},
		{name: "wanted nowhere: a teardown", spec: specA, withdrawn: true, node1: budget.Other, node2: budget.Other, status1: budget.Other},
		{name: "wanted elsewhere under its other name", spec: specEBSInTree, wantedOn: node2, withdrawn: true,
			node1: budget.Move, status1: budget.Move},
	} {
		t.Run(tc.name, func(t *testing.T) {
			desired, actual := cache.NewDesiredState(), cache.NewActualState()
			for _, n := range []string{node1, node2} {
				actual.SetNode(n, cache.NodeInfo{Managed: true, Exists: true, Ready: true}, time.Time{})
			}
			want := tc.spec
			if tc.wantedOn != "" {
				if tc.spec == specEBSInTree {
					// The pod elsewhere names the disk by its CSI name.
					want = &volume.Spec{Name: ebsCSI, Aliases: []volume.Name{ebsInTree}, Kind: volume.KindCSI,
						Driver: "ebs.csi.aws.com", VolumeHandle: "vol-ebs", PVName: "pv-ebs", SingleNode: true}
				}
				desired.SetPod(podA, tc.wantedOn, []*volume.Spec{want})
			}
			actual.Update(key(tc.spec, node1), true, func(a *cache.Attachment) {
				a.Kind, a.State, a.Spec, a.Withdrawn = tc.spec.Kind, cache.Attached, tc.spec, tc.withdrawn
			})
			r := New(desired, actual, nodestatus.NewRecord(actual), nil, nil, nil, Config{MaxWaitForUnmount: time.Minute})
			if got := r.Rank(key(tc.spec, node1)); got != tc.node1 {
				t.Errorf("Rank(%s on node1) = %d, want %d", tc.spec.Name, got, tc.node1)
			}
			if tc.spec != specEBSInTree {
				if got := r.Rank(key(want, node2)); got != tc.node2 {
					t.Errorf("Rank(%s on node2) = %d, want %d", want.Name, got, tc.node2)
				}
			}
			if got := r.NodeRank(node1); got != tc.status1 {
				t.Errorf("NodeRank(node1) = %d, want %d", got, tc.status1)
			}
		})
	}
}

// A move keeps its rank through every step until the new node's status
// lists the volume, also once the old attachment is gone (nothing in the
// actual state then says the volume moves); a new attach beside it keeps
// Attach. The mark goes with the pods that want the volume.
func TestRankThroughAMove(t *testing.T) {
	e := newEnv(t, Config{MaxWaitForUnmount: time.Minute})
	for _, n := range []string{node1, node2} {
		e.actual.SetNode(n, cache.NodeInfo{Managed: true, Exists: true, Ready: true}, time.Time{})
	}
	ctx := context.Background()
	old, moved, fresh := key(specA, node1), key(specA, node2), key(specB, node2)
	e.actual.Update(old, true, func(a *cache.Attachment) {
		a.Kind, a.State, a.Spec, a.AttachmentName, a.AttachmentUID = specA.Kind, cache.Attached, specA, vaNameA, "uid-va"
	})
	e.status.Recover(node1, []v1.AttachedVolume{{Name: v1.UniqueVolumeName(specA.Name)}})
	e.desired.SetPod(podB, node2, []*volume.Spec{specA})
	e.desired.SetPod(podC, node2, []*volume.Spec{specB})
	step := func(what string, wantOld, wantMoved, wantStatus1, wantStatus2 int) {
		t.Helper()
		if got := e.r.Rank(old); got != wantOld {
			t.Errorf("%s: Rank(old) = %d, want %d", what, got, wantOld)
		}
		if got := e.r.Rank(moved); got != wantMoved {
			t.Errorf("%s: Rank(moved) = %d, want %d", what, got, wantMoved)
		}
		if got := e.r.Rank(fresh); got != budget.Attach {
			t.Errorf("%s: Rank(fresh) = %d, want Attach", what, got)
		}
		if got := e.r.NodeRank(node1); got != wantStatus1 {
			t.Errorf("%s: NodeRank(node1) = %d, want %d", what, got, wantStatus1)
		}
		if got := e.r.NodeRank(node2); got != wantStatus2 {
			t.Errorf("%s: NodeRank(node2) = %d, want %d", what, got, wantStatus2)
		}
	}
	step("held on the old node", budget.Move, budget.Move, budget.Other, budget.Other)
	res, err := e.r.Sync(ctx, moved)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Awaited, []string{node1}) {
		t.Errorf("the blocked key awaits %v, want [%s]: the old node's write, queued before anybody waited, is ranked anew", res.Awaited, node1)
	}
	if !e.desired.Waited(moved) {
		t.Fatal("a key that found its volume held elsewhere is not marked")
	}
	// The old node unmounted: withdrawn, then written.
	if _, err := e.r.Sync(ctx, old); err != nil {
		t.Fatal(err)
	}
	step("withdrawn from the old node", budget.Move, budget.Move, budget.Move, budget.Other)
	e.writeStatus(node1)
	// The detach, then its object gone: the actual state forgets it.
	e.detach[specA.Name] = detachReply{done: true}
	if _, err := e.r.Sync(ctx, old); err != nil {
		t.Fatal(err)
	}
	e.actual.Delete(old)
	step("detached", budget.Other, budget.Move, budget.Other, budget.Other)
	// The attach on the new node, then its announcement.
	e.attach[specA.Name] = attachReply{res: AttachResult{Attached: true}}
	if _, err := e.r.Sync(ctx, moved); err != nil {
		t.Fatal(err)
	}
	step("attached on the new node", budget.Other, budget.Move, budget.Other, budget.Move)
	e.writeStatus(node2)
	step("listed on the new node", budget.Other, budget.Attach, budget.Other, budget.Other)
	e.desired.DeletePod(podB.String())
	if e.desired.Waited(moved) {
		t.Error("the mark outlived the pods that want the volume")
	}
}
