package controller

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

const outOfServiceTaint = "node.kubernetes.io/out-of-service"

// syncNode turns one Node into node facts: managed, Ready, out of service,
// and the volumes it has mounted; or records that it is gone.
func (c *Controller) syncNode(ctx context.Context, name string) error {
	// Whatever this sync records, the zones are looked at again (zones.go).
	defer c.checkZones(ctx, name)
	if name == zonesKey {
		return nil
	}
	node, err := c.nodes.Get(name)
	if err == nil && c.actual.Stale(name, string(node.UID), node.ResourceVersion) {
		// Older than the answer of the controller's own status write, or
		// a copy of the Node known deleted: the sync of a newer version
		// (or of the deletion) follows.
		return nil
	}
	c.mu.Lock()
	last := c.goneNodes[name]
	delete(c.goneNodes, name)
	c.mu.Unlock()
	if apierrors.IsNotFound(err) {
		return c.nodeGone(ctx, name, last)
	}
	if err != nil {
		return fmt.Errorf("get node %s: %w", name, err)
	}
	c.touch(c.setNode(ctx, name, NodeInfo(node), false)...)
	if !c.status.Lists(name, node.Status.VolumesAttached) {
		c.statusDiffers(ctx, node)
	}
	return nil
}

// nodeGone records that a node the informer does not hold is gone, with
// its last state when its delete event carried it.
//
// A node never read (named by a VolumeAttachment) may not be in the
// informer yet: only the API says that it does not exist. If it does, its
// add event syncs it; it is looked at again a while later anyway, in case
// it is deleted before the informer shows it (a relist then says nothing).
func (c *Controller) nodeGone(ctx context.Context, name string, last *v1.Node) error {
	if last != nil {
		// What the node had mounted when it went, not when last synced.
		c.actual.SetFinal(name, NodeInfo(last))
	}
	n, ok := c.actual.Node(name)
	if !ok || n.Deleted {
		if last != nil {
			// A status write found it gone: its last state may say
			// that a volume is not mounted after all.
			c.touch(c.actual.KeysOn(name)...)
		}
		return nil
	}
	if n.Unread() {
		_, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			klog.FromContext(ctx).V(2).Info("Node named by a VolumeAttachment exists but is not in the informer yet")
			c.nodeQueue.AddAfter(name, unreadNodeRecheck)
			return nil
		case apierrors.IsForbidden(err):
			// A role without get on nodes (an older ClusterRole): the
			// synced informer's word is taken, as before it was asked.
			klog.FromContext(ctx).Error(err, "Can't ask the API whether a node a VolumeAttachment names is gone: taking it as deleted, as the informer says; grant get on nodes (manifests/base/clusterrole.yaml)")
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("get node %s: %w", name, err)
		}
	}
	// Without its last state (a relist found it gone, or it was never
	// read), what it had mounted is unknown.
	c.touch(c.actual.DeleteNode(name, last != nil, c.clock.Now())...)
	c.countNode(name)
	return nil
}

// unreadNodeRecheck is how long after the API said that a node named by a
// VolumeAttachment exists, while the informer did not show it, its sync
// looks again.
const unreadNodeRecheck = 10 * time.Second

// nodeWritten records the facts of the answer of a node status write and
// returns the keys whose decision may change.
func (c *Controller) nodeWritten(ctx context.Context, node *v1.Node) []cache.Key {
	return c.setNode(ctx, node.Name, NodeInfo(node), true)
}

// setNode records a node's facts and returns the keys whose decision may
// change: its attachments (ActualState.SetNode) and, when it turned managed
// (or appeared managed), every key its pods want there, decided "not
// managed" or "no such node" until then.
//
// A node turning managed may hold volumes its kubelet attached for pods
// this controller has not read yet (their events queued behind others):
// taken as unwanted, they would be detached. So its facts say managed only
// once the desired state has read every pod the informer lists on it; until
// then they keep saying unmanaged, and the read of such a pod, or a look a
// second later, queues the node again (readPod). Not while the controller
// reads every pod after a start (the desired state is partial): nothing is
// taken as unwanted then anyway, and a controller asked to stop meanwhile
// reads no more pods, but finishes the attaches under way on the node.
//
// written: the facts come from a status write's answer, which only updates
// a node on record as existing (cache.ActualState.SetNodeWritten).
func (c *Controller) setNode(ctx context.Context, name string, info cache.NodeInfo, written bool) []cache.Key {
	if old, ok := c.actual.Node(name); info.Managed && !c.rebuilding && !c.desired.Partial() && (!ok || !old.Exists || !old.Managed) {
		if unread := c.unreadPods(name); unread > 0 {
			klog.FromContext(ctx).V(2).Info("Node turned managed; waiting for its pods to be read", "unread", unread)
			info.Managed = false
			c.nodeQueue.AddAfter(name, time.Second)
		}
	}
	set := c.actual.SetNode
	if written {
		set = c.actual.SetNodeWritten
	}
	keys, turnedManaged := set(name, info, c.clock.Now())
	if turnedManaged {
		keys = append(keys, c.desired.KeysOn(name)...)
	}
	c.countNode(name)
	return keys
}

// countNode says to the desired state's metrics whether what pods want on
// the node counts: it exists and is managed. Every change of a node's facts
// ends with it (setNode, a deletion, a status write that found it gone).
func (c *Controller) countNode(name string) {
	n, ok := c.actual.Node(name)
	c.desired.SetCounted(name, ok && n.Exists && n.Managed)
}

// unreadPods counts the pods the informer lists on node, not terminated,
// that the desired state has not read there as they are now.
func (c *Controller) unreadPods(node string) int {
	n := 0
	for _, p := range c.podsOn(node) {
		if !podTerminated(p) && !c.desired.Read(p.Namespace+"/"+p.Name, string(p.UID), node) {
			n++
		}
	}
	return n
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
	info.Annotated = info.Managed
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

// rewriteStatus is statusDiffers outside shadow mode: node.status lists
// other volumes than the controller wrote (someone else wrote it, or the
// object predates the controller's last write), so it is written again.
func (c *Controller) rewriteStatus(ctx context.Context, node *v1.Node) {
	klog.FromContext(ctx).V(2).Info("Node status lists other attached volumes than written, or a write is under way; comparing once it ends")
	c.status.Observe(node.Name, node.Status.VolumesAttached, node.ResourceVersion)
	c.statusQueue.Add(node.Name)
}
