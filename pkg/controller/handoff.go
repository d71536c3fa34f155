package controller

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"
)

// handoffPoll is how often a handoff checks whether it is done.
const handoffPoll = 100 * time.Millisecond

// handOver prepares the volumes for the next controller (pkg/nodestatus/handoff.go
// says why) for at most Config.HandoffTimeout, while the informers, the
// VolumeAttachment and node syncs and the node status writer keep running.
// It returns early when ctx is cancelled: then this replica may no longer
// write.
func (c *Controller) handOver(ctx context.Context) {
	logger := klog.FromContext(ctx)
	timeout := c.cfg.HandoffTimeout
	if c.cfg.Shadow != nil {
		// It acted on nothing: nothing to hand over.
		return
	}
	if timeout <= 0 {
		logger.Info("Stopping without a handoff")
		return
	}
	start := time.Now()
	c.BeginHandOver()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(handoffPoll)
	defer tick.Stop()
	// Done on two polls in a row: an item taken from a queue is counted as
	// being processed a moment after it leaves the queue.
	settled := 0
	for {
		n, sample := c.HandedOver()
		if n == 0 {
			settled++
		} else {
			settled = 0
		}
		if settled == 2 {
			logger.Info("Handed over: every volume attached is listed in its node's status; no attach or detach under way",
				"took", time.Since(start).Round(time.Millisecond))
			return
		}
		select {
		case <-ctx.Done():
			logger.Info("Handoff cut short: this replica may no longer write", "unsettled", n, "volumes", sample)
			return
		case <-deadline.C:
			logger.Info("Handoff timed out: the next controller finds these volumes unsettled", "timeout", timeout, "unsettled", n, "volumes", sample)
			return
		case <-tick.C:
		}
	}
}

// BeginHandOver starts a handoff: no operation starts any more, and volumes
// withdrawn for a detach that has not started are listed again in their
// node's status. The attaches and detaches under way go on.
func (c *Controller) BeginHandOver() {
	for _, node := range c.status.HandOver() {
		c.statusQueue.Add(node)
	}
}

// HandedOver reports how many volumes are still in between (0: the handoff
// is done) and a few of them. A node status write that ended without a
// volume (computed before the handoff began) queues nothing by itself: every
// report still due is queued again.
//
// Until the node, VolumeAttachment and node status queues are empty and
// none of their items is being processed, what the informers delivered may
// not be in the actual state yet (a node created again, an attach
// confirmed): that counts as one more unsettled entry. So does a volume
// sync under way: the VolumeAttachment its attach call created may be in no
// cache yet.
func (c *Controller) HandedOver() (unsettled int, sample []string) {
	n, sample, toWrite := c.status.Unsettled(10)
	for _, node := range toWrite {
		c.statusQueue.Add(node)
	}
	if pending := c.nodeQueue.Len() + c.attachmentQueue.Len() + c.statusQueue.Len() + int(c.observing.Load()); pending > 0 {
		n++
		sample = append(sample, fmt.Sprintf("%d node, VolumeAttachment or node status syncs pending", pending))
	}
	if syncing := c.reconciler.Syncing(); syncing > 0 {
		n++
		sample = append(sample, fmt.Sprintf("%d volume syncs under way (an attach or detach call may await its answer)", syncing))
	}
	return n, sample
}
