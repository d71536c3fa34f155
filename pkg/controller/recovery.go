package controller

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

var everything = labels.Everything()

// Recover rebuilds both states from the synced informers before any worker
// runs: attachments from VolumeAttachments and node.status.volumesAttached,
// then every pod's wants. Only then can "not desired" be trusted, so a
// restart never detaches a volume still in use, and a pod deleted while the
// controller was down is detached right away. It queues every known key.
func (c *Controller) Recover(ctx context.Context) error {
	keys, err := c.RecoverHeld(ctx)
	for _, k := range keys {
		c.volumeQueue.Add(k)
	}
	return err
}

// RecoverHeld is Recover with the volume keys held back: they are returned
// for the caller to queue (Run: feedRecovered), the keys with something to
// do first (settledLast); only a volume a pod wants that is not attached yet
// is queued at once (Step). Only before the workers start.
func (c *Controller) RecoverHeld(ctx context.Context) ([]cache.Key, error) {
	r, err := c.BeginRecovery(ctx)
	if err != nil {
		return nil, err
	}
	for {
		more, err := r.Step(ctx, math.MaxInt)
		if err != nil {
			return nil, err
		}
		if !more {
			return r.Finish(ctx), nil
		}
	}
}

// Recovery is a restart's rebuild of both states from the synced informers,
// in three parts. BeginRecovery rebuilds the actual state before any worker
// runs. Step then reads the pods a few at a time while the workers run
// (Run: all but the pods' workers; the caller processes the pod queue
// between steps, so that one goroutine alone reads pods), and a new pod's
// volume is attached meanwhile, with the actual state complete: a
// single-node volume attached elsewhere stays blocked. Until Finish, the
// desired state is partial (DesiredState.SetPartial): no volume is taken
// as unwanted, so none is withdrawn or detached, for it may be a pod's not
// read yet. Finish returns every known key for one look, with detaches
// allowed again.
type Recovery struct {
	c *Controller
	// pods are the keys of the pods left to read, in order (listPods); nil
	// until listed.
	pods  []string
	nodes int
	read  int
	start time.Time
}

// BeginRecovery rebuilds the actual state: attachments from
// VolumeAttachments and node.status.volumesAttached. Only before the
// workers start; the volume keys it touches get their look from Finish.
func (c *Controller) BeginRecovery(ctx context.Context) (*Recovery, error) {
	r := &Recovery{c: c, start: time.Now()}
	c.desired.SetPartial(true)
	c.rebuilding = true
	defer func() { c.rebuilding = false }()
	vas, err := c.attachments.List(everything)
	if err != nil {
		return nil, fmt.Errorf("list VolumeAttachments: %w", err)
	}
	// In name order: a restart does the same in the same order (logs,
	// events), whatever the order of the informers' maps.
	slices.SortFunc(vas, func(a, b *storagev1.VolumeAttachment) int { return strings.Compare(a.Name, b.Name) })
	for _, va := range vas {
		if err := c.syncAttachment(ctx, va.Name); err != nil {
			return nil, err
		}
	}
	nodes, err := c.nodes.List(everything)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	r.nodes = len(nodes)
	slices.SortFunc(nodes, func(a, b *v1.Node) int { return strings.Compare(a.Name, b.Name) })
	for _, node := range nodes {
		// What its status lists counts as listed, as upstream reports
		// what it recovers.
		c.status.Recover(node.Name, node.Status.VolumesAttached)
		for _, av := range node.Status.VolumesAttached {
			k := cache.Key{Volume: volume.Name(av.Name), Node: node.Name}
			c.actual.Update(k, true, func(a *cache.Attachment) {
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
		// Its pods are read after (Step): syncNode doesn't queue them.
		if err := c.syncNode(ctx, node.Name); err != nil {
			return nil, err
		}
	}
	// The nodes VolumeAttachments name that the informer does not hold
	// were deleted before this start (the API says): their zone is lost,
	// and their deletion counts in every zone (cache.UnknownZone). One
	// the API can't answer for stays unread, its keys waiting, and is
	// synced again.
	for _, name := range c.actual.UnreadNodes() {
		if err := c.syncNode(ctx, name); err != nil {
			klog.FromContext(ctx).Error(err, "Reading a node named by a VolumeAttachment", "node", name)
			c.nodeQueue.AddRateLimited(name)
		}
	}
	// The zones, once, on whole counts: a look while the nodes were read
	// one by one would find a healthy zone disrupted ("3 of 3 not ready"),
	// and its recovery would restart its nodes' max wait.
	c.rebuilding = false
	c.checkZones(ctx, zonesKey)
	attachments := 0
	for _, n := range c.actual.Stats() {
		attachments += n
	}
	klog.FromContext(ctx).Info("Recovered the actual state", "attachments", attachments, "nodes", len(nodes),
		"duration", time.Since(r.start).Round(time.Millisecond))
	return r, nil
}

// Step reads up to n of the pods left; it reports whether any remain. A pod
// changed or deleted since the list is read as it is now (its event, queued
// meanwhile, reads it again). A volume a pod wants that is not attached yet
// (a pod created while the controller was down, or during its
// start) is queued at once: its attach needs no other pod read. Every other
// key it changes gets its look from Finish.
func (r *Recovery) Step(ctx context.Context, n int) (bool, error) {
	c := r.c
	if r.pods == nil {
		if err := r.listPods(); err != nil {
			return false, err
		}
	}
	n = min(n, len(r.pods))
	for _, key := range r.pods[:n] {
		touched, err := c.readPod(ctx, key)
		if err != nil {
			return false, err
		}
		for _, k := range touched {
			if !c.settled(k) && c.reconciler.Wanted(k) {
				c.volumeQueue.Add(k)
			}
		}
	}
	r.pods = r.pods[n:]
	r.read += n
	return len(r.pods) > 0, nil
}

// listPods lists the pods to read, once their informer has synced: the
// newest first, those created while the controller was down or starting
// (the likeliest to need an attach), then by namespace and name, so that a
// restart does the same in the same order (logs, events), whatever the
// order of the informer's map.
func (r *Recovery) listPods() error {
	pods, err := r.c.pods.List(everything)
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	slices.SortFunc(pods, func(a, b *v1.Pod) int {
		return cmp.Or(b.CreationTimestamp.Compare(a.CreationTimestamp.Time),
			strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	r.pods = make([]string, len(pods))
	for i, p := range pods {
		r.pods[i] = p.Namespace + "/" + p.Name
	}
	return nil
}

// Finish ends the recovery once every pod is read: the desired state is
// complete, and every known key is returned for one look (settledLast
// orders them), whether or not it changed, and every node with one gets a
// status look. touch would also queue each key's volume on every node and
// under every name: keys both states hold, returned anyway.
func (r *Recovery) Finish(ctx context.Context) []cache.Key {
	c := r.c
	// First: a key the workers look at from now on may be detached, and one
	// looked at before (left waiting for the pods) is in the lists below.
	c.desired.SetPartial(false)
	actual, desired := c.actual.Keys(), c.desired.Keys()
	keys := make([]cache.Key, 0, len(actual)+len(desired))
	seen := sets.New[cache.Key]()
	for _, k := range slices.Concat(actual, desired) {
		if !seen.Has(k) {
			seen.Insert(k)
			keys = append(keys, k)
			c.statusQueue.Add(k.Node)
		}
	}
	klog.FromContext(ctx).Info("Recovered state", "attachments", len(actual), "desired", len(desired), "pods", r.read, "nodes", r.nodes,
		"duration", time.Since(r.start).Round(time.Millisecond))
	return c.settledLast(keys)
}

// recoveryStep is how many pods Run reads between two looks at the pod
// queue, and how many of its items it processes then at most: an event
// waits behind at most that many pods (a few milliseconds), and a flood of
// events (every pod queued by a CSIDriver change) does not hold the reading.
const recoveryStep = 128

// readPods reads every pod of the recovery, and between steps processes
// the pod queue (its workers start after): one goroutine alone reads pods,
// so a pod's event never runs beside its read. It stops early, with no
// error, when ctx is done, and reports true when stop is closed first.
func (c *Controller) readPods(ctx context.Context, stop <-chan struct{}, r *Recovery) (bool, error) {
	for ctx.Err() == nil {
		select {
		case <-stop:
			return true, nil
		default:
		}
		more, err := r.Step(ctx, recoveryStep)
		if err != nil {
			return false, err
		}
		for i := 0; i < recoveryStep && c.podQueue.Len() > 0 && c.Process(ctx, QueuePods); i++ {
		}
		if !more {
			// What is still queued goes to the pod workers.
			return false, nil
		}
	}
	return false, nil
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

// settledLast orders keys for the feed after a restart: first those whose
// look may lead to a write (a volume a pod created while the controller was
// down wants attached, one nobody wants, an attach left uncertain, one
// withdrawn for a detach), then those already as they should be: wanted and
// attached. (One attached that node status does not list yet has its write
// queued by its node, not by its look.) The
// settled are almost every key of a big cluster, and a new pod's volume
// would otherwise wait behind all of them (its key comes from the pods,
// after every VolumeAttachment's). The order is only the feed's: every key
// still gets its look, and each look reads the state as it is then.
func (c *Controller) settledLast(keys []cache.Key) []cache.Key {
	settled := make([]cache.Key, 0, len(keys))
	n := 0
	for _, k := range keys {
		if c.settled(k) {
			settled = append(settled, k)
			continue
		}
		keys[n] = k
		n++
	}
	copy(keys[n:], settled)
	return keys
}

// settled tells whether the look at the volume at k has nothing to do: it
// is wanted and attached, not withdrawn, no detach wanted.
func (c *Controller) settled(k cache.Key) bool {
	a, ok := c.actual.Get(k)
	return ok && a.State == cache.Attached && !a.Withdrawn && a.DetachWanted.IsZero() && c.reconciler.Wanted(k)
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
