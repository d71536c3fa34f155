package sim

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
)

// Zones. Every node is in one zone (zoneOf: "a", "b" or "c", node i in
// zone i mod Config.Zones), re-created there under its name; a partition
// makes every node of one zone NotReady at once and removes some of their
// pods at once, as an operator's tooling force-deleting them would. The
// controller holds the forced detaches by timeout of a disrupted zone
// (reconciler.ZoneDisrupted: at least zoneMinNodes, and zoneThreshold, of
// its managed nodes not Ready or deleted within the deleted node's max wait
// for unmount), which I10 checks on the world, zone by zone:
//
//	I10 no forced detach by timeout starts on a node of a zone that has been
//	    disrupted, as the world shows it, for zoneSeen or more.

const (
	zoneThreshold = 0.55
	zoneMinNodes  = 3
	// zoneSeen is how long a disruption lasts before the controller must
	// have seen it (its events delivered and synced, a detach decided
	// before it finished).
	zoneSeen = seenWant
)

// zoneNames are the zones nodes are spread over, the first Config.Zones of
// them.
var zoneNames = []string{"a", "b", "c"}

// zoneOf is the zone of a node, by its name: a node created again under its
// name is in the same zone, and a node deleted is still known to be there.
func (s *Sim) zoneOf(node string) string {
	i, err := strconv.Atoi(strings.TrimPrefix(node, "node-"))
	if err != nil {
		return ""
	}
	return zoneNames[i%max(1, s.cfg.Zones)]
}

// zones lists the zones of the world.
func (s *Sim) zones() []string { return zoneNames[:max(1, s.cfg.Zones)] }

// zoneState is the world's side of the zones: when nodes were deleted, and
// since when each zone has been disrupted.
type zoneState struct {
	// deletedAt: when each managed node was deleted; deletedGen, the
	// controller generation running when a node was deleted (one deleted
	// while the controller was down: the one before the next).
	deletedAt      map[string]time.Time
	deletedGen     map[string]int
	disruptedSince map[string]time.Time
	// partitioned are the nodes the last partition made NotReady, in zone
	// partitionedZone; endAt, when one that outlives the faults ends
	// (heal).
	partitioned     map[string]bool
	partitionedZone string
	endAt           time.Time
}

// deletedNodeWait is the max wait for unmount of a deleted node, also how
// long its deletion counts in its zone (reconciler.Config.DeletedNodeWait).
func (s *Sim) deletedNodeWait() time.Duration {
	if w := s.cfg.MaxWaitForUnmountDeletedNode; w != nil {
		return *w
	}
	return s.cfg.MaxWaitForUnmount
}

// zoneCount is what the world shows of a zone's managed nodes.
type zoneCount struct {
	// nodes counts the zone's managed nodes, unhealthy those not Ready, a
	// node deleted within the deleted node's max wait counting as one not
	// Ready; deleted counts those, unseen those of them deleted before the
	// running controller started.
	nodes, unhealthy, deleted, unseen int
}

func (z zoneCount) disrupted() bool {
	return z.nodes > 0 && z.unhealthy >= zoneMinNodes && float64(z.unhealthy) >= zoneThreshold*float64(z.nodes)
}

// zoneHealth counts a zone's managed nodes and those not Ready, a node
// deleted within the deleted node's max wait counting as one not Ready. A
// node deleted before the running controller started counts only while it
// has an attachment: of one without any, the controller cannot know (it
// never read the node, nor anything on it).
func (s *Sim) zoneHealth(zone string) zoneCount {
	var z zoneCount
	now := s.clock.Now()
	for _, o := range s.w.list(rNodes) {
		n := o.(*v1.Node)
		if n.Annotations[managed] == "" || n.Labels[v1.LabelTopologyZone] != zone {
			continue
		}
		z.nodes++
		if !ready(n) {
			z.unhealthy++
		}
	}
	var attached map[string]bool
	for name, t := range s.zone.deletedAt {
		if s.zoneOf(name) != zone || s.w.node(name) != nil || now.Sub(t) >= s.deletedNodeWait() {
			continue
		}
		if s.zone.deletedGen[name] < s.gen {
			if attached == nil {
				attached = s.nodesWithAttachments()
			}
			if !attached[name] {
				continue
			}
			z.unseen++
		}
		z.nodes++
		z.unhealthy++
		z.deleted++
	}
	return z
}

// nodesWithAttachments returns the nodes that hold an attachment.
func (s *Sim) nodesWithAttachments() map[string]bool {
	out := map[string]bool{}
	for _, nodes := range s.attachedNodes() {
		for _, n := range nodes {
			out[n] = true
		}
	}
	return out
}

func (s *Sim) zoneDisrupted(zone string) bool { return s.zoneHealth(zone).disrupted() }

// noteZone keeps when each zone became disrupted, every step.
func (s *Sim) noteZone() {
	for _, z := range s.zones() {
		switch {
		case !s.zoneDisrupted(z):
			delete(s.zone.disruptedSince, z)
		case s.zone.disruptedSince[z].IsZero():
			s.zone.disruptedSince[z] = s.clock.Now()
			s.stats["zone: disrupted"]++
		}
	}
}

// checkZoneHold checks I10 when a forced detach by timeout starts from
// node (not Ready or deleted, the volume mounted, no out-of-service taint).
// Without the guard in a world of the sweep, it counts what I10 would find.
func (s *Sim) checkZoneHold(pv, node string) {
	zone := s.zoneOf(node)
	if t := s.zone.disruptedSince[zone]; !t.IsZero() && s.clock.Now().Sub(t) >= zoneSeen {
		if s.cfg.ZoneHoldUnchecked {
			s.stats["zone: forced detach in a disrupted zone, no guard"]++
			return
		}
		state := "not Ready"
		if s.deletedNodes[node] {
			state = "deleted"
			if s.zone.deletedGen[node] < s.gen {
				state = "deleted before the running controller started"
			}
		}
		z := s.zoneHealth(zone)
		s.violate("I10", "forced detach of %s from node %s (%s) while its zone %q has been disrupted for %s (%d of %d nodes not ready, %d deleted, %d before the running controller started)",
			pv, node, state, zone, s.clock.Now().Sub(t), z.unhealthy, z.nodes, z.deleted, z.unseen)
	}
}

// partition makes every node of one zone (one with a volume mounted, when
// there is one) NotReady at once, and removes at once the pods of some of
// them.
func (s *Sim) partition() {
	s.stats["fault: zone partitioned"]++
	var mounted []string
	for _, z := range s.zones() {
		if s.anyMountedIn(z) {
			mounted = append(mounted, z)
		}
	}
	if len(mounted) == 0 {
		mounted = s.zones()
	}
	zone := mounted[0]
	if len(mounted) > 1 {
		zone = mounted[s.rng.Intn(len(mounted))]
	}
	s.zone.partitioned, s.zone.partitionedZone = map[string]bool{}, zone
	for _, o := range s.w.list(rNodes) {
		n := o.(*v1.Node).DeepCopy()
		if !ready(n) || s.zoneOf(n.Name) != zone {
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
	s.tracef("zone %q partitioned: %d nodes NotReady at once", zone, len(s.zone.partitioned))
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
	s.tracef("zone %q partition over: %d nodes Ready again", s.zone.partitionedZone, len(s.zone.partitioned))
	s.zone.partitioned = nil
	s.zone.endAt = time.Time{}
	if !s.faults {
		s.readyAgainIfDisrupted(s.zone.partitionedZone)
	}
}

// outlivePartition lets a partition under way when the faults stop last
// twice the longer max wait for unmount more, long enough for forced
// detaches by timeout to be due (and held), then end.
func (s *Sim) outlivePartition() {
	if len(s.zone.partitioned) > 0 {
		s.zone.endAt = s.clock.Now().Add(2 * max(s.cfg.MaxWaitForUnmount, s.deletedNodeWait()))
	}
}

// anyMounted reports whether some node has a volume mounted.
func (s *Sim) anyMounted() bool { return s.anyMountedIn("") }

// anyMountedIn reports whether some node of zone (any zone: "") has a
// volume mounted.
func (s *Sim) anyMountedIn(zone string) bool {
	for _, o := range s.w.list(rNodes) {
		if len(o.(*v1.Node).Status.VolumesInUse) > 0 && (zone == "" || s.zoneOf(o.GetName()) == zone) {
			return true
		}
	}
	return false
}

// reconcilerConfig is the controller's safety settings, as its flags'
// defaults set them (but the shorter max wait) or the configuration says.
func (s *Sim) reconcilerConfig() reconciler.Config {
	cfg := reconciler.Config{MaxWaitForUnmount: s.cfg.MaxWaitForUnmount, MaxWaitForUnmountDeletedNode: s.cfg.MaxWaitForUnmountDeletedNode}
	if !s.cfg.ZoneGuardOff {
		cfg.UnhealthyZoneThreshold, cfg.UnhealthyZoneMinNodes = zoneThreshold, zoneMinNodes
	}
	return cfg
}
