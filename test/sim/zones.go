package sim

import (
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
)

// Zones. Every node is in one zone (simZone); a partition makes every node
// of it NotReady at once and removes some of their pods at once, as an
// operator's tooling force-deleting them would. The controller holds the
// forced detaches by timeout of a disrupted zone (reconciler.ZoneDisrupted:
// at least zoneMinNodes, and zoneThreshold, of its managed nodes not Ready
// or deleted within the max wait for unmount), which I10 checks on the
// world:
//
//	I10 no forced detach by timeout starts on a node of a zone that has been
//	    disrupted, as the world shows it, for zoneSeen or more.

const (
	simZone       = "a"
	zoneThreshold = 0.55
	zoneMinNodes  = 3
	// zoneSeen is how long a disruption lasts before the controller must
	// have seen it (its events delivered and synced, a detach decided
	// before it finished).
	zoneSeen = seenWant
)

// zoneState is the world's side of the zone: when nodes were deleted, and
// since when the zone has been disrupted.
type zoneState struct {
	deletedAt      map[string]time.Time
	disruptedSince time.Time
	// partitioned are the nodes the last partition made NotReady; endAt,
	// when one that outlives the faults ends (heal).
	partitioned map[string]bool
	endAt       time.Time
}

// zoneHealth counts the zone's managed nodes and those not Ready, a node
// deleted within the max wait for unmount counting as one not Ready.
func (s *Sim) zoneHealth() (unhealthy, nodes int) {
	now := s.clock.Now()
	for _, o := range s.w.list(rNodes) {
		n := o.(*v1.Node)
		if n.Annotations[managed] == "" || n.Labels[v1.LabelTopologyZone] != simZone {
			continue
		}
		nodes++
		if !ready(n) {
			unhealthy++
		}
	}
	for name, t := range s.zone.deletedAt {
		if s.w.node(name) == nil && now.Sub(t) < s.cfg.MaxWaitForUnmount {
			nodes++
			unhealthy++
		}
	}
	return unhealthy, nodes
}

func (s *Sim) zoneDisrupted() bool {
	unhealthy, nodes := s.zoneHealth()
	return nodes > 0 && unhealthy >= zoneMinNodes && float64(unhealthy) >= zoneThreshold*float64(nodes)
}

// noteZone keeps when the zone became disrupted, every step.
func (s *Sim) noteZone() {
	switch {
	case !s.zoneDisrupted():
		s.zone.disruptedSince = time.Time{}
	case s.zone.disruptedSince.IsZero():
		s.zone.disruptedSince = s.clock.Now()
		s.stats["zone: disrupted"]++
	}
}

// checkZoneHold checks I10 when a forced detach by timeout starts from
// node (not Ready or deleted, the volume mounted, no out-of-service taint).
func (s *Sim) checkZoneHold(pv, node string) {
	if t := s.zone.disruptedSince; !t.IsZero() && s.clock.Now().Sub(t) >= zoneSeen {
		unhealthy, nodes := s.zoneHealth()
		s.violate("I10", "forced detach of %s from node %s while its zone has been disrupted for %s (%d of %d nodes not ready)",
			pv, node, s.clock.Now().Sub(t), unhealthy, nodes)
	}
}

// partition makes every node of the zone NotReady at once, and removes at
// once the pods of some of them.
func (s *Sim) partition() {
	s.stats["fault: zone partitioned"]++
	s.zone.partitioned = map[string]bool{}
	for _, o := range s.w.list(rNodes) {
		n := o.(*v1.Node).DeepCopy()
		if !ready(n) {
			continue
		}
		n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionFalse}}
		s.w.update(rNodes, n)
		s.zone.partitioned[n.Name] = true
		if !s.chance(0.8) {
			continue
		}
		for _, p := range s.w.list(rPods) {
			if p.(*v1.Pod).Spec.NodeName == n.Name {
				s.w.remove(rPods, keyOf(p))
			}
		}
	}
	s.tracef("zone partitioned: %d nodes NotReady at once", len(s.zone.partitioned))
}

// endPartition brings the nodes of the last partition back Ready, as a
// partition heals: when the faults stop (heal), and sometimes before.
func (s *Sim) endPartition() {
	if len(s.zone.partitioned) == 0 {
		return
	}
	// In name order: a seed replays exactly.
	for _, name := range slices.Sorted(maps.Keys(s.zone.partitioned)) {
		if n := s.w.node(name); n != nil && !ready(n) {
			n = n.DeepCopy()
			n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
			s.w.update(rNodes, n)
		}
	}
	s.tracef("zone partition over: %d nodes Ready again", len(s.zone.partitioned))
	s.zone.partitioned = nil
	s.zone.endAt = time.Time{}
}

// outlivePartition lets a partition under way when the faults stop last
// twice the max wait for unmount more, long enough for forced detaches by
// timeout to be due (and held), then end.
func (s *Sim) outlivePartition() {
	if len(s.zone.partitioned) > 0 {
		s.zone.endAt = s.clock.Now().Add(2 * s.cfg.MaxWaitForUnmount)
	}
}

// anyMounted reports whether some node has a volume mounted.
func (s *Sim) anyMounted() bool {
	for _, o := range s.w.list(rNodes) {
		if len(o.(*v1.Node).Status.VolumesInUse) > 0 {
			return true
		}
	}
	return false
}

// reconcilerConfig is the controller's safety settings, as its flags'
// defaults set them (but the shorter max wait).
func (s *Sim) reconcilerConfig() reconciler.Config {
	cfg := reconciler.Config{MaxWaitForUnmount: s.cfg.MaxWaitForUnmount}
	if !s.cfg.ZoneGuardOff {
		cfg.UnhealthyZoneThreshold, cfg.UnhealthyZoneMinNodes = zoneThreshold, zoneMinNodes
	}
	return cfg
}
