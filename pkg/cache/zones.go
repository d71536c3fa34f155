package cache

import (
	"slices"
	"strings"
	"time"
)

// When many nodes of a zone stop reporting at once, they are seldom dead:
// a network partition, a failed switch, kubelets that can't reach an
// overloaded API server. Their pods may still write. The actual state
// counts each zone's managed nodes and those not Ready, a node deleted
// lately counting as one not Ready, so that the reconciler can hold the
// forced detaches by timeout of a zone that looks disrupted
// (reconciler.ZoneDisrupted).
//
// Whether a zone is disrupted is computed and recorded in one step, under
// the actual state's lock, by whoever asks (Zone, NodeZone, AnnounceZones):
// a decision and the record of the zone's recovery, which gives its nodes a
// fresh max wait, never disagree, however many workers ask at once and
// whether a node's change or the end of a deletion's count ended it.

// UnknownZone is the zone of a node deleted before this controller read it
// (before a start, or a leader change): its zone label is lost. Its
// deletion counts in every zone, since it may have been in any of them, and
// its own forced detach by timeout is held while any zone is disrupted. Not
// a valid label value, so no real zone has this name.
const UnknownZone = "(unknown)"

// forgetDeletedAfter bounds how long a deleted node is remembered; a
// deletion counts only within the max wait for unmount, minutes.
const forgetDeletedAfter = 24 * time.Hour

type zoneEntry struct {
	// nodes counts the zone's managed nodes that exist, unhealthy those of
	// them that are not Ready.
	nodes, unhealthy int
	// deleted holds when each of its managed nodes was deleted.
	deleted map[string]time.Time
	// disrupted is what the last look found (observeLocked); recovered is
	// when a look last found it no longer disrupted.
	disrupted bool
	recovered time.Time
	// announced is the state the controller last announced (AnnounceZones).
	announced bool
	// looked is the time of the latest look recorded: a look that read the
	// clock before it (another worker's, slower to take the lock) records
	// nothing, lest it undo a recovery seen since.
	looked time.Time
}

// ZoneRule says how long a deletion counts in its zone and when a zone is
// disrupted (reconciler.ZoneDisrupted).
type ZoneRule struct {
	Window    time.Duration
	Disrupted func(ZoneHealth) bool
}

// ZoneHealth is what is known of one zone's managed nodes.
type ZoneHealth struct {
	Zone string
	// Nodes counts the zone's managed nodes: those that exist, and those
	// deleted within the rule's window (of its own, and of UnknownZone).
	Nodes int
	// Unhealthy counts those not Ready, the deleted ones included.
	Unhealthy int
	// Expires is when the first of the deletions counted stops counting;
	// zero when none is counted.
	Expires time.Time
	// Disrupted is the rule's verdict.
	Disrupted bool
	// Recovered is when the zone last stopped being disrupted (zero: not
	// since this controller started).
	Recovered time.Time
}

// countZoneLocked adds (sign 1) or removes (sign -1) what info says of its
// node to its zone's counts.
func (a *ActualState) countZoneLocked(info NodeInfo, sign int) {
	if !info.Exists || !info.Managed {
		return
	}
	z := a.zoneLocked(info.Zone)
	z.nodes += sign
	if !info.Ready {
		z.unhealthy += sign
	}
	a.gcZoneLocked(info.Zone)
}

func (a *ActualState) zoneLocked(name string) *zoneEntry {
	z := a.zones[name]
	if z == nil {
		z = &zoneEntry{}
		a.zones[name] = z
	}
	return z
}

func (a *ActualState) gcZoneLocked(name string) {
	if z := a.zones[name]; z != nil && z.nodes == 0 && len(z.deleted) == 0 && z.recovered.IsZero() && !z.disrupted && !z.announced {
		delete(a.zones, name)
	}
}

// recordDeletedLocked remembers that node, managed in zone, was deleted at
// at, and forgets deletions too old to matter.
func (a *ActualState) recordDeletedLocked(zone, node string, at time.Time) {
	z := a.zoneLocked(zone)
	if z.deleted == nil {
		z.deleted = map[string]time.Time{}
	}
	z.deleted[node] = at
	for n, t := range z.deleted {
		if at.Sub(t) > forgetDeletedAfter {
			delete(z.deleted, n)
		}
	}
}

// forgetDeletedLocked forgets the deletion of a node that exists again.
func (a *ActualState) forgetDeletedLocked(node string) {
	for name, z := range a.zones {
		if _, ok := z.deleted[node]; ok {
			delete(z.deleted, node)
			a.gcZoneLocked(name)
		}
	}
}

// healthLocked counts zone's nodes at now: those that exist, and those
// deleted within window, in the zone or in UnknownZone.
func (a *ActualState) healthLocked(zone string, now time.Time, window time.Duration) ZoneHealth {
	h := ZoneHealth{Zone: zone}
	count := func(deleted map[string]time.Time) {
		for _, t := range deleted {
			expires := t.Add(window)
			if !expires.After(now) {
				continue
			}
			h.Nodes++
			h.Unhealthy++
			if h.Expires.IsZero() || expires.Before(h.Expires) {
				h.Expires = expires
			}
		}
	}
	if z := a.zones[zone]; z != nil {
		h.Nodes, h.Unhealthy = z.nodes, z.unhealthy
		count(z.deleted)
	}
	if u := a.zones[UnknownZone]; u != nil && zone != UnknownZone {
		count(u.deleted)
	}
	return h
}

// observeLocked returns zone's health at now and records the rule's
// verdict: a zone found no longer disrupted recovered at now.
func (a *ActualState) observeLocked(zone string, now time.Time, rule ZoneRule) ZoneHealth {
	h := a.healthLocked(zone, now, rule.Window)
	h.Disrupted = rule.Disrupted(h)
	z := a.zones[zone]
	if z == nil && !h.Disrupted {
		return h
	}
	if z == nil {
		z = a.zoneLocked(zone)
	}
	if now.Before(z.looked) {
		h.Recovered = z.recovered
		return h
	}
	z.looked = now
	if z.disrupted && !h.Disrupted {
		z.recovered = now
	}
	z.disrupted = h.Disrupted
	h.Recovered = z.recovered
	return h
}

// Zone returns the health of zone at now under rule, recorded as it is
// returned.
func (a *ActualState) Zone(zone string, now time.Time, rule ZoneRule) ZoneHealth {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.observeLocked(zone, now, rule)
}

// NodeZone is Zone for the zone of a node: for UnknownZone, the first
// disrupted zone on record (the node may have been in any), else the
// zone that recovered last (its fresh max wait applies).
func (a *ActualState) NodeZone(zone string, now time.Time, rule ZoneRule) ZoneHealth {
	a.mu.Lock()
	defer a.mu.Unlock()
	if zone != UnknownZone {
		return a.observeLocked(zone, now, rule)
	}
	h := a.observeLocked(UnknownZone, now, rule)
	for _, name := range a.zoneNamesLocked() {
		z := a.observeLocked(name, now, rule)
		switch {
		case h.Disrupted:
		case z.Disrupted || z.Recovered.After(h.Recovered):
			h = z
		}
	}
	return h
}

func (a *ActualState) zoneNamesLocked() []string {
	names := make([]string, 0, len(a.zones))
	for name := range a.zones {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// ZoneChange is a zone whose state differs from what was last announced.
type ZoneChange struct {
	ZoneHealth
	// Keys are the attachments on the zone's nodes: their forced detaches
	// may go, or must now be held (all of them for UnknownZone, whose
	// nodes may be in any zone, and the other way round).
	Keys []Key
	// Node is one of the zone's nodes, the first by name: one that exists,
	// else one deleted; "" if none is known.
	Node string
}

// AnnounceZones looks at every zone at now under rule and returns those
// whose state changed since the last announcement, marked announced: each
// change is returned once, whoever asks. It also returns how many zones are
// disrupted, and when the first deletion counted stops counting (zero:
// none is), when the zones must be looked at again.
func (a *ActualState) AnnounceZones(now time.Time, rule ZoneRule) (changes []ZoneChange, disrupted int, next time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, name := range a.zoneNamesLocked() {
		h := a.observeLocked(name, now, rule)
		z := a.zones[name]
		if h.Disrupted {
			disrupted++
		}
		if !h.Expires.IsZero() && (next.IsZero() || h.Expires.Before(next)) {
			next = h.Expires
		}
		if z.announced == h.Disrupted {
			a.gcZoneLocked(name)
			continue
		}
		z.announced = h.Disrupted
		changes = append(changes, ZoneChange{ZoneHealth: h})
		a.gcZoneLocked(name)
	}
	for i := range changes {
		changes[i].Keys = a.keysInZoneLocked(changes[i].Zone)
		changes[i].Node = a.nodeInZoneLocked(changes[i].Zone)
	}
	return changes, disrupted, next
}

// nodeInZoneLocked returns the first node by name of zone that exists, else
// of those deleted it remembers.
func (a *ActualState) nodeInZoneLocked(zone string) string {
	first := func(names []string) string {
		if len(names) == 0 {
			return ""
		}
		return slices.Min(names)
	}
	var names []string
	for name, n := range a.nodes {
		if n.info.Exists && n.info.Zone == zone {
			names = append(names, name)
		}
	}
	if name := first(names); name != "" {
		return name
	}
	if z := a.zones[zone]; z != nil {
		for name := range z.deleted {
			names = append(names, name)
		}
	}
	return first(names)
}

// keysInZoneLocked returns the key of every attachment on a node of zone,
// and of every node of UnknownZone (and, for UnknownZone, of every node).
func (a *ActualState) keysInZoneLocked(zone string) []Key {
	var keys []Key
	for name, n := range a.nodes {
		if zone != UnknownZone && n.info.Zone != zone && n.info.Zone != UnknownZone {
			continue
		}
		for v := range n.attachments {
			keys = append(keys, Key{Volume: v, Node: name})
		}
	}
	slices.SortFunc(keys, func(x, y Key) int { return strings.Compare(x.String(), y.String()) })
	return keys
}
