package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

var everything = labels.Everything()

// Recover rebuilds both states from the synced informers before any worker
// runs: attachments from VolumeAttachments and node.status.volumesAttached,
// then every pod's wants. Only then can "not desired" be trusted, so a
// restart never detaches a volume still in use, and a pod deleted while the
// controller was down is detached right away.
func (c *Controller) Recover(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	start := time.Now()
	vas, err := c.attachments.List(everything)
	if err != nil {
		return fmt.Errorf("list VolumeAttachments: %w", err)
	}
	// In name order: a restart does the same in the same order (logs,
	// events), whatever the order of the informers' maps.
	slices.SortFunc(vas, func(a, b *storagev1.VolumeAttachment) int { return strings.Compare(a.Name, b.Name) })
	for _, va := range vas {
		if err := c.syncAttachment(ctx, va.Name); err != nil {
			return err
		}
	}
	nodes, err := c.nodes.List(everything)
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	slices.SortFunc(nodes, func(a, b *v1.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, node := range nodes {
		for _, av := range node.Status.VolumesAttached {
			k := cache.Key{Volume: volume.Name(av.Name), Node: node.Name}
			c.actual.Update(k, true, func(a *cache.Attachment) {
				a.Reported = true
				if a.AttachmentName != "" {
					return // the VolumeAttachment knows better
				}
				a.Kind = kindOf(k.Volume)
				a.PluginName, _, _ = volume.Parse(k.Volume)
				a.DevicePath = av.DevicePath
				if a.Kind == volume.KindInTree {
					a.State = cache.Attached
				}
				// A CSI volume without a VolumeAttachment stays uncertain:
				// attached again if wanted, else taken out of the report.
			})
		}
		if err := c.syncNode(ctx, node.Name); err != nil {
			return err
		}
	}
	pods, err := c.pods.List(everything)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	slices.SortFunc(pods, func(a, b *v1.Pod) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	for _, p := range pods {
		if err := c.syncPod(ctx, p.Namespace+"/"+p.Name); err != nil {
			return err
		}
	}
	// Every known key gets one look, whether or not it changed, and every
	// node with one a status look. touch would also queue each key's
	// volume on every node and under every name: keys both states hold,
	// queued here anyway.
	for _, keys := range [][]cache.Key{c.actual.Keys(), c.desired.Keys()} {
		for _, k := range keys {
			c.volumeQueue.Add(k)
			c.statusQueue.Add(k.Node)
		}
	}
	logger.Info("Recovered state", "attachments", len(c.actual.Keys()), "desired", len(c.desired.Keys()), "pods", len(pods), "nodes", len(nodes),
		"duration", time.Since(start).Round(time.Millisecond))
	return nil
}

func kindOf(name volume.Name) volume.Kind {
	if plugin, _, _ := volume.Parse(name); plugin == volume.CSIPluginName {
		return volume.KindCSI
	}
	return volume.KindInTree
}

// After a restart, Recover gives every known volume one look: at 100,000
// volumes, seconds of syncs. Queued all at once, they would hold the first
// attach of a pod created meanwhile behind every one of them; fed to the
// volume queue a few at a time instead, an event's key waits behind at most
// recoveryFeedDepth of them.
const (
	recoveryFeedDepth    = 256
	recoveryFeedInterval = 5 * time.Millisecond
)

// RecoverHeld is Recover with the volume keys it queues held back: they
// are returned for the caller to queue (Run: feedRecovered), the keys with
// something to do first (settledLast), each part in the order Recover queued
// them. Only before the workers start: nothing else adds to the volume queue
// then.
func (c *Controller) RecoverHeld(ctx context.Context) ([]cache.Key, error) {
	queue := c.volumeQueue
	held := &heldKeys{TypedRateLimitingInterface: queue, seen: sets.New[cache.Key]()}
	c.volumeQueue = held
	defer func() { c.volumeQueue = queue }()
	if err := c.Recover(ctx); err != nil {
		return held.keys, err
	}
	return c.settledLast(held.keys), nil
}

// settledLast orders keys for the feed after a restart: first those whose
// look may lead to a write (a volume a pod created while the controller was
// down wants attached, one nobody wants, an attach left uncertain), then
// those already as they should be: wanted, attached, in node status. The
// settled are almost every key of a big cluster, and a new pod's volume
// would otherwise wait behind all of them (its key comes from the pods,
// after every VolumeAttachment's). The order is only the feed's: every key
// still gets its look, and each look reads the state as it is then.
func (c *Controller) settledLast(keys []cache.Key) []cache.Key {
	settled := make([]cache.Key, 0, len(keys))
	n := 0
	for _, k := range keys {
		if a, ok := c.actual.Get(k); ok && a.State == cache.Attached && a.Reported && a.DetachWanted.IsZero() && c.desired.Wanted(k) {
			settled = append(settled, k)
			continue
		}
		keys[n] = k
		n++
	}
	copy(keys[n:], settled)
	return keys
}

// heldKeys is a volume queue whose Add only records the key.
type heldKeys struct {
	workqueue.TypedRateLimitingInterface[cache.Key]
	keys []cache.Key
	seen sets.Set[cache.Key]
}

func (h *heldKeys) Add(k cache.Key) {
	if !h.seen.Has(k) {
		h.seen.Insert(k)
		h.keys = append(h.keys, k)
	}
}

// feedRecovered adds keys to queue whenever it holds fewer than depth items,
// checking every tick, until every key is added or ctx is done.
func feedRecovered(ctx context.Context, queue interface {
	Len() int
	Add(cache.Key)
}, keys []cache.Key, depth int, tick <-chan time.Time) {
	for {
		n := min(len(keys), max(0, depth-queue.Len()))
		for _, k := range keys[:n] {
			queue.Add(k)
		}
		if keys = keys[n:]; len(keys) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}
