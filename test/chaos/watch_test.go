package chaos

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// watchInto feeds the checker every VolumeAttachment and Node event,
// resuming across kube-apiserver restarts from the last resourceVersion
// seen. A watch the apiserver can no longer resume (410 Gone: etcd was
// compacted past it) is listed again, and relists counts it; what the list
// no longer holds is recorded as a tombstone, and the stretch of history
// missed as unseen. The apiserver runs without a watch cache, so that a
// restart alone does not make the last resourceVersion seen too old.
func watchInto(t *testing.T, client kubernetes.Interface, checker *Checker, relists *atomic.Int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	vas := client.StorageV1().VolumeAttachments()
	watchKind(ctx, t, checker, relists, "volumeattachments",
		func(ctx context.Context) ([]*storagev1.VolumeAttachment, string, error) {
			l, err := vas.List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, "", err
			}
			items := make([]*storagev1.VolumeAttachment, len(l.Items))
			for i := range l.Items {
				items[i] = &l.Items[i]
			}
			return items, l.ResourceVersion, nil
		},
		&cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return vas.Watch(ctx, o)
		}},
		func(typ watch.EventType, va *storagev1.VolumeAttachment) Event { return Event{Type: typ, VA: va} })
	nodes := client.CoreV1().Nodes()
	watchKind(ctx, t, checker, relists, "nodes",
		func(ctx context.Context) ([]*v1.Node, string, error) {
			l, err := nodes.List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, "", err
			}
			items := make([]*v1.Node, len(l.Items))
			for i := range l.Items {
				items[i] = &l.Items[i]
			}
			return items, l.ResourceVersion, nil
		},
		&cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return nodes.Watch(ctx, o)
		}},
		func(typ watch.EventType, n *v1.Node) Event { return Event{Type: typ, Node: n} })
}

// watched is a VolumeAttachment or a Node.
type watched interface {
	runtime.Object
	metav1.Object
}

// watchKind lists, then watches in the background.
func watchKind[T watched](ctx context.Context, t *testing.T, checker *Checker, relists *atomic.Int64, name string,
	list func(context.Context) ([]T, string, error), lw cache.WatcherWithContext, event func(watch.EventType, T) Event) {
	t.Helper()
	known := map[string]T{}
	var last uint64
	seen := func(typ watch.EventType, obj T) {
		checker.Record(event(typ, obj))
		if typ == watch.Deleted {
			delete(known, obj.GetName())
		} else {
			known[obj.GetName()] = obj
		}
		last = max(last, parseRV(obj.GetResourceVersion()))
	}
	relist := func(first bool) (string, error) {
		items, rv, err := list(ctx)
		if err != nil {
			return "", err
		}
		if !first {
			present := map[string]bool{}
			for _, o := range items {
				present[o.GetName()] = true
			}
			for n, o := range known {
				if present[n] {
					continue
				}
				// Gone after the last version seen: placed there, so that
				// nothing seen later finds it still present.
				tomb := o.DeepCopyObject().(T)
				tomb.SetResourceVersion(strconv.FormatUint(last, 10))
				e := event(watch.Deleted, tomb)
				e.Tombstone = true
				checker.Record(e)
				delete(known, n)
			}
			checker.Unseen(last, parseRV(rv))
		}
		for _, o := range items {
			seen(watch.Added, o)
		}
		last = max(last, parseRV(rv))
		return rv, nil
	}
	rv, err := relist(true)
	if err != nil {
		t.Fatalf("list %s: %v", name, err)
	}
	go func() {
		for ctx.Err() == nil {
			watchUntilGone(ctx, t, name, rv, lw, seen)
			for ctx.Err() == nil {
				if rv, err = relist(false); err == nil {
					relists.Add(1)
					break
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
	}()
}

// watchUntilGone watches from rv, across disconnections, until the
// apiserver can no longer resume the watch (or ctx ends).
func watchUntilGone[T watched](ctx context.Context, t *testing.T, name, rv string, lw cache.WatcherWithContext, seen func(watch.EventType, T)) {
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, lw)
	if err != nil {
		t.Errorf("watch %s: %v", name, err)
		return
	}
	defer rw.Stop()
	for ev := range rw.ResultChan() {
		switch ev.Type {
		case watch.Error:
			t.Logf("watch %s: %v", name, apierrors.FromObject(ev.Object))
		case watch.Bookmark:
		default:
			if obj, ok := ev.Object.(T); ok {
				seen(ev.Type, obj)
			}
		}
	}
}

func parseRV(rv string) uint64 {
	n, _ := strconv.ParseUint(rv, 10, 64)
	return n
}
