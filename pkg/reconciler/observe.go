package reconciler

import (
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
)

// Observation is a decision taken by a controller that watches and does not
// act (shadow mode), with the safety rule's verdict on a detach.
type Observation struct {
	Decision
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

// Observe decides as Sync does and keeps the one record Sync keeps for its
// timers, when the detach of a volume was first wanted (the start of the max
// wait for unmount); it acts on nothing. since stands for that time when the
// actual state no longer holds the volume (someone else detached it); zero:
// now.
func (r *Reconciler) Observe(k cache.Key, now, since time.Time) Observation {
	d := r.Decide(k, now)
	o := Observation{Decision: d}
	if d.Desired || r.Wanted(k) {
		if d.Spec != nil {
			o.HeldElsewhere = singleNodeAccessConflict(d.Spec, k.Node, r.actual)
		}
		if d.HasAttachment && !d.Attachment.DetachWanted.IsZero() {
			r.actual.Update(k, false, func(a *cache.Attachment) { a.DetachWanted = time.Time{} })
		}
		r.noteHeld(k, false)
		return o
	}
	if d.HasAttachment {
		since = d.Attachment.DetachWanted
		if since.IsZero() {
			since = now
			r.actual.Update(k, false, func(a *cache.Attachment) {
				if a.DetachWanted.IsZero() {
					a.DetachWanted = now
				}
			})
		}
	}
	if since.IsZero() {
		since = now
	}
	node, _ := r.actual.Node(k.Node)
	v := safeToDetach(k, node, since, now, r.cfg, r.zone(node, now))
	o.WaitAfter, o.Wait, o.HeldIn = v.After, v.Wait, v.HeldIn
	r.noteHeld(k, v.HeldIn != nil)
	return o
}
