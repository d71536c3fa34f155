package controller

import (
	"context"
	"time"

	"k8s.io/klog/v2"
)

// handoffPoll is how often a handoff checks whether it is done.
const handoffPoll = 100 * time.Millisecond

// handOver prepares the volumes for the next controller (pkg/cache/handoff.go
// says why): no operation starts any more, volumes withdrawn for a detach
// that has not started are listed again in their node's status, and the
// attaches and detaches under way are given until Config.HandoffTimeout to
// finish, while the informers, the VolumeAttachment and node syncs and the
// node status writer keep running. It returns early when ctx is cancelled:
// then this replica may no longer write.
func (c *Controller) handOver(ctx context.Context) {
	logger := klog.FromContext(ctx)
	timeout := c.cfg.HandoffTimeout
	if timeout <= 0 {
		logger.Info("Stopping without a handoff")
		return
	}
	start := time.Now()
	c.reconciler.HandOver()
	for _, node := range c.actual.HandOver() {
		c.statusQueue.Add(node)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(handoffPoll)
	defer tick.Stop()
	for {
		n, sample, toWrite := c.actual.Unsettled(10)
		// A write that ended without the volume (computed before the
		// freeze) queues nothing by itself: queue every report still due.
		for _, node := range toWrite {
			c.statusQueue.Add(node)
		}
		if n == 0 {
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
