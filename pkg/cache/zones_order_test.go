package cache

import (
	"testing"
	"time"
)

// Two workers look at a zone at about the same time, each with the time it
// read before taking the lock: the later time may be looked at first. The
// recovery seen at the later time stays recorded: a look at a moment just
// before it says nothing newer, and must neither mark the zone disrupted
// again nor move its recovery (and its nodes' fresh max wait) later.
func TestZoneLookAtAnEarlierTimeDoesNotUndoARecovery(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	wait := 6 * time.Minute
	rule := atLeast3(wait)
	a := NewActualState()
	a.SetNode("a0", NodeInfo{Zone: "a", Ready: false, Managed: true}, time.Time{})
	a.Update(Key{Volume: volA, Node: "a0"}, true, func(*Attachment) {})
	for _, n := range []string{"a1", "a2"} {
		a.SetNode(n, NodeInfo{Zone: "a", Ready: true, Managed: true}, time.Time{})
		a.DeleteNode(n, true, t0)
	}
	if changes, _, _ := a.AnnounceZones(t0, rule); len(changes) != 1 || !changes[0].Disrupted {
		t.Fatalf("announced %+v, want zone a disrupted", changes)
	}
	recovered := t0.Add(wait)
	if h := a.Zone("a", recovered, rule); h.Disrupted || !h.Recovered.Equal(recovered) {
		t.Fatalf("zone at the deletions' expiry: %+v, want recovered at %v", h, recovered)
	}
	// The other worker's look, its time read a millisecond before.
	a.Zone("a", recovered.Add(-time.Millisecond), rule)

	later := recovered.Add(time.Second)
	if h := a.Zone("a", later, rule); h.Disrupted || !h.Recovered.Equal(recovered) {
		t.Errorf("zone a second later: disrupted %v, recovered at %v; want recovered at %v", h.Disrupted, h.Recovered, recovered)
	}
}
