// Package reconciler decides and acts, one volume on one node at a time.
//
// Sync(key) compares the desired and actual state of that key, applies the
// safety rules (rules.go: one function per rule), and then asks the volume's
// mechanism to attach or detach. It never waits for an outcome: mechanisms
// that work asynchronously (CSI: the external-attacher acts on a
// VolumeAttachment) report back through the actual state, which re-queues
// the key. Timers are returned as Result.RequeueAfter, never slept on.
package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
	"github.com/kube-attach/attach-detach-controller/pkg/nodestatus"
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Mechanism attaches and detaches volumes of one kind. Two implementations
// exist: CSI (VolumeAttachment objects) and in-tree attacher plugins.
type Mechanism interface {
	// Attach attaches spec to node, or starts or checks an attach that
	// completes later. It is idempotent.
	Attach(ctx context.Context, spec *volume.Spec, node string) (AttachResult, error)
	// Detach detaches a, or starts doing so; done is true once it is detached.
	Detach(ctx context.Context, a cache.Attachment) (done bool, err error)
	// Settle says what became of the detach of a that started and whose
	// outcome is unknown (its call failed, or raced another delete), for a
	// pod on a's node that wants the volume (spec) again: from what the
	// API shows now, or, where nothing shows it, by attaching the volume
	// again. It never detaches. The CSI mechanism only reads: it also
	// says whether the VolumeAttachment of an attachment of unknown
	// outcome exists (Confirm; spec nil).
	Settle(ctx context.Context, a cache.Attachment, spec *volume.Spec) (Settled, error)
}

// Settled is what became of a detach whose outcome was unknown
// (Mechanism.Settle).
type Settled struct {
	// Detached: the volume is detached (its VolumeAttachment is gone).
	Detached bool
	// Detaching: the detach is under way (its VolumeAttachment is being
	// deleted).
	Detaching bool
	// Otherwise the detach did not happen: the volume is attached
	// (Attached, with DevicePath), or its attach is under way.
	Attached   bool
	DevicePath string
	// UID is the VolumeAttachment's, for the CSI mechanism.
	UID string
	// Error is the attacher's last error on it: its attach error, or its
	// detach error while Detaching.
	Error string
}

// AttachResult is what an attach call learned.
type AttachResult struct {
	// Attached is true when the volume is attached now.
	Attached   bool
	DevicePath string
	// AttachmentName names the VolumeAttachment of a CSI attach.
	AttachmentName string
	// Created: the call asked the API to create the VolumeAttachment,
	// whatever the answer; UID is the created object's, when the answer
	// came. The object under that name, if any, may be one no informer
	// event has shown yet.
	Created bool
	UID     string
	// Refused: the API answered the create with a refusal (the request
	// was invalid, forbidden or throttled): no object of it exists, and
	// none will land later, unlike after a timeout or a lost answer.
	Refused bool
}

// AttachError is an error the attacher reported for the volume (for CSI,
// VolumeAttachment.status.attachError): the attach is under way and failing.
type AttachError struct{ Message string }

func (e *AttachError) Error() string { return e.Message }

// NotAttachedError is an attach failure after which the volume is known not
// to be attached anywhere (the mechanism did nothing), as opposed to one whose
// outcome is unknown.
type NotAttachedError struct{ Err error }

func (e *NotAttachedError) Error() string { return e.Err.Error() }
func (e *NotAttachedError) Unwrap() error { return e.Err }

// Config holds the safety settings.
type Config struct {
	// MaxWaitForUnmount is how long a volume still mounted on an unhealthy
	// node is waited for before it is detached anyway.
	MaxWaitForUnmount time.Duration
	// MaxWaitForUnmountDeletedNode, when set, replaces MaxWaitForUnmount
	// for a node whose Node object is gone (deleted, or absent when the
	// controller started): where a deleted Node means the machine is gone,
	// its volumes may be detached sooner (0: at once).
	MaxWaitForUnmountDeletedNode *time.Duration
	// DisableForceDetachOnTimeout keeps mounted volumes of unhealthy nodes
	// attached however long it takes (the out-of-service taint still works).
	DisableForceDetachOnTimeout bool
	// UnhealthyZoneThreshold and UnhealthyZoneMinNodes say when a zone is
	// disrupted (ZoneDisrupted): its forced detaches by timeout are then
	// held. A threshold of 0 turns the guard off.
	UnhealthyZoneThreshold float64
	UnhealthyZoneMinNodes  int
	// Clock tells the time; nil: the real clock.
	Clock clock.PassiveClock
}

// Result tells the caller what to schedule after a Sync.
type Result struct {
	// RequeueAfter, when not zero, asks to sync the key again after it.
	RequeueAfter time.Duration
	// WriteNodeStatus asks for the node's status report to be rewritten.
	WriteNodeStatus bool
	// Detached says the volume's detach from the key's node completed
	// within the call: its keys on every node (a pod elsewhere may wait for
	// it) must be synced again.
	Detached bool
	// Wake lists keys to sync again: they found the volume busy while this
	// call held it.
	Wake []cache.Key
	// Awaited lists the nodes whose status write the key now waits for (a
	// move's withdrawal from the node holding the volume): queued again,
	// a write queued before anybody waited for it is ranked anew (Rank).
	Awaited []string
}

// Reconciler drives the actual state towards the desired state.
type Reconciler struct {
	desired *cache.DesiredState
	actual  *cache.ActualState
	// status is what node status lists: a detach starts only once it no
	// longer may (BeginDetach).
	status     *nodestatus.Record
	mechanisms map[volume.Kind]Mechanism
	recorder   record.EventRecorder
	metrics    *metrics.Metrics
	cfg        Config
	now        func() time.Time

	// told remembers, per key and pod, the last warning posted, so that each
	// is posted once and not at every retry.
	mu   sync.Mutex
	told map[cache.Key]map[string]string

	locks volumeLocks

	// held lists the keys whose forced detach is held by a disrupted zone
	// (the gauge ForcedDetachesHeld); heldCount spares the others the lock.
	held      map[cache.Key]bool
	heldCount atomic.Int64

	// syncing counts the Syncs under way: one may be waiting on the answer
	// of an attach or detach call whose outcome no cache holds yet.
	syncing atomic.Int64
}

// Syncing is how many Syncs are under way. A VolumeAttachment created by
// one of them is in no cache until its answer comes or its informer
// delivers it: a handoff is not done while one is.
func (r *Reconciler) Syncing() int { return int(r.syncing.Load()) }

// New returns a Reconciler. status is the record of actual's node statuses;
// mechanisms maps each volume kind to the mechanism that attaches it.
func New(desired *cache.DesiredState, actual *cache.ActualState, status *nodestatus.Record, mechanisms map[volume.Kind]Mechanism,
	recorder record.EventRecorder, m *metrics.Metrics, cfg Config) *Reconciler {
	now := time.Now
	if cfg.Clock != nil {
		now = cfg.Clock.Now
	}
	return &Reconciler{
		desired:    desired,
		actual:     actual,
		status:     status,
		mechanisms: mechanisms,
		recorder:   recorder,
		metrics:    m,
		cfg:        cfg,
		now:        now,
		told:       map[cache.Key]map[string]string{},
		held:       map[cache.Key]bool{},
	}
}

// NoteHeld records whether the forced detach of the volume at k is held by
// a disrupted zone, as its last decision says, for the gauge
// ForcedDetachesHeld.
func (r *Reconciler) NoteHeld(k cache.Key, held bool) {
	if !held && r.heldCount.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if held == r.held[k] {
		return
	}
	if held {
		r.held[k] = true
	} else {
		delete(r.held, k)
	}
	r.heldCount.Store(int64(len(r.held)))
	r.metrics.ForcedDetachesHeld.Set(float64(len(r.held)))
}

// Sync reconciles one volume on one node.
//
// An attach of a single-node volume decides and acts under that volume's
// lock (exclusive.go): a decision is taken again whenever the lock it needs
// is not the one held. A key that finds the lock taken does nothing: the
// holder's Result.Wake hands it back.
func (r *Reconciler) Sync(ctx context.Context, k cache.Key) (res Result, err error) {
	r.syncing.Add(1)
	defer r.syncing.Add(-1)
	logger := klog.FromContext(ctx)
	var held volume.Name
	var wake []cache.Key
	defer func() {
		if held != "" {
			wake = append(wake, r.locks.unlock(held)...)
		}
		res.Wake = append(res.Wake, wake...)
	}()
	for {
		now := r.now()
		d := r.Decide(k, now)
		if name := exclusiveName(d); name != held {
			if held != "" {
				wake = append(wake, r.locks.unlock(held)...)
				held = ""
			}
			if name != "" && !r.locks.tryLock(name, k) {
				logger.V(4).Info("Volume busy on another node; synced again when that is done")
				return Result{}, nil
			}
			held = name
			continue
		}
		logger.V(4).Info("Decided", "action", d.Action, "reason", d.Reason)
		r.NoteHeld(k, d.HeldIn != nil)
		return r.act(ctx, d, now, true)
	}
}

// act carries out decision d. again allows one more decision in the same
// call, after a withdraw that needs no node status write.
func (r *Reconciler) act(ctx context.Context, d Decision, now time.Time, again bool) (Result, error) {
	logger := klog.FromContext(ctx)
	k := d.Key
	if r.actual.HandingOver() && !handoffContinues(d) {
		logger.V(2).Info("Handing over: left to the next controller", "action", d.Action, "reason", d.Reason)
		return Result{}, nil
	}
	switch d.Action {
	case Nothing:
		return r.settle(d), nil
	case Attach:
		return r.attach(ctx, d, now)
	case Blocked:
		if len(d.Elsewhere) > 0 {
			// A move: its pods wait until the volume is listed here
			// (Rank).
			r.desired.MarkWaited(k)
			r.warnWaitingForDetach(d)
			// The other node's detach re-queues this key.
			var res Result
			for _, e := range d.Elsewhere {
				res.Awaited = append(res.Awaited, e.Node)
			}
			return res, nil
		}
		// The mechanism is undecided: retry with backoff; the arrival of the
		// node's information re-queues the key at once. A driver that has
		// not registered yet on a kubelet that just started is waited for
		// quietly a while (undecidedGrace).
		if wait := undecidedGrace - now.Sub(d.Spec.PendingSince); !d.Spec.PendingSince.IsZero() && wait > 0 {
			logger.V(2).Info("Mechanism undecided: the pods are warned if it still is then", "reason", d.Spec.Pending, "after", wait)
		} else {
			r.warnOnce(d, "FailedAttachVolume", sameFor(fmt.Sprintf("AttachVolume.Attach failed for volume %q : %s", displayName(d.Spec), d.Spec.Pending)))
		}
		return Result{}, fmt.Errorf("volume %s on node %s: %s", k.Volume, k.Node, d.Reason)
	case Wait:
		if !d.Unread {
			r.markDetachWanted(d, now)
		}
		return Result{RequeueAfter: d.After}, nil
	case Withdraw:
		r.actual.Update(k, false, func(a *cache.Attachment) {
			a.Withdrawn = true
			if a.DetachWanted.IsZero() {
				a.DetachWanted = now
			}
		})
		logger.V(2).Info("Removing volume from node status before detach", "reason", d.Reason)
		if !again {
			return Result{WriteNodeStatus: true}, nil
		}
		// When node.status does not list the volume and no write is under
		// way, no write will happen and none will re-queue the key: the
		// detach starts now. Otherwise the end of the write re-queues it.
		res, err := r.act(ctx, r.Decide(k, now), now, false)
		res.WriteNodeStatus = true
		return res, err
	case Detach:
		return r.detach(ctx, d, now)
	case Settle:
		return r.settleDetach(ctx, d, now, again)
	case Confirm:
		return r.confirmGone(ctx, d, now)
	}
	return Result{}, fmt.Errorf("unknown action %q", d.Action)
}

// settle finishes a key that needs no operation: an attached volume wanted
// again (under this name or, by a pod that names it differently, as an
// alias) is put back in the node's report, and a first attach is announced.
func (r *Reconciler) settle(d Decision) Result {
	var res Result
	if !d.HasAttachment || !(d.Desired || r.Wanted(d.Key)) {
		r.forget(d.Key)
		return res
	}
	a := d.Attachment
	// A detach that started is settled first (Decide): until then it stays
	// out of the report (on a node whose management changed meanwhile, the
	// decision is Nothing).
	if a.DetachStarted.IsZero() && (a.Withdrawn || !a.DetachWanted.IsZero()) {
		r.actual.Update(d.Key, false, func(a *cache.Attachment) {
			a.Withdrawn = false
			a.DetachWanted = time.Time{}
		})
		res.WriteNodeStatus = a.Withdrawn
	}
	if d.Desired && a.State == cache.Attached && !a.Announced() {
		r.announceAttached(d)
		res.WriteNodeStatus = true
	}
	r.forget(d.Key)
	return res
}

func (r *Reconciler) attach(ctx context.Context, d Decision, now time.Time) (Result, error) {
	logger := klog.FromContext(ctx)
	spec := d.Spec
	mech, ok := r.mechanisms[spec.Kind]
	if !ok {
		return Result{}, fmt.Errorf("no mechanism attaches volumes of kind %q", spec.Kind)
	}
	// A node status write that waits for the attaches under way on the
	// node (nodestatus.Record.Hold) waits for this call too, until
	// its outcome is on record; its end queues the write, which may have
	// nothing left to wait for.
	r.status.StartAttach(d.Key.Node)
	res, err := mech.Attach(ctx, spec, d.Key.Node)
	// A mechanism sure it attached nothing (no attacher for the volume)
	// records nothing: an uncertain attachment would hold a single-node
	// volume on this node with no way to detach it.
	var notAttached *NotAttachedError
	create := err == nil || !errors.As(err, &notAttached)
	var state cache.State
	r.actual.Update(d.Key, create, func(a *cache.Attachment) {
		a.Kind = spec.Kind
		a.PluginName = spec.PluginName
		a.Spec = spec
		if res.AttachmentName != "" {
			a.AttachmentName = res.AttachmentName
		}
		if res.Created && a.AttachmentUID != res.UID {
			// The object last seen under that name is gone: the UID on
			// record no longer names what is there, and a lister that
			// has not shown the new one yet must not make it look
			// detached (syncAttachment asks the API instead).
			a.AttachmentUID = ""
		}
		if res.Created && !res.Refused {
			// Until its event is read, an object of that name the lister
			// shows may be the one before (syncAttachment). A create
			// whose answer did not come may also land later: the API
			// showing no object then proves nothing (unseenOnUnhealthyNode).
			a.CreatedUID = res.UID
			if res.UID == "" {
				a.CreatedUID = cache.CreatedUnknown
			}
		}
		// The volume was not attached when the attach was decided: an
		// attachment seen attached now completed inside the call (the
		// VolumeAttachment's informer can mark it before Attach returns).
		// It is this attach's, and is announced.
		if a.AttachStarted.IsZero() {
			a.AttachStarted = now
		}
		a.Withdrawn = false
		a.DetachWanted = time.Time{}
		if err != nil {
			a.AttachError = err.Error()
			return
		}
		a.AttachError = ""
		if res.Attached {
			a.State = cache.Attached
			a.DevicePath = res.DevicePath
		}
		state = a.State
	})
	held := r.status.EndAttach(d.Key.Node)
	if err != nil {
		r.metrics.AttachErrors.WithLabelValues(pluginLabel(spec)).Inc()
		var took time.Duration
		if a, ok := r.actual.Get(d.Key); ok && !a.AttachStarted.IsZero() {
			took = now.Sub(a.AttachStarted)
		}
		r.metrics.ObserveOperation(pluginLabel(spec), metrics.OperationAttach, spec.Migrated, false, took)
		r.warnOnce(d, "FailedAttachVolume", sameFor(fmt.Sprintf("AttachVolume.Attach failed for volume %q : %s", displayName(spec), err)))
		// The worker retries with backoff; an *AttachError stays wrapped.
		return Result{WriteNodeStatus: held}, fmt.Errorf("attach %s to node %s: %w", d.Key.Volume, d.Key.Node, err)
	}
	if !res.Attached && state != cache.Attached {
		if res.Created {
			logger.V(2).Info("Attach started", "attachment", res.AttachmentName)
		} else {
			logger.V(4).Info("Attach under way", "attachment", res.AttachmentName)
		}
		return Result{WriteNodeStatus: held, RequeueAfter: r.attachUnderWay(d, now)}, nil
	}
	a, _ := r.actual.Get(d.Key)
	d.Attachment, d.HasAttachment = a, true
	r.announceAttached(d)
	r.forget(d.Key)
	return Result{WriteNodeStatus: true}, nil
}

// An attach through a VolumeAttachment waits for events of its object.
// Two of them may never come: its object's, when someone deleted it before
// the informer showed it (a relist then says nothing of it), and its
// attacher's, when no external-attacher serves its driver. So the key is
// looked at again: unseenRecheck after the create while its object is not
// seen (Attach then finds it gone and creates it again), and once
// AttachTimeout has passed since the attach started, when the pod is told,
// as kube-controller-manager tells it after waiting that long.
const (
	unseenRecheck = 10 * time.Second
	AttachTimeout = 2 * time.Minute
)

// attachUnderWay warns the pods of an attach under way for AttachTimeout
// with no error reported, and returns when to look at the key again.
func (r *Reconciler) attachUnderWay(d Decision, now time.Time) time.Duration {
	a, ok := r.actual.Get(d.Key)
	if !ok || a.Kind != volume.KindCSI || a.State == cache.Attached {
		return 0
	}
	if a.AttachmentUID == "" {
		return unseenRecheck
	}
	if !attachTimedOut(a, now) {
		return a.AttachStarted.Add(AttachTimeout).Sub(now)
	}
	if a.AttachError == "" {
		r.warnOnce(d, "FailedAttachVolume", sameFor(fmt.Sprintf("AttachVolume.Attach failed for volume %q : %s", displayName(d.Spec), attachTimeoutMessage(d.Spec))))
	}
	return 0
}

// attachTimedOut reports whether the attach of a has been under way for
// AttachTimeout.
func attachTimedOut(a cache.Attachment, now time.Time) bool {
	return !a.AttachStarted.IsZero() && now.Sub(a.AttachStarted) >= AttachTimeout
}

// attachTimeoutMessage words an attach nobody acts on as
// kube-controller-manager does.
func attachTimeoutMessage(s *volume.Spec) string {
	return fmt.Sprintf("timed out waiting for external-attacher of %s CSI driver to attach volume %s", s.Driver, s.VolumeHandle)
}

func (r *Reconciler) detach(ctx context.Context, d Decision, now time.Time) (Result, error) {
	logger := klog.FromContext(ctx)
	a := d.Attachment
	kind := a.Kind
	if kind == "" {
		kind = kindOfName(a.Volume)
	}
	mech, ok := r.mechanisms[kind]
	if !ok {
		return Result{}, fmt.Errorf("no mechanism detaches volumes of kind %q", kind)
	}
	// The detach may complete (and be observed) before Detach returns: its
	// start must be on record first, and from then on no node status
	// report may list the volume.
	if !r.status.BeginDetach(d.Key, now) {
		logger.V(2).Info("Node status may list the volume again; the detach waits for the next write")
		return Result{WriteNodeStatus: true}, nil
	}
	if kind == volume.KindCSI && a.AttachmentName == "" {
		// Known from node status alone: the delete goes to the object
		// under the volume's name, whose events must find this record
		// (ByAttachmentName), its create and deletion read as one too.
		_, driver, handle := volume.Parse(a.Volume)
		a.AttachmentName = volume.AttachmentName(handle, driver, a.Node)
		r.actual.Update(d.Key, false, func(cur *cache.Attachment) {
			if cur.AttachmentName == "" {
				cur.AttachmentName = a.AttachmentName
			}
		})
	}
	if a.DetachStarted.IsZero() {
		a.DetachStarted = now
	}
	// The record as the call starts: an answer "gone" says nothing of an
	// object of that name seen since (someone created it again).
	started, _ := r.actual.Get(d.Key)
	done, err := mech.Detach(ctx, a)
	if err != nil {
		r.actual.Update(d.Key, false, func(a *cache.Attachment) { a.DetachError = err.Error() })
		r.metrics.ObserveOperation(volume.MetricPluginName(a.Volume), metrics.OperationDetach, migrated(a), false, now.Sub(a.DetachStarted))
		return Result{}, fmt.Errorf("detach %s from node %s: %w", a.Volume, a.Node, err)
	}
	if d.Force != "" {
		r.metrics.ForcedDetaches.WithLabelValues(d.Force).Inc()
		logger.Info("Forcing detach of a volume still mounted", "reason", d.Force)
	} else {
		logger.V(2).Info("Detaching volume", "reason", d.Reason)
	}
	if done {
		if !r.actual.DeleteUnchanged(d.Key, started) {
			// The record changed during the call: decided again.
			return Result{Wake: []cache.Key{d.Key}}, nil
		}
		r.metrics.ObserveOperation(volume.MetricPluginName(a.Volume), metrics.OperationDetach, migrated(a), true, now.Sub(a.DetachStarted))
		r.forget(d.Key)
		return Result{Detached: true, Wake: r.WantedUnderOtherNames(a)}, nil
	}
	r.actual.Update(d.Key, false, func(cur *cache.Attachment) {
		if cur.AttachmentUID != a.AttachmentUID && cur.AttachmentUID != "" {
			// The record follows another object of that name now (the
			// one deleted is gone, someone created it again): this
			// answer says nothing of it.
			return
		}
		cur.State = cache.Detaching
		if cur.DetachStarted.IsZero() {
			cur.DetachStarted = now
		}
	})
	return Result{}, nil
}

// settleDetach settles the detach that started at d's key, whose outcome
// is unknown, for the pod on that node that wants the volume again
// (Mechanism.Settle), and records the outcome: detached, the record goes
// (its keys are synced again, and the volume is attached anew); under way,
// it is detaching, and the VolumeAttachment's deletion, read by its
// informer, re-queues the key; otherwise the detach did not happen, and
// the volume is attached (or its attach under way) as before it, put back
// in the node's report by the next decision, which again allows in the
// same call.
func (r *Reconciler) settleDetach(ctx context.Context, d Decision, now time.Time, again bool) (Result, error) {
	logger := klog.FromContext(ctx)
	k, a := d.Key, d.Attachment
	kind := a.Kind
	if kind == "" {
		kind = kindOfName(a.Volume)
	}
	mech, ok := r.mechanisms[kind]
	if !ok {
		return Result{}, fmt.Errorf("no mechanism settles volumes of kind %q", kind)
	}
	s, err := mech.Settle(ctx, a, d.Spec)
	if err != nil {
		return Result{}, fmt.Errorf("settle the detach of %s from node %s: %w", a.Volume, a.Node, err)
	}
	if s.Detached {
		if !r.actual.DeleteUnchanged(k, a) {
			// The record changed during the call: decided again.
			return Result{Wake: []cache.Key{k}}, nil
		}
		r.metrics.ObserveOperation(volume.MetricPluginName(a.Volume), metrics.OperationDetach, migrated(a), true, now.Sub(a.DetachStarted))
		logger.V(2).Info("The detach that started is done: the volume is attached anew", "reason", d.Reason)
		return Result{Detached: true, Wake: r.WantedUnderOtherNames(a)}, nil
	}
	// Applied only to the record as it was decided on: an event read
	// during the call may say more than the answer (a delete that landed
	// since).
	if !r.actual.UpdateUnchanged(k, a, func(cur *cache.Attachment) {
		if s.UID != "" && s.UID != cur.AttachmentUID {
			// An object no informer event has shown yet (someone
			// created it again under that name since the one on
			// record): until one does, the deletion of the one
			// before, read late, proves nothing of it.
			cur.CreatedUID = s.UID
		}
		if s.UID != "" {
			cur.AttachmentUID = s.UID
		}
		if s.Detaching {
			cur.State, cur.DetachError = cache.Detaching, s.Error
			return
		}
		cur.DetachStarted, cur.DetachError, cur.AttachError = time.Time{}, "", s.Error
		if cur.Spec == nil {
			cur.Spec = d.Spec
		}
		cur.State = cache.Uncertain
		if s.Attached {
			cur.State, cur.DevicePath = cache.Attached, s.DevicePath
		}
	}) {
		return Result{Wake: []cache.Key{k}}, nil
	}
	if s.Detaching {
		logger.V(2).Info("The detach that started is under way: the volume is attached again once it is done", "reason", d.Reason)
		return Result{}, nil
	}
	logger.V(2).Info("The detach that started did not happen: the volume stays attached", "attached", s.Attached, "reason", d.Reason)
	if !again {
		return Result{Wake: []cache.Key{k}}, nil
	}
	return r.act(ctx, r.Decide(k, now), now, false)
}

// confirmGone reads from the API whether the VolumeAttachment of d's
// attachment exists (the CSI mechanism's Settle, which only reads). Gone,
// nothing is attached there: the record goes, as after a detach that
// completed within the call, and the volume's keys on other nodes are
// synced again; nothing was detached, so no detach is counted. There, the
// wait d stands for goes on (its timer, the max wait for unmount), and the
// object's events say more. An attach of unknown outcome is never
// reported, but one known from node status alone after a restart is
// listed there, as upstream lists what it recovers.
func (r *Reconciler) confirmGone(ctx context.Context, d Decision, now time.Time) (Result, error) {
	logger := klog.FromContext(ctx)
	k, a := d.Key, d.Attachment
	mech, ok := r.mechanisms[volume.KindCSI]
	if !ok {
		return Result{}, fmt.Errorf("no mechanism reads volumes of kind %q", volume.KindCSI)
	}
	s, err := mech.Settle(ctx, a, nil)
	if err != nil {
		r.markDetachWanted(d, now)
		return Result{}, fmt.Errorf("read the VolumeAttachment of %s on node %s: %w", a.Volume, a.Node, err)
	}
	if !s.Detached {
		logger.V(2).Info("A VolumeAttachment of the volume exists: the detach waits", "reason", d.Reason)
		r.markDetachWanted(d, now)
		return Result{RequeueAfter: d.After}, nil
	}
	if !r.actual.DeleteUnchanged(k, a) {
		// The record changed during the call: decided again.
		return Result{Wake: []cache.Key{k}}, nil
	}
	logger.V(2).Info("No VolumeAttachment of the volume exists on the node: nothing is attached there, nothing to detach", "reason", d.Reason)
	r.forget(k)
	// Node status may still list it (recovered from there after a
	// restart): it is written again. kubelet can't mount it meanwhile:
	// its CSI plugin waits for the VolumeAttachment to say attached.
	return Result{Detached: true, Wake: r.WantedUnderOtherNames(a), WriteNodeStatus: r.status.Pending(k)}, nil
}

// WantedUnderOtherNames returns the keys that want the volume of a, gone
// from its node, under another of its names (another spelling of the same
// disk): a single-node attach elsewhere may have waited for it.
func (r *Reconciler) WantedUnderOtherNames(a cache.Attachment) []cache.Key {
	if a.Spec == nil {
		return nil
	}
	var keys []cache.Key
	for _, name := range a.Spec.OtherNames(a.Volume) {
		keys = append(keys, r.desired.KeysFor(name)...)
	}
	return keys
}

// markDetachWanted starts the max wait for unmount the first time a volume
// nobody wants is seen attached.
func (r *Reconciler) markDetachWanted(d Decision, now time.Time) {
	if d.Desired || !d.HasAttachment || !d.Attachment.DetachWanted.IsZero() {
		return
	}
	r.actual.Update(d.Key, false, func(a *cache.Attachment) {
		if a.DetachWanted.IsZero() {
			a.DetachWanted = now
		}
	})
}

func (r *Reconciler) announceAttached(d Decision) {
	a := d.Attachment
	if !a.AttachStarted.IsZero() {
		r.metrics.ObserveOperation(pluginLabel(d.Spec), metrics.OperationAttach, d.Spec.Migrated, true, r.now().Sub(a.AttachStarted))
	}
	r.actual.Update(d.Key, false, func(a *cache.Attachment) { a.AttachStarted = time.Time{} })
	msg := fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", displayName(d.Spec))
	for _, p := range d.Pods {
		r.recorder.Event(podReference(p), v1.EventTypeNormal, "SuccessfulAttachVolume", msg)
	}
}

// warnOnce posts a Warning event to each of the key's pods, with the message
// msg gives for it, unless that pod was already told the same.
func (r *Reconciler) warnOnce(d Decision, reason string, msg func(cache.PodRef) string) {
	r.warn(d, reason, msg, "")
}

// undecidedGrace is how long after a kubelet created its CSINode a
// migrated plugin whose CSI driver has not registered there is waited for
// before the pods are warned: kubelet writes the CSINode, every translatable
// plugin listed as migrated, at start, and its drivers register a moment
// later. kube-controller-manager v1.37 reads no CSINode for them and posts
// nothing; the key still retries with backoff, and the CSINode's update
// queues it at once.
const undecidedGrace = 30 * time.Second

// waitingForDetachWarned stands for "told it waits for a detach elsewhere"
// among the messages a pod was told.
const waitingForDetachWarned = "\x00waiting-for-detach"

// warnWaitingForDetach posts the "Waiting for detach" warning to each of the
// key's pods that was not already given one, whatever it said then: its
// wording changes while the pod waits (the other pod goes, its detach has yet
// to finish), and the waiting pod is told once.
func (r *Reconciler) warnWaitingForDetach(d Decision) {
	r.warn(d, "FailedAttachVolume", r.waitingForDetachMessage(d), waitingForDetachWarned)
}

// warn posts msg to each pod not told seen before (the message itself when
// seen is empty).
func (r *Reconciler) warn(d Decision, reason string, msg func(cache.PodRef) string, seen string) {
	for _, p := range d.Pods {
		m := msg(p)
		seen := seen
		if seen == "" {
			seen = m
		}
		r.mu.Lock()
		byPod := r.told[d.Key]
		if byPod == nil {
			byPod = map[string]string{}
			r.told[d.Key] = byPod
		}
		told := byPod[p.String()+"/"+p.UID] == seen
		byPod[p.String()+"/"+p.UID] = seen
		r.mu.Unlock()
		if !told {
			r.recorder.Event(podReference(p), v1.EventTypeWarning, reason, m)
		}
	}
}

// sameFor gives every pod the same message.
func sameFor(msg string) func(cache.PodRef) string {
	return func(cache.PodRef) string { return msg }
}

func (r *Reconciler) forget(k cache.Key) {
	r.mu.Lock()
	delete(r.told, k)
	r.mu.Unlock()
}

// waitingForDetachMessage words the warning of a single-node volume held on
// another node as kube-controller-manager v1.37 does (v1.36 began it with
// "Multi-Attach error"): it names the pods that use the volume on the other
// nodes when they are in the told pod's namespace, and only counts the others.
func (r *Reconciler) waitingForDetachMessage(d Decision) func(cache.PodRef) string {
	prefix := fmt.Sprintf("Waiting for detach for volume %q ", displayName(d.Spec))
	users := r.podsElsewhere(d)
	return func(p cache.PodRef) string {
		if len(users) == 0 {
			return prefix + "Volume is already exclusively attached to one node, waiting on detach before it can be attached to another node"
		}
		var local []string
		others := 0
		for _, u := range users {
			if u.Namespace == p.Namespace {
				local = append(local, u.Name)
			} else {
				others++
			}
		}
		switch {
		case len(local) == 0:
			return prefix + fmt.Sprintf("Volume is already used by %d pod(s) in different namespaces", others)
		case others > 0:
			return prefix + fmt.Sprintf("Volume is already used by pod(s) %s and %d pod(s) in different namespaces", strings.Join(local, ", "), others)
		}
		return prefix + "Volume is already used by pod(s) " + strings.Join(local, ", ")
	}
}

// podsElsewhere returns the pods that want the volume, under any of its
// names, on the nodes in d.Elsewhere, sorted.
func (r *Reconciler) podsElsewhere(d Decision) []cache.PodRef {
	nodes := map[string]bool{}
	for _, k := range d.Elsewhere {
		nodes[k.Node] = true
	}
	seen := map[cache.PodRef]bool{}
	var pods []cache.PodRef
	for _, name := range d.Spec.AllNames() {
		for _, k := range r.desired.KeysFor(name) {
			if !nodes[k.Node] || k.Node == d.Key.Node {
				continue
			}
			_, ps, _ := r.desired.Get(k)
			for _, p := range ps {
				if !seen[p] {
					seen[p] = true
					pods = append(pods, p)
				}
			}
		}
	}
	slices.SortFunc(pods, func(a, b cache.PodRef) int {
		return strings.Compare(a.String(), b.String())
	})
	return pods
}

func podReference(p cache.PodRef) *v1.ObjectReference {
	return &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: typesUID(p.UID)}
}

// displayName is the volume name upstream's events use: the PV's name, or
// the pod volume's name for an inline volume.
func displayName(s *volume.Spec) string {
	switch {
	case s.PVName != "":
		return s.PVName
	case s.Inline != nil:
		return s.Inline.Name
	}
	return string(s.Name)
}

func pluginLabel(s *volume.Spec) string { return volume.MetricPluginName(s.Name) }

func migrated(a cache.Attachment) bool { return a.Spec != nil && a.Spec.Migrated }

// kindOfName picks the mechanism of an attachment known only by its name
// (recovered from node.status).
func kindOfName(name volume.Name) volume.Kind {
	if plugin, _, _ := volume.Parse(name); plugin == volume.CSIPluginName {
		return volume.KindCSI
	}
	return volume.KindInTree
}
