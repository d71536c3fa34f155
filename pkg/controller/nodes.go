package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const outOfServiceTaint = "node.kubernetes.io/out-of-service"

// syncNode turns one Node into node facts: managed, Ready, out of service,
// and the volumes it has mounted.
func (c *Controller) syncNode(ctx context.Context, name string) error {
	// Whatever this sync records, the zones the node was and is in are
	// looked at again (zones.go).
	if was, ok := c.actual.Node(name); ok {
		defer c.checkZone(ctx, was.Zone, name)
	}
	defer func() {
		if is, ok := c.actual.Node(name); ok {
			c.checkZone(ctx, is.Zone, name)
		}
	}()
	node, err := c.nodes.Get(name)
	if err == nil && c.actual.Stale(name, node.ResourceVersion) {
		// Older than the answer of the controller's own status write: the
		// sync of the newer version follows.
		return nil
	}
	c.mu.Lock()
	last := c.goneNodes[name]
	delete(c.goneNodes, name)
	wasManaged, synced := c.nodeManaged[name]
	if err == nil {
		c.nodeManaged[name] = managed(node)
	} else if apierrors.IsNotFound(err) {
		delete(c.nodeManaged, name)
	}
	c.mu.Unlock()
	if apierrors.IsNotFound(err) {
		if c.desired.ClearUnread(name) {
			// Its pods read while it was missing wait no more.
			c.touch(c.actual.KeysOn(name)...)
		}
		if last != nil {
			// What the node had mounted when it went, not when last synced.
			c.actual.SetNode(name, NodeInfo(last))
		}
		if n, ok := c.actual.Node(name); ok && !n.Exists && !n.Seen {
			// Gone before this controller read it, or its status write
			// found it gone: nothing says what it had mounted.
			return nil
		}
		n, _ := c.actual.Node(name)
		// Without its last state (a relist found it gone), what it had
		// mounted is unknown.
		c.touch(c.actual.DeleteNode(name, last != nil, c.clock.Now())...)
		if wait := c.cfg.Reconciler.DeletedNodeWait(); n.Exists && n.Managed && wait > 0 {
			// It stops counting in its zone's health after the max wait:
			// its sync then looks at the zone again.
			c.nodeQueue.AddAfter(name, wait+time.Second)
		}
		if !c.rebuilding {
			c.enqueueNodePods(name)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get node %s: %w", name, err)
	}
	info := NodeInfo(node)
	// Compared with what this sync saw last, not with the node's facts: a
	// status write's answer sets those too, and may say managed first.
	readPods := (!synced || wasManaged != info.Managed || last != nil) && !c.rebuilding
	var pods []*v1.Pod
	if readPods {
		pods = c.podsOn(name)
	}
	if readPods && info.Managed {
		// Its pods were read while the node was not known, gone (a delete
		// and a create may reach this sync as one) or unmanaged, or not
		// read yet: they may want something here that the desired state
		// lacks. Until each is read again, nothing here is taken as
		// unwanted (set before the facts say managed).
		c.touch(c.markPods(name, pods)...)
	}
	touched := c.setNode(name, info)
	if readPods {
		for _, p := range pods {
			c.podQueue.Add(p.Namespace + "/" + p.Name)
		}
		// And a volume already wanted there may have been looked at before
		// this sync: its pod read again through the handler (which queues a
		// node's pods when it becomes managed) with the node's facts still
		// saying unmanaged. Reading the pod again changes nothing, and the
		// facts just set wake what pods want only when they turned managed
		// (setNode), not when the node is new to them: that look is the one
		// that wakes it.
		touched = append(touched, c.desiredOf(name, pods)...)
	}
	if !sameAttached(node.Status.VolumesAttached, c.actual.Reported(name)) {
		c.statusDiffers(ctx, name, node.Status.VolumesAttached)
	}
	c.touch(touched...)
	return nil
}

// markPods marks pods, on node, unread (DesiredState.MarkUnread), queues
// them (their read clears the mark: a mark is never left without one on
// its way, whoever set it) and returns the attachments of other nodes
// whose last unread pod was one of them (a pod of the same name). A pod
// already gone from the lister, or replaced by one of the same name on
// another node, is read as such at once: its last event may have been read
// before the mark.
func (c *Controller) markPods(node string, pods []*v1.Pod) []cache.Key {
	var touched []cache.Key
	for _, p := range pods {
		key := p.Namespace + "/" + p.Name
		touched = c.woken(c.desired.MarkUnread(key, node), touched)
		c.podQueue.Add(key)
		if now, err := c.pods.Pods(p.Namespace).Get(p.Name); apierrors.IsNotFound(err) || (err == nil && now.Spec.NodeName != node) {
			touched = c.woken(c.desired.Read(key), touched)
		}
	}
	return touched
}

// nodeWritten records the facts of the answer of a node status write and
// returns the keys whose decision may change. An answer that says managed
// before the node's sync has read so marks the node's pods unread first and
// queues them, as that sync would (syncNode): the sync, which compares with
// what it read last, may see no change.
func (c *Controller) nodeWritten(node *v1.Node) []cache.Key {
	info := NodeInfo(node)
	if old, ok := c.actual.Node(node.Name); info.Managed && (!ok || !old.Exists || !old.Managed) {
		c.touch(c.markPods(node.Name, c.podsOn(node.Name))...)
	}
	return c.setNode(node.Name, info)
}

// setNode records a node's facts and returns the keys whose decision may
// change: its attachments (ActualState.SetNode) and, when it turned
// managed, every key wanted there: a volume with no attachment there yet
// was decided "not managed", and however the change is learned (a sync,
// the answer of a status write), nothing else wakes it. The desired state
// says what is wanted, not the pods the informer lists now: the one that
// wants it may be created again under its name and not read yet.
func (c *Controller) setNode(name string, info cache.NodeInfo) []cache.Key {
	keys, turnedManaged := c.actual.SetNode(name, info)
	if turnedManaged {
		keys = append(keys, c.desired.KeysOn(name)...)
	}
	return keys
}

// desiredOf returns the keys pods, on node, want, as last read.
func (c *Controller) desiredOf(node string, pods []*v1.Pod) []cache.Key {
	var keys []cache.Key
	for _, p := range pods {
		for _, pv := range c.desired.PodVolumes(p.Namespace+"/"+p.Name, string(p.UID)) {
			keys = append(keys, cache.Key{Volume: pv.Spec.Name, Node: node})
		}
	}
	return keys
}

// podsOn returns the pods on node, from the pod informer's index.
func (c *Controller) podsOn(node string) []*v1.Pod {
	objs, err := c.podIndex.ByIndex(indexByNode, node)
	if err != nil {
		return nil
	}
	pods := make([]*v1.Pod, 0, len(objs))
	for _, obj := range objs {
		if p, ok := obj.(*v1.Pod); ok {
			pods = append(pods, p)
		}
	}
	return pods
}

// NodeInfo is what the controller reads of a Node.
func NodeInfo(node *v1.Node) cache.NodeInfo {
	info := cache.NodeInfo{Exists: true, ResourceVersion: node.ResourceVersion, UID: string(node.UID), InUse: map[volume.Name]bool{}}
	info.Managed = managed(node)
	info.Zone = node.Labels[v1.LabelTopologyZone]
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			info.Ready = c.Status == v1.ConditionTrue
		}
	}
	for _, t := range node.Spec.Taints {
		if t.Key == outOfServiceTaint {
			info.OutOfService = true
		}
	}
	for _, v := range node.Status.VolumesInUse {
		info.InUse[volume.Name(v)] = true
	}
	return info
}

func sameAttached(a, b []v1.AttachedVolume) bool {
	if len(a) != len(b) {
		return false
	}
	a = slices.Clone(a)
	slices.SortFunc(a, func(x, y v1.AttachedVolume) int {
		switch {
		case x.Name < y.Name:
			return -1
		case x.Name > y.Name:
			return 1
		}
		return 0
	})
	return slices.Equal(a, b)
}

// rewriteStatus is statusDiffers outside shadow mode: node.status lists
// other volumes than the controller wrote (someone else wrote it, or the
// object predates the controller's last write), so it is written again.
func (c *Controller) rewriteStatus(ctx context.Context, name string, listed []v1.AttachedVolume) {
	klog.FromContext(ctx).V(2).Info("Node status lists other attached volumes than written; rewriting it")
	c.actual.ObserveReport(name, listed)
	c.statusQueue.Add(name)
}
