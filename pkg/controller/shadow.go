package controller

import (
	"context"
	"fmt"
	"net/http"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/pkg/shadow"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// In shadow mode (Config.Shadow) the volume and node status queues are
// synced by the two functions of this file instead of the reconciler and the
// node status writer: the controller compares and never acts. Its actual
// state is then the cluster's: VolumeAttachments (syncAttachment, as always)
// and node.status.volumesAttached as the other controller writes it
// (mirrorStatus).

// minShadowRecheck bounds how often a volume the cluster detached while we
// would keep it is looked at again.
const minShadowRecheck = time.Second

// syncShadow compares what the controller would do with one key and what
// the cluster shows, and records the verdict (pkg/shadow).
func (c *Controller) syncShadow(ctx context.Context, k cache.Key) error {
	t := c.cfg.Shadow
	held, since := t.Held(k)
	if held != shadow.WouldWaitForUnmount {
		since = c.clock.Now()
	}
	now := c.clock.Now()
	o := shadow.Observe(c.reconciler, c.actual, k, now, since)
	v := shadow.Compare(o, c.clusterView(o.Decision), held)
	after := t.Record(ctx, k, v, podNames(o.Pods), now)
	if v.Kind == shadow.WouldWaitForUnmount && !o.HasAttachment && after == 0 {
		// Nothing of the cluster's is left to re-queue the key: it is
		// looked at again, every grace period, until we would have
		// detached the volume too.
		after = max(t.GracePeriod(), minShadowRecheck)
	}
	if o.Wait != "" && o.WaitAfter > 0 && (after == 0 || o.WaitAfter < after) {
		// The max wait for unmount ends: we would detach then.
		after = o.WaitAfter
	}
	if after > 0 {
		c.volumeQueue.AddAfter(k, after)
	}
	return nil
}

// queueMirror is statusDiffers in shadow mode: node.status, as the other
// controller wrote it, is read into the actual state (mirrorStatus).
func (c *Controller) queueMirror(_ context.Context, node *v1.Node) {
	c.statusQueue.Add(node.Name)
}

// mirrorStatus records a node's status.volumesAttached, as the other
// controller wrote it, in the actual state. A volume known from node.status
// alone that it stops listing is being detached: it is compared once as
// such (we may still want it kept: mounted), then forgotten, and the
// comparison goes on as a detached volume.
func (c *Controller) mirrorStatus(ctx context.Context, name string) error {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get node %s: %w", name, err)
	}
	changed, dropped := shadow.MirrorReport(c.actual, c.status, name, node.Status.VolumesAttached)
	for _, k := range dropped {
		if err := c.syncShadow(ctx, k); err != nil {
			return err
		}
		c.actual.Delete(k)
	}
	for _, k := range append(changed, dropped...) {
		c.volumeQueue.Add(k)
		for _, dk := range c.desired.KeysFor(k.Volume) {
			c.volumeQueue.Add(dk)
		}
	}
	return nil
}

// clusterView says what the cluster shows for d's volume on d's node, under
// any of the volume's names.
func (c *Controller) clusterView(d reconciler.Decision) shadow.Cluster {
	names := []volume.Name{d.Key.Volume}
	if d.Spec != nil {
		names = append(names, d.Spec.AllNames()...)
	}
	for _, name := range names {
		a, ok := c.actual.Get(cache.Key{Volume: name, Node: d.Key.Node})
		if !ok {
			continue
		}
		cl := shadow.Cluster{Reported: c.status.IsListed(cache.Key{Volume: name, Node: d.Key.Node})}
		if name != d.Key.Volume {
			cl.Name = string(name)
		}
		switch a.State {
		case cache.Attached:
			cl.State = shadow.Attached
		case cache.Detaching:
			cl.State = shadow.Detaching
		default:
			cl.State = shadow.Attaching
		}
		return cl
	}
	return shadow.Cluster{State: shadow.NotAttached}
}

// ShadowExplanation is what shadow mode adds to an explanation: what the
// cluster shows, and the disagreement, if any.
type ShadowExplanation struct {
	Cluster string `json:"cluster"`
	// Disagreement is pending (younger than the grace period) or, when
	// Open, reported.
	Disagreement *shadow.Disagreement `json:"disagreement,omitempty"`
	Open         bool                 `json:"open"`
}

func (c *Controller) explainShadow(d reconciler.Decision) *ShadowExplanation {
	if c.cfg.Shadow == nil {
		return nil
	}
	e := &ShadowExplanation{Cluster: c.clusterView(d).String()}
	if dis, reported, ok := c.cfg.Shadow.Get(d.Key); ok {
		e.Disagreement, e.Open = &dis, reported
	}
	return e
}

// ShadowSummary is the shadow mode report; false when not in shadow mode.
func (c *Controller) ShadowSummary() (shadow.Summary, bool) {
	if c.cfg.Shadow == nil {
		return shadow.Summary{}, false
	}
	return c.cfg.Shadow.Summary(), true
}

func podNames(pods []cache.PodRef) []string {
	out := make([]string, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.String())
	}
	return out
}

// ServeShadow answers /shadow with the shadow mode report (JSON); 404 when
// not in shadow mode.
func (c *Controller) ServeShadow(w http.ResponseWriter, _ *http.Request) {
	s, ok := c.ShadowSummary()
	if !ok {
		http.Error(w, "not in shadow mode (--shadow)", http.StatusNotFound)
		return
	}
	writeJSON(w, s)
}
