package cache

import "time"

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
