package sim

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/controller"
	"github.com/kube-attach/attach-detach-controller/pkg/intree"
	"github.com/kube-attach/attach-detach-controller/pkg/metrics"
)

// Config sets the size and the fault rates of a run.
type Config struct {
	// Steps is the number of steps with workload and faults; then the
	// world heals and the run goes on until it is quiet, for at most
	// QuietSteps steps (I4).
	Steps, QuietSteps int
	// Nodes is the number of nodes, spread over Zones zones ("a", "b",
	// "c": node i in zone i mod Zones).
	Nodes, Zones int
	// Workers is the number of volume workers, StatusWorkers of node status
	// writers.
	Workers, StatusWorkers int
	// APIFailure is the chance that a write fails before it lands,
	// APILostAnswer that it lands and its answer is lost.
	APIFailure, APILostAnswer float64
	// Restart is the weight of a controller restart among the actions.
	Restart float64
	// Relist is the weight of an informer's watch breaking (it lists
	// again: tombstones, skipped versions) among the actions; ThirdParty,
	// of a write by someone else than the controller, the workload and the
	// attachers (VolumeAttachments deleted and created, node status
	// patched, the managed annotation removed for a while).
	Relist, ThirdParty float64
	// MaxWaitForUnmount and MaxWaitForUnmountDeletedNode as the
	// controller's flags (nil: the deleted node waits MaxWaitForUnmount).
	MaxWaitForUnmount            time.Duration
	MaxWaitForUnmountDeletedNode *time.Duration
	// ZoneGuardOff runs the controller without its zone disruption guard
	// (--disable-zone-disruption-guard): I10 must then find violations,
	// unless ZoneHoldUnchecked, which counts them instead (a world of the
	// sweep without the guard).
	ZoneGuardOff, ZoneHoldUnchecked bool
	// SyncPeriod as --attach-detach-reconcile-sync-period: how often the
	// running controller compares its attachments with the
	// VolumeAttachments (Controller.Resync); zero turns it off, as
	// --disable-attach-detach-reconcile-sync.
	SyncPeriod time.Duration
	// Trace keeps every step's trace line, not only the last ones.
	Trace bool
	// Explain names a PV whose explanation (Controller.Explain, on every
	// node) is traced after each step with faults.
	Explain string
}

// DefaultConfig is what `make test` runs for each seed.
func DefaultConfig() Config {
	// A max wait for unmount shorter than the default lets forced detaches
	// happen within a run's simulated minutes (the rule is the same).
	return Config{Steps: 400, QuietSteps: 4000, Nodes: 3, Zones: 1, Workers: 3, StatusWorkers: 2, APIFailure: 0.08, APILostAnswer: 0.04,
		Restart: 0.08, Relist: 1.5, ThirdParty: 0.6, MaxWaitForUnmount: 90 * time.Second, SyncPeriod: time.Minute}
}

// Result is what a run did and found.
type Result struct {
	Seed int64
	// Config is the configuration the seed ran.
	Config     Config
	Steps      int
	Violations []string
	// Trace is the end of the step trace (all of it with Config.Trace).
	Trace []string
	Stats map[string]int
}

// Sim is one seeded run.
type Sim struct {
	cfg   Config
	seed  int64
	rng   *rand.Rand
	clock *clocktesting.FakePassiveClock
	w     *world
	ctx   context.Context

	gen     int
	ctrl    *controller.Controller
	inf     map[string]*informer
	queues  []runnable
	workers map[string]int

	current *task
	paused  []*task
	reports chan taskReport
	taskSeq int

	faults bool
	step   int
	// handoffUntil: a graceful stop is under way (the controller hands its
	// volumes over) until this step at the latest; 0: none.
	handoffUntil int
	trace        []string
	violations   []string
	stats        map[string]int

	vols   []simVolume
	intree map[string]map[string]bool // node -> in-tree unique names attached
	podSeq int
	// podUIDs numbers the pods' UIDs (a name may be used again).
	podUIDs int
	// volumeQueue is the controller's volume queue; recovery, the rebuild
	// still reading pods (nil once done); recovered, the keys it held back
	// and not yet queued.
	volumeQueue *queue[cache.Key]
	recovery    *controller.Recovery
	recovered   []cache.Key
	// unwantedSince: since when no live pod wants the volume on the node;
	// deletedInUse: what a node had mounted when its object was deleted.
	unwantedSince map[pair]time.Time
	wantedSince   map[pair]time.Time
	podResolved   map[string]time.Time
	// wantStreak and wantSeen: since when each pod's want could be read at
	// a stretch, and whether that lasted seenWant, while the running
	// controller generation lived; wantRead: the last generation that could
	// read it at all (by pod UID; noteWants).
	wantStreak   map[string]time.Time
	wantSeen     map[string]bool
	wantRead     map[string]int
	deletedInUse map[string][]string
	deletedNodes map[string]bool
	zone         zoneState
	// taintSeen, unhealthySeen and deletedSeen: when each node last had
	// the out-of-service taint, was last not Ready or deleted, and was last
	// deleted.
	taintSeen, unhealthySeen, deletedSeen map[string]time.Time
	// podNode: the node of every pod created, by UID (a pod's name may be
	// used again, its UID never); unannounced: the VolumeAttachments (their
	// UIDs) the running controller generation created and has not
	// announced to a pod on their node (I8).
	podNode     map[string]string
	unannounced map[pair]types.UID
	// thirdPartyListed: per node, the volumes a third party added to or
	// took out of node.status.volumesAttached since the controller's last
	// status write landed (I3, I6); flapped: the nodes whose managed
	// annotation a third party removed, to put back.
	thirdPartyListed map[string]map[string]bool
	// thirdPartyRemoved: per node, the volumes a third party took out of
	// its status since the controller's last status write landed.
	thirdPartyRemoved map[string]map[string]bool
	flapped           map[string]bool
	// selfAttach: the nodes whose kubelet is told to attach and detach by
	// itself (the workload took their managed annotation away), since
	// when (attachesByItself); kubeletVA, per node, the VolumeAttachments
	// its kubelet created and has not deleted.
	selfAttach map[string]time.Time
	kubeletVA  map[string]map[string]bool
	// selfMounted, per node, the volumes its kubelet mounted as it
	// attached them by itself, and has not unmounted: it reports them in
	// use only later.
	selfMounted map[string]map[string]bool
	// mounts, per node, the volumes (by kubelet's name) its kubelet has
	// mounted, with the UIDs of the pods each is mounted for (kubelet.go);
	// statusWritten, when its status loop last wrote volumesInUse (the
	// tick).
	mounts        map[string]map[string]map[string]bool
	statusWritten map[string]time.Time
	// reportsHeld: kubelets report no change of volumes in use (directed
	// tests).
	reportsHeld bool
	// thirdPartyVA: the VolumeAttachments a third party created or
	// deleted last (I6).
	thirdPartyVA map[string]bool
	// explained: the last explanation traced for each key (Config.Explain).
	explained map[cache.Key]string
	// failingUntil: until when the attach of a VolumeAttachment (by UID)
	// keeps failing.
	failingUntil map[types.UID]time.Time
	// resyncAt: when the running controller's periodic sync runs next
	// (zero: not started, as in Run before every pod is read);
	// resyncedQuiet: it ran since the last other action.
	resyncAt      time.Time
	resyncedQuiet bool
	// answeredManaged: whether the last answer to a node status write said
	// the node is managed.
	answeredManaged map[string]bool
	// readUnmanaged: the node informer delivered the node unmanaged since
	// the last answer to its status write.
	readUnmanaged map[string]bool
	// answerOnWay counts, per node, the status writes that landed and
	// whose answer has not reached the controller yet.
	answerOnWay map[string]int
	// moves: the clock of each move nothing holds back (I11, moves.go);
	// managedSince: since when each node has been managed (noteManaged).
	moves        map[pair]move
	managedSince map[string]managedMark
	// createsUnknown: the VolumeAttachments (by name) whose create by the
	// controller got no answer, or a server error: as far as anyone but
	// the API server can tell, it may land yet (noteCreate, moves.go).
	createsUnknown map[string]pair
}

type pair struct{ pv, node string }

// simEpoch is when every run starts.
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Run runs one seed.
func Run(seed int64, cfg Config) Result {
	s := newSim(seed, cfg)
	s.faults = true
	for s.step = 1; s.step <= cfg.Steps && len(s.violations) == 0; s.step++ {
		s.act(true)
		if cfg.Explain != "" && s.volumeByPV(cfg.Explain) != nil {
			s.explainChanges(cfg.Explain)
		}
		s.checkEveryStep()
		s.checkHandoff()
	}
	if len(s.violations) == 0 {
		s.quiesce()
	}
	s.kill()
	res := Result{Seed: seed, Config: cfg, Steps: s.step, Violations: s.violations, Stats: s.stats, Trace: s.trace}
	if !cfg.Trace && len(res.Trace) > 300 {
		res.Trace = res.Trace[len(res.Trace)-300:]
	}
	return res
}

// newSim sets up the world and starts the first controller.
func newSim(seed int64, cfg Config) *Sim {
	s := &Sim{
		cfg: cfg, seed: seed, rng: rand.New(rand.NewSource(seed)),
		clock:   clocktesting.NewFakePassiveClock(simEpoch),
		reports: make(chan taskReport), stats: map[string]int{}, intree: map[string]map[string]bool{},
		unwantedSince: map[pair]time.Time{}, wantedSince: map[pair]time.Time{}, podResolved: map[string]time.Time{}, podNode: map[string]string{}, unannounced: map[pair]types.UID{}, deletedInUse: map[string][]string{}, deletedNodes: map[string]bool{},
		taintSeen: map[string]time.Time{}, unhealthySeen: map[string]time.Time{}, deletedSeen: map[string]time.Time{}, zone: zoneState{deletedAt: map[string]time.Time{}, deletedGen: map[string]int{}, disruptedSince: map[string]time.Time{}},
		thirdPartyListed: map[string]map[string]bool{}, thirdPartyRemoved: map[string]map[string]bool{}, flapped: map[string]bool{}, selfAttach: map[string]time.Time{}, kubeletVA: map[string]map[string]bool{}, selfMounted: map[string]map[string]bool{}, mounts: map[string]map[string]map[string]bool{}, statusWritten: map[string]time.Time{}, thirdPartyVA: map[string]bool{}, explained: map[cache.Key]string{}, failingUntil: map[types.UID]time.Time{}, answeredManaged: map[string]bool{}, readUnmanaged: map[string]bool{}, answerOnWay: map[string]int{},
	}
	s.ctx = s.logContext()
	s.tracef("configuration: %s", cfg)
	s.w = newWorld(s)
	s.setup()
	s.newController()
	return s
}

func (s *Sim) chance(p float64) bool { return s.rng.Float64() < p }

func (s *Sim) tracef(format string, args ...any) {
	line := fmt.Sprintf("%5d %s ", s.step, s.clock.Now().Format("15:04:05.000")) + fmt.Sprintf(format, args...)
	s.trace = append(s.trace, line)
	if !s.cfg.Trace && len(s.trace) > 2000 {
		s.trace = append(s.trace[:0], s.trace[1000:]...)
	}
}

// violate records a broken invariant; the run stops after the step.
func (s *Sim) violate(inv, format string, args ...any) {
	msg := inv + ": " + fmt.Sprintf(format, args...)
	s.tracef("VIOLATION %s", msg)
	s.violations = append(s.violations, msg)
}

// newController starts a controller generation: fresh informers listing the
// world, fresh caches, Recover, as a process that (re)starts.
func (s *Sim) newController() {
	s.gen++
	// What it recovers attached needs no announcement.
	s.unannounced = map[pair]types.UID{}
	s.wantStreak, s.wantSeen = map[string]time.Time{}, map[string]bool{}
	s.inf = map[string]*informer{}
	for _, r := range resources {
		s.inf[r] = newInformer(controller.Trim)
	}
	s.queues = nil
	s.workers = map[string]int{controller.QueuePods: 2, controller.QueueNodes: 2, controller.QueueVolumeAttachments: 2,
		controller.QueueVolumes: s.cfg.Workers, controller.QueueNodeStatus: s.cfg.StatusWorkers}
	c, err := controller.New(controller.Config{
		Client:        newClient(s),
		Recorder:      &recorder{s: s},
		Metrics:       metrics.New(),
		Reconciler:    s.reconcilerConfig(),
		InTree:        intree.NewRegistry(&iscsiPlugin{s: s}),
		Workers:       s.cfg.Workers,
		StatusWorkers: s.cfg.StatusWorkers,
		SyncPeriod:    s.cfg.SyncPeriod,
		// As the command runs it: a write that only adds volumes waits
		// for the node's other attaches under way.
		StatusHold: time.Second,
		Informers: &controller.Informers{Pods: s.inf[rPods], PVCs: s.inf[rPVCs], PVs: s.inf[rPVs], Nodes: s.inf[rNodes],
			CSINodes: s.inf[rCSINodes], CSIDrivers: s.inf[rCSIDrivers], VolumeAttachments: s.inf[rAttachments]},
		Clock: s.clock,
		NewQueue: func(name string) workqueueOf[string] {
			q := newQueue[string](s, name)
			s.queues = append(s.queues, q)
			return q
		},
		NewKeyQueue: func(name string) workqueueOf[cache.Key] {
			q := newQueue[cache.Key](s, name)
			s.queues = append(s.queues, q)
			s.volumeQueue = q
			return q
		},
	})
	if err != nil {
		panic(err)
	}
	s.ctrl = c
	// The initial list of every informer, then a watch from now on. As Run
	// does: the actual state is rebuilt once every informer but the pods'
	// and claims' has listed, then those list, then the pods are read a few
	// at a time (readPods) while every worker but the pods' runs; one pod
	// worker stands for Run's processing of the pod queue between two steps.
	// Then the volume keys recovery found are fed to the queue a few at a
	// time (feedRecovered), events meanwhile.
	list := func(r string) {
		s.w.pending[r] = nil
		for _, o := range s.w.list(r) {
			s.inf[r].deliver(event{typ: added, obj: o, initial: true})
		}
	}
	for _, r := range resources {
		if r != rPods && r != rPVCs {
			list(r)
		}
	}
	rec, err := c.BeginRecovery(s.ctx)
	if err != nil {
		panic(err)
	}
	list(rPods)
	list(rPVCs)
	s.recovery = rec
	s.recovered = nil
	s.resyncAt = time.Time{}
	s.workers[controller.QueuePods] = 1
	s.tracef("controller generation %d started, reading pods", s.gen)
}

// readPods reads the next 1 to 4 pods of the recovery; after the last, the
// recovery ends and its keys are fed from then on.
func (s *Sim) readPods() {
	more, err := s.recovery.Step(s.ctx, 1+s.rng.Intn(4))
	if err != nil {
		panic(err)
	}
	if more {
		s.tracef("read pods")
		return
	}
	s.recovered = s.recovery.Finish(s.ctx)
	s.sortRecovered()
	s.recovery = nil
	// Run starts its periodic sync now, and runs it at once; not at all
	// when it is off.
	if s.cfg.SyncPeriod > 0 {
		s.resyncAt = s.clock.Now()
	}
	s.workers[controller.QueuePods] = 2
	s.tracef("every pod read, %d recovered volume keys to queue", len(s.recovered))
}

// sortRecovered orders the keys recovery held back as Finish does (those
// not settled first) and, within each group, by name: Finish returns them in
// the order the controller's maps gave them, and a seed must replay exactly.
func (s *Sim) sortRecovered() {
	settled := func(k cache.Key) bool {
		e := s.ctrl.Explain(k)
		return e.State == string(cache.Attached) && e.Reported && e.Desired
	}
	class := make(map[cache.Key]bool, len(s.recovered))
	for _, k := range s.recovered {
		class[k] = settled(k)
	}
	slices.SortStableFunc(s.recovered, func(a, b cache.Key) int {
		switch {
		case class[a] != class[b] && class[b]:
			return -1
		case class[a] != class[b]:
			return 1
		}
		return strings.Compare(string(a.Volume)+"@"+a.Node, string(b.Volume)+"@"+b.Node)
	})
}

// kill stops the controller as SIGKILL does: calls in flight get no answer.
func (s *Sim) kill() {
	for _, t := range s.paused {
		t.killed = true
	}
	s.drainKilled()
	s.ctrl = nil
}

func (s *Sim) restart() {
	s.stats["fault: controller restart"]++
	s.tracef("controller killed")
	s.replace()
}

// gracefulStop asks the controller to stop as SIGTERM does: it hands its
// volumes over while everything else goes on; checkHandoff replaces it once
// it has or when its time is up.
func (s *Sim) gracefulStop() {
	s.stats["fault: graceful stop"]++
	if s.recovery != nil {
		// As Run: asked to stop while reading the pods, it reads no more
		// of them nor of their events, and hands over at once.
		s.stats["fault: graceful stop while reading the pods"]++
		s.workers[controller.QueuePods] = 0
	}
	s.tracef("controller asked to stop: handoff")
	s.handoffUntil = s.step + handoffSteps
	s.ctrl.BeginHandOver()
}

// handoffSteps bounds a handoff, as --handoff-timeout does.
const handoffSteps = 60

// checkHandoff ends a handoff under way: once the controller says it is
// done, I6 must hold; then (or when its steps are up) the next controller
// starts.
func (s *Sim) checkHandoff() {
	if s.handoffUntil == 0 || len(s.violations) > 0 {
		return
	}
	n, sample := s.ctrl.HandedOver()
	if n > 0 && s.step < s.handoffUntil {
		return
	}
	if n == 0 {
		s.stats["handoff: done"]++
		s.tracef("handed over")
		s.checkHandedOver()
	} else {
		s.stats["handoff: timed out"]++
		for _, e := range sample {
			_, why, _ := strings.Cut(e, ": ")
			if i := strings.IndexByte(e, ' '); i > 0 && strings.HasSuffix(e, "pending") {
				why = "syncs pending"
			}
			s.stats["handoff: timed out, "+why]++
		}
		s.tracef("handoff timed out: %d unsettled %v", n, sample)
	}
	s.replace()
}

// replace stops the controller (calls in flight get no answer) and starts
// the next generation.
func (s *Sim) replace() {
	s.handoffUntil = 0
	s.kill()
	s.forgetInTree()
	s.newController()
}

// forgetInTree drops the in-tree attachments no one knows of once the
// controller's memory is gone: the iSCSI attacher only records, and its
// record is the node's volumesAttached; an attachment withdrawn from it is
// known to no one then (as with upstream).
func (s *Sim) forgetInTree() {
	for node, names := range s.intree {
		n := s.w.node(node)
		for name := range names {
			if n == nil || !slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return string(a.Name) == name }) {
				s.tracef("iscsi attachment %s on %s forgotten with the controller's memory", name, node)
				delete(names, name)
			}
		}
	}
}

type choice struct {
	weight float64
	name   string
	do     func()
}

// act makes one step: one choice among everything that can happen now.
func (s *Sim) act(chaos bool) (progress bool) {
	cs := s.choices(chaos)
	if len(cs) == 0 {
		if at, ok := s.nextTimer(); ok {
			s.advance(at.Sub(s.clock.Now()))
			return true
		}
		if !s.resyncAt.IsZero() && !s.resyncedQuiet {
			// Nothing left but the periodic sync: it runs once more
			// before the run counts as quiet.
			s.advance(s.resyncAt.Sub(s.clock.Now()))
			s.periodicSync()
			return true
		}
		return false
	}
	total := 0.0
	for _, c := range cs {
		total += c.weight
	}
	x := s.rng.Float64() * total
	c := cs[len(cs)-1]
	for _, y := range cs {
		if x -= y.weight; x < 0 {
			c = y
			break
		}
	}
	if c.name != "periodic sync" {
		s.resyncedQuiet = false
	}
	c.do()
	return true
}

// choices lists everything that can happen now, with chaos the faults and
// time passing too; without, only what is due (time passes in act when
// nothing is).
func (s *Sim) choices(chaos bool) []choice {
	var cs []choice
	add := func(w float64, name string, do func()) { cs = append(cs, choice{w, name, do}) }
	for _, r := range resources {
		if len(s.w.pending[r]) > 0 && !s.w.held[r] {
			add(3, "deliver "+r, func() { s.deliver(r) })
		}
	}
	running := map[string]int{}
	for _, t := range s.paused {
		running[t.desc[:strings.IndexByte(t.desc, ' ')]]++
	}
	for _, q := range s.queues {
		if len(q.readyNames()) > 0 && running[q.queueName()] < s.workers[q.queueName()] {
			add(4, "work "+q.queueName(), func() { s.work(q) })
		}
	}
	if len(s.paused) > 0 {
		add(5, "resume", func() { s.resumeAt(s.rng.Intn(len(s.paused))) })
	}
	if s.recovery != nil && s.handoffUntil == 0 {
		add(3, "read pods", s.readPods)
	}
	if len(s.recovered) > 0 {
		add(3, "feed recovered", s.feedRecovered)
	}
	if s.attacherPending() {
		add(2, "attacher", s.attacher)
	}
	if at := s.zone.endAt; !at.IsZero() && !s.clock.Now().Before(at) {
		add(3, "end partition", s.endPartition)
	}
	if !s.resyncAt.IsZero() && !s.clock.Now().Before(s.resyncAt) {
		add(3, "periodic sync", s.periodicSync)
	}
	for _, n := range s.w.list(rNodes) {
		if !s.reportsHeld && s.statusDue(n.GetName()) && s.kubeletChange(n.(*v1.Node)) != nil {
			add(1.5, "kubelet", func() { s.kubelet(n.GetName()) })
		}
		if todo := s.kubeletMounts(n.(*v1.Node)); len(todo) > 0 {
			add(1.5, "kubelet mounts", func() { todo[s.rng.Intn(len(todo))]() })
		}
		if todo := append(s.kubeletAttaches(n.(*v1.Node)), s.kubeletUnmounts(n.(*v1.Node))...); len(todo) > 0 {
			add(1.5, "kubelet attaches", func() { todo[s.rng.Intn(len(todo))]() })
		}
	}
	if chaos {
		if d := s.timeRoom(); d > 0 {
			add(1, "time", func() { s.advance(time.Duration(s.rng.Int63n(int64(min(d, 10*time.Second))) + 1)) })
		}
		add(2.5, "workload", s.workload)
		if len(s.zone.partitioned) == 0 && s.anyMounted() {
			add(0.1, "partition", s.partition)
		} else if len(s.zone.partitioned) > 0 {
			add(0.005, "end partition", s.endPartition)
		}
		add(s.cfg.Restart, "restart", s.restart)
		add(s.cfg.Restart, "outage", s.outage)
		if len(s.answerOnWay) > 0 && len(s.w.list(rNodes)) > 1 && len(s.answersOnTheirWay()) > 0 {
			add(0.15, "node deleted under a status answer", s.deleteNodeUnderAnswer)
		}
		if s.handoffUntil == 0 {
			add(s.cfg.Restart, "graceful stop", s.gracefulStop)
		}
		add(0.2, "resync", s.resync)
		add(s.cfg.Relist, "relist", s.relist)
		if s.handoffUntil == 0 {
			add(s.cfg.ThirdParty, "third party", s.thirdParty)
			if len(s.stuck()) > 0 {
				add(s.cfg.ThirdParty, "third party: unstick", s.unstick)
			}
			if len(s.unseenAttachments()) > 0 {
				add(s.cfg.ThirdParty/2, "third party: delete unseen", s.deleteUnseenAttachment)
			}
		}
		if len(s.flapped) > 0 {
			add(1, "third party: managed again", s.unflap)
		}
	}
	return cs
}

// periodicSync runs the controller's periodic sync, as Run does every
// SyncPeriod once every pod is read.
func (s *Sim) periodicSync() {
	s.stats["periodic sync"]++
	s.tracef("periodic sync")
	s.ctrl.Resync(s.ctx)
	s.resyncAt = s.clock.Now().Add(s.cfg.SyncPeriod)
	s.resyncedQuiet = true
}

// feedRecovered queues the next 1 to 4 volume keys recovery held back.
func (s *Sim) feedRecovered() {
	n := min(len(s.recovered), 1+s.rng.Intn(4))
	for _, k := range s.recovered[:n] {
		s.volumeQueue.Add(k)
	}
	s.recovered = s.recovered[n:]
	s.tracef("feed %d recovered volume keys, %d left", n, len(s.recovered))
}

func (s *Sim) deliver(r string) {
	ev := s.w.pending[r][0]
	s.w.pending[r] = s.w.pending[r][1:]
	s.tracef("deliver %s %s %s", r, eventNames[ev.typ], keyOf(ev.obj.(object)))
	if n, ok := ev.obj.(*v1.Node); ok && n.Annotations[managed] == "" {
		s.readUnmanaged[n.Name] = true
	}
	s.inf[r].deliver(ev)
}

// relist breaks one informer's watch: it lists again (informer.relist).
// Half the time the informer is one with events on their way (breaking the
// others makes no difference).
func (s *Sim) relist() {
	r := resources[s.rng.Intn(len(resources))]
	var behind []string
	for _, x := range resources {
		if len(s.w.pending[x]) > 0 {
			behind = append(behind, x)
		}
	}
	if len(behind) > 0 && s.chance(0.5) {
		r = behind[s.rng.Intn(len(behind))]
	}
	s.relistOf(r)
}

// relistOf breaks the watch of the informer of r: it lists again.
func (s *Sim) relistOf(r string) {
	s.stats["fault: informer relist"]++
	lost := len(s.w.pending[r])
	st := s.inf[r].relist(s.w, r)
	for k, v := range st {
		s.stats[k] += v
	}
	s.tracef("relist %s: %d events lost, %d delivered instead", r, lost, len(s.w.pending[r]))
}

func (s *Sim) resync() {
	r := resources[s.rng.Intn(len(resources))]
	s.stats["fault: informer resync"]++
	s.tracef("resync %s", r)
	s.inf[r].resync()
}

// work starts a worker on one ready item of q.
func (s *Sim) work(q runnable) {
	item := q.takeAt(s.pick(q))
	name := q.queueName()
	desc := name + " " + item
	s.tracef("work %s", desc)
	c := s.ctrl
	s.start(desc, func() { c.Process(s.ctx, name) })
}

// timeRoom is how far time may move now: a worker takes a queued item
// within workLag, as a running process does.
func (s *Sim) timeRoom() time.Duration {
	room := time.Duration(1<<62 - 1)
	for _, q := range s.queues {
		if at, ok := q.oldestReady(); ok {
			room = min(room, at.Add(workLag).Sub(s.clock.Now()))
		}
	}
	return room
}

func (s *Sim) nextTimer() (time.Time, bool) {
	first := s.zone.endAt
	for _, q := range s.queues {
		if at, ok := q.nextTimer(); ok && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	// A kubelet with a change to report writes it at its status loop's
	// next tick.
	for _, o := range s.w.list(rNodes) {
		n := o.(*v1.Node)
		if s.reportsHeld || s.statusDue(n.Name) || s.kubeletChange(n) == nil {
			continue
		}
		if at := s.nextStatusTick(n.Name); first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, !first.IsZero()
}

func (s *Sim) advance(d time.Duration) {
	if d < 0 {
		d = 0
	}
	// Watch events are late, but not by much: those that would be more
	// than informerLag late are delivered first.
	for _, r := range resources {
		for len(s.w.pending[r]) > 0 && !s.w.held[r] && !s.w.pending[r][0].at.Add(informerLag).After(s.clock.Now().Add(d)) {
			s.deliver(r)
		}
	}
	s.clock.SetTime(s.clock.Now().Add(d))
	for _, q := range s.queues {
		q.fire(s.clock.Now())
	}
	s.tracef("time +%s", d)
}

// recorder keeps the controller's events in the trace.
type recorder struct{ s *Sim }

func (r *recorder) Event(obj runtimeObject, eventtype, reason, message string) {
	r.s.stats["event "+reason]++
	if ref, ok := obj.(*v1.ObjectReference); ok && reason == "SuccessfulAttachVolume" {
		// AttachVolume.Attach succeeded for volume "<pv>"
		if _, rest, ok := strings.Cut(message, `"`); ok {
			pv, _, _ := strings.Cut(rest, `"`)
			delete(r.s.unannounced, pair{pv, r.s.podNode[string(ref.UID)]})
		}
	}
	r.s.tracef("  event %s %s: %s", eventtype, reason, message)
}

func (r *recorder) Eventf(obj runtimeObject, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r *recorder) AnnotatedEventf(obj runtimeObject, _ map[string]string, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

// iscsiPlugin is the in-tree iSCSI attacher, whose attach and detach are
// remote calls like any other.
type iscsiPlugin struct{ s *Sim }

func (p *iscsiPlugin) Name() string { return intree.ISCSI{}.Name() }

func (p *iscsiPlugin) Attach(ctx context.Context, spec *volumeSpec, node string) (string, error) {
	s := p.s
	if s.yield() {
		return "", fmt.Errorf("connection refused")
	}
	if s.faults && s.chance(s.cfg.APIFailure) {
		s.stats["fault: iSCSI call failed"]++
		s.tracef("  iscsi attach %s: injected failure", spec.Name)
		return "", fmt.Errorf("injected iSCSI failure")
	}
	dev, err := intree.ISCSI{}.Attach(ctx, spec, node)
	if err == nil {
		if s.intree[node] == nil {
			s.intree[node] = map[string]bool{}
		}
		s.intree[node][string(spec.Name)] = true
	}
	if err == nil && s.faults && s.chance(s.cfg.APILostAnswer) {
		s.stats["fault: API write landed, answer lost: iSCSI attach"]++
		s.tracef("  iscsi attach %s to %s: landed, answer lost", spec.Name, node)
		return "", fmt.Errorf("injected: iSCSI answer lost")
	}
	s.tracef("  iscsi attach %s to %s: %s", spec.Name, node, errText(err))
	return dev, err
}

func (p *iscsiPlugin) Detach(ctx context.Context, name volumeName, node string) error {
	s := p.s
	if s.yield() {
		return fmt.Errorf("connection refused")
	}
	if s.faults && s.chance(s.cfg.APIFailure) {
		s.stats["fault: iSCSI call failed"]++
		s.tracef("  iscsi detach %s: injected failure", name)
		return fmt.Errorf("injected iSCSI failure")
	}
	if s.intree[node][string(name)] {
		s.checkDetachStart(s.volumeByName(string(name)).pv, node)
	}
	delete(s.intree[node], string(name))
	if s.w.lost["iscsi detach"] {
		s.stats["test: API write landed, answer lost"]++
		s.tracef("  iscsi detach %s from %s: landed, answer lost by the test", name, node)
		return fmt.Errorf("the test lost the iSCSI answer")
	}
	if s.faults && s.chance(s.cfg.APILostAnswer) {
		s.stats["fault: API write landed, answer lost: iSCSI detach"]++
		s.tracef("  iscsi detach %s from %s: landed, answer lost", name, node)
		return fmt.Errorf("injected: iSCSI answer lost")
	}
	s.tracef("  iscsi detach %s from %s: ok", name, node)
	return intree.ISCSI{}.Detach(ctx, name, node)
}

// logContext is the controller's logging: discarded, or with SIM_LOG set,
// its V(4) logs in the trace, in order with the steps.
func (s *Sim) logContext() context.Context {
	if os.Getenv("SIM_LOG") != "" {
		return klog.NewContext(context.Background(), funcr.New(func(prefix, args string) {
			s.tracef("  log %s %s", prefix, args)
		}, funcr.Options{Verbosity: 4}))
	}
	return klog.NewContext(context.Background(), logr.Discard())
}
