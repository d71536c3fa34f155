package reconciler

import (
	"fmt"
	"strings"
	"time"

	"github.com/kube-attach/attach-detach-controller/pkg/budget"
	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Action is what the reconciler does for one key.
type Action string

const (
	// Nothing: the volume is where it should be.
	Nothing Action = "nothing"
	// Attach: attach the volume (or check on an attach under way).
	Attach Action = "attach"
	// Withdraw: take the volume out of node.status.volumesAttached, the
	// first step of a detach.
	Withdraw Action = "withdraw"
	// Detach: start the detach.
	Detach Action = "detach"
	// Wait: something outside must happen first (an unmount, an attacher, a
	// node status write, the max wait for unmount).
	Wait Action = "wait"
	// Blocked: the volume can't be attached until something changes
	// (single-node access, undecided mechanism).
	Blocked Action = "blocked"
	// Settle: a pod wants the volume again on a node where a detach of it
	// started and has an unknown outcome: what became of that detach is
	// read from the API (or, for an in-tree volume, the volume is attached
	// again), and recorded.
	Settle Action = "settle"
	// Confirm: no pod wants the volume on a node that is not Ready, or is
	// gone, where its attachment has an unknown outcome and no
	// VolumeAttachment of it was seen: whether one exists is read from the
	// API; none, nothing is attached there, and the record goes, with no
	// wait for the max wait for unmount.
	Confirm Action = "confirm"
)

// Force reasons, as the forced detach metric labels them.
const (
	ForceTimeout      = "timeout"
	ForceOutOfService = "out-of-service"
)

// Decision is the reconciler's verdict on one key, and the reason for it in
// words a user can act on.
type Decision struct {
	Key    cache.Key
	Action Action
	Reason string
	// After, with Wait, is when to look again (the max wait for unmount).
	After time.Duration
	// Force, with Withdraw or Detach, says why a mounted volume is detached.
	Force string
	// Desired: some pod wants the volume here; Spec and Pods say what and who.
	Desired bool
	Spec    *volume.Spec
	Pods    []cache.PodRef
	// Attachment is the actual state, when there is one.
	Attachment    cache.Attachment
	HasAttachment bool
	// Elsewhere lists the other nodes holding a single-node volume.
	Elsewhere []cache.Key
	// HeldIn, with Wait: the forced detach by timeout is held while this
	// zone is disrupted (ZoneDisrupted).
	HeldIn *cache.ZoneHealth
	// Unread, with Wait: the volume is not known to be unwanted yet, pods
	// remain to be read after a restart (DesiredState.Partial).
	Unread bool
}

func (d Decision) String() string {
	return fmt.Sprintf("%s: %s", d.Action, d.Reason)
}

// Decide composes the answer to "what should happen to volume V on node N,
// and why is it not attached (or detached) right now". It reads the caches
// only and changes nothing.
func (r *Reconciler) Decide(k cache.Key, now time.Time) Decision {
	d := Decision{Key: k}
	d.Attachment, d.HasAttachment = r.actual.Get(k)
	node, known := r.actual.Node(k.Node)
	if known && node.Exists && !node.Managed {
		return d.with(Nothing, "node %s is not managed by this controller (no %s annotation)", k.Node, "volumes.kubernetes.io/controller-managed-attach-detach")
	}
	// What pods want on a node counts only while it exists (it is managed
	// from here on).
	spec, pods, wanted := r.desired.Get(k)
	if wanted && !(known && node.Exists) {
		if !d.HasAttachment {
			return d.with(Nothing, "pod %s wants it on node %s, which does not exist", pods[0], k.Node)
		}
	} else {
		d.Spec, d.Pods, d.Desired = spec, pods, wanted
	}
	if d.HasAttachment && !d.Attachment.DetachStarted.IsZero() && d.Attachment.State != cache.Detaching {
		// A detach was started and its outcome is unknown (its call
		// failed, or raced another delete): it is settled before the
		// volume is attached or reported again.
		if d.Desired {
			return r.decideSettle(d)
		}
		// No pod on the node wants it: the detach is finished. The volume
		// may still be attached, and the node may have come back and
		// mounted it since: each try is decided again under the detach
		// rules, as the first was.
		if r.status.Pending(k) {
			return d.with(Wait, "a detach from node %s started; waiting for node status to stop listing the volume", k.Node)
		}
		if wait := r.detachRules(&d, node, now); wait != "" {
			if unseenOnUnhealthyNode(d.Attachment, node) {
				return d.with(Confirm, "a detach from node %s started and did not finish, and no VolumeAttachment of it is seen: reading from the API whether one exists (none: nothing to detach); else %s", k.Node, wait)
			}
			return d.with(Wait, "a detach from node %s started and did not finish; %s", k.Node, wait)
		}
		return d.with(Detach, "finishing the detach from node %s that started", k.Node)
	}
	if d.HasAttachment && d.Attachment.State == cache.Detaching && d.Attachment.Kind == volume.KindCSI &&
		d.Attachment.AttachmentUID == "" && !d.Attachment.DetachStarted.IsZero() {
		// Its delete was accepted and its object never seen: no event will
		// say it is gone (its create and delete reached one sync). The API
		// is asked again.
		return d.with(Detach, "confirming with the API that the VolumeAttachment is gone")
	}
	if d.Desired {
		return r.decideAttach(d, now)
	}
	return r.decideDetach(d, node, now)
}

// decideSettle decides for a pod that wants the volume again on a node
// where its detach started and has an unknown outcome. Finishing that
// detach would wait for the volume to leave the node's volumesInUse, where
// kubelet lists a volume a pod wants before it is attached: it would never
// finish, and the volume never come back. What became of the detach is
// settled instead (kube-controller-manager puts a volume whose detach
// failed back as attached and reported): a VolumeAttachment the API shows
// not being deleted was not detached, so the volume is attached as before
// and listed again; one being deleted is waited for; one gone is attached
// anew. The API is read, not the informer's copy, which may predate the
// delete. An in-tree detach leaves nothing to read: the volume is attached
// again (attaches are idempotent), unless another node holds it.
func (r *Reconciler) decideSettle(d Decision) Decision {
	k, a := d.Key, d.Attachment
	if a.Kind == volume.KindCSI || (a.Kind == "" && kindOfName(a.Volume) == volume.KindCSI) {
		return d.with(Settle, "pod %s wants it again on node %s, where its detach started with an unknown outcome: reading its VolumeAttachment from the API to settle it", d.Pods[0], k.Node)
	}
	if elsewhere := singleNodeAccessConflict(d.Spec, k.Node, r.actual); len(elsewhere) > 0 {
		d.Elsewhere = elsewhere
		return d.with(Blocked, "volume is already exclusively attached to node %s, waiting on detach before it can be attached to another node", nodesOf(elsewhere))
	}
	return d.with(Settle, "pod %s wants it again on node %s, where its detach started with an unknown outcome: attaching it again to settle it", d.Pods[0], k.Node)
}

func (r *Reconciler) decideAttach(d Decision, now time.Time) Decision {
	k := d.Key
	if d.HasAttachment {
		switch d.Attachment.State {
		case cache.Attached:
			return d.with(Nothing, "attached")
		case cache.Detaching:
			return d.with(Wait, "a detach from node %s is still in progress; the volume is attached again once it completes", k.Node)
		}
		if a := d.Attachment; a.Kind != volume.KindCSI || a.AttachmentUID == "" {
			// An attach of unknown outcome whose object is not seen (or
			// an in-tree one, or one recovered from node status alone):
			// trying again may attach it anew, so not while another node
			// holds it (someone else deleted its VolumeAttachment and it
			// was attached elsewhere meanwhile).
			if elsewhere := singleNodeAccessConflict(d.Spec, k.Node, r.actual); len(elsewhere) > 0 {
				d.Elsewhere = elsewhere
				return d.with(Blocked, "volume is already exclusively attached to node %s, waiting on detach before it can be attached to another node", nodesOf(elsewhere))
			}
		}
		if a := d.Attachment; a.Kind == volume.KindCSI && a.AttachmentUID != "" && a.AttachError == "" && attachTimedOut(a, now) {
			return d.with(Attach, "attach in progress for %s: %s (VolumeAttachment %s not attached, no error reported)",
				now.Sub(a.AttachStarted).Round(time.Second), attachTimeoutMessage(d.Spec), a.AttachmentName)
		}
		return d.with(Attach, "attach in progress")
	}
	for _, alias := range d.Spec.Aliases {
		if a, ok := r.actual.Get(cache.Key{Volume: alias, Node: k.Node}); ok && a.State != cache.Detaching {
			return d.with(Nothing, "attached as %s by the %s mechanism", alias, a.Kind)
		}
	}
	if d.Spec.Pending != "" {
		return d.with(Blocked, "%s", d.Spec.Pending)
	}
	if elsewhere := singleNodeAccessConflict(d.Spec, k.Node, r.actual); len(elsewhere) > 0 {
		d.Elsewhere = elsewhere
		return d.with(Blocked, "volume is already exclusively attached to node %s, waiting on detach before it can be attached to another node", nodesOf(elsewhere))
	}
	return d.with(Attach, "not attached yet")
}

func (r *Reconciler) decideDetach(d Decision, node cache.NodeInfo, now time.Time) Decision {
	k := d.Key
	if !d.HasAttachment {
		return d.with(Nothing, "neither wanted nor attached")
	}
	if r.Wanted(k) {
		return d.with(Nothing, "wanted under another name by a pod on node %s", k.Node)
	}
	if d.Attachment.State != cache.Detaching && r.desired.Partial() {
		// Every key gets a look once the last pod is read (Recovery.Finish).
		if a := d.Attachment; r.actual.HandingOver() && handoffFinishesAttach(a, r.actual) {
			d.Spec = a.Spec
			return d.with(Attach, "finishing, before handing over, the attach started on node %s: pods that may want it remain to be read", k.Node)
		}
		d.Unread = true
		return d.with(Wait, "reading every pod after the controller started before deciding no pod on node %s wants it", k.Node)
	}
	if d.Attachment.State == cache.Detaching {
		if d.Attachment.DetachError != "" {
			return d.with(Wait, "detach in progress, last error: %s", d.Attachment.DetachError)
		}
		return d.with(Wait, "detach in progress")
	}
	if wait := r.detachRules(&d, node, now); wait != "" {
		if d.Attachment.State == cache.Uncertain && unseenOnUnhealthyNode(d.Attachment, node) {
			return d.with(Confirm, "attach of unknown outcome, no VolumeAttachment of it seen: reading from the API whether one exists (none: nothing to detach); else %s", wait)
		}
		return d.with(Wait, "%s", wait)
	}
	if !d.Attachment.Withdrawn {
		// Every detach is withdrawn first, listed or not: the end of a
		// node status write then re-queues it, whatever that write was.
		return d.with(Withdraw, "no pod wants it; removing it from node %s status before the detach", k.Node)
	}
	if r.status.Pending(k) {
		return d.with(Wait, "waiting for node %s status to stop listing the volume before the detach", k.Node)
	}
	return d.with(Detach, "no pod wants it")
}

// unseenOnUnhealthyNode reports whether a is a CSI attachment, not being
// detached, no VolumeAttachment of which is seen (an attach whose object
// was never shown, or whose object a third party deleted before a create
// again failed; one known from node status alone after a restart; a detach
// whose object went), on a node that is not Ready or is gone, so that the
// detach rules would hold it for the max wait for unmount. A detach would
// only delete its VolumeAttachment, if there is one: the external-attacher
// unpublishes the volume before it lets a VolumeAttachment go (its
// finalizer), so when the API has none there, the volume is not attached
// there, and waiting protects nothing; it only keeps a single-node volume
// from a pod on another node for as long. The API is asked (Confirm): the
// informer may not show an object yet (a create whose answer was lost).
// An in-tree attachment has no object to ask about: it waits. So does one
// whose create of the controller's own got no answer (CreatedUnknown): the
// API server may still carry it out after the GET (a timeout answers
// before the write is done), and the object would land on the node, its
// volume attached there, after the record went and the volume was given
// to another node (kube-controller-manager also holds an attach that
// failed as uncertain for the max wait for unmount).
func unseenOnUnhealthyNode(a cache.Attachment, node cache.NodeInfo) bool {
	kind := a.Kind
	if kind == "" {
		kind = kindOfName(a.Volume)
	}
	return kind == volume.KindCSI && a.State != cache.Detaching && a.AttachmentUID == "" && a.CreatedUID != cache.CreatedUnknown &&
		!node.Healthy() && !node.Unread()
}

// Wanted reports whether some pod on k's node wants the volume k names,
// under its primary name or as an alias (the same volume attached by another
// mechanism), and the node is managed and exists: what pods want elsewhere
// does not count. A wanted attachment is never detached.
func (r *Reconciler) Wanted(k cache.Key) bool {
	if n, ok := r.actual.Node(k.Node); !ok || !n.Exists || !n.Managed {
		return false
	}
	return r.desired.Wanted(k)
}

// Rank says how soon the key's work is wanted, as the queues hand it out
// and the API budget serves its requests (budget.Move first, then
// budget.Attach, then budget.Other):
//
//   - budget.Move: a pod waits for a volume that changes nodes: the detach
//     of the single-node volume at k that a pod on another node wants
//     (awaited), or, at the new node, its attach and announcement until the
//     node's status lists it (moving). A move goes before a burst of new
//     attaches: its pod was running, and each of its steps would otherwise
//     queue behind the whole burst again.
//   - budget.Attach: a pod wants the volume here (a new attach).
//   - budget.Other: no pod waits (a teardown).
//
// The urgency of the waiting pod reaches every key it waits for, for as
// long as it waits, derived from both states at each add; the one fact
// kept, that the key waited for a detach elsewhere (MarkWaited), lasts as
// long as its pods want the volume.
func (r *Reconciler) Rank(k cache.Key) int {
	if r.Wanted(k) {
		if r.moving(k) {
			return budget.Move
		}
		return budget.Attach
	}
	if r.awaited(k) {
		return budget.Move
	}
	return budget.Other
}

// moving reports whether the single-node volume desired at k is on its way
// from another node: still held there, or held there before
// (DesiredState.Waited), and not listed in k's node status yet.
func (r *Reconciler) moving(k cache.Key) bool {
	spec, ok := r.desired.Spec(k)
	if !ok || !spec.SingleNode || r.status.IsListed(k) {
		return false
	}
	return r.desired.Waited(k) || len(singleNodeAccessConflict(spec, k.Node, r.actual)) > 0
}

// awaited reports whether the single-node volume attached at k is wanted by
// a pod on another node, under any of its names.
func (r *Reconciler) awaited(k cache.Key) bool {
	a, ok := r.actual.Get(k)
	if !ok || (a.Spec != nil && !a.Spec.SingleNode) {
		// A volume several nodes share waits for no detach: its pods
		// elsewhere (a DaemonSet's, on every node) are not read.
		return false
	}
	names := []volume.Name{k.Volume}
	if a.Spec != nil {
		names = append(names, a.Spec.OtherNames(k.Volume)...)
	}
	for _, name := range names {
		for _, w := range r.desired.KeysFor(name) {
			if w.Node == k.Node {
				continue
			}
			if spec, ok := r.desired.Spec(w); ok && spec.SingleNode && r.Wanted(w) {
				return true
			}
		}
	}
	return false
}

// NodeRank is Rank for the write of node's status: budget.Move when it
// takes out a volume a pod elsewhere waits for (the first step of a move)
// or adds a moved one (its last); budget.Attach when it adds a volume;
// budget.Other otherwise.
func (r *Reconciler) NodeRank(node string) int {
	for _, k := range r.actual.WithdrawnOn(node) {
		if r.awaited(k) {
			return budget.Move
		}
	}
	for _, k := range r.desired.WaitedOn(node) {
		if a, ok := r.actual.Get(k); ok && a.State == cache.Attached && r.moving(k) {
			return budget.Move
		}
	}
	if r.status.Adds(node) {
		return budget.Attach
	}
	return budget.Other
}

func (d Decision) with(a Action, format string, args ...any) Decision {
	d.Action = a
	d.Reason = fmt.Sprintf(format, args...)
	return d
}

func nodesOf(keys []cache.Key) string {
	names := make([]string, 0, len(keys))
	for _, k := range keys {
		names = append(names, k.Node)
	}
	return strings.Join(names, ", ")
}

// DetachVerdict applies the detach rule (safeToDetach) to the volume at k
// as the actual state knows its node now, its max wait for unmount counted
// from since: for a controller that decides and does not act (shadow mode),
// and for a volume the actual state may no longer hold.
func (r *Reconciler) DetachVerdict(k cache.Key, since, now time.Time) Verdict {
	node, _ := r.actual.Node(k.Node)
	return safeToDetach(k, node, since, now, r.cfg, r.zone(node, now))
}

// HeldElsewhere returns where a single-node volume of spec is held on
// other nodes than node (singleNodeAccessConflict).
func (r *Reconciler) HeldElsewhere(spec *volume.Spec, node string) []cache.Key {
	return singleNodeAccessConflict(spec, node, r.actual)
}

// zone returns the health of node's zone, asked for only when a forced
// detach by timeout is due.
func (r *Reconciler) zone(node cache.NodeInfo, now time.Time) func() cache.ZoneHealth {
	return func() cache.ZoneHealth { return r.actual.NodeZone(node.Zone, now, r.cfg.ZoneRule()) }
}

// detachRules applies safeToDetach to the attachment of d, its max wait
// counted from when its detach was first wanted: it returns the reason to
// wait (with d.After and d.HeldIn set), or "" with d.Force set.
func (r *Reconciler) detachRules(d *Decision, node cache.NodeInfo, now time.Time) string {
	wanted := d.Attachment.DetachWanted
	if wanted.IsZero() {
		wanted = now
	}
	v := safeToDetach(d.Key, node, wanted, now, r.cfg, r.zone(node, now))
	d.After, d.HeldIn, d.Force = v.After, v.HeldIn, v.Force
	return v.Wait
}
