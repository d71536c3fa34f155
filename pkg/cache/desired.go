package cache

import (
	"maps"
	"slices"
	"sync"

	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// DesiredState records, for every scheduled pod that has not terminated, the
// volumes it needs attached to its node, whatever the node: managed or not,
// known to exist or not. Whether a node's wants count is the node's facts'
// answer (reconciler.Decide), not the desired state's. A volume is desired
// on a node while at least one pod there wants it.
type DesiredState struct {
	mu sync.RWMutex
	// pods maps a pod key to what that pod wants.
	pods map[string]*podWants
	// entries maps a volume's primary name on a node to its spec and pods.
	entries map[Key]*desiredEntry
	// names indexes every name a desired volume can have (its primary name
	// and its aliases) by where it is wanted: node and primary name, with
	// the pod volumes behind each. It answers "is this attachment still
	// wanted" for a volume attached under an alias, and finds the keys a
	// change of that name concerns.
	names map[volume.Name]nameUses
	// counts counts entries per node as they change, and totals those of
	// the nodes whose wants count (SetCounted), so that a metrics scrape
	// reads a few numbers instead of every entry (Stats).
	counts  map[string]*entryCounts
	counted map[string]bool
	totals  entryCounts
	// waited holds, by node, the desired single-node volumes that waited
	// for their detach from another node (MarkWaited): moves, until no pod
	// on the node wants the volume.
	waited map[string]map[volume.Name]struct{}
	// partial: not every pod has been read since the controller started
	// (SetPartial), so a volume no pod wants here may yet be wanted by a
	// pod not read so far.
	partial bool
}

// entryCounts counts one node's entries by metric plugin name, and those
// whose mechanism is undecided.
type entryCounts struct {
	byPlugin map[string]int
	pending  int
}

type podWants struct {
	ref   PodRef
	node  string
	specs []*volume.Spec
	// vols says which pod volume each spec came from.
	vols []PodVolume
}

// PodVolume is what one volume of a pod (by its name in the pod's spec)
// resolves to.
type PodVolume struct {
	Name string
	Spec *volume.Spec
}

type desiredEntry struct {
	spec *volume.Spec
	// pods want the volume on the node: almost always one, a few when pods
	// on one node share a claim; a slice costs a tenth of a map for one.
	pods []PodRef
}

// podIndex returns the index in pods of the pod named by ref, or -1.
func podIndex(pods []PodRef, ref PodRef) int {
	return slices.IndexFunc(pods, func(p PodRef) bool { return p.Name == ref.Name && p.Namespace == ref.Namespace })
}

// nameUses is where one name is wanted: on which nodes, under which primary
// names, by how many pod volumes. Almost every name is wanted on one node
// under one primary name, held in one; a name wanted on several nodes (a
// ReadOnlyMany or ReadWriteMany volume) or under several primary names
// gets a map, node -> primary name -> pod volumes.
type nameUses struct {
	one  nameUse
	many map[string]map[volume.Name]int
}

type nameUse struct {
	node    string
	primary volume.Name
	pods    int
}

func (u *nameUses) add(node string, primary volume.Name) {
	switch {
	case u.many == nil && u.one.pods == 0:
		u.one = nameUse{node: node, primary: primary, pods: 1}
		return
	case u.many == nil && u.one.node == node && u.one.primary == primary:
		u.one.pods++
		return
	case u.many == nil:
		u.many = map[string]map[volume.Name]int{u.one.node: {u.one.primary: u.one.pods}}
		u.one = nameUse{}
	}
	if u.many[node] == nil {
		u.many[node] = map[volume.Name]int{}
	}
	u.many[node][primary]++
}

// remove takes one pod volume away; it reports whether the name is still
// wanted anywhere.
func (u *nameUses) remove(node string, primary volume.Name) bool {
	if u.many == nil {
		if u.one.node == node && u.one.primary == primary {
			u.one.pods--
		}
		return u.one.pods > 0
	}
	if u.many[node][primary]--; u.many[node][primary] <= 0 {
		delete(u.many[node], primary)
	}
	if len(u.many[node]) == 0 {
		delete(u.many, node)
	}
	if len(u.many) == 1 {
		// Back to one use: the map goes.
		for n, primaries := range u.many {
			if len(primaries) == 1 {
				for p, pods := range primaries {
					u.one, u.many = nameUse{node: n, primary: p, pods: pods}, nil
				}
			}
		}
	}
	return u.many != nil || u.one.pods > 0
}

func (u *nameUses) wantedOn(node string) bool {
	if u.many == nil {
		return u.one.pods > 0 && u.one.node == node
	}
	return len(u.many[node]) > 0
}

// keys returns the key of every use.
func (u *nameUses) keys() []Key {
	if u.many == nil {
		if u.one.pods == 0 {
			return nil
		}
		return []Key{{Volume: u.one.primary, Node: u.one.node}}
	}
	var keys []Key
	for node, primaries := range u.many {
		for p := range primaries {
			keys = append(keys, Key{Volume: p, Node: node})
		}
	}
	return keys
}

// NewDesiredState returns an empty DesiredState.
func NewDesiredState() *DesiredState {
	return &DesiredState{
		pods:    map[string]*podWants{},
		entries: map[Key]*desiredEntry{},
		names:   map[volume.Name]nameUses{},
		counts:  map[string]*entryCounts{},
		counted: map[string]bool{},
		totals:  entryCounts{byPlugin: map[string]int{}},
	}
}

// SetPartial says whether pods remain to be read since the controller
// started: while they do, no attachment may be taken as unwanted.
func (d *DesiredState) SetPartial(partial bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.partial = partial
}

// Partial reports whether pods remain to be read (SetPartial).
func (d *DesiredState) Partial() bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.partial
}

// Read reports whether the pod with this key and UID was read on node
// (SetPodVolumes) since it last went (DeletePod): what it wants there, if
// anything, is known.
func (d *DesiredState) Read(podKey, uid, node string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.pods[podKey]
	return p != nil && p.ref.UID == uid && p.node == node
}

// SetPod replaces what pod wants on node with specs (nil or empty: nothing,
// the pod read all the same: Read).
// It returns the keys whose desired state changed: each added or removed
// volume's key, and the keys of its aliases on the node (whether an
// attachment under an alias is wanted changed with it), once each.
func (d *DesiredState) SetPod(pod PodRef, node string, specs []*volume.Spec) []Key {
	vols := make([]PodVolume, len(specs))
	for i, s := range specs {
		vols[i] = PodVolume{Name: string(s.Name), Spec: s}
	}
	return d.SetPodVolumes(pod, node, vols)
}

// PodVolumes returns what the pod with this key and UID was last given by
// SetPodVolumes; nothing for another pod of the same name.
func (d *DesiredState) PodVolumes(podKey, uid string) []PodVolume {
	d.mu.RLock()
	defer d.mu.RUnlock()
	p := d.pods[podKey]
	if p == nil || p.ref.UID != uid {
		return nil
	}
	return slices.Clone(p.vols)
}

// SetPodVolumes is SetPod with each spec's pod volume, for PodVolumes.
func (d *DesiredState) SetPodVolumes(pod PodRef, node string, vols []PodVolume) []Key {
	specs := make([]*volume.Spec, 0, len(vols))
	for _, v := range vols {
		specs = append(specs, v.Spec)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.setPodLocked(pod, node, vols, dedupe(specs), true)
}

// setPodLocked is SetPodVolumes with specs deduplicated; without read, the
// pod goes (DeletePod).
func (d *DesiredState) setPodLocked(pod PodRef, node string, vols []PodVolume, specs []*volume.Spec, read bool) []Key {
	podKey := pod.String()
	old := d.pods[podKey]
	var touched []Key
	touch := func(s *volume.Spec, node string) {
		for _, n := range s.AllNames() {
			if k := (Key{Volume: n, Node: node}); !slices.Contains(touched, k) {
				touched = append(touched, k)
			}
		}
	}
	if old != nil {
		for _, s := range old.specs {
			if old.node == node && containsSpec(specs, s) {
				continue
			}
			d.removeLocked(old.ref, old.node, s)
			touch(s, old.node)
		}
	}
	for _, s := range specs {
		if old != nil && old.node == node && containsSpec(old.specs, s) {
			// Same spec; keep the newest object for the PV/inline source,
			// and the pod's current UID (a pod re-created under the same
			// name is another pod: events go to it).
			e := d.entries[Key{Volume: s.Name, Node: node}]
			d.setSpecLocked(node, e, s)
			if i := podIndex(e.pods, pod); i >= 0 {
				e.pods[i] = pod
			}
			continue
		}
		d.addLocked(pod, node, s)
		touch(s, node)
	}
	if !read {
		delete(d.pods, podKey)
	} else {
		d.pods[podKey] = &podWants{ref: pod, node: node, specs: specs, vols: slices.Clone(vols)}
	}
	return touched
}

// DeletePod forgets the pod (gone, terminated or not scheduled); it returns
// the keys whose desired state changed.
func (d *DesiredState) DeletePod(podKey string) []Key {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok := d.pods[podKey]
	if !ok {
		return nil
	}
	return d.setPodLocked(p.ref, p.node, nil, nil, false)
}

func (d *DesiredState) addLocked(pod PodRef, node string, s *volume.Spec) {
	k := Key{Volume: s.Name, Node: node}
	e := d.entries[k]
	if e == nil {
		e = &desiredEntry{}
		d.entries[k] = e
		d.countLocked(node, volume.MetricPluginName(k.Volume), 1, 0)
	}
	d.setSpecLocked(node, e, s)
	if i := podIndex(e.pods, pod); i >= 0 {
		e.pods[i] = pod
	} else {
		e.pods = append(e.pods, pod)
	}
	for _, n := range s.AllNames() {
		u := d.names[n]
		u.add(node, s.Name)
		d.names[n] = u
	}
}

func (d *DesiredState) removeLocked(pod PodRef, node string, s *volume.Spec) {
	k := Key{Volume: s.Name, Node: node}
	if e := d.entries[k]; e != nil {
		if i := podIndex(e.pods, pod); i >= 0 {
			e.pods = slices.Delete(e.pods, i, i+1)
		}
		if len(e.pods) == 0 {
			delete(d.entries, k)
			d.unmarkLocked(k)
			d.setSpecLocked(node, e, nil)
			d.countLocked(node, volume.MetricPluginName(k.Volume), -1, 0)
		}
	}
	for _, n := range s.AllNames() {
		u, ok := d.names[n]
		if !ok {
			continue
		}
		if u.remove(node, s.Name) {
			d.names[n] = u
		} else {
			delete(d.names, n)
		}
	}
}

// Get returns the spec of the volume desired under k's name on k's node and
// the pods that want it.
func (d *DesiredState) Get(k Key) (*volume.Spec, []PodRef, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e, ok := d.entries[k]
	if !ok {
		return nil, nil, false
	}
	pods := slices.Clone(e.pods)
	slices.SortFunc(pods, func(a, b PodRef) int {
		if a.Namespace != b.Namespace {
			if a.Namespace < b.Namespace {
				return -1
			}
			return 1
		}
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return e.spec, pods, true
}

// Wanted reports whether some pod on k's node wants the volume k names,
// under its primary name or as an alias (the same volume attached by another
// mechanism). A wanted attachment is never detached.
func (d *DesiredState) Wanted(k Key) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	u := d.names[k.Volume]
	return u.wantedOn(k.Node)
}

// MarkWaited records that the volume desired at k waited for its detach
// from another node: the pods that want it wait for a move. It lasts as
// long as the desired entry; nothing when there is none.
func (d *DesiredState) MarkWaited(k Key) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.entries[k]; !ok {
		return
	}
	if d.waited == nil {
		d.waited = map[string]map[volume.Name]struct{}{}
	}
	vols := d.waited[k.Node]
	if vols == nil {
		vols = map[volume.Name]struct{}{}
		d.waited[k.Node] = vols
	}
	vols[k.Volume] = struct{}{}
}

func (d *DesiredState) unmarkLocked(k Key) {
	vols, ok := d.waited[k.Node]
	if !ok {
		return
	}
	delete(vols, k.Volume)
	if len(vols) == 0 {
		delete(d.waited, k.Node)
	}
}

// Waited reports whether the volume desired at k waited for its detach
// from another node (MarkWaited).
func (d *DesiredState) Waited(k Key) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	_, ok := d.waited[k.Node][k.Volume]
	return ok
}

// WaitedOn returns the keys on node that waited for their detach from
// another node (MarkWaited).
func (d *DesiredState) WaitedOn(node string) []Key {
	d.mu.RLock()
	defer d.mu.RUnlock()
	vols := d.waited[node]
	if len(vols) == 0 {
		return nil
	}
	keys := make([]Key, 0, len(vols))
	for v := range vols {
		keys = append(keys, Key{Volume: v, Node: node})
	}
	return keys
}

// Spec returns the spec of the volume desired under k's name on k's node.
func (d *DesiredState) Spec(k Key) (*volume.Spec, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e, ok := d.entries[k]
	if !ok {
		return nil, false
	}
	return e.spec, true
}

// KeysFor returns the desired keys of the volume that name names, as its
// primary name or an alias, on every node.
func (d *DesiredState) KeysFor(name volume.Name) []Key {
	d.mu.RLock()
	defer d.mu.RUnlock()
	u := d.names[name]
	return u.keys()
}

// KeysOn returns the desired keys on node. It reads every entry: for a
// change as rare as a node's management.
func (d *DesiredState) KeysOn(node string) []Key {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var keys []Key
	for k := range d.entries {
		if k.Node == node {
			keys = append(keys, k)
		}
	}
	return keys
}

// Keys returns every desired key.
func (d *DesiredState) Keys() []Key {
	d.mu.RLock()
	defer d.mu.RUnlock()
	keys := make([]Key, 0, len(d.entries))
	for k := range d.entries {
		keys = append(keys, k)
	}
	return keys
}

// SetCounted says whether what pods want on node counts in Stats: the node
// exists and is managed.
func (d *DesiredState) SetCounted(node string, counted bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.counted[node] == counted {
		return
	}
	sign := -1
	if counted {
		sign = 1
		d.counted[node] = true
	} else {
		delete(d.counted, node)
	}
	if c := d.counts[node]; c != nil {
		for p, n := range c.byPlugin {
			d.totals.add(p, sign*n, 0)
		}
		d.totals.add("", 0, sign*c.pending)
	}
}

// Stats counts the desired volumes on the nodes that count (SetCounted), by
// metric plugin name, and those whose mechanism is still undecided (waiting
// for node information).
func (d *DesiredState) Stats() (byPlugin map[string]int, pending int) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return maps.Clone(d.totals.byPlugin), d.totals.pending
}

// add adds n entries of plugin ("" for none) and pending undecided ones.
func (c *entryCounts) add(plugin string, n, pending int) {
	if plugin != "" {
		if c.byPlugin[plugin] += n; c.byPlugin[plugin] <= 0 {
			delete(c.byPlugin, plugin)
		}
	}
	c.pending += pending
}

// countLocked adds n entries of plugin and pending undecided ones to node's
// counts, and to the totals when the node counts; a node's counts go once
// they are all zero.
func (d *DesiredState) countLocked(node, plugin string, n, pending int) {
	c := d.counts[node]
	if c == nil {
		c = &entryCounts{byPlugin: map[string]int{}}
		d.counts[node] = c
	}
	c.add(plugin, n, pending)
	if d.counted[node] {
		d.totals.add(plugin, n, pending)
	}
	if c.pending == 0 && len(c.byPlugin) == 0 {
		delete(d.counts, node)
	}
}

// setSpecLocked sets the spec of an entry on node (nil: the entry is
// going), keeping the count of undecided ones.
func (d *DesiredState) setSpecLocked(node string, e *desiredEntry, s *volume.Spec) {
	was, is := e.spec != nil && e.spec.Pending != "", s != nil && s.Pending != ""
	switch {
	case is && !was:
		d.countLocked(node, "", 0, 1)
	case was && !is:
		d.countLocked(node, "", 0, -1)
	}
	e.spec = s
}

// containsSpec reports whether specs holds a spec equal to s in every field
// that matters for attaching.
func containsSpec(specs []*volume.Spec, s *volume.Spec) bool {
	for _, o := range specs {
		if sameAttachment(o, s) {
			return true
		}
	}
	return false
}

func sameAttachment(a, b *volume.Spec) bool {
	return a.Name == b.Name && a.Kind == b.Kind && a.Pending == b.Pending &&
		a.Driver == b.Driver && a.VolumeHandle == b.VolumeHandle && a.PVName == b.PVName &&
		a.SingleNode == b.SingleNode && a.ReadOnly == b.ReadOnly && a.Migrated == b.Migrated &&
		slices.Equal(a.Aliases, b.Aliases)
}

// dedupe keeps the first spec of each name: two pod volumes may name the same
// claim.
func dedupe(specs []*volume.Spec) []*volume.Spec {
	seen := make(map[volume.Name]bool, len(specs))
	out := specs[:0:0]
	for _, s := range specs {
		if !seen[s.Name] {
			seen[s.Name] = true
			out = append(out, s)
		}
	}
	return out
}
