package reconciler

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// gateMechanism holds every Attach until released, as an API call in flight
// does, and counts the calls.
type gateMechanism struct {
	entered chan cache.Key
	release chan struct{}
	mu      sync.Mutex
	calls   []cache.Key
}

func (g *gateMechanism) Attach(_ context.Context, spec *volume.Spec, node string) (AttachResult, error) {
	k := cache.Key{Volume: spec.Name, Node: node}
	g.mu.Lock()
	g.calls = append(g.calls, k)
	g.mu.Unlock()
	g.entered <- k
	<-g.release
	return AttachResult{}, nil
}

func (g *gateMechanism) Detach(context.Context, cache.Attachment) (bool, error) { return false, nil }

func (g *gateMechanism) Settle(context.Context, cache.Attachment, *volume.Spec) (Settled, error) {
	return Settled{}, nil
}

// Two workers sync one ReadWriteOnce volume on two nodes at the same time:
// the second must not attach while the first is attaching, must not block
// either, and is handed back when the first is done; it then finds the
// volume attached elsewhere.
func TestSingleNodeAttachIsExclusiveAcrossWorkers(t *testing.T) {
	ebs := func(id string, kind volume.Kind) *volume.Spec {
		inTree, csi := volume.Name("kubernetes.io/aws-ebs/"+id), volume.CSIName("ebs.csi.aws.com", "vol-1")
		s := &volume.Spec{Name: inTree, Aliases: []volume.Name{csi}, Kind: kind, PluginName: "kubernetes.io/aws-ebs",
			Driver: "ebs.csi.aws.com", VolumeHandle: "vol-1", SingleNode: true}
		if kind == volume.KindCSI {
			s.Name, s.Aliases, s.Migrated = csi, []volume.Name{inTree}, true
		}
		return s
	}
	for _, tc := range []struct {
		name      string
		spec      *volume.Spec
		other     *volume.Spec // the second node's, when it spells the volume otherwise
		wantCalls int
	}{
		{name: "ReadWriteOnce", spec: specA, wantCalls: 1},
		{name: "ReadWriteMany attaches on both at once", spec: specX, wantCalls: 2},
		{name: "one disk spelled two ways, migrated", spec: ebs("aws://us-east-1a/vol-1", volume.KindCSI),
			other: ebs("vol-1", volume.KindCSI), wantCalls: 1},
		{name: "one disk spelled two ways, in-tree", spec: ebs("aws://us-east-1a/vol-1", volume.KindInTree),
			other: ebs("vol-1", volume.KindInTree), wantCalls: 1},
		{name: "one disk spelled two ways, in-tree on one node only", spec: ebs("aws://us-east-1a/vol-1", volume.KindInTree),
			other: ebs("vol-1", volume.KindCSI), wantCalls: 1},
	} {
		if tc.other == nil {
			tc.other = tc.spec
		}
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			desired, actual := cache.NewDesiredState(), cache.NewActualState()
			for _, n := range []string{node1, node2} {
				actual.SetNode(n, cache.NodeInfo{Managed: true, Ready: true}, time.Time{})
			}
			desired.SetPod(podA, node1, []*volume.Spec{tc.spec})
			desired.SetPod(podB, node2, []*volume.Spec{tc.other})
			g := &gateMechanism{entered: make(chan cache.Key, 2), release: make(chan struct{})}
			r := New(desired, actual, nodestatus.NewRecord(actual), map[volume.Kind]Mechanism{volume.KindCSI: g, volume.KindInTree: g}, record.NewFakeRecorder(10), metrics.New(),
				Config{MaxWaitForUnmount: time.Minute})
			k1, k2 := key(tc.spec, node1), key(tc.other, node2)

			first := make(chan Result, 1)
			go func() {
				res, _ := r.Sync(ctx, k1)
				first <- res
			}()
			<-g.entered // the first worker is inside its attach
			second := make(chan Result, 1)
			go func() {
				res, _ := r.Sync(ctx, k2)
				second <- res
			}()
			var res2 Result
			select {
			case res2 = <-second:
			case k := <-g.entered:
				if tc.wantCalls == 1 {
					close(g.release)
					t.Fatalf("second worker attached %s while the first was attaching", k)
				}
				close(g.release)
				res2 = <-second
			}
			if tc.wantCalls == 1 {
				close(g.release)
			}
			res1 := <-first
			if len(g.calls) != tc.wantCalls {
				t.Fatalf("attach calls %v, want %d", g.calls, tc.wantCalls)
			}
			if tc.wantCalls == 2 {
				return
			}
			if !reflect.DeepEqual(res2, Result{}) {
				t.Errorf("second sync result %+v, want nothing done", res2)
			}
			if !reflect.DeepEqual(res1.Wake, []cache.Key{k2}) {
				t.Errorf("first sync wakes %v, want the key that found the volume busy: %v", res1.Wake, k2)
			}
			if d := r.Decide(k2, time.Now()); d.Action != Blocked || len(d.Elsewhere) != 1 {
				t.Errorf("second node, synced again: %s, want blocked by the first", d)
			}
		})
	}
}
