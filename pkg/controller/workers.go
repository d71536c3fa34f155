package controller

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

// process runs one item of q through sync. The worker alone decides between
// Forget and AddRateLimited.
func process[T comparable](ctx context.Context, q workqueue.TypedRateLimitingInterface[T], kv func(T) []any,
	sync func(context.Context, T) error) bool {
	item, quit := q.Get()
	if quit {
		return false
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

func keyKV(name string) func(string) []any {
	return func(k string) []any { return []any{name, k} }
}

func (c *Controller) podWorker(ctx context.Context) {
	for process(ctx, c.podQueue, keyKV("pod"), c.syncPod) {
	}
}

func (c *Controller) nodeWorker(ctx context.Context) {
	for process(ctx, c.nodeQueue, keyKV("node"), c.syncNode) {
	}
}

func (c *Controller) attachmentWorker(ctx context.Context) {
	for process(ctx, c.attachmentQueue, keyKV("volumeAttachment"), c.syncAttachment) {
	}
}

func (c *Controller) statusWorker(ctx context.Context) {
	for process(ctx, c.statusQueue, keyKV("node"), c.syncStatus) {
	}
}

func (c *Controller) volumeWorker(ctx context.Context) {
	kv := func(k cache.Key) []any { return []any{"volume", k.Volume, "node", k.Node} }
	for process(ctx, c.volumeQueue, kv, c.syncVolume) {
	}
}

func (c *Controller) syncStatus(ctx context.Context, node string) error {
	keys, err := c.writer.Sync(ctx, node)
	for _, k := range keys {
		c.volumeQueue.Add(k)
	}
	return err
}

func (c *Controller) syncVolume(ctx context.Context, k cache.Key) error {
	res, err := c.reconciler.Sync(ctx, k)
	if res.WriteNodeStatus {
		c.statusQueue.Add(k.Node)
	}
	if res.RequeueAfter > 0 {
		c.volumeQueue.AddAfter(k, res.RequeueAfter)
	}
	return err
}
