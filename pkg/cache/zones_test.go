package cache

import (
	"slices"
	"testing"
	"time"
)

func TestZoneHealth(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	wait := 6 * time.Minute
	a := NewActualState()
	node := func(name, zone string, ready, managed bool) {
		a.SetNode(name, NodeInfo{Zone: zone, Ready: ready, Managed: managed})
	}
	node("a1", "a", true, true)
	node("a2", "a", false, true)
	node("a3", "a", false, true)
	node("a4", "a", false, false) // unmanaged: not counted
	node("b1", "b", false, true)
	node("n1", "", true, true)
	check := func(when string, zone string, now time.Time, nodes, unhealthy int) {
		t.Helper()
		if h := a.ZoneHealth(zone, now, wait); h.Nodes != nodes || h.Unhealthy != unhealthy {
			t.Errorf("%s: zone %q: %d of %d unhealthy, want %d of %d", when, zone, h.Unhealthy, h.Nodes, unhealthy, nodes)
		}
	}
	check("start", "a", t0, 3, 2)
	check("start", "b", t0, 1, 1)
	check("start", "", t0, 1, 0)
	check("start", "c", t0, 0, 0)

	node("a2", "a", true, true) // Ready again
	check("a2 ready", "a", t0, 3, 1)
	node("a1", "b", true, true) // relabelled
	check("a1 moved", "a", t0, 2, 1)
	check("a1 moved", "b", t0, 2, 1)

	// A deleted node counts as unhealthy within the wait.
	a.DeleteNode("a2", true, t0)
	check("a2 deleted", "a", t0.Add(time.Minute), 2, 2)
	if h := a.ZoneHealth("a", t0.Add(time.Minute), wait); !h.Expires.Equal(t0.Add(wait)) {
		t.Errorf("expires %v, want %v", h.Expires, t0.Add(wait))
	}
	check("a2 deleted, wait over", "a", t0.Add(wait), 1, 1)
	// Created again: counted as it is.
	node("a2", "a", true, true)
	check("a2 back", "a", t0.Add(time.Minute), 2, 1)
	// Deleted unmanaged: never counted.
	a.DeleteNode("a4", true, t0)
	check("a4 deleted", "a", t0.Add(time.Minute), 2, 1)
	// A status write finding a node gone counts it as deleted then; its
	// deletion, read after, changes nothing.
	a.NodeGone("a3", "", t0)
	check("a3 gone", "a", t0, 2, 1)
	a.DeleteNode("a3", false, t0.Add(time.Minute))
	check("a3 deletion read", "a", t0.Add(time.Minute), 2, 1)
	check("a3 gone, wait over", "a", t0.Add(wait), 1, 0)

	a.Update(Key{Volume: volA, Node: "b1"}, true, func(*Attachment) {})
	a.Update(Key{Volume: volB, Node: "a2"}, true, func(*Attachment) {})
	if got := a.KeysInZone("b"); !slices.Equal(got, []Key{{Volume: volA, Node: "b1"}}) {
		t.Errorf("KeysInZone(b) = %v", got)
	}
}
