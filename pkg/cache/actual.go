package cache

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

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
	// under AttachmentName, or first read from the API (a settled detach's
	// GET, of an object someone created again under that name), until an
	// informer event of it is read (CreatedUnknown when the create's
	// answer did not come): an object the lister shows meanwhile under that
	// name may be an older one, gone before, so that its deletion proves
	// nothing of what is there now. "" when no object awaits its event.
	CreatedUID string
	// AttachError and DetachError are the last errors the mechanism reported.
	AttachError string
	DetachError string
	// AttachStarted and DetachStarted time the operations for metrics.
	AttachStarted time.Time
	DetachStarted time.Time
	// Withdrawn: taken out of the node.status report because a detach is
	// about to start. The detach waits until node status no longer lists
	// it (pkg/nodestatus).
	Withdrawn bool
	// DetachWanted is when the controller first wanted to detach it (the
	// start of the max wait for unmount); zero while it is wanted.
	DetachWanted time.Time

	// rev changes with every change of the attachment (DeleteUnchanged, UpdateUnchanged).
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
	// Exists: the Node object exists. Deleted: it is known gone (its
	// deletion read, a status write answered that it does not exist, or
	// absent from the API when read). A node that is neither has not been
	// read yet (an attachment named it before its sync): nothing is known
	// of it, not even whether it exists. Once deleted, the other fields
	// keep their last known values.
	Exists, Deleted bool
	// Managed: the node has the controller-managed-attach-detach annotation
	// and counts as managed (pkg/controller holds a node that turned
	// managed unmanaged until its pods are read). Annotated: its object has
	// the annotation.
	Managed, Annotated bool
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
	// ManagedAgain is when the node was first read with the annotation
	// after it was read without it, or deleted, or in place of another
	// object of its name (SetNode's at); zero when
	// it had it from its first read. A kubelet that attached volumes by
	// itself mounted them without waiting to report them in use, and what
	// pods wanted there did not count meanwhile: its volumesInUse is not
	// taken to show every mount until its next status update, and the max
	// wait for unmount counts from then at the earliest
	// (pkg/reconciler/rules.go). Kept while the node has the annotation.
	ManagedAgain time.Time
}

// Unread reports whether nothing is known of the node yet: named by an
// attachment, not read by its sync.
func (n NodeInfo) Unread() bool { return !n.Exists && !n.Deleted }

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
	// handingOver: the controller is stopping gracefully (handoff.go); no
	// detach starts any more.
	handingOver bool
	// zones counts the managed nodes of each zone (zones.go).
	zones map[string]*zoneEntry
}

type nodeEntry struct {
	info        NodeInfo
	attachments map[volume.Name]*Attachment
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
	return a.updateLocked(k, create, fn)
}

// UpdateUnchanged applies fn to the attachment at k, as Update (never
// creating it), unless it changed since seen was read (Get): what the API
// answered about it may be older than a change recorded meanwhile (an
// informer event of a delete that landed after the answer). It reports
// whether fn was applied.
func (a *ActualState) UpdateUnchanged(k Key, seen Attachment, fn func(*Attachment)) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if at, ok := a.volumes[k.Volume][k.Node]; !ok || at.rev != seen.rev {
		return false
	}
	a.updateLocked(k, false, fn)
	return true
}

func (a *ActualState) updateLocked(k Key, create bool, fn func(*Attachment)) bool {
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
		a.nodeLocked(k.Node).attachments[k.Volume] = at
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
		a.gcNodeLocked(k.Node)
	}
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
	if n := a.nodes[name]; n != nil && !n.info.Exists && len(n.attachments) == 0 {
		delete(a.nodes, name)
	}
}

// SetNode records what the Node object says, read at at, unless the
// controller already knows a newer version of it, or knows that object
// deleted. It returns
// the keys of the node's attachments whose decision may change: all of them
// when existence, readiness, management or the out-of-service taint
// changed, else those whose in-use flag changed. And it reports whether the
// node turned managed (unmanaged, or not known to exist, before): then what
// its pods want there with no attachment yet, decided "not managed" or "no
// such node" until then, must be decided again too, which this record of
// attachments cannot list. A node read with the annotation after it was
// read without it, or deleted, is managed again from at
// (NodeInfo.ManagedAgain).
func (a *ActualState) SetNode(name string, info NodeInfo, at time.Time) (keys []Key, turnedManaged bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.setNodeLocked(name, info, at)
}

// SetNodeWritten is SetNode for the answer of a status write: it updates
// only a node on record as existing, under the same UID. Only the informer
// says that a node exists: an answer read after the node's deletion (a
// relist's tombstone carries no version to compare) must not bring it
// back, and one that landed on a Node created again comes through the
// informer too.
func (a *ActualState) SetNodeWritten(name string, info NodeInfo, at time.Time) (keys []Key, turnedManaged bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.nodes[name]; n == nil || !n.info.Exists || n.info.UID != info.UID {
		return nil, false
	}
	return a.setNodeLocked(name, info, at)
}

// SetFinal records the last state of a deleted Node, as its delete event
// carries it, before DeleteNode (with final): the node as it was when it
// went, which kubelet can no longer change. Of a node already recorded
// deleted by a status write that found it gone (NodeGone), only what it
// had mounted is taken: the rest is recorded already.
func (a *ActualState) SetFinal(name string, info NodeInfo) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n := a.nodes[name]; n != nil && n.info.Deleted {
		if n.info.UID == info.UID && !n.info.Seen {
			n.info.InUse, n.info.Seen = info.InUse, true
		}
		return
	}
	a.setNodeLocked(name, info, time.Time{})
}

func (a *ActualState) setNodeLocked(name string, info NodeInfo, at time.Time) (keys []Key, turnedManaged bool) {
	info.Exists, info.Deleted, info.Seen = true, false, true
	n := a.nodeLocked(name)
	old := n.info
	if old.stale(info.UID, info.ResourceVersion) {
		return nil, false
	}
	switch {
	case !info.Annotated:
		info.ManagedAgain = time.Time{}
	case old.Exists && old.Annotated && sameObject(old.UID, info.UID):
		info.ManagedAgain = old.ManagedAgain
	case old.Exists || old.Deleted:
		// Read without the annotation before, deleted, or another object
		// of that name (created again, its deletion hidden by a relist).
		info.ManagedAgain = at
	default:
		// First read (or named by an attachment before it).
		info.ManagedAgain = time.Time{}
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

// Stale reports whether a Node object (its UID and resourceVersion) says
// nothing newer than what the controller knows of the node (SetNode
// ignores it).
func (a *ActualState) Stale(node, uid, resourceVersion string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n := a.nodes[node]
	return n != nil && n.info.stale(uid, resourceVersion)
}

// sameObject reports whether two Node UIDs may name one object (an
// unknown UID may).
func sameObject(a, b string) bool { return a == "" || b == "" || a == b }

// stale: an object older than what the controller already knows (the
// answer of its own status write): what kubelet had mounted then must not
// replace what it has mounted now. Nor does a copy of a Node known deleted,
// no newer than what was known of it when it went (a lister that has not
// read the deletion yet), bring it back.
func (n NodeInfo) stale(uid, resourceVersion string) bool {
	switch {
	case n.Exists:
		return older(resourceVersion, n.ResourceVersion)
	case n.Deleted:
		return uid == n.UID && !older(n.ResourceVersion, resourceVersion)
	}
	return false
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
// a while (ZoneHealth). A node never read (deleted before this controller
// started) is taken as managed, in UnknownZone, deleted at at: when it
// really went is as unknown as its zone.
func (a *ActualState) DeleteNode(name string, final bool, at time.Time) []Key {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.nodes[name]
	if !ok || n.info.Deleted {
		return nil
	}
	if n.info.Unread() {
		n.info = NodeInfo{Managed: true, Zone: UnknownZone}
		final = false
	}
	a.countZoneLocked(n.info, -1)
	if n.info.Managed {
		a.recordDeletedLocked(n.info.Zone, name, at)
	}
	if !final {
		n.info.Seen, n.info.InUse = false, nil
	}
	n.info.Exists, n.info.Deleted = false, true
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

// UnreadNodes returns, sorted, the nodes named by attachments and not read
// yet (NodeInfo.Unread).
func (a *ActualState) UnreadNodes() []string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var names []string
	for name, n := range a.nodes {
		if n.info.Unread() {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
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

// NamedState is the VolumeAttachment name of an attachment and its state.
type NamedState struct {
	AttachmentName string
	State          State
}

// AttachmentStates returns the name and state of every attachment made
// through a VolumeAttachment: what the periodic sync compares, 24 bytes
// an attachment where a copy of each (Attachments) is about 450.
func (a *ActualState) AttachmentStates() []NamedState {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]NamedState, 0, len(a.byAttachmentName))
	for _, byNode := range a.volumes {
		for _, at := range byNode {
			if at.AttachmentName != "" {
				out = append(out, NamedState{AttachmentName: at.AttachmentName, State: at.State})
			}
		}
	}
	return out
}

// Stats counts attachments by metric plugin name.
func (a *ActualState) Stats() map[string]int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return maps.Clone(a.byPlugin)
}
