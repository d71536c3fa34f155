package sim

import (
	"fmt"
	"math"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// The end of a run: the faults stop, the world heals, and the run must get
// quiet, twice: with the nodes as heal leaves them (deleted ones stay
// deleted, so what is attached there must go), then with every node back.

// quiesce heals the world (faults off, no new workload, deleted pods gone,
// claims and CSINodes back, partitions ending) and runs until nothing is left
// to do: then the world and the controller must agree (I4, I5, I8). Then
// every node comes back (the deleted ones created again, every node Ready),
// and once nothing is left to do again, they must agree again.
//
// A handoff under way goes on with no step limit (and on half the seeds one
// starts as the faults stop, with whatever is in flight): once nothing is
// left to do, it must be done.
func (s *Sim) quiesce() {
	s.faults = false
	s.heal()
	if s.handoffUntil == 0 && s.chance(0.5) {
		s.gracefulStop()
	}
	if s.handoffUntil > 0 {
		s.handoffUntil = math.MaxInt
	}
	if !s.runUntilQuiet() {
		return
	}
	s.checkQuiet()
	if len(s.violations) > 0 {
		return
	}
	s.nodesBack()
	if s.runUntilQuiet() {
		s.checkQuiet()
	}
}

// runUntilQuiet runs with no fault and no new work until nothing is left to
// do, and reports whether it got there (I4) with no violation.
func (s *Sim) runUntilQuiet() bool {
	for i := 0; i < s.cfg.QuietSteps && len(s.violations) == 0; i++ {
		s.step++
		if !s.act(false) {
			if s.handoffUntil == 0 {
				return true
			}
			n, sample := s.ctrl.HandedOver()
			if n > 0 {
				s.violate("I4", "quiet, and the handoff is not done: %d unsettled %v", n, sample)
				return false
			}
		}
		s.checkEveryStep()
		s.checkMoves()
		s.checkHandoff()
	}
	if len(s.violations) == 0 {
		s.violate("I4", "not quiet after %d steps with no fault and no new work: %s", s.cfg.QuietSteps, s.busy())
	}
	return false
}

func (s *Sim) busy() string {
	var out []string
	for _, q := range s.queues {
		if !q.idle() {
			out = append(out, fmt.Sprintf("queue %s: %v", q.queueName(), q.readyNames()))
		}
	}
	for _, t := range s.paused {
		out = append(out, "task "+t.desc)
	}
	return strings.Join(out, "; ")
}

// heal ends the faults: deleting pods finish, claims and CSINodes are back.
func (s *Sim) heal() {
	for _, o := range s.w.list(rPods) {
		if p := o.(*v1.Pod); p.DeletionTimestamp != nil {
			s.w.remove(rPods, keyOf(p))
		}
	}
	for _, v := range s.vols {
		if s.w.get(rPVCs, ns+"/c-"+v.pv) == nil {
			s.createClaim(v.pv)
		}
	}
	for _, v := range s.vols {
		if s.w.get(rPVs, v.pv) == nil {
			s.createPV(v)
		}
	}
	s.flapped = map[string]bool{}
	s.selfAttach = map[string]time.Time{}
	for i := range s.cfg.Nodes {
		if name := nodeName(i); s.w.node(name) != nil && s.w.get(rCSINodes, name) == nil {
			s.createCSINode(name)
		}
		if n := s.w.node(nodeName(i)); n != nil && n.Annotations[managed] == "" {
			n = n.DeepCopy()
			n.Annotations = map[string]string{managed: "true"}
			s.w.update(rNodes, n)
		}
	}
	// A partition heals, a while later; so does a zone left disrupted by
	// nodes gone NotReady one by one, or its forced detaches would be held
	// for good.
	s.outlivePartition()
	for _, z := range s.zones() {
		if len(s.zone.partitioned) == 0 || z != s.zone.partitionedZone {
			s.readyAgainIfDisrupted(z)
		}
	}
	s.tracef("heal: deleting pods gone, PVs, claims, CSINodes and managed nodes back, a partition under way ends in a while; no more faults")
}

// readyAgainIfDisrupted makes every node of a zone disrupted by nodes not
// Ready Ready again: once the faults stop, its forced detaches would
// otherwise be held for good.
func (s *Sim) readyAgainIfDisrupted(zone string) {
	if !s.zoneDisrupted(zone) {
		return
	}
	for _, o := range s.w.list(rNodes) {
		if n := o.(*v1.Node); !ready(n) && s.zoneOf(n.Name) == zone {
			n = n.DeepCopy()
			n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
			s.w.update(rNodes, n)
		}
	}
}

// nodesBack brings every node back once the healed world is quiet: the
// deleted ones are created again (with their CSINodes), every node is Ready.
func (s *Sim) nodesBack() {
	created, readied := 0, 0
	for _, name := range s.nodeNames() {
		n := s.w.node(name)
		switch {
		case n == nil:
			s.createNode(name)
			created++
		case !ready(n):
			n = n.DeepCopy()
			n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
			s.w.update(rNodes, n)
			readied++
		}
		if s.w.get(rCSINodes, name) == nil {
			s.createCSINode(name)
		}
	}
	s.stats["heal: node created again once quiet"] += created
	s.stats["heal: node Ready again once quiet"] += readied
	s.tracef("every node back: %d created again, %d Ready again", created, readied)
}
