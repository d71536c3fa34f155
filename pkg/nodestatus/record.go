package nodestatus

import (
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Record is what node.status.volumesAttached lists as far as the controller
// knows, per node, and the write of it under way. The Writer writes it
// (Begin, the API's patch, End); the reconciler reads it before a detach
// (Pending, BeginDetach). What a node's status must list comes from the
// actual state's attachments (cache.ActualState.ReportWant).
//
// Its lock is taken before the actual state's, never after: Begin computes
// a report and marks the write in flight, and BeginDetach checks "not
// listed, no write under way" and starts the detach, each under it, so that
// a report that lists a volume and the start of its detach never
// interleave.
type Record struct {
	actual *cache.ActualState
	mu     sync.RWMutex
	nodes  map[string]*report
	// attachCalls counts the attach calls under way by node (Hold).
	attachCalls map[string]int
}

// report is one node's part of the record.
type report struct {
	// listed is what node.status lists, or may list: what the last write
	// that landed listed, what a failed write (which may have landed) and
	// what the status was seen to list added to it. Name to device path.
	listed map[volume.Name]string
	// writing is true while a write is in flight: no detach may start on
	// the node until it ends, since it may still list a volume.
	writing bool
	// dirty: the status must be written even if listed shows no change (a
	// write failed, or the status was seen to list something else).
	dirty bool
	// holdSince is when a write that only adds volumes first waited for the
	// attaches under way (Hold); zero when none waits.
	holdSince time.Time
	// writeUID is the UID of the Node object known when the write in
	// flight began: a write that finds the node gone says nothing of
	// another Node object read since, one created again (NodeGone).
	writeUID string
	// observed is what the status was seen to list while a write was in
	// flight (Observe), taken into account when the write ends unless it
	// is older than the write's answer; observedVersion is the
	// resourceVersion of the Node object it was seen in.
	observed        []v1.AttachedVolume
	observedVersion string
}

// NewRecord returns an empty record of the node statuses of actual's nodes.
func NewRecord(actual *cache.ActualState) *Record {
	return &Record{actual: actual, nodes: map[string]*report{}, attachCalls: map[string]int{}}
}

func (r *Record) nodeLocked(node string) *report {
	n := r.nodes[node]
	if n == nil {
		n = &report{listed: map[volume.Name]string{}}
		r.nodes[node] = n
	}
	return n
}

// gcLocked drops a node's entry that holds nothing.
func (r *Record) gcLocked(node string) {
	if n := r.nodes[node]; n != nil && len(n.listed) == 0 && !n.writing && !n.dirty && n.holdSince.IsZero() && n.observed == nil {
		delete(r.nodes, node)
	}
}

// sameNames reports whether want lists exactly the names of listed.
func sameNames(want []v1.AttachedVolume, listed map[volume.Name]string) bool {
	if len(want) != len(listed) {
		return false
	}
	for _, w := range want {
		if _, ok := listed[volume.Name(w.Name)]; !ok {
			return false
		}
	}
	return true
}

// Begin returns what node.status.volumesAttached must hold for node (sorted
// by name) and whether that differs from what it lists now. When it
// differs, a write is in flight until End.
func (r *Record) Begin(node string) (want []v1.AttachedVolume, changed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	want = r.actual.ReportWant(node)
	n := r.nodes[node]
	if n == nil && len(want) == 0 {
		return nil, false
	}
	n = r.nodeLocked(node)
	changed = n.dirty || !sameNames(want, n.listed)
	n.writing = changed
	if changed {
		n.holdSince = time.Time{}
		info, _ := r.actual.Node(node)
		n.writeUID = info.UID
	}
	r.gcLocked(node)
	return want, changed
}

// End records the outcome of a write of written. On success the status
// lists exactly written; on failure the write may or may not have landed,
// so what it carried counts as listed (for the detach rule) and the next
// Begin reports a change (to retry). It returns the keys of the node whose
// listing changed and every withdrawn key on the node (their detach may
// wait for this write).
func (r *Record) End(node string, written []v1.AttachedVolume, ok bool) []cache.Key {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[node] == nil {
		return nil
	}
	return r.endLocked(node, written, ok, "")
}

// EndOn is End of a write that landed on the Node object with the given UID
// (the API's answer). When the controller knows another object under the
// node's name by then (deleted and created again, the new one read before
// this answer), the write says nothing of what that one lists: it counts as
// failed, to be written again, and landed is false. Compared under the
// record's lock: an Observe of the new object in between would otherwise
// be overwritten by this answer.
//
// version is the resourceVersion of the answer: what was observed in an
// older object during the write says nothing after it.
func (r *Record) EndOn(node, uid, version string, written []v1.AttachedVolume) (keys []cache.Key, landed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodes[node] == nil {
		return nil, true
	}
	info, _ := r.actual.Node(node)
	landed = info.UID == uid
	return r.endLocked(node, written, landed, version), landed
}

func (r *Record) endLocked(node string, written []v1.AttachedVolume, ok bool, version string) []cache.Key {
	n := r.nodes[node]
	n.writing = false
	n.dirty = !ok
	before := n.listed
	n.listed = make(map[volume.Name]string, len(written))
	if !ok {
		for v, path := range before {
			n.listed[v] = path
		}
	}
	for _, w := range written {
		n.listed[volume.Name(w.Name)] = w.DevicePath
	}
	keys := r.actual.WithdrawnOn(node)
	for _, k := range r.actual.KeysOn(node) {
		_, was := before[k.Volume]
		_, is := n.listed[k.Volume]
		if was != is && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	if seen := n.observed; seen != nil {
		if !older(n.observedVersion, version) {
			r.observeLocked(node, n, seen)
		}
		n.observed, n.observedVersion = nil, ""
	}
	r.gcLocked(node)
	return keys
}

// Pending reports whether node.status may still list the volume at k: it
// is listed, or a write of the node's status (which may carry it) is under
// way. Both are read at once: a write that ends between two separate reads
// would otherwise go unseen.
func (r *Record) Pending(k cache.Key) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.pendingLocked(k)
}

func (r *Record) pendingLocked(k cache.Key) bool {
	n := r.nodes[k.Node]
	return n != nil && (n.writing || n.lists(k.Volume))
}

// lists reports whether the node's status lists v, as far as the
// controller knows.
func (n *report) lists(v volume.Name) bool {
	_, ok := n.listed[v]
	return ok
}

// BeginDetach starts the detach of the volume at k
// (cache.ActualState.StartDetach), unless node.status may still list it
// (Pending) or the actual state refuses (not on record; during a handoff,
// attached with no detach begun): then it returns false and changes
// nothing. Once started, the volume is out of every later report.
func (r *Record) BeginDetach(k cache.Key, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.pendingLocked(k) && r.actual.StartDetach(k, now)
}

// InFlight reports whether a write of node's status is under way.
func (r *Record) InFlight(node string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := r.nodes[node]
	return n != nil && n.writing
}

// Listed returns what node.status.volumesAttached lists as far as the
// controller knows, sorted by name.
func (r *Record) Listed(node string) []v1.AttachedVolume {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return listedLocked(r.nodes[node])
}

// IsListed reports whether node.status lists the volume at k, as far as the
// controller knows.
func (r *Record) IsListed(k cache.Key) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := r.nodes[k.Node]
	return n != nil && n.lists(k.Volume)
}

// Lists reports whether seen, node.status.volumesAttached as a Node object
// holds it, is what the record says the status lists (Observe otherwise).
//
// While a write is in flight it says no: what the record lists then is
// what the status listed before the write, and an object that lists the
// same may be someone else's write after it landed (taking out what it
// added), which the write's end must compare with what it wrote (Observe).
func (r *Record) Lists(node string, seen []v1.AttachedVolume) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := r.nodes[node]
	return (n == nil || !n.writing) && sameList(seen, n)
}

// sameList compares seen, in any order, with what n lists.
func sameList(seen []v1.AttachedVolume, n *report) bool {
	listed := listedLocked(n)
	if len(seen) != len(listed) {
		return false
	}
	seen = slices.Clone(seen)
	sortList(seen)
	return slices.Equal(seen, listed)
}

func listedLocked(n *report) []v1.AttachedVolume {
	if n == nil {
		return nil
	}
	var out []v1.AttachedVolume
	for v, path := range n.listed {
		out = append(out, v1.AttachedVolume{Name: v1.UniqueVolumeName(v), DevicePath: path})
	}
	sortList(out)
	return out
}

func sortList(l []v1.AttachedVolume) {
	slices.SortFunc(l, func(x, y v1.AttachedVolume) int {
		if c := strings.Compare(string(x.Name), string(y.Name)); c != 0 {
			return c
		}
		return strings.Compare(x.DevicePath, y.DevicePath)
	})
}

// Observe records what node.status.volumesAttached says when it differs
// from what the controller believes it lists (someone else wrote it, or
// the object is older than the controller's last write): the next write
// must make it right. A volume the object lists counts as listed (its
// detach waits for that write); one it does not list stays listed, since
// the object may predate a write that listed it, and only a confirmed write
// of the controller's own takes it out.
//
// Seen while a write of the node's status is in flight, in the Node
// object of resourceVersion version, it is taken into account when that
// write ends, unless the write's answer is newer: someone may have written
// after it landed.
func (r *Record) Observe(node string, seen []v1.AttachedVolume, version string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodeLocked(node)
	if n.writing {
		n.observed = slices.Clone(seen)
		if n.observed == nil {
			n.observed = []v1.AttachedVolume{}
		}
		n.observedVersion = version
		return
	}
	r.observeLocked(node, n, seen)
	r.gcLocked(node)
}

func (r *Record) observeLocked(node string, n *report, seen []v1.AttachedVolume) {
	if sameList(seen, n) {
		return
	}
	n.dirty = true
	for _, s := range seen {
		if _, ok := n.listed[volume.Name(s.Name)]; !ok {
			n.listed[volume.Name(s.Name)] = s.DevicePath
		}
	}
}

// Recover records what node.status.volumesAttached lists when the
// controller starts: its own (or its predecessor's) last write.
func (r *Record) Recover(node string, listed []v1.AttachedVolume) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(listed) == 0 {
		return
	}
	n := r.nodeLocked(node)
	if len(n.listed) == 0 {
		n.listed = make(map[volume.Name]string, len(listed))
	}
	for _, l := range listed {
		n.listed[volume.Name(l.Name)] = l.DevicePath
	}
}

// Mirror makes the record say exactly what node.status lists, as another
// controller wrote it (shadow mode: this controller writes nothing).
func (r *Record) Mirror(node string, listed []v1.AttachedVolume) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodeLocked(node)
	n.listed = make(map[volume.Name]string, len(listed))
	for _, l := range listed {
		n.listed[volume.Name(l.Name)] = l.DevicePath
	}
	r.gcLocked(node)
}

// NodeGone records that the API answered the node's status write, at at,
// that the Node object does not exist (cache.ActualState.NodeGone, of the
// object the write began on). It returns the keys of its attachments.
func (r *Record) NodeGone(node string, at time.Time) []cache.Key {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[node]
	if n == nil {
		return nil
	}
	return r.actual.NodeGone(node, n.writeUID, at)
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
func (r *Record) StartAttach(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attachCalls[node]++
}

// EndAttach records the end of an attach call started by StartAttach. It
// reports whether a write of the node's status is waiting (Hold), for the
// caller to queue it: the attach it waited for may have ended without
// anything to report.
func (r *Record) EndAttach(node string) (held bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attachCalls[node]--; r.attachCalls[node] <= 0 {
		delete(r.attachCalls, node)
	}
	n := r.nodes[node]
	return n != nil && !n.holdSince.IsZero()
}

// Hold returns how long the write of node's status may still wait for the
// attaches under way on the node (zero: write now). Only a write that adds
// volumes and nothing else waits, and only while an attach on the node is
// under way: its call has not returned, or its VolumeAttachment exists with
// no error and is not attached yet. It waits at most limit from the first
// time it waited. The caller looks again when the time returned is up: the
// end of every attach it waits for also queues the write (EndAttach, the
// VolumeAttachment's update), but only the time is sure to come.
func (r *Record) Hold(node string, now time.Time, limit time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.nodes[node]
	if limit <= 0 || r.actual.HandingOver() || (n != nil && n.dirty) || !r.addsOnlyLocked(node, n) {
		if n != nil {
			n.holdSince = time.Time{}
			r.gcLocked(node)
		}
		return 0
	}
	n = r.nodeLocked(node)
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

// addsOnlyLocked reports whether the node's status changes by added volumes
// alone while an attach is under way on the node.
func (r *Record) addsOnlyLocked(node string, n *report) bool {
	want := r.actual.ReportWant(node)
	var listed map[volume.Name]string
	if n != nil {
		listed = n.listed
	}
	in := make(map[volume.Name]bool, len(want))
	adds := false
	for _, w := range want {
		in[volume.Name(w.Name)] = true
		if _, ok := listed[volume.Name(w.Name)]; !ok {
			adds = true
		}
	}
	for v := range listed {
		if !in[v] {
			return false
		}
	}
	return adds && (r.attachCalls[node] > 0 || r.actual.AttachPending(node))
}

// Adds reports whether node's status must list an attached volume it does
// not list yet: a pod waits for that write, which goes before the node's
// withdrawals (the status queue's urgent items).
func (r *Record) Adds(node string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := r.nodes[node]
	return r.actual.ReportsAny(node, func(v volume.Name) bool { return n == nil || !n.lists(v) })
}

// older reports whether resource version a is older than b (both of one
// Node); unknown or malformed versions are never older.
func older(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c < 0
}
