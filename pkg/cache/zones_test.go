package cache

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// atLeast3 is a rule that says a zone is disrupted with 3 nodes not ready
// and 55% of them.
func atLeast3(window time.Duration) ZoneRule {
	return ZoneRule{Window: window, Disrupted: func(h ZoneHealth) bool {
		return h.Unhealthy >= 3 && float64(h.Unhealthy) >= 0.55*float64(h.Nodes)
	}}
}

func TestZoneHealth(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	wait := 6 * time.Minute
	a := NewActualState()
	node := func(name, zone string, ready, managed bool) {
		a.SetNode(name, NodeInfo{Zone: zone, Ready: ready, Managed: managed}, time.Time{})
	}
	node("a1", "a", true, true)
	node("a2", "a", false, true)
	node("a3", "a", false, true)
	node("a4", "a", false, false) // unmanaged: not counted
	node("b1", "b", false, true)
	node("n1", "", true, true)
	check := func(when string, zone string, now time.Time, nodes, unhealthy int) {
		t.Helper()
		if h := a.Zone(zone, now, atLeast3(wait)); h.Nodes != nodes || h.Unhealthy != unhealthy {
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
	if h := a.Zone("a", t0.Add(time.Minute), atLeast3(wait)); !h.Expires.Equal(t0.Add(wait)) {
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

}

// A node deleted before the controller read it (a restart) counts in every
// zone, and its own zone is disrupted when any is.
func TestUnknownZoneCountsEverywhere(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	wait := 6 * time.Minute
	rule := atLeast3(wait)
	a := NewActualState()
	for i, ready := range []bool{false, false, true, true} {
		a.SetNode(fmt.Sprintf("a%d", i), NodeInfo{Zone: "a", Ready: ready, Managed: true}, time.Time{})
	}
	a.SetNode("b0", NodeInfo{Zone: "b", Ready: true, Managed: true}, time.Time{})
	for _, n := range []string{"x1", "x2"} {
		a.Update(Key{Volume: volA, Node: n}, true, func(*Attachment) {})
		if info, _ := a.Node(n); !info.Unread() {
			t.Fatalf("node %s named by an attachment only: %+v, want unread", n, info)
		}
		a.DeleteNode(n, true, t0)
		if info, _ := a.Node(n); !info.Deleted || info.Zone != UnknownZone || info.Seen {
			t.Fatalf("node %s deleted unread: %+v, want deleted in the unknown zone, mounts unknown", n, info)
		}
	}
	if h := a.Zone("a", t0, rule); !h.Disrupted || h.Unhealthy != 4 || h.Nodes != 6 {
		t.Errorf("zone a: %+v, want 4 of 6 not ready (2 deleted somewhere), disrupted", h)
	}
	if h := a.Zone("b", t0, rule); h.Disrupted || h.Unhealthy != 2 || h.Nodes != 3 {
		t.Errorf("zone b: %+v, want 2 of 3, not disrupted (below 3)", h)
	}
	if h := a.NodeZone(UnknownZone, t0, rule); !h.Disrupted || h.Zone != "a" {
		t.Errorf("unknown zone: %+v, want zone a's disruption", h)
	}
	// The deletions stop counting: the zone recovers at that look.
	at := t0.Add(wait)
	if h := a.NodeZone(UnknownZone, at, rule); h.Disrupted || !h.Recovered.Equal(at) {
		t.Errorf("unknown zone after the window: %+v, want zone a recovered at %v", h, at)
	}
}

// The look that finds a zone no longer disrupted records its recovery, at
// that look, whether a node's change or the end of a deletion's count
// ended it; every change is announced once.
func TestZoneRecoveryIsRecordedByTheLookThatSeesIt(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	wait := 6 * time.Minute
	rule := atLeast3(wait)
	a := NewActualState()
	a.SetNode("a0", NodeInfo{Zone: "a", Ready: false, Managed: true}, time.Time{})
	a.Update(Key{Volume: volA, Node: "a0"}, true, func(*Attachment) {})
	for _, n := range []string{"a1", "a2"} {
		a.SetNode(n, NodeInfo{Zone: "a", Ready: true, Managed: true}, time.Time{})
		a.SetNode(n, NodeInfo{Zone: "a", Ready: false, Managed: true, ResourceVersion: "2"}, time.Time{})
		a.DeleteNode(n, true, t0)
	}
	changes, n, _ := a.AnnounceZones(t0, rule)
	if n != 1 || len(changes) != 1 || !changes[0].Disrupted || !slices.Equal(changes[0].Keys, []Key{{Volume: volA, Node: "a0"}}) {
		t.Fatalf("announced %+v (%d disrupted), want zone a disrupted with a0's key", changes, n)
	}
	if changes, _, _ := a.AnnounceZones(t0, rule); len(changes) != 0 {
		t.Errorf("announced again: %+v", changes)
	}
	// A decision at the deletions' expiry, before any announcement, sees
	// the recovery (a fresh max wait from now).
	at := t0.Add(wait)
	if h := a.Zone("a", at, rule); h.Disrupted || !h.Recovered.Equal(at) {
		t.Errorf("zone at expiry: %+v, want recovered at %v", h, at)
	}
	changes, n, _ = a.AnnounceZones(at.Add(time.Second), rule)
	if n != 0 || len(changes) != 1 || changes[0].Disrupted || !changes[0].Recovered.Equal(at) {
		t.Errorf("announced %+v (%d disrupted), want zone a recovered at %v", changes, n, at)
	}
}

// Many workers looking at one zone while its nodes change: the recorded
// state is always the state of the last look, never a stale one.
func TestZoneLooksAtOnce(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rule := atLeast3(time.Minute)
	for round := range 50 {
		a := NewActualState()
		for i := range 10 {
			a.SetNode(fmt.Sprintf("a%d", i), NodeInfo{Zone: "a", Ready: true, Managed: true, ResourceVersion: "1"}, time.Time{})
		}
		var wg sync.WaitGroup
		for i := range 10 {
			wg.Go(func() {
				a.SetNode(fmt.Sprintf("a%d", i), NodeInfo{Zone: "a", Ready: i%10 >= 4, Managed: true, ResourceVersion: "2"}, time.Time{})
				a.AnnounceZones(t0, rule)
			})
		}
		wg.Wait()
		// 4 of 10 not ready: not disrupted; then 6.
		if changes, n, _ := a.AnnounceZones(t0, rule); n != 0 || len(changes) != 0 {
			t.Fatalf("round %d: 4 of 10 not ready: %+v, %d disrupted", round, changes, n)
		}
		for i := 4; i < 6; i++ {
			wg.Go(func() {
				a.SetNode(fmt.Sprintf("a%d", i), NodeInfo{Zone: "a", Ready: false, Managed: true, ResourceVersion: "3"}, time.Time{})
				a.AnnounceZones(t0, rule)
			})
		}
		wg.Wait()
		if h := a.Zone("a", t0, rule); !h.Disrupted {
			t.Fatalf("round %d: 6 of 10 not ready: %+v, want disrupted", round, h)
		}
		if changes, n, _ := a.AnnounceZones(t0, rule); n != 1 || len(changes) != 0 {
			t.Fatalf("round %d: %+v, %d disrupted: want the disruption announced once already", round, changes, n)
		}
	}
}
