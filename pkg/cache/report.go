package cache

import (
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// The node status record: what node.status.volumesAttached holds as far as
// the controller knows, and the write of it under way. pkg/nodestatus writes
// it (BeginReport, the API's patch, EndReport); the reconciler reads it
// before a detach (ReportPending, BeginDetach). Every attachment's Reported
// and Withdrawn flags are part of it: kept with the attachment, under the
// actual state's one lock, so that a detach checks "not listed, no write
// under way" and starts in one step, and a report that lists a volume and
// the start of its detach can never interleave.

// report is one node's part of the record.
type report struct {
	// writing is true while a node.status write is in flight: no detach may
	// start on the node until it ends, since it may still report a volume.
	writing bool
	// dirty: node.status was seen holding a volume the controller does not
	// report; the next write must correct it.
	dirty bool
	// unrecorded: volumes node.status may list with no attachment on
	// record (detached since it was written, or listed by someone else):
	// until a write confirms they are gone, an attachment recorded again
	// under such a name counts as reported.
	unrecorded map[volume.Name]bool
	// holdSince is when a write of the node's report that only adds
	// volumes first waited for the attaches under way (HoldReport); zero when
	// none waits.
	holdSince time.Time
	// writeUID is the UID of the Node object known when the write in
	// flight began: a write that finds the node gone says nothing of
	// another Node object read since, one created again (NodeGone).
	writeUID string
	// observed is what node.status was seen to list while a write was in
	// flight (ObserveReport), taken into account when the write ends: it
	// may be newer than the write.
	observed []v1.AttachedVolume
}

// reportLocked says whether the node report lists at: an attached volume not
// withdrawn for a detach or, during a handoff, one whose detach has not
// started.
func reportLocked(at *Attachment, handingOver bool) bool {
	if at.State != Attached {
		return false
	}
	return !at.Withdrawn || (handingOver && at.DetachStarted.IsZero())
}

// BeginReport returns what node.status.volumesAttached must hold for node
// (the attached volumes not withdrawn for a detach, sorted by name) and
// whether that differs from what is reported now. When it differs, a write is
// in flight until EndReport.
func (a *ActualState) BeginReport(node string) (want []v1.AttachedVolume, changed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.nodes[node]
	if n == nil {
		return nil, false
	}
	for _, at := range n.attachments {
		report := reportLocked(at, a.handingOver)
		if report {
			want = append(want, v1.AttachedVolume{Name: v1.UniqueVolumeName(at.Volume), DevicePath: at.DevicePath})
		}
		if report != at.Reported {
			changed = true
		}
	}
	slices.SortFunc(want, func(x, y v1.AttachedVolume) int { return strings.Compare(string(x.Name), string(y.Name)) })
	changed = changed || n.dirty || len(n.unrecorded) > 0
	n.writing = changed
	if changed {
		n.holdSince = time.Time{}
		n.writeUID = n.info.UID
	}
	return want, changed
}

// EndReport records the outcome of a node.status write of written. On
// success the report is exactly written; on failure the write may or may not
// have landed, so a volume in written counts as reported (for the detach
// rule) and the next BeginReport reports a change (to retry). It returns the keys
// whose Reported flag changed and every withdrawn key on the node (their
// detach may wait for this write).
func (a *ActualState) EndReport(node string, written []v1.AttachedVolume, ok bool) []Key {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.nodes[node]
	if n == nil {
		return nil
	}
	return a.endReportLocked(n, node, written, ok)
}

// EndReportOn is EndReport of a write that landed on the Node object with
// the given UID (the API's answer). When the controller knows another object
// under the node's name by then (deleted and created again, the new one
// read before this answer), the write says nothing of what that one lists:
// it counts as failed, to be written again, and landed is false. Compared
// under the lock that ends the write: a sync of the new object in between
// would find it listing what the controller believed, and let the answer
// confirm a list no object holds.
func (a *ActualState) EndReportOn(node, uid string, written []v1.AttachedVolume) (keys []Key, landed bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.nodes[node]
	if n == nil {
		return nil, true
	}
	landed = n.info.UID == uid
	return a.endReportLocked(n, node, written, landed), landed
}

func (a *ActualState) endReportLocked(n *nodeEntry, node string, written []v1.AttachedVolume, ok bool) []Key {
	n.writing = false
	// A failed write may not have landed: the next BeginReport must write
	// again even when the Reported flags (set as if it had) show no change.
	n.dirty = !ok
	if ok && len(n.unrecorded) > 0 {
		n.unrecorded = nil
		defer a.gcNodeLocked(node)
	}
	in := make(map[volume.Name]bool, len(written))
	for _, r := range written {
		v := volume.Name(r.Name)
		in[v] = true
		if n.attachments[v] == nil {
			// Its record went while the write was in flight (someone
			// deleted its VolumeAttachment): node.status lists it, or may,
			// until a later write takes it out.
			a.markUnrecordedLocked(n, v)
		}
	}
	var keys []Key
	for v, at := range n.attachments {
		reported := in[v] || (!ok && at.Reported)
		if at.Reported != reported || at.Withdrawn {
			at.Reported = reported
			keys = append(keys, at.Key)
		}
	}
	if seen := n.observed; seen != nil {
		n.observed = nil
		a.observeLocked(n, seen)
	}
	return keys
}

// ReportPending reports whether node.status may still list the volume at k:
// it was reported, or a write of the node's status (which may carry it) is
// under way. Both are read at once: a write that ends between two separate
// reads would otherwise go unseen.
func (a *ActualState) ReportPending(k Key) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := a.nodes[k.Node]
	if n == nil {
		return false
	}
	at := n.attachments[k.Volume]
	return n.writing || (at != nil && at.Reported)
}

// BeginDetach marks the detach of the volume at k as started, unless
// node.status may still list it (it was reported, or a write of the node's
// status is under way) or, during a handoff (handoff.go), it is attached
// and its detach has not begun: then it returns false and changes nothing.
// Once
// started, the volume is out of every later report. Checking and marking
// under one lock keeps a report from taking the volume in between.
func (a *ActualState) BeginDetach(k Key, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.nodes[k.Node]
	at := a.volumes[k.Volume][k.Node]
	if at == nil || (a.handingOver && at.State == Attached && at.DetachStarted.IsZero()) {
		return false
	}
	if at.Reported || (n != nil && n.writing) {
		return false
	}
	at.Withdrawn = true
	if at.DetachStarted.IsZero() {
		at.DetachStarted = now
	}
	return true
}

// ReportInFlight reports whether a node.status write for node is under way.
func (a *ActualState) ReportInFlight(node string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := a.nodes[node]
	return n != nil && n.writing
}

// Reported returns the volumes node.status.volumesAttached holds as far as
// the controller knows, sorted by name.
func (a *ActualState) Reported(node string) []v1.AttachedVolume {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := a.nodes[node]
	if n == nil {
		return nil
	}
	return a.reportedLocked(n)
}

func (a *ActualState) reportedLocked(n *nodeEntry) []v1.AttachedVolume {
	var out []v1.AttachedVolume
	for _, at := range n.attachments {
		if at.Reported {
			out = append(out, v1.AttachedVolume{Name: v1.UniqueVolumeName(at.Volume), DevicePath: at.DevicePath})
		}
	}
	slices.SortFunc(out, func(x, y v1.AttachedVolume) int { return strings.Compare(string(x.Name), string(y.Name)) })
	return out
}

// ObserveReport records what node.status.volumesAttached says when it
// differs from what the controller believes it wrote (someone else wrote
// it, or the object is older than the controller's last write): the next
// write must make it right. A volume the object lists counts as reported
// (its detach waits for that write); one it does not list keeps its flag,
// since the object may predate a write that listed it, and only a confirmed
// write of the controller's own clears it.
//
// Seen while a write of the node's status is in flight, it is taken into
// account when that write ends: someone may have written after it landed.
func (a *ActualState) ObserveReport(node string, seen []v1.AttachedVolume) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.nodes[node]
	if n == nil {
		return
	}
	if n.writing {
		n.observed = slices.Clone(seen)
		if n.observed == nil {
			n.observed = []v1.AttachedVolume{}
		}
		return
	}
	a.observeLocked(n, seen)
}

func (a *ActualState) observeLocked(n *nodeEntry, seen []v1.AttachedVolume) {
	seen = slices.Clone(seen)
	slices.SortFunc(seen, func(x, y v1.AttachedVolume) int { return strings.Compare(string(x.Name), string(y.Name)) })
	if slices.Equal(seen, a.reportedLocked(n)) {
		return
	}
	n.dirty = true
	for _, r := range seen {
		if at := n.attachments[volume.Name(r.Name)]; at != nil {
			at.Reported = true
		} else {
			a.markUnrecordedLocked(n, volume.Name(r.Name))
		}
	}
}

func (a *ActualState) markUnrecordedLocked(n *nodeEntry, v volume.Name) {
	if n.unrecorded == nil {
		n.unrecorded = map[volume.Name]bool{}
	}
	n.unrecorded[v] = true
	n.dirty = true
}

// NodeGone records that the API answered the node's status write, at at,
// that the Node object does not exist, before its deletion was read from
// the informer: what it had mounted last is unknown until then (SetNode
// with its last state, then DeleteNode), so anything attached there may be
// mounted. A managed node counts in its zone as deleted at at, as
// DeleteNode would count it: its deletion, read later, finds it gone
// already. Another Node object read since the write began (one created
// again, whose sync came before this answer) is not the one gone: nothing
// changes. It returns the keys of its attachments.
func (a *ActualState) NodeGone(name string, at time.Time) []Key {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.nodes[name]
	if !ok || !n.info.Exists || n.info.UID != n.writeUID {
		return nil
	}
	a.countZoneLocked(n.info, -1)
	if n.info.Managed {
		a.recordDeletedLocked(n.info.Zone, name, at)
	}
	n.info = NodeInfo{Managed: n.info.Managed, Zone: n.info.Zone}
	keys := make([]Key, 0, len(n.attachments))
	for v := range n.attachments {
		keys = append(keys, Key{Volume: v, Node: name})
	}
	return keys
}

// A node's volumes often attach together (its pods were scheduled together),
// and one node.status write can report them all. A write that only adds
// volumes may wait, for a short while, for the other attaches under way on
// the node: fewer writes leave more of the API budget to attaches and
// detaches. Nothing else ever waits: a withdrawal (a detach waits on it), a
// correction, the retry of a failed write, and every write during a handoff
// go at once.

// StartAttach records that an attach to node is under way: the mechanism's
// call has not returned, and nothing may be recorded for it yet. EndAttach
// must follow.
func (a *ActualState) StartAttach(node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.attachCalls[node]++
}

// EndAttach records the end of an attach call started by StartAttach. It
// reports whether a write of the node's report is waiting (HoldReport), for
// the caller to queue it: the attach it waited for may have ended without
// anything to report.
func (a *ActualState) EndAttach(node string) (held bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.attachCalls[node]--; a.attachCalls[node] <= 0 {
		delete(a.attachCalls, node)
	}
	n := a.nodes[node]
	return n != nil && !n.holdSince.IsZero()
}

// HoldReport returns how long the write of node's report may still wait for
// the attaches under way on the node (zero: write now). Only a report that
// adds volumes and nothing else waits, and only while an attach on the node
// is under way: its call has not returned, or its VolumeAttachment exists
// with no error and is not attached yet. It waits at most limit from the
// first time it waited. The caller looks again when the time returned is
// up: the end of every attach it waits for also queues the write (EndAttach,
// the VolumeAttachment's update), but only the time is sure to come.
func (a *ActualState) HoldReport(node string, now time.Time, limit time.Duration) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.nodes[node]
	if n == nil {
		return 0
	}
	if limit <= 0 || a.handingOver || n.dirty || len(n.unrecorded) > 0 || !n.addsOnlyLocked(a.attachCalls[node] > 0) {
		n.holdSince = time.Time{}
		return 0
	}
	if n.holdSince.IsZero() {
		n.holdSince = now
	}
	left := limit - now.Sub(n.holdSince)
	if left <= 0 {
		n.holdSince = time.Time{}
		return 0
	}
	return left
}

// addsOnlyLocked reports whether the node's report changes by added volumes
// alone while an attach is under way on the node (attaching: one whose call
// has not returned).
func (n *nodeEntry) addsOnlyLocked(attaching bool) bool {
	adds := false
	for _, at := range n.attachments {
		if report := reportLocked(at, false); report != at.Reported {
			if !report {
				return false
			}
			adds = true
		}
		if at.State == Uncertain && at.AttachError == "" && at.DetachStarted.IsZero() {
			attaching = true
		}
	}
	return adds && attaching
}

// ReportAdds reports whether node's report would list an attached volume
// that node.status does not list yet: a pod waits for that write, which
// goes before the node's withdrawals (the status queue's urgent items).
func (a *ActualState) ReportAdds(node string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := a.nodes[node]
	if n == nil {
		return false
	}
	for _, at := range n.attachments {
		if reportLocked(at, a.handingOver) && !at.Reported {
			return true
		}
	}
	return false
}
