package reconciler

import (
	"context"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
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

// Two workers sync one ReadWriteOnce volume on two nodes at the same time:
// the second must see the first one's attach, never start its own.
func TestSingleNodeAttachIsExclusiveAcrossWorkers(t *testing.T) {
	for _, tc := range []struct {
		name       string
		spec       *volume.Spec
		wantCalls  int
		secondKind string
	}{
		{name: "ReadWriteOnce", spec: specA, wantCalls: 1},
		{name: "ReadWriteMany attaches on both at once", spec: specX, wantCalls: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			desired, actual := cache.NewDesiredState(), cache.NewActualState()
			for _, n := range []string{node1, node2} {
				actual.SetNode(n, cache.NodeInfo{Managed: true, Ready: true})
			}
			desired.SetPod(podA, node1, []*volume.Spec{tc.spec})
			desired.SetPod(podB, node2, []*volume.Spec{tc.spec})
			g := &gateMechanism{entered: make(chan cache.Key, 2), release: make(chan struct{})}
			r := New(desired, actual, map[volume.Kind]Mechanism{volume.KindCSI: g}, record.NewFakeRecorder(10), metrics.New(),
				Config{MaxWaitForUnmount: time.Minute})

			var wg sync.WaitGroup
			wg.Go(func() { _, _ = r.Sync(ctx, key(tc.spec, node1)) })
			<-g.entered // the first worker is inside its attach
			wg.Go(func() { _, _ = r.Sync(ctx, key(tc.spec, node2)) })
			// Without exclusion the second worker reaches Attach at once;
			// with it, it waits for the first to record its attach.
			select {
			case <-g.entered:
			case <-time.After(500 * time.Millisecond):
			}
			close(g.release)
			wg.Wait()
			if len(g.calls) != tc.wantCalls {
				t.Fatalf("attach calls %v, want %d", g.calls, tc.wantCalls)
			}
			if tc.wantCalls == 1 {
				d := r.Decide(key(tc.spec, node2), time.Now())
				if d.Action != Blocked || len(d.Elsewhere) != 1 {
					t.Errorf("second node: %s, want blocked by the first", d)
				}
			}
		})
	}
}
