package controller

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
)

// zonesKey, on the node queue, stands for the zones' own look (no node
// has an empty name): its sync reads no node and looks at the zones.
const zonesKey = ""

// checkZones announces the zones whose disruption (reconciler.ZoneDisrupted)
// changed since it was last announced: a log line, an event on the node
// whose sync saw it, the metric; and queues every attachment in such a
// zone: the forced detaches held there may go, or must now be held. The
// actual state computes and records each zone's state in one step, so that
// two node workers announce each change once, and a decision that sees a
// recovery first (a deletion that stopped counting) already gives a fresh
// max wait. Every zone is looked at, not only the node's: a deleted node,
// forgotten once nothing is attached there, still counted somewhere, and a
// node deleted before this controller read it counts everywhere. Each
// node's sync ends here, and the zones' own look is queued for when the
// next deletion stops counting.
func (c *Controller) checkZones(ctx context.Context, node string) {
	cfg := c.cfg.Reconciler
	if cfg.UnhealthyZoneThreshold <= 0 || c.rebuilding {
		// While the actual state is rebuilt the counts are partial: the
		// zones are looked at once it is (BeginRecovery).
		return
	}
	// The gauge is set in the order of the looks: a worker's older count
	// must not overwrite a newer one.
	c.zoneMu.Lock()
	now := c.clock.Now()
	changes, disrupted, next := c.actual.AnnounceZones(now, cfg.ZoneRule())
	c.cfg.Metrics.DisruptedZones.Set(float64(disrupted))
	c.zoneMu.Unlock()
	if !next.IsZero() {
		// A deletion stops counting then, however it was learnt (its
		// event, a relist, a status write that found the node gone, a
		// start): the zones are looked at again, under zonesKey.
		c.nodeQueue.AddAfter(zonesKey, next.Sub(now)+time.Second)
	}
	logger := klog.FromContext(ctx)
	for _, h := range changes {
		ref := &v1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: node}
		if node == zonesKey {
			// After a restart, or a deletion that stopped counting: one
			// of the zone's nodes.
			ref.Name = h.Node
		}
		what := reconciler.DescribeZone(h.ZoneHealth, cfg)
		if h.Disrupted {
			logger.Info("Zone disrupted: forced detaches by timeout of its nodes are held", "zone", h.Zone, "unhealthy", h.Unhealthy, "nodes", h.Nodes)
			if ref.Name != "" {
				c.cfg.Recorder.Eventf(ref, v1.EventTypeWarning, "ZoneDisrupted",
					"%s; forced detaches by timeout of its nodes are held (the out-of-service taint still detaches at once)", what)
			}
		} else {
			logger.Info("Zone no longer disrupted: its nodes still not ready get the max wait for unmount again", "zone", h.Zone, "unhealthy", h.Unhealthy, "nodes", h.Nodes)
			if ref.Name != "" {
				c.cfg.Recorder.Eventf(ref, v1.EventTypeNormal, "ZoneRecovered",
					"%s; the nodes still not ready get the max wait for unmount again from now before a forced detach", what)
			}
		}
		c.touch(h.Keys...)
	}
}
