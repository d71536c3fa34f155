package reconciler

import (
	"fmt"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// singleNodeAccessConflict enforces "a ReadWriteOnce / ReadWriteOncePod
// volume (or an inline azureDisk / cinder volume) is attached to one node at
// most". It returns where the volume is held on other nodes, under any of its
// names and in any state: an uncertain or detaching attachment may still be
// attached.
func singleNodeAccessConflict(spec *volume.Spec, node string, actual *cache.ActualState) []cache.Key {
	if !spec.SingleNode {
		return nil
	}
	return actual.AttachedElsewhere(append(spec.AllNames(), spec.DiskName()), node)
}

// Verdict is safeToDetach's answer: the force reason when a mounted volume
// may be detached, or a reason to wait (Wait), with the time after which to
// look again (After; zero: wait for a change of the node) and, when a
// forced detach by timeout is held, the zone that holds it.
type Verdict struct {
	Force  string
	After  time.Duration
	Wait   string
	HeldIn *cache.ZoneHealth
}

// safeToDetach enforces "never detach a volume mounted on a healthy node",
// with its two exceptions: the node.kubernetes.io/out-of-service taint (at
// once), and an unhealthy node (not Ready, or deleted) once the max wait for
// unmount has passed since the detach was first wanted, unless forced
// detaches on timeout are disabled. A node whose Node object is gone waits
// MaxWaitForUnmountDeletedNode instead, when set.
//
// A node not read yet (an attachment named it before its sync) is waited
// for: its sync says whether it exists, and re-queues its keys. A node
// deleted unread (before the controller started) may have anything
// mounted: it is treated as unhealthy with the volume mounted.
//
// It returns the force reason when a mounted volume may be detached, or a
// non-empty reason to wait, with the time after which to look again (zero:
// wait for a change of the node).
//
// A forced detach by timeout is held while the node's zone is disrupted
// (ZoneDisrupted; zone is asked only then): the wait then ends with the
// zone's next expiring deletion, or with a change of its nodes. Once the
// zone recovers, its nodes get the max wait again from then. So does a
// node that is managed again (managedAgain).
func safeToDetach(k cache.Key, node cache.NodeInfo, wanted, now time.Time, cfg Config, zone func() cache.ZoneHealth) Verdict {
	if node.ManagedAgain.After(wanted) {
		wanted = node.ManagedAgain
	}
	if !node.Mounted(k.Volume) {
		if left := unreportedMounts(node, now); left > 0 {
			return Verdict{After: left, Wait: fmt.Sprintf("node %s is managed again since %s: what its kubelet mounted while it attached volumes by itself is in volumesInUse only from its next status update; detach in %s unless it reports the volume in use",
				k.Node, now.Sub(node.ManagedAgain).Round(time.Second), left.Round(time.Second))}
		}
		return Verdict{}
	}
	if node.OutOfService {
		return Verdict{Force: ForceOutOfService}
	}
	if node.Healthy() {
		return Verdict{Wait: fmt.Sprintf("still mounted on node %s (in node.status.volumesInUse); waiting for kubelet to unmount it", k.Node)}
	}
	if node.Unread() {
		return Verdict{Wait: fmt.Sprintf("node %s is not read yet: waiting to learn whether it exists and what it has mounted", k.Node)}
	}
	if cfg.DisableForceDetachOnTimeout {
		return Verdict{Wait: fmt.Sprintf("still mounted on unhealthy node %s and forced detach on timeout is disabled", k.Node)}
	}
	maxWait := cfg.MaxWaitForUnmount
	if node.Deleted {
		maxWait = cfg.DeletedNodeWait()
	}
	if elapsed := now.Sub(wanted); elapsed < maxWait {
		left := maxWait - elapsed
		return Verdict{After: left, Wait: fmt.Sprintf("still mounted on unhealthy node %s; forced detach in %s unless it is unmounted", k.Node, left.Round(time.Second))}
	}
	z := zone()
	if z.Disrupted {
		var left time.Duration
		if !z.Expires.IsZero() {
			left = z.Expires.Sub(now)
		}
		return Verdict{After: left, Wait: fmt.Sprintf("still mounted on unhealthy node %s; forced detach held: %s", k.Node, DescribeZone(z, cfg)), HeldIn: &z}
	}
	if since := now.Sub(z.Recovered); !z.Recovered.IsZero() && since < maxWait {
		// A partition heals node by node: the nodes not back yet get the
		// max wait again from the zone's recovery, as the node lifecycle
		// controller gives a zone's nodes a fresh grace period then.
		left := maxWait - since
		return Verdict{After: left, Wait: fmt.Sprintf("still mounted on unhealthy node %s; its zone recovered from a disruption %s ago: forced detach in %s unless it is unmounted",
			k.Node, since.Round(time.Second), left.Round(time.Second))}
	}
	return Verdict{Force: ForceTimeout}
}

// KubeletReportGrace is how long, after a node is managed again
// (cache.NodeInfo.ManagedAgain), its volumesInUse is not taken to list
// every volume its kubelet has mounted: kubelet writes it at its node
// status updates (nodeStatusUpdateFrequency, 10 s by default), and the
// update that lists a mount may reach the controller some seconds after it
// was written. Twice the status cycle and a margin for the watch.
const KubeletReportGrace = 30 * time.Second

// unreportedMounts enforces "a node managed again may have mounted what it
// has not reported": while its kubelet attached volumes by itself (the
// node without the controller-managed annotation), it mounted each as soon
// as it was attached, with no wait for volumesInUse to list it, and it
// reports the mount only at its next node status update. A node view
// written before that update (the annotation put back, by an admin or by
// the kubelet restarted with controller attach/detach, is written first)
// shows the volume not in use: taken at its word, with the pod that mounts
// it not read yet, the volume would be detached from under the pod. So,
// for KubeletReportGrace after the node is managed again, a volume it
// does not list in use counts as possibly mounted; the wait ends with the
// grace, or as soon as the node lists it (then the mount rules apply). It
// returns how long is left (0: nothing to wait for). Not on a node with
// the out-of-service taint, whose volumes go at once anyway.
//
// kube-controller-manager takes every attachment it learns of as mounted
// until a node update says otherwise (actual_state_of_world.go:
// mountedByNode) and reads the node again before each detach; it never
// learns of the VolumeAttachments a kubelet created by itself, which it
// leaves attached for good.
func unreportedMounts(node cache.NodeInfo, now time.Time) time.Duration {
	if node.ManagedAgain.IsZero() || node.OutOfService {
		return 0
	}
	return max(0, node.ManagedAgain.Add(KubeletReportGrace).Sub(now))
}

// ZoneDisrupted enforces "a partition is not a mass death": when many
// managed nodes of one zone are not Ready (or were deleted within the max
// wait for unmount) at once, they are more likely cut off than dead, and
// their pods may still write. A zone is disrupted while at least
// UnhealthyZoneMinNodes of its nodes, and at least UnhealthyZoneThreshold of
// them, are unhealthy; the guard is off when the threshold is 0. Nodes
// without a zone label form one zone.
func ZoneDisrupted(z cache.ZoneHealth, cfg Config) bool {
	return cfg.UnhealthyZoneThreshold > 0 && z.Nodes > 0 && z.Unhealthy >= cfg.UnhealthyZoneMinNodes &&
		float64(z.Unhealthy) >= cfg.UnhealthyZoneThreshold*float64(z.Nodes)
}

// ZoneRule is ZoneDisrupted as the actual state applies it, with how long
// a deleted node counts (cache.ActualState.Zone).
func (c Config) ZoneRule() cache.ZoneRule {
	return cache.ZoneRule{Window: c.DeletedNodeWait(), Disrupted: func(z cache.ZoneHealth) bool { return ZoneDisrupted(z, c) }}
}

// DescribeZone says how disrupted a zone is, in the words of events, logs
// and /explain.
func DescribeZone(z cache.ZoneHealth, cfg Config) string {
	name := fmt.Sprintf("zone %q", z.Zone)
	switch z.Zone {
	case "":
		name = "the nodes without a zone"
	case cache.UnknownZone:
		name = "the nodes deleted before this controller read their zone"
	}
	state := "disrupted"
	if !ZoneDisrupted(z, cfg) {
		state = "not disrupted"
	}
	return fmt.Sprintf("%s is %s: %d of %d nodes not ready, threshold %d%%", name, state, z.Unhealthy, z.Nodes,
		int(cfg.UnhealthyZoneThreshold*100+0.5))
}

// DeletedNodeWait is the max wait for unmount on a deleted node, also how
// long a deleted node counts as unhealthy in its zone.
func (c Config) DeletedNodeWait() time.Duration {
	if c.MaxWaitForUnmountDeletedNode != nil {
		return *c.MaxWaitForUnmountDeletedNode
	}
	return c.MaxWaitForUnmount
}

// The handoff rule: a controller that stops gracefully
// (nodestatus.Record.HandOver) leaves every volume either attached and
// listed in its node's status, or gone, for whichever controller runs next
// (pkg/nodestatus/handoff.go says why).
// It starts nothing new; it finishes what is under way.

// handoffContinues says whether d, during a handoff, finishes what is under
// way rather than starting something: an attach started before (its
// VolumeAttachment created, or an in-tree attach of unknown outcome), a
// detach that began (retried after a failure, or settled for a pod that
// wants the volume again), or the detach of an attach
// never confirmed, which no node status lists, so that its detach needs no
// withdrawal and leaves the successor nothing ambiguous. So does the wait
// before such a detach (the max wait for unmount on a node that is gone),
// and the wait before the next try of a detach that began (its node went
// unhealthy with the volume mounted since): it keeps its timer, since the
// handoff waits for that detach, and the decision its end brings is gated
// again.
func handoffContinues(d Decision) bool {
	switch d.Action {
	case Nothing:
		return true
	case Wait:
		return d.HasAttachment && (d.Attachment.State == cache.Uncertain || !d.Attachment.DetachStarted.IsZero())
	case Attach:
		return d.HasAttachment && d.Attachment.State == cache.Uncertain
	case Withdraw:
		// Of an attach never confirmed: no report lists it.
		return d.HasAttachment && d.Attachment.State != cache.Attached
	case Detach:
		return d.HasAttachment && (d.Attachment.State != cache.Attached || !d.Attachment.DetachStarted.IsZero())
	case Settle:
		// Of a detach that began: its outcome is settled, never left
		// ambiguous.
		return true
	case Confirm:
		// It only reads, and forgets an attachment that is not there.
		return true
	}
	return false
}

// handoffFinishesAttach says whether, during a handoff with pods left to
// read (no volume may be taken as unwanted, so none may be detached), the
// attach of a is finished rather than left in between: an attach this
// controller started, whose object it never saw (its call failed, or its
// answer is not seen yet), of a volume no other node holds.
func handoffFinishesAttach(a cache.Attachment, actual *cache.ActualState) bool {
	return a.State == cache.Uncertain && a.Spec != nil && !a.AttachStarted.IsZero() && a.AttachmentUID == "" &&
		len(singleNodeAccessConflict(a.Spec, a.Node, actual)) == 0
}
