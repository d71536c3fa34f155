package sim

import (
	"fmt"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/controller"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
	"github.com/kube-attach/attach-detach-controller/test/invariants"
)

// Moves: a single-node volume whose pod left one node and that a pod on
// another node now wants. The controller ranks a move's steps above new
// attaches (Reconciler.Rank); I4 says that a move ends once the run is
// quiet, I11 how soon, in simulated time:
//
//	I11 a move completes within moveBound once nothing holds it back: a
//	    single-node volume that a live pod on node B uses (its claim and PV
//	    there, bound to each other), on no other node, B existing, Ready,
//	    managed, with its CSINode, every other node holding an attachment of
//	    it existing, Ready, managed and not listing it in
//	    status.volumesInUse (its kubelet has unmounted it), no fault active
//	    and the controller running and past its start: B's node status
//	    lists the volume within moveBound of when all that started to hold
//	    at a stretch.
//
// It is checked while the healed world runs until it is quiet
// (runUntilQuiet): then no fault, no new work and no third party, and
// simulated time passes only when nothing else can happen (to a queue's
// timer, the end of a partition, the periodic sync), so a move that takes
// longer than moveBound waited for a timer, not for a lag.
//
// What holds a move back, and so stops its clock (moveHeld), each for a
// reason of its own:
//
//   - a fault active, a handoff under way, a controller not running or still
//     reading its pods, or feeding the keys its start found: faults delay
//     anything (an API write failing over and over, an attacher failing for
//     a minute, a restart); a controller handing over attaches nothing new;
//     one reading its pods knows only part of what pods want (its desired
//     state is partial: DesiredState.Partial);
//   - a pod on another node that wants it too: the volume goes to one of
//     them, the controller's choice, and the other waits for good (I4 allows
//     it);
//   - B deleted, not Ready, unmanaged, or without its CSINode: a deleted
//     node wants nothing, an unmanaged one is its kubelet's, and without
//     its CSINode the mechanism of a migratable volume is undecided (the
//     attach is Blocked, retried with backoff, until the CSINode comes);
//   - an old node deleted, not Ready or unmanaged, or still listing the
//     volume in use: its detach waits for the max wait for unmount
//     (--max-wait-for-unmount, or the deleted node's), for the zone
//     disruption guard when its zone is disrupted, for an unmanaged node's
//     kubelet, or for the kubelet to unmount. The out-of-service taint needs
//     no exclusion: it only lets a mounted volume go sooner, and an
//     unmounted one goes at once anyway;
//   - an old node, not Ready, deleted or unmanaged, where the
//     controller's create of a VolumeAttachment of the volume got no
//     answer or a server error, and no write of that name landed since:
//     as far as anyone but the API server can tell, it may land yet, and
//     the attachment it may make is held as any other there;
//   - an old node managed again (or created again) less than
//     managedAgainHold ago: a kubelet that attached volumes by itself may
//     have mounted one it has not reported in use yet, and the controller
//     takes a volume it does not list as unmounted only
//     KubeletReportGrace (pkg/reconciler) after it read the node managed
//     again, which is up to informerLag and workLag after it was.
//
// Nothing else is excluded, on purpose: the zone disruption guard holds
// only forced detaches (of a volume mounted on an unhealthy node, kept out
// above); a node the controller has not read yet, an event late or lost to
// a relist, a VolumeAttachment's attach error left by the faults are what
// the controller must get past by itself within the bound (the sim's
// attacher fails only while faults are on, and in the quiet phase an
// informer delivers its events before any time passes).
//
// moveBound counts a move's steps from the old kubelet's unmount, each as
// late as the simulation lets it be (informerLag for an event, workLag for
// a queued item to be taken):
//
//	the old node's status update (the volume not in use) is read   10 s
//	the old key is synced: withdraw                                 5 s
//	the old node's status write (the withdraw)                      5 s
//	the old key again, re-queued by the write: detach               5 s
//	the VolumeAttachment's deletion is read                        10 s
//	the new key is synced, woken by it: create                      5 s
//	the attach is read                                             10 s
//	the new key records it, asks for a status write                 5 s
//	the new node's status write, after its hold (StatusHold, 1 s)   6 s
//	                                                               ----
//	                                                               61 s
//
// plus one of the controller's 10-s rechecks (unseenRecheck: the new
// VolumeAttachment's events lost to a relist; unreadNodeRecheck), and a
// small margin: 75 s.
const moveBound = 75 * time.Second

// managedAgainHold is how long after an old node is managed again its
// detaches are held (KubeletReportGrace from when the controller read it).
const managedAgainHold = reconciler.KubeletReportGrace + informerLag + workLag

// managedMark is since when a Node object (by UID) has been managed.
type managedMark struct {
	uid types.UID
	at  time.Time
}

// noteManaged records, after each step, since when each node has been
// managed, as its object says.
func (s *Sim) noteManaged() {
	if s.managedSince == nil {
		s.managedSince = map[string]managedMark{}
	}
	for _, name := range s.nodeNames() {
		n := s.w.node(name)
		if n == nil || n.Annotations[managed] == "" {
			delete(s.managedSince, name)
			continue
		}
		if m, ok := s.managedSince[name]; !ok || m.uid != n.UID {
			s.managedSince[name] = managedMark{uid: n.UID, at: s.clock.Now()}
		}
	}
}

// noteCreate records what the API did with a VolumeAttachment create or
// delete of the controller's: a create that got no answer, or a server
// error, may land yet as far as the controller can tell (a timeout or an
// etcd error answers before the write is done), so it holds the volume on
// its node until a write of that name lands (done).
func (s *Sim) noteCreate(action k8stesting.Action, done bool) {
	if action.GetResource().Resource != rAttachments {
		return
	}
	switch a := action.(type) {
	case k8stesting.CreateAction:
		va, ok := a.GetObject().(*storagev1.VolumeAttachment)
		if !ok {
			return
		}
		if s.createsUnknown == nil {
			s.createsUnknown = map[string]pair{}
		}
		if done {
			delete(s.createsUnknown, va.Name)
		} else {
			s.createsUnknown[va.Name] = pair{attachmentVolume(va), va.Spec.NodeName}
		}
	case k8stesting.DeleteAction:
		if done {
			delete(s.createsUnknown, a.GetName())
		}
	}
}

// move is the clock of one move: since when nothing holds it back, and
// whether another node held an attachment of the volume then.
type move struct {
	since time.Time
	from  bool
}

// checkMoves checks I11 after a step of the quiet phase, and tallies how
// long the moves took.
func (s *Sim) checkMoves() {
	if s.moves == nil {
		s.moves = map[pair]move{}
	}
	now := s.clock.Now()
	waiting, listed := s.movesFree()
	for _, p := range slices.SortedFunc(maps.Keys(s.moves), comparePairs) {
		m := s.moves[p]
		if _, ok := listed[p]; ok {
			s.stats[moveStat(m.from, now.Sub(m.since))]++
		}
		if _, ok := waiting[p]; !ok {
			delete(s.moves, p)
		}
	}
	for _, p := range slices.SortedFunc(maps.Keys(waiting), comparePairs) {
		m, ok := s.moves[p]
		if !ok {
			s.moves[p] = move{since: now, from: waiting[p]}
			continue
		}
		if took := now.Sub(m.since); took > moveBound {
			s.violate("I11", "%s wanted on %s since %s, nothing holding it back (attached to %v), and %s status does not list it after %s (bound %s)%s",
				p.pv, p.node, m.since.Format("15:04:05.000"), s.attachedNodes()[p.pv], p.node, took, moveBound, s.says(p.pv, p.node))
			s.explain(p.pv)
			delete(s.moves, p)
		}
	}
}

func comparePairs(a, b pair) int {
	if a.pv != b.pv {
		return compareText(a.pv, b.pv)
	}
	return compareText(a.node, b.node)
}

// moveStat names the tally of a move that took d: from another node, or a
// single-node volume attached nowhere else when its clock started.
func moveStat(from bool, d time.Duration) string {
	kind := "attach of a single-node volume"
	if from {
		kind = "from another node"
	}
	for _, b := range []time.Duration{0, time.Second, 10 * time.Second, 30 * time.Second} {
		if d <= b {
			return fmt.Sprintf("move timed (I11), %s: listed within %s", kind, b)
		}
	}
	return fmt.Sprintf("move timed (I11), %s: listed within %s", kind, moveBound)
}

// movesFree returns the single-node volumes that nothing holds back from
// being listed on the one node where a live pod wants them, apart
// (waiting) from those listed there already (listed); the value says
// whether another node holds an attachment of it.
func (s *Sim) movesFree() (waiting, listed map[pair]bool) {
	waiting, listed = map[pair]bool{}, map[pair]bool{}
	if s.moveHeld() {
		return waiting, listed
	}
	wantedOn := map[string][]string{}
	bound := map[pair]bool{}
	for _, o := range s.w.list(rPods) {
		p := o.(*v1.Pod)
		if !live(p) || s.w.node(p.Spec.NodeName) == nil {
			continue
		}
		if pv := podPV(p); !slices.Contains(wantedOn[pv], p.Spec.NodeName) {
			wantedOn[pv] = append(wantedOn[pv], p.Spec.NodeName)
		}
		if s.boundNow(p) {
			bound[pair{podPV(p), p.Spec.NodeName}] = true
		}
	}
	calm := func(n *v1.Node) bool {
		return n != nil && ready(n) && n.Annotations[managed] != ""
	}
	attached := s.attachedNodes()
	for _, v := range s.vols {
		if !v.singleNode || len(wantedOn[v.pv]) != 1 {
			continue
		}
		p := pair{v.pv, wantedOn[v.pv][0]}
		b := s.w.node(p.node)
		if !bound[p] || !calm(b) || s.w.get(rCSINodes, p.node) == nil {
			continue
		}
		from, held := false, false
		for _, a := range attached[v.pv] {
			if a == p.node {
				continue
			}
			from = true
			n := s.w.node(a)
			if !calm(n) || s.clock.Now().Sub(s.managedSince[a].at) < managedAgainHold {
				held = true
				break
			}
			if _, inUse := invariants.NodeLists(n); v.inv().ListedIn(inUse) {
				held = true
				break
			}
		}
		for _, u := range s.createsUnknown {
			if u.pv == v.pv && u.node != p.node && !calm(s.w.node(u.node)) {
				held = true
			}
		}
		if held {
			continue
		}
		if on, _ := invariants.NodeLists(b); v.inv().ListedIn(on) {
			listed[p] = from
		} else {
			waiting[p] = from
		}
	}
	return waiting, listed
}

// moveHeld: nothing may be timed now (a fault active, a handoff under way,
// the controller not running or not past its start).
func (s *Sim) moveHeld() bool {
	return s.faults || s.ctrl == nil || s.handoffUntil != 0 || s.recovery != nil || len(s.recovered) > 0
}

// The scheduler's choice of the item a worker takes. The controller's
// volume and node status queues hand out the lowest rank first (a move's
// steps, then new attaches, then the rest: priority.go), first in, first
// out within a rank; the simulation's queue lets the seed take any ready
// item, which explores every order but seldom the one the real queue
// follows under load. So, half the time, a worker of those queues takes
// what theirs would: the lowest rank, as the controller ranks the item now
// (the real queue ranks it when it is added, and ranks it again only
// upward), the longest waiting, then by name.
const rankedPick = 0.5

// pick returns the index, among q's ready items, of the one a worker
// takes.
func (s *Sim) pick(q runnable) int {
	ready := q.readyNames()
	if rq, ok := q.(interface{ head() (int, bool) }); ok && len(ready) > 1 && s.chance(rankedPick) {
		if i, ok := rq.head(); ok {
			return i
		}
	}
	return s.rng.Intn(len(ready))
}

// head returns the index, in ready's order, of the item the controller's
// own queue would hand out next; false for a queue it does not rank.
func (q *queue[T]) head() (int, bool) {
	c := q.s.ctrl
	rank := func(x T) (int, bool) {
		switch v := any(x).(type) {
		case cache.Key:
			return c.Rank(v), q.name == controller.QueueVolumes
		case string:
			return c.NodeRank(v), q.name == controller.QueueNodeStatus
		}
		return 0, false
	}
	if c == nil {
		return 0, false
	}
	items := q.ready()
	ranks := make([]int, len(items))
	for i, x := range items {
		r, ok := rank(x)
		if !ok {
			return 0, false
		}
		ranks[i] = r
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	best := 0
	for i, x := range items {
		if ranks[i] < ranks[best] || (ranks[i] == ranks[best] && q.since[x].Before(q.since[items[best]])) {
			best = i
		}
	}
	if slices.Max(ranks) > ranks[best] {
		q.s.stats["interleaving: a worker took a ranked queue's head ahead of less urgent items"]++
	}
	return best, true
}
