package controller

import (
	"context"
	"sync/atomic"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

// process runs one item of q through sync. The worker alone decides between
// Forget and AddRateLimited.
func process[T comparable](ctx context.Context, q workqueue.TypedRateLimitingInterface[T], kv func(T) []any,
	sync func(context.Context, T) error, busy *atomic.Int64) bool {
	item, quit := q.Get()
	if quit {
		return false
	}
	if busy != nil {
		busy.Add(1)
		defer busy.Add(-1)
	}
	defer q.Done(item)
	logger := klog.FromContext(ctx).WithValues(kv(item)...)
	err := sync(klog.NewContext(ctx, logger), item)
	if err != nil {
		logger.Error(err, "Sync failed; will retry", "retries", q.NumRequeues(item))
		q.AddRateLimited(item)
		return true
	}
	q.Forget(item)
	return true
}

// Process runs one item of the named queue (Queue*) through its sync, as a
// worker does; it returns false once the queue is shut down. For drivers that
// schedule the work themselves; Run starts workers that call it in a loop.
func (c *Controller) Process(ctx context.Context, queue string) bool {
	switch queue {
	case QueuePods:
		return process(ctx, c.podQueue, keyKV("pod"), c.syncPod, nil)
	case QueueNodes:
		return process(ctx, c.nodeQueue, keyKV("node"), c.syncNode, &c.observing)
	case QueueVolumeAttachments:
		return process(ctx, c.attachmentQueue, keyKV("volumeAttachment"), c.syncAttachment, &c.observing)
	case QueueNodeStatus:
		return process(ctx, c.statusQueue, keyKV("node"), ranked(func(node string) int { return c.reconciler.NodeRank(node) }, c.syncNodeStatus), &c.observing)
	case QueueVolumes:
		return process(ctx, c.volumeQueue, volumeKV, ranked(func(k cache.Key) int { return c.reconciler.Rank(k) }, c.syncKey), nil)
	}
	panic("unknown queue " + queue)
}

// syncKey syncs one volume key (the reconciler, or in shadow mode the
// comparison), and queues the read of its node when no sync has read it
// yet: a key there waits for that read (the reconciler's "not read yet"),
// whatever made its attachment (a VolumeAttachment, or an attach that
// raced the node's deletion).
func (c *Controller) syncKey(ctx context.Context, k cache.Key) error {
	err := c.syncVolumeKey(ctx, k)
	if n, ok := c.actual.Node(k.Node); ok && n.Unread() {
		c.nodeQueue.Add(k.Node)
	}
	return err
}

// ranked makes sync's API requests wait for the budget (budget.Limiter) at
// the rank of their item, asked again as they wait: a withdrawal taken at
// Other becomes a move's first step when a pod comes to wait for it.
func ranked[T comparable](rank func(T) int, sync func(context.Context, T) error) func(context.Context, T) error {
	return func(ctx context.Context, item T) error {
		return sync(budget.WithPriorityFunc(ctx, func() int { return rank(item) }), item)
	}
}

func volumeKV(k cache.Key) []any { return []any{"volume", k.Volume, "node", k.Node} }

func keyKV(name string) func(string) []any {
	return func(k string) []any { return []any{name, k} }
}

// worker processes the named queue until it shuts down.
func (c *Controller) worker(queue string) func(context.Context) {
	return func(ctx context.Context) {
		for c.Process(ctx, queue) {
		}
	}
}

func (c *Controller) syncStatus(ctx context.Context, node string) error {
	keys, after, err := c.writer.Sync(ctx, node)
	// The write may have found the node gone (Writer.Sync).
	c.countNode(node)
	for _, k := range keys {
		c.volumeQueue.Add(k)
	}
	if after > 0 {
		c.statusQueue.AddAfter(node, after)
	}
	return err
}

func (c *Controller) syncVolume(ctx context.Context, k cache.Key) error {
	res, err := c.reconciler.Sync(ctx, k)
	if res.Detached {
		c.touch(k)
	}
	for _, w := range res.Wake {
		c.volumeQueue.Add(w)
	}
	if res.WriteNodeStatus {
		c.statusQueue.Add(k.Node)
	}
	for _, node := range res.Awaited {
		c.statusQueue.Add(node)
	}
	if res.RequeueAfter > 0 {
		c.volumeQueue.AddAfter(k, res.RequeueAfter)
	}
	return err
}
