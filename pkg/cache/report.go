package cache

import (
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// What node.status.volumesAttached lists, and the write of it under way, is
// pkg/nodestatus's record. It asks the actual state, under the actual
// state's lock, what the attachments say a node's status must list, and
// starts a detach only through StartDetach, with its own lock held (taken
// before this one): a report that lists a volume and the start of its
// detach never interleave.

// reportLocked says whether the node report lists at: an attached volume not
// withdrawn for a detach or, during a handoff, one whose detach has not
// started.
func reportLocked(at *Attachment, handingOver bool) bool {
	if at.State != Attached {
		return false
	}
	return !at.Withdrawn || (handingOver && at.DetachStarted.IsZero())
}

// ReportWant returns what node.status.volumesAttached must list for node:
// its attached volumes not withdrawn for a detach (during a handoff, also
// those whose detach has not started), sorted by name.
func (a *ActualState) ReportWant(node string) []v1.AttachedVolume {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.reportWantLocked(a.nodes[node])
}

func (a *ActualState) reportWantLocked(n *nodeEntry) []v1.AttachedVolume {
	if n == nil {
		return nil
	}
	var want []v1.AttachedVolume
	for _, at := range n.attachments {
		if reportLocked(at, a.handingOver) {
			want = append(want, v1.AttachedVolume{Name: v1.UniqueVolumeName(at.Volume), DevicePath: at.DevicePath})
		}
	}
	slices.SortFunc(want, func(x, y v1.AttachedVolume) int { return strings.Compare(string(x.Name), string(y.Name)) })
	return want
}

// ReportsAny reports whether node's status must list a volume for which
// pick is true, without building the list (ReportWant): the status queue
// asks it at every add.
func (a *ActualState) ReportsAny(node string, pick func(volume.Name) bool) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if n := a.nodes[node]; n != nil {
		for _, at := range n.attachments {
			if reportLocked(at, a.handingOver) && pick(at.Volume) {
				return true
			}
		}
	}
	return false
}

// AttachPending reports whether a VolumeAttachment on node waits to be
// attached: an uncertain attachment with no error and no detach started.
func (a *ActualState) AttachPending(node string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if n := a.nodes[node]; n != nil {
		for _, at := range n.attachments {
			if at.State == Uncertain && at.AttachError == "" && at.DetachStarted.IsZero() {
				return true
			}
		}
	}
	return false
}

// StartDetach marks the detach of the volume at k as started: withdrawn
// from every later report, since now. It refuses (false, nothing changed)
// when k is not on record or, during a handoff, when the volume is attached
// and its detach has not begun. Only the node status record calls it,
// having checked that no status may list the volume (nodestatus.BeginDetach).
func (a *ActualState) StartDetach(k Key, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	at := a.volumes[k.Volume][k.Node]
	if at == nil || (a.handingOver && at.State == Attached && at.DetachStarted.IsZero()) {
		return false
	}
	at.Withdrawn = true
	if at.DetachStarted.IsZero() {
		at.DetachStarted = now
	}
	return true
}

// WithdrawnOn returns the keys of node's attachments withdrawn from its
// report: their detach may wait for a write.
func (a *ActualState) WithdrawnOn(node string) []Key {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var keys []Key
	if n := a.nodes[node]; n != nil {
		for v, at := range n.attachments {
			if at.Withdrawn {
				keys = append(keys, Key{Volume: v, Node: node})
			}
		}
	}
	return keys
}

// NodeGone records that the API answered a status write of the node, begun
// on the Node object with UID uid, at at, that the object does not exist,
// before its deletion was read from the informer: what it had mounted last
// is unknown until then (SetNode with its last state, then DeleteNode), so
// anything attached there may be mounted. A managed node counts in its zone
// as deleted at at, as DeleteNode would count it: its deletion, read later,
// finds it gone already. Another Node object read since the write began
// (one created again, whose sync came before this answer) is not the one
// gone: nothing changes. It returns the keys of its attachments.
func (a *ActualState) NodeGone(name, uid string, at time.Time) []Key {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.nodes[name]
	if !ok || !n.info.Exists || n.info.UID != uid {
		return nil
	}
	a.countZoneLocked(n.info, -1)
	if n.info.Managed {
		a.recordDeletedLocked(n.info.Zone, name, at)
	}
	// Its version is kept: a lister's copy no newer than it is the
	// object gone (SetNode).
	n.info = NodeInfo{Deleted: true, Managed: n.info.Managed, Zone: n.info.Zone, ResourceVersion: n.info.ResourceVersion, UID: n.info.UID}
	keys := make([]Key, 0, len(n.attachments))
	for v := range n.attachments {
		keys = append(keys, Key{Volume: v, Node: name})
	}
	return keys
}

// NodeReport is what EachNode tells of one node.
type NodeReport struct {
	Name string
	Info NodeInfo
	// Want is what its status must list (ReportWant).
	Want []v1.AttachedVolume
	// Attachments are copies of its attachments.
	Attachments []Attachment
}

// EachNode calls fn with every node on record, in no order, under the
// actual state's read lock: fn must not call back into it.
func (a *ActualState) EachNode(fn func(NodeReport)) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	for name, n := range a.nodes {
		r := NodeReport{Name: name, Info: n.info, Want: a.reportWantLocked(n), Attachments: make([]Attachment, 0, len(n.attachments))}
		for _, at := range n.attachments {
			r.Attachments = append(r.Attachments, *at)
		}
		fn(r)
	}
}
