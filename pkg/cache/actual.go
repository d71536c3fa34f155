package cache

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// State is where an attachment stands.
type State string

const (
	// Uncertain: an attach was started (a VolumeAttachment exists but is not
	// attached yet, or an in-tree attach failed in an unknown way). It may be
	// attached: it counts for single-node access and is detached like an
	// attached volume, but is never reported in node.status.
	Uncertain State = "uncertain"
	// Attached: the attach is confirmed.
	Attached State = "attached"
	// Detaching: the detach was started and has not finished.
	Detaching State = "detaching"
)

// Attachment is one volume on one node, as far as the controller knows.
type Attachment struct {
	Key
	State State
	// Kind and PluginName say which mechanism attached it (and detaches it).
	Kind       volume.Kind
	PluginName string
	DevicePath string
	// Spec is the spec the volume was attached with; nil when the attachment
	// was recovered from node.status alone.
	Spec *volume.Spec
	// AttachmentName is the VolumeAttachment's name, for the CSI mechanism,
	// and AttachmentUID the UID of the object last seen under that name: an
	// informer event of the object whose delete the controller started says
	// nothing newer than that delete.
	AttachmentName string
	AttachmentUID  string
	// CreatedUID is the UID of the VolumeAttachment the controller created
	// under AttachmentName, until an informer event of it is read
	// (CreatedUnknown when the create's answer did not come): an object
	// the lister shows meanwhile under that name may be an older one, gone
	// before the create, so that its deletion proves nothing of what is
	// there now. "" when no create awaits its event.
	CreatedUID string
	// AttachError and DetachError are the last errors the mechanism reported.
	AttachError string
	DetachError string
	// AttachStarted and DetachStarted time the operations for metrics.
	AttachStarted time.Time
	DetachStarted time.Time
	// Reported: listed in node.status.volumesAttached, as last written by the
	// node status writer or read at start.
	Reported bool
	// Withdrawn: taken out of the node.status report because a detach is
	// about to start. The detach waits until Reported is false.
	Withdrawn bool
	// DetachWanted is when the controller first wanted to detach it (the
	// start of the max wait for unmount); zero while it is wanted.
	DetachWanted time.Time

	// rev changes with every change of the attachment (DeleteUnchanged).
	rev uint64
}

// CreatedUnknown is Attachment.CreatedUID after a create whose answer did
// not come (or said the object exists): no object has it.
const CreatedUnknown = "(unknown)"

// Announced reports whether the attach the controller started has been
// announced (event, metric); recovered attachments need no announcement.
func (a Attachment) Announced() bool { return a.AttachStarted.IsZero() }

// NodeInfo is what the controller knows of a node.
type NodeInfo struct {
	// Exists is false once the Node object is deleted (or was never seen);
	// the other fields then keep their last known values.
	Exists bool
	// Managed: the node has the controller-managed-attach-detach annotation.
	Managed bool
	// Ready: the node's Ready condition is True.
	Ready bool
	// OutOfService: the node carries the node.kubernetes.io/out-of-service taint.
	OutOfService bool
	// Zone is the node's topology.kubernetes.io/zone label ("" without one).
	Zone string
	// InUse is node.status.volumesInUse: the volumes the node has mounted.
	InUse map[volume.Name]bool
	// ResourceVersion and UID are the Node object's these facts come from.
	ResourceVersion string
	UID             string
	// Seen: what the node has mounted is known: a Node object was read
	// (SetNode) and, once it is deleted, its final state too (DeleteNode).
	// Of a node never seen (its object gone before this controller
	// started), or whose final state is unknown, nothing is known:
	// everything attached there may be mounted.
	Seen bool
}

// Mounted reports whether the volume may be mounted on the node.
func (n NodeInfo) Mounted(v volume.Name) bool { return !n.Seen || n.InUse[v] }

// Healthy reports whether the node exists and is Ready.
func (n NodeInfo) Healthy() bool { return n.Exists && n.Ready }

// ActualState records attachments and node facts.
type ActualState struct {
	mu sync.RWMutex
	// revs numbers the changes of attachments (Attachment.rev).
	revs    uint64
	volumes map[volume.Name]map[string]*Attachment
	nodes   map[string]*nodeEntry
	// byAttachmentName finds the key of a VolumeAttachment whose source can
	// no longer be read (its PV is gone).
	byAttachmentName map[string]Key
	// byOtherName finds attachments by the other names of their volume
	// (Spec.AllNames and DiskName, but the one they are recorded under):
	// one disk spelled two ways has two in-tree names and one CSI name,
	// and a single-node volume must be found under any of them.
	byOtherName map[volume.Name]map[Key]struct{}
	// Counts kept as attachments change, so that a metrics scrape reads a
	// few numbers instead of every attachment: by metric plugin name, by
	// state, and the attaches not confirmed yet (few, unless an attacher
	// stopped acting).
	byPlugin    map[string]int
	byState     map[State]int
	unconfirmed map[Key]*Attachment
	// attachCalls counts the attach calls under way by node (hold.go).
	attachCalls map[string]int
	// handingOver: the controller is stopping gracefully (handoff.go); no
	// detach starts any more.
	handingOver bool
	// zones counts the managed nodes of each zone (zones.go).
	zones map[string]*zoneEntry
}

type nodeEntry struct {
	info        NodeInfo
	attachments map[volume.Name]*Attachment
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
	// volumes first waited for the attaches under way (hold.go); zero when
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

// NewActualState returns an empty ActualState.
func NewActualState() *ActualState {
	return &ActualState{
		volumes:          map[volume.Name]map[string]*Attachment{},
		nodes:            map[string]*nodeEntry{},
		byAttachmentName: map[string]Key{},
		byOtherName:      map[volume.Name]map[Key]struct{}{},
		byPlugin:         map[string]int{},
		byState:          map[State]int{},
		unconfirmed:      map[Key]*Attachment{},
		attachCalls:      map[string]int{},
		zones:            map[string]*zoneEntry{},
	}
}

// Get returns a copy of the attachment at k.
func (a *ActualState) Get(k Key) (Attachment, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	at, ok := a.volumes[k.Volume][k.Node]
	if !ok {
		return Attachment{}, false
	}
	return *at, true
}

// Update applies fn to the attachment at k, creating it (as Uncertain) when
// create is true and it does not exist. It reports whether anything changed.
func (a *ActualState) Update(k Key, create bool, fn func(*Attachment)) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.volumes[k.Volume][k.Node]
	if !ok {
		if !create {
			return false
		}
		at = &Attachment{Key: k, State: Uncertain}
		byNode := a.volumes[k.Volume]
		if byNode == nil {
			byNode = map[string]*Attachment{}
			a.volumes[k.Volume] = byNode
		}
		byNode[k.Node] = at
		n := a.nodeLocked(k.Node)
		n.attachments[k.Volume] = at
		if n.unrecorded[k.Volume] {
			at.Reported = true
			delete(n.unrecorded, k.Volume)
		}
	}
	before := *at
	fn(at)
	at.Key = k
	if !ok || before != *at {
		a.revs++
		at.rev = a.revs
	}
	if !ok {
		a.byPlugin[volume.MetricPluginName(k.Volume)]++
	} else {
		a.uncountLocked(&before)
	}
	a.countLocked(at)
	if before.AttachmentName != at.AttachmentName && before.AttachmentName != "" {
		delete(a.byAttachmentName, before.AttachmentName)
	}
	if at.AttachmentName != "" {
		a.byAttachmentName[at.AttachmentName] = k
	}
	if before.Spec != at.Spec {
		a.indexOtherNamesLocked(k, before.Spec, false)
		a.indexOtherNamesLocked(k, at.Spec, true)
	}
	return !ok || before != *at
}

// indexOtherNamesLocked adds (or removes) k under the other names of spec.
func (a *ActualState) indexOtherNamesLocked(k Key, spec *volume.Spec, add bool) {
	if spec == nil {
		return
	}
	for _, name := range spec.OtherNames(k.Volume) {
		keys := a.byOtherName[name]
		if add {
			if keys == nil {
				keys = map[Key]struct{}{}
				a.byOtherName[name] = keys
			}
			keys[k] = struct{}{}
			continue
		}
		delete(keys, k)
		if len(keys) == 0 {
			delete(a.byOtherName, name)
		}
	}
}

// Delete forgets the attachment at k: the volume is detached.
func (a *ActualState) Delete(k Key) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.volumes[k.Volume][k.Node]
	if !ok {
		return false
	}
	a.deleteLocked(k, at)
	return true
}

// DeleteUnchanged forgets the attachment at k, as Delete, unless it changed
// since seen was read (Get): a decision to drop it taken on seen and on an
// answer of the API, while the controller's own create under its name was
// recorded meanwhile, would drop what that create made. It reports whether
// it was dropped.
func (a *ActualState) DeleteUnchanged(k Key, seen Attachment) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	at, ok := a.volumes[k.Volume][k.Node]
	if !ok || at.rev != seen.rev {
		return false
	}
	a.deleteLocked(k, at)
	return true
}

func (a *ActualState) deleteLocked(k Key, at *Attachment) {
	delete(a.volumes[k.Volume], k.Node)
	if len(a.volumes[k.Volume]) == 0 {
		delete(a.volumes, k.Volume)
	}
	a.uncountLocked(at)
	plugin := volume.MetricPluginName(k.Volume)
	if a.byPlugin[plugin]--; a.byPlugin[plugin] <= 0 {
		delete(a.byPlugin, plugin)
	}
	if at.AttachmentName != "" && a.byAttachmentName[at.AttachmentName] == k {
		delete(a.byAttachmentName, at.AttachmentName)
	}
	a.indexOtherNamesLocked(k, at.Spec, false)
	if n := a.nodes[k.Node]; n != nil {
		delete(n.attachments, k.Volume)
		if at.Reported {
			// Detached while node.status lists it: the next write must
			// take it out, and until then it may be listed.
			a.markUnrecordedLocked(n, k.Volume)
		}
		a.gcNodeLocked(k.Node)
	}
}

func (a *ActualState) markUnrecordedLocked(n *nodeEntry, v volume.Name) {
	if n.unrecorded == nil {
		n.unrecorded = map[volume.Name]bool{}
	}
	n.unrecorded[v] = true
	n.dirty = true
}

// ByAttachmentName returns the key a VolumeAttachment was recorded under.
func (a *ActualState) ByAttachmentName(name string) (Key, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	k, ok := a.byAttachmentName[name]
	return k, ok
}

// nodeLocked returns the node's entry, creating an unknown one.
func (a *ActualState) nodeLocked(name string) *nodeEntry {
	n := a.nodes[name]
	if n == nil {
		n = &nodeEntry{attachments: map[volume.Name]*Attachment{}}
		a.nodes[name] = n
	}
	return n
}

// gcNodeLocked drops a node that is gone and has nothing attached.
func (a *ActualState) gcNodeLocked(name string) {
	if n := a.nodes[name]; n != nil && !n.info.Exists && len(n.attachments) == 0 && len(n.unrecorded) == 0 {
		delete(a.nodes, name)
	}
}

// SetNode records what the Node object says, unless the controller already
// knows a newer version of it. It returns the keys of the node's attachments
// whose decision may change: all of them when readiness, management or the
// out-of-service taint changed, else those whose in-use flag changed. And
// it reports whether the node turned managed (unmanaged, or not known to
// exist, before): then what its pods want there with no attachment yet,
// decided "not managed" or "no such node" until then, must be decided again
// too, which this record of attachments cannot list.
func (a *ActualState) SetNode(name string, info NodeInfo) (keys []Key, turnedManaged bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	info.Exists, info.Seen = true, true
	n := a.nodeLocked(name)
	old := n.info
	if older(info.ResourceVersion, old.ResourceVersion) {
		// An informer event older than what the controller already knows
		// (the answer of its own status write): what kubelet had mounted
		// then must not replace what it has mounted now. Nor does an
		// answer that landed before the node's deletion, read since,
		// bring the node back.
		return nil, false
	}
	n.info = info
	a.countZoneLocked(old, -1)
	a.countZoneLocked(info, 1)
	a.forgetDeletedLocked(name)
	all := old.Exists != info.Exists || old.Managed != info.Managed || old.Ready != info.Ready ||
		old.OutOfService != info.OutOfService
	for v := range n.attachments {
		if all || old.InUse[v] != info.InUse[v] {
			keys = append(keys, Key{Volume: v, Node: name})
		}
	}
	return keys, !(old.Exists && old.Managed) && info.Managed
}

// Stale reports whether resourceVersion is older than the version of the
// node's object the controller already knows.
func (a *ActualState) Stale(node, resourceVersion string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := a.nodes[node]
	return n != nil && n.info.Exists && older(resourceVersion, n.info.ResourceVersion)
}

// older reports whether resource version a is older than b (both of one
// Node); unknown or malformed versions are never older.
func older(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c < 0
}

// DeleteNode records that the Node object is gone. With final (the delete
// event carried the object's last state, set by SetNode before), its last
// in-use list is kept: a volume mounted on a vanished node is still treated
// as mounted until the max wait for unmount has passed, out-of-service
// taint or not. Without it (a relist found the node gone: its tombstone
// holds the informer's last copy, which may predate mounts the watch
// missed), nothing is known of what it had mounted: everything attached
// there may be.
//
// A managed node deleted at at counts, in its zone, as a node not Ready for
// a while (ZoneHealth).
func (a *ActualState) DeleteNode(name string, final bool, at time.Time) []Key {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.nodes[name]
	if !ok || !n.info.Exists {
		return nil
	}
	a.countZoneLocked(n.info, -1)
	if n.info.Managed {
		a.recordDeletedLocked(n.info.Zone, name, at)
	}
	if !final {
		n.info.Seen, n.info.InUse = false, nil
	}
	n.info.Exists = false
	n.info.Ready = false
	// A deleted node carries no taint: its mounted volumes wait the max
	// wait for unmount, as upstream (which reads the taint from the Node).
	n.info.OutOfService = false
	keys := make([]Key, 0, len(n.attachments))
	for v := range n.attachments {
		keys = append(keys, Key{Volume: v, Node: name})
	}
	a.gcNodeLocked(name)
	return keys
}

// NodeGone records that the API answered the node's status write that the
// Node object does not exist, before its deletion was read from the
// informer: what it had mounted last is unknown until then (SetNode with
// its last state, then DeleteNode), so anything attached there may be
// mounted. Another Node object read since the write began (one created
// again, whose sync came before this answer) is not the one gone: nothing
// changes. It returns the keys of its attachments.
func (a *ActualState) NodeGone(name string) []Key {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.nodes[name]
	if !ok || !n.info.Exists || n.info.UID != n.writeUID {
		return nil
	}
	a.countZoneLocked(n.info, -1)
	n.info = NodeInfo{Managed: n.info.Managed, Zone: n.info.Zone}
	keys := make([]Key, 0, len(n.attachments))
	for v := range n.attachments {
		keys = append(keys, Key{Volume: v, Node: name})
	}
	return keys
}

// Node returns what is known of a node; ok is false for a node never seen.
func (a *ActualState) Node(name string) (info NodeInfo, ok bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n, ok := a.nodes[name]
	if !ok {
		return NodeInfo{}, false
	}
	return n.info, true
}

// NodesOf returns the nodes a volume is (maybe) attached to under name.
func (a *ActualState) NodesOf(name volume.Name) []string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	nodes := make([]string, 0, len(a.volumes[name]))
	for n := range a.volumes[name] {
		nodes = append(nodes, n)
	}
	return nodes
}

// AttachedElsewhere returns the attachments of a volume, under any of names
// or recorded with a spec that has one of them among its names (another
// spelling of the same disk), on nodes other than node, in any state (an
// uncertain or detaching volume may still be attached).
func (a *ActualState) AttachedElsewhere(names []volume.Name, node string) []Key {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var keys []Key
	for _, name := range names {
		for n := range a.volumes[name] {
			if k := (Key{Volume: name, Node: n}); n != node && !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
		for k := range a.byOtherName[name] {
			if k.Node != node && !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.SortFunc(keys, func(x, y Key) int { return strings.Compare(x.String(), y.String()) })
	return keys
}

// KeysOn returns the key of every attachment on node.
func (a *ActualState) KeysOn(node string) []Key {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := a.nodes[node]
	if n == nil {
		return nil
	}
	keys := make([]Key, 0, len(n.attachments))
	for v := range n.attachments {
		keys = append(keys, Key{Volume: v, Node: node})
	}
	return keys
}

// Keys returns every attachment's key.
func (a *ActualState) Keys() []Key {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var keys []Key
	for v, byNode := range a.volumes {
		for n := range byNode {
			keys = append(keys, Key{Volume: v, Node: n})
		}
	}
	return keys
}

// Attachments returns a copy of every attachment.
func (a *ActualState) Attachments() []Attachment {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var out []Attachment
	for _, byNode := range a.volumes {
		for _, at := range byNode {
			out = append(out, *at)
		}
	}
	return out
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

// Stats counts attachments by metric plugin name.
func (a *ActualState) Stats() map[string]int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return maps.Clone(a.byPlugin)
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
