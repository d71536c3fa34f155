package sim

import (
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// Faults timed against what the controller knows, each a `fault:` counter
// (its name below) in the run's summary, counted per configuration:
//
//   - an outage: the controller is down for a while and nodes go meanwhile,
//     so that the next generation never sees them (it finds their
//     VolumeAttachments and nothing else of them);
//   - a node deleted while the answer of a status write to it is on its
//     way, the deletion often read as a relist's tombstone: the answer,
//     written before the deletion, is read after it;
//   - a third party deleting a VolumeAttachment the controller's informer
//     has not shown yet, its events often lost to a relist: the informer
//     never shows it at all.
const (
	faultOutage           = "fault: controller down for a while"
	faultOutageDeletion   = "fault: node deleted while the controller was down"
	faultAnswerDeletion   = "fault: node deleted while the answer of its status write is on its way"
	faultAnswerTombstone  = "fault: node deleted while the answer of its status write is on its way, read as a tombstone"
	faultUnseenDeleted    = "fault: third party deleted a VolumeAttachment the informer has not shown"
	faultNeverShownDelete = "fault: third party deleted a VolumeAttachment the informer never shows"
)

// sweepFaults are the counters the summary gives per configuration, with
// their short names; a sub-count is given within the one before.
var sweepFaults = []struct {
	stat, short string
	sub         bool
}{
	{faultOutageDeletion, "nodes deleted while down", false},
	{faultAnswerDeletion, "deleted under a status answer", false},
	{faultAnswerTombstone, "as tombstones", true},
	{faultUnseenDeleted, "VolumeAttachments deleted unseen", false},
	{faultNeverShownDelete, "never shown", true},
}

// outage kills the controller and starts the next one a while later, as an
// upgrade, a crash loop or a lost lease does: meanwhile, on most outages, a
// node goes (one with a volume mounted, when there is one) with its pods,
// and time passes. What the world's actors would do meanwhile, they do
// after: nothing of theirs depends on the controller running.
func (s *Sim) outage() {
	s.stats[faultOutage]++
	s.tracef("controller killed: down for a while")
	s.handoffUntil = 0
	s.kill()
	if nodes := s.w.list(rNodes); len(nodes) > 1 && s.chance(0.7) {
		var mounted []*v1.Node
		for _, o := range nodes {
			if n := o.(*v1.Node); len(n.Status.VolumesInUse) > 0 {
				mounted = append(mounted, n)
			}
		}
		n := nodes[s.rng.Intn(len(nodes))].(*v1.Node)
		if len(mounted) > 0 {
			n = mounted[s.rng.Intn(len(mounted))]
			s.stats[faultOutageDeletion+", a volume mounted"]++
		}
		s.stats[faultOutageDeletion]++
		s.stats["fault: node deleted"]++
		s.tracef("node %s deleted while the controller is down", n.Name)
		s.deleteNode(n)
	}
	d := time.Duration(1+s.rng.Intn(30)) * time.Second
	s.clock.SetTime(s.clock.Now().Add(d))
	s.tracef("time +%s, the controller down", d)
	s.forgetInTree()
	s.newController()
}

// answersOnTheirWay lists the existing nodes a status write landed on
// whose answer has not reached the controller yet, in name order.
func (s *Sim) answersOnTheirWay() []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(s.answerOnWay)) {
		if s.w.node(name) != nil {
			out = append(out, name)
		}
	}
	return out
}

// deleteNodeUnderAnswer deletes a node a status write landed on while its
// answer is on its way; on most of these, the node informer's watch breaks
// across the deletion, which then arrives as a relist's tombstone holding
// the informer's copy, older than the answer.
func (s *Sim) deleteNodeUnderAnswer() {
	names := s.answersOnTheirWay()
	n := s.w.node(names[s.rng.Intn(len(names))])
	s.stats[faultAnswerDeletion]++
	s.stats["fault: node deleted"]++
	s.tracef("workload: node %s deleted, the answer of its status write on its way", n.Name)
	s.deleteNode(n)
	if _, cached, _ := s.inf[rNodes].GetStore().GetByKey(n.Name); cached && s.chance(0.6) {
		s.stats[faultAnswerTombstone]++
		s.relistOf(rNodes)
	}
}

// unseenAttachments lists the VolumeAttachments the controller's informer
// has not shown yet (their add still on its way), not being deleted.
func (s *Sim) unseenAttachments() []*storagev1.VolumeAttachment {
	var out []*storagev1.VolumeAttachment
	for _, va := range s.w.attachments() {
		if _, ok, _ := s.inf[rAttachments].GetStore().GetByKey(va.Name); !ok && va.DeletionTimestamp == nil {
			out = append(out, va)
		}
	}
	return out
}

// deleteUnseenAttachment is a third party deleting a VolumeAttachment right
// after its creation, before the controller's informer has shown it; on
// half of them, the informer's watch breaks meanwhile and the relist finds
// nothing: neither its add nor its delete is ever shown.
func (s *Sim) deleteUnseenAttachment() {
	all := s.unseenAttachments()
	va := all[s.rng.Intn(len(all))]
	s.stats[faultUnseenDeleted]++
	s.tracef("third party: VolumeAttachment %s deleted right after its creation, the informer has not shown it", va.Name)
	s.deleteAttachmentAsThirdParty(va)
	if s.w.get(rAttachments, va.Name) == nil && s.chance(0.5) {
		s.stats[faultNeverShownDelete]++
		s.relistOf(rAttachments)
	}
}
