package cache

import (
	"testing"
	"time"
)

func TestHoldReport(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const limit = time.Second
	kA, kB, kC := k(volA, "n1"), k(volB, "n1"), k(volC, "n1")
	tests := []struct {
		name        string
		attachments []Attachment
		calls       int  // attach calls under way on n1
		dirty       bool // node.status seen listing what is not reported
		handingOver bool
		want        time.Duration
	}{
		{name: "an addition while a VolumeAttachment is not attached yet waits",
			attachments: []Attachment{{Key: kA, State: Attached}, {Key: kB, State: Uncertain}},
			want:        limit},
		{name: "an addition while an attach call is under way waits",
			attachments: []Attachment{{Key: kA, State: Attached}},
			calls:       1,
			want:        limit},
		{name: "nothing under way: written at once",
			attachments: []Attachment{{Key: kA, State: Attached}, {Key: kB, State: Attached, Reported: true}}},
		{name: "an attach that failed is not waited for",
			attachments: []Attachment{{Key: kA, State: Attached}, {Key: kB, State: Uncertain, AttachError: "refused"}}},
		{name: "an attachment whose detach started is not waited for",
			attachments: []Attachment{{Key: kA, State: Attached}, {Key: kB, State: Uncertain, DetachStarted: t0}}},
		{name: "a withdrawal goes at once, additions with it",
			attachments: []Attachment{{Key: kA, State: Attached}, {Key: kB, State: Attached, Reported: true, Withdrawn: true}, {Key: kC, State: Uncertain}},
			calls:       1},
		{name: "a volume no longer attached leaves the report at once",
			attachments: []Attachment{{Key: kA, State: Attached}, {Key: kB, State: Uncertain, Reported: true}},
			calls:       1},
		{name: "nothing to add: nothing waits",
			attachments: []Attachment{{Key: kA, State: Attached, Reported: true}, {Key: kB, State: Uncertain}}},
		{name: "a correction of node.status goes at once",
			attachments: []Attachment{{Key: kA, State: Attached}, {Key: kB, State: Uncertain}},
			dirty:       true},
		{name: "during a handoff nothing waits",
			attachments: []Attachment{{Key: kA, State: Attached}, {Key: kB, State: Uncertain}},
			handingOver: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewActualState()
			a.SetNode("n1", NodeInfo{Exists: true, ResourceVersion: "1"})
			for _, at := range tt.attachments {
				a.Update(at.Key, true, set(at))
			}
			for range tt.calls {
				a.StartAttach("n1")
			}
			if tt.dirty {
				a.nodes["n1"].dirty = true
			}
			if tt.handingOver {
				a.HandOver()
			}
			if got := a.HoldReport("n1", t0, limit); got != tt.want {
				t.Errorf("HoldReport = %v, want %v", got, tt.want)
			}
			if got := a.HoldReport("n1", t0, 0); got != 0 {
				t.Errorf("HoldReport with no limit = %v, want 0", got)
			}
		})
	}
}

// A write waits at most the limit from the first time it waited; the end of
// an attach call tells the caller a write waits; a write ends the wait.
func TestHoldReportLimit(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const limit = time.Second
	a := NewActualState()
	a.SetNode("n1", NodeInfo{Exists: true, ResourceVersion: "1"})
	a.Update(k(volA, "n1"), true, set(Attachment{State: Attached}))
	a.StartAttach("n1")
	a.StartAttach("n1")
	if got := a.HoldReport("n1", t0, limit); got != limit {
		t.Fatalf("HoldReport = %v, want %v", got, limit)
	}
	if got := a.HoldReport("n1", t0.Add(300*time.Millisecond), limit); got != 700*time.Millisecond {
		t.Errorf("HoldReport 300ms later = %v, want 700ms", got)
	}
	if !a.EndAttach("n1") {
		t.Error("EndAttach = false while a write waits, want true")
	}
	if got := a.HoldReport("n1", t0.Add(400*time.Millisecond), limit); got != 600*time.Millisecond {
		t.Errorf("HoldReport with one call still under way = %v, want 600ms", got)
	}
	if got := a.HoldReport("n1", t0.Add(limit), limit); got != 0 {
		t.Errorf("HoldReport at the limit = %v, want 0", got)
	}
	if a.EndAttach("n1") {
		t.Error("EndAttach = true once the wait is over, want false")
	}

	// A withdrawal during a wait ends it: written at once.
	a.StartAttach("n1")
	if got := a.HoldReport("n1", t0.Add(2*time.Second), limit); got != limit {
		t.Fatalf("HoldReport of a new wait = %v, want %v", got, limit)
	}
	a.Update(k(volB, "n1"), true, set(Attachment{State: Attached, Reported: true, Withdrawn: true}))
	if got := a.HoldReport("n1", t0.Add(2100*time.Millisecond), limit); got != 0 {
		t.Errorf("HoldReport with a withdrawal = %v, want 0", got)
	}
	if a.EndAttach("n1") {
		t.Error("EndAttach = true after a withdrawal ended the wait, want false")
	}
	// Wanted again: reported, nothing to remove.
	a.Update(k(volB, "n1"), false, set(Attachment{State: Attached, Reported: true}))

	// A new wait starts from its own first time; a write ends it.
	a.StartAttach("n1")
	t1 := t0.Add(5 * time.Second)
	if got := a.HoldReport("n1", t1, limit); got != limit {
		t.Errorf("HoldReport of a new wait = %v, want %v", got, limit)
	}
	want, changed := a.BeginReport("n1")
	if !changed || len(want) != 2 {
		t.Fatalf("BeginReport = %v, %v; want a write of %s and %s", want, changed, volA, volB)
	}
	a.EndReport("n1", want, true)
	if a.EndAttach("n1") {
		t.Error("EndAttach = true after a write, want false")
	}
	if n := len(a.attachCalls); n != 0 {
		t.Errorf("%d nodes with attach calls under way after every call ended, want 0", n)
	}
	if got := a.HoldReport("unknown", t1, limit); got != 0 {
		t.Errorf("HoldReport of an unknown node = %v, want 0", got)
	}
}
