package controller

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
)

// checkZone compares zone's disruption (reconciler.ZoneDisrupted) with what
// was seen last. On a change it says so (a log line, an event on the node
// whose sync saw it, the metric) and queues every attachment in the zone:
// the forced detaches held there may go, or must now be held. Every change
// of a zone's health reaches it: each node's sync, the status writes'
// answers included, ends here, and a deleted node's sync is queued again
// when it stops counting.
func (c *Controller) checkZone(ctx context.Context, zone, node string) {
	cfg := c.cfg.Reconciler
	if cfg.UnhealthyZoneThreshold <= 0 {
		return
	}
	h := c.actual.ZoneHealth(zone, c.clock.Now(), cfg.DeletedNodeWait())
	disrupted := reconciler.ZoneDisrupted(h, cfg)
	c.mu.Lock()
	if c.zoneDisrupted[zone] == disrupted {
		c.mu.Unlock()
		return
	}
	if disrupted {
		c.zoneDisrupted[zone] = true
	} else {
		delete(c.zoneDisrupted, zone)
	}
	count := len(c.zoneDisrupted)
	c.mu.Unlock()

	if !disrupted {
		c.actual.ZoneRecovered(zone, c.clock.Now())
	}
	c.cfg.Metrics.DisruptedZones.Set(float64(count))
	logger := klog.FromContext(ctx)
	what := reconciler.DescribeZone(h, cfg)
	ref := &v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node}
	if disrupted {
		logger.Info("Zone disrupted: forced detaches by timeout of its nodes are held", "zone", zone, "unhealthy", h.Unhealthy, "nodes", h.Nodes)
		c.cfg.Recorder.Eventf(ref, v1.EventTypeWarning, "ZoneDisrupted",
			"%s; forced detaches by timeout of its nodes are held (the out-of-service taint still detaches at once)", what)
	} else {
		logger.Info("Zone no longer disrupted: its nodes still not ready get the max wait for unmount again", "zone", zone, "unhealthy", h.Unhealthy, "nodes", h.Nodes)
		c.cfg.Recorder.Eventf(ref, v1.EventTypeNormal, "ZoneRecovered",
			"%s; the nodes still not ready get the max wait for unmount again from now before a forced detach", what)
	}
	c.touch(c.actual.KeysInZone(zone)...)
}
