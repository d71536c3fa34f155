package shadow

import (
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
)

// Observation is a decision taken by a controller that watches and does not
// act, with the detach rule's verdict on a volume no pod wants.
type Observation struct {
	reconciler.Decision
	// Wait, for a volume no pod wants on the node, says why it would not be
	// detached now (still mounted on a healthy node, the max wait for
	// unmount not over); empty when it would be.
	Wait string
	// WaitAfter, with Wait, is when the wait may end by itself (the max
	// wait for unmount); zero: only a change of the node ends it.
	WaitAfter time.Duration
	// HeldElsewhere, for a single-node volume a pod wants on the node,
	// lists the other nodes that hold it, attached there or not: where it
	// is attached here too, it should not have been.
	HeldElsewhere []cache.Key
}

// Observe decides as the reconciler's Sync does and keeps the one record
// Sync keeps for its timers, when the detach of a volume was first wanted
// (the start of the max wait for unmount); it acts on nothing. since stands
// for that time when the actual state no longer holds the volume (the
// other controller detached it); zero: now.
func Observe(r *reconciler.Reconciler, actual *cache.ActualState, k cache.Key, now, since time.Time) Observation {
	d := r.Decide(k, now)
	o := Observation{Decision: d}
	if d.Desired || r.Wanted(k) {
		if d.Spec != nil {
			o.HeldElsewhere = r.HeldElsewhere(d.Spec, k.Node)
		}
		if d.HasAttachment && !d.Attachment.DetachWanted.IsZero() {
			actual.Update(k, false, func(a *cache.Attachment) { a.DetachWanted = time.Time{} })
		}
		r.NoteHeld(k, false)
		return o
	}
	if d.HasAttachment {
		since = d.Attachment.DetachWanted
		if since.IsZero() {
			since = now
			actual.Update(k, false, func(a *cache.Attachment) {
				if a.DetachWanted.IsZero() {
					a.DetachWanted = now
				}
			})
		}
	}
	if since.IsZero() {
		since = now
	}
	v := r.DetachVerdict(k, since, now)
	o.WaitAfter, o.Wait, o.HeldIn = v.After, v.Wait, v.HeldIn
	r.NoteHeld(k, v.HeldIn != nil)
	return o
}
