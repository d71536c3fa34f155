package cache

import (
	"time"
)

// When many nodes of a zone stop reporting at once, they are seldom dead:
// a network partition, a failed switch, kubelets that can't reach an
// overloaded API server. Their pods may still write. The actual state
// counts each zone's managed nodes and those not Ready, a node deleted
// lately counting as one not Ready, so that the reconciler can hold the
// forced detaches by timeout of a zone that looks disrupted
// (reconciler.ZoneDisrupted).

// forgetDeletedAfter bounds how long a deleted node is remembered; a
// deletion counts only within the max wait for unmount, minutes.
const forgetDeletedAfter = 24 * time.Hour

type zoneEntry struct {
	// nodes counts the zone's managed nodes that exist, unhealthy those of
	// them that are not Ready.
	nodes, unhealthy int
	// deleted holds when each of its managed nodes was deleted.
	deleted map[string]time.Time
	// recovered is when the zone last stopped being disrupted.
	recovered time.Time
}

// ZoneHealth is what is known of one zone's managed nodes.
type ZoneHealth struct {
	Zone string
	// Nodes counts the zone's managed nodes: those that exist, and those
	// deleted within the window asked for.
	Nodes int
	// Unhealthy counts those not Ready, the deleted ones included.
	Unhealthy int
	// Expires is when the first of the deletions counted stops counting;
	// zero when none is counted.
	Expires time.Time
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
	if z := a.zones[name]; z != nil && z.nodes == 0 && len(z.deleted) == 0 && z.recovered.IsZero() {
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

// ZoneHealth returns the health of zone's managed nodes at now, counting
// the nodes deleted within window before now as not Ready.
func (a *ActualState) ZoneHealth(zone string, now time.Time, window time.Duration) ZoneHealth {
	a.mu.RLock()
	defer a.mu.RUnlock()
	h := ZoneHealth{Zone: zone}
	z := a.zones[zone]
	if z == nil {
		return h
	}
	h.Nodes, h.Unhealthy, h.Recovered = z.nodes, z.unhealthy, z.recovered
	for _, t := range z.deleted {
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
	return h
}

// ZoneRecovered records that zone stopped being disrupted at at: its nodes
// get a fresh max wait for unmount from then on (reconciler.safeToDetach).
func (a *ActualState) ZoneRecovered(zone string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.zoneLocked(zone).recovered = at
}

// KeysInZone returns the key of every attachment on a node of zone.
func (a *ActualState) KeysInZone(zone string) []Key {
	a.mu.RLock()
	defer a.mu.RUnlock()
	var keys []Key
	for name, n := range a.nodes {
		if n.info.Zone != zone {
			continue
		}
		for v := range n.attachments {
			keys = append(keys, Key{Volume: v, Node: name})
		}
	}
	return keys
}
