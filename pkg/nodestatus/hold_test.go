package nodestatus

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

func TestHold(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const limit = time.Second
	kA, kB, kC := k(volA, "n1"), k(volB, "n1"), k(volC, "n1")
	tests := []struct {
		name        string
		attachments []cache.Attachment
		listed      []v1.AttachedVolume // what node status lists
		calls       int                 // attach calls under way on n1
		dirty       bool                // node.status seen listing what is not reported
		handingOver bool
		want        time.Duration
	}{
		{name: "an addition while a VolumeAttachment is not attached yet waits",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain}},
			want:        limit},
		{name: "an addition while an attach call is under way waits",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}},
			calls:       1,
			want:        limit},
		{name: "nothing under way: written at once",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Attached}},
			listed:      []v1.AttachedVolume{av(volB, "")}},
		{name: "an attach that failed is not waited for",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain, AttachError: "refused"}}},
		{name: "an attachment whose detach started is not waited for",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain, DetachStarted: t0}}},
		{name: "a withdrawal goes at once, additions with it",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Attached, Withdrawn: true}, {Key: kC, State: cache.Uncertain}},
			listed:      []v1.AttachedVolume{av(volB, "")},
			calls:       1},
		{name: "a volume no longer attached leaves the report at once",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain}},
			listed:      []v1.AttachedVolume{av(volB, "")},
			calls:       1},
		{name: "a volume listed with no attachment on record leaves the report at once",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain}},
			listed:      []v1.AttachedVolume{av(volC, "")},
			calls:       1},
		{name: "nothing to add: nothing waits",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain}},
			listed:      []v1.AttachedVolume{av(volA, "")}},
		{name: "a correction of node.status goes at once",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain}},
			dirty:       true},
		{name: "during a handoff nothing waits",
			attachments: []cache.Attachment{{Key: kA, State: cache.Attached}, {Key: kB, State: cache.Uncertain}},
			handingOver: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := cache.NewActualState()
			a.SetNode("n1", cache.NodeInfo{Exists: true, ResourceVersion: "1"}, time.Time{})
			for _, at := range tt.attachments {
				a.Update(at.Key, true, set(at))
			}
			r := NewRecord(a)
			r.Recover("n1", tt.listed)
			for range tt.calls {
				r.StartAttach("n1")
			}
			if tt.dirty {
				r.mu.Lock()
				r.nodeLocked("n1").dirty = true
				r.mu.Unlock()
			}
			if tt.handingOver {
				r.HandOver()
			}
			if got := r.Hold("n1", t0, limit); got != tt.want {
				t.Errorf("Hold = %v, want %v", got, tt.want)
			}
			if got := r.Hold("n1", t0, 0); got != 0 {
				t.Errorf("Hold with no limit = %v, want 0", got)
			}
		})
	}
}

// A write waits at most the limit from the first time it waited; the end of
// an attach call tells the caller a write waits; a write ends the wait.
func TestHoldLimit(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const limit = time.Second
	a := cache.NewActualState()
	a.SetNode("n1", cache.NodeInfo{Exists: true, ResourceVersion: "1"}, time.Time{})
	a.Update(k(volA, "n1"), true, set(cache.Attachment{State: cache.Attached}))
	r := NewRecord(a)
	r.StartAttach("n1")
	r.StartAttach("n1")
	if got := r.Hold("n1", t0, limit); got != limit {
		t.Fatalf("Hold = %v, want %v", got, limit)
	}
	if got := r.Hold("n1", t0.Add(300*time.Millisecond), limit); got != 700*time.Millisecond {
		t.Errorf("Hold 300ms later = %v, want 700ms", got)
	}
	if !r.EndAttach("n1") {
		t.Error("EndAttach = false while a write waits, want true")
	}
	if got := r.Hold("n1", t0.Add(400*time.Millisecond), limit); got != 600*time.Millisecond {
		t.Errorf("Hold with one call still under way = %v, want 600ms", got)
	}
	if got := r.Hold("n1", t0.Add(limit), limit); got != 0 {
		t.Errorf("Hold at the limit = %v, want 0", got)
	}
	if r.EndAttach("n1") {
		t.Error("EndAttach = true once the wait is over, want false")
	}

	// A withdrawal during a wait ends it: written at once.
	r.StartAttach("n1")
	if got := r.Hold("n1", t0.Add(2*time.Second), limit); got != limit {
		t.Fatalf("Hold of a new wait = %v, want %v", got, limit)
	}
	a.Update(k(volB, "n1"), true, set(cache.Attachment{State: cache.Attached, Withdrawn: true}))
	r.Recover("n1", []v1.AttachedVolume{av(volB, "")})
	if got := r.Hold("n1", t0.Add(2100*time.Millisecond), limit); got != 0 {
		t.Errorf("Hold with a withdrawal = %v, want 0", got)
	}
	if r.EndAttach("n1") {
		t.Error("EndAttach = true after a withdrawal ended the wait, want false")
	}
	// Wanted again: listed, nothing to remove.
	a.Update(k(volB, "n1"), false, set(cache.Attachment{State: cache.Attached}))

	// A new wait starts from its own first time; a write ends it.
	r.StartAttach("n1")
	t1 := t0.Add(5 * time.Second)
	if got := r.Hold("n1", t1, limit); got != limit {
		t.Errorf("Hold of a new wait = %v, want %v", got, limit)
	}
	want, changed := r.Begin("n1")
	if !changed || len(want) != 2 {
		t.Fatalf("Begin = %v, %v; want a write of %s and %s", want, changed, volA, volB)
	}
	r.End("n1", want, true)
	if r.EndAttach("n1") {
		t.Error("EndAttach = true after a write, want false")
	}
	r.mu.Lock()
	calls := len(r.attachCalls)
	r.mu.Unlock()
	if calls != 0 {
		t.Errorf("%d nodes with attach calls under way after every call ended, want 0", calls)
	}
	if got := r.Hold("unknown", t1, limit); got != 0 {
		t.Errorf("Hold of an unknown node = %v, want 0", got)
	}
}
