// Package chaos runs the controller binary on the real stack (etcd,
// kube-apiserver, the CSI external-attacher with a CSI mock driver,
// kubeletsim) through minutes of churn while faults are injected, and checks
// the safety invariants on everything the API server recorded.
//
// The Checker sees the VolumeAttachments and Nodes as the API server's
// watches deliver them, and judges them in the order etcd wrote them (by
// resourceVersion, which one etcd orders across resources): at the moment a
// detach starts (a VolumeAttachment gets its deletion timestamp), the Node as
// last written before that moment is the one the rules read.
//
// A detach started by someone else (a VolumeAttachment deleted by a third
// party, DeletedByOthers) is not judged: the rules bind the controller. A
// watch listed again after 410 Gone leaves a stretch of history unseen
// (Unseen): the objects gone meanwhile come as tombstones, and a detach that
// started within the stretch is counted as unjudged, not judged against a
// Node whose versions there were missed.
//
// A zone the harness kept disrupted (Disrupted) is judged on its nodes as
// they were last written, those deleted meanwhile too: the Node object is
// gone, but what its kubelet last reported mounted is still mounted.
package chaos

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kube-attach/attach-detach-controller/test/invariants"
)

// outOfService is the taint under which a mounted volume may be detached.
const outOfService = invariants.OutOfService

// Volume is what the checker knows of a PV: whether it may be attached to
// one node only, and the names node status may list it under.
type Volume = invariants.Volume

// Event is one watch event of a VolumeAttachment or a Node.
type Event struct {
	Type watch.EventType
	VA   *storagev1.VolumeAttachment
	Node *v1.Node
	// Tombstone: the object was found gone by a list; it went at some
	// point after its resourceVersion, which is the last one seen before
	// the list.
	Tombstone bool
}

func (e Event) rv() uint64 {
	var s string
	if e.VA != nil {
		s = e.VA.ResourceVersion
	} else {
		s = e.Node.ResourceVersion
	}
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// unseen is a stretch of etcd's history a watch did not deliver: after
// from, up to and including to.
type unseen struct{ from, to uint64 }

// disruption is a zone the harness kept disrupted after resourceVersion
// from and before to: at least --unhealthy-zone-min-nodes, and
// --unhealthy-zone-threshold, of its nodes NotReady or deleted.
type disruption struct {
	zone     string
	nodes    []string
	from, to uint64
}

// Checker records events and evaluates the invariants:
//
//	I1 a single-node volume has VolumeAttachments (in any state) on one node
//	   at most;
//	I2 no detach starts for a volume in volumesInUse of a node without the
//	   out-of-service taint (the harness keeps nodes NotReady for less than
//	   the max wait for unmount);
//	I3 no detach starts while node.status.volumesAttached lists the volume;
//	I10 no detach starts for a volume in volumesInUse of a node of a
//	   disrupted zone, the node NotReady or deleted (as it was last written),
//	   while the zone is disrupted, out-of-service taint aside: "a partition
//	   is not a mass death", the forced detaches by timeout the max wait for
//	   unmount makes due there are held (the harness keeps the zone
//	   disrupted for longer than the max wait). As I2 on a node that exists,
//	   and reported as I10 alone.
type Checker struct {
	mu          sync.Mutex
	volumes     map[string]Volume
	events      []Event
	others      map[types.UID]bool
	unseen      []unseen
	disruptions []disruption
}

// NewChecker returns a Checker of the given volumes; VolumeAttachments of
// other PVs are ignored.
func NewChecker(volumes ...Volume) *Checker {
	c := &Checker{volumes: map[string]Volume{}, others: map[types.UID]bool{}}
	for _, v := range volumes {
		c.volumes[v.PV] = v
	}
	return c
}

// AddVolume adds a volume to check.
func (c *Checker) AddVolume(v Volume) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volumes[v.PV] = v
}

// Record adds a watch event; any goroutine may call it.
func (c *Checker) Record(e Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, e)
}

// DeletedByOthers records that the VolumeAttachment with this UID was
// deleted by someone other than the controller, first: its detach is not
// the controller's and is not judged. The one re-created under the same name
// has another UID and is.
func (c *Checker) DeletedByOthers(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.others[uid] = true
}

// Unseen records that a watch missed what etcd wrote after resourceVersion
// from, up to and including to: it was listed again at to.
func (c *Checker) Unseen(from, to uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unseen = append(c.unseen, unseen{from, to})
}

// Disrupted records that the zone, of these nodes, was kept disrupted after
// resourceVersion from and before to (I10).
func (c *Checker) Disrupted(zone string, nodes []string, from, to uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.disruptions = append(c.disruptions, disruption{zone: zone, nodes: slices.Clone(nodes), from: from, to: to})
}

// Events returns how many events were recorded.
func (c *Checker) Events() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

// Violations replays the recorded events in etcd's order and returns every
// broken invariant.
func (c *Checker) Violations() []string {
	v, _ := c.Judge()
	return v
}

// Judge is Violations, with how many detaches were not judged: those
// started within a stretch of history a watch missed.
func (c *Checker) Judge() (violations []string, unjudged int) {
	c.mu.Lock()
	events := slices.Clone(c.events)
	volumes := c.volumes
	others := maps.Clone(c.others)
	gaps := slices.Clone(c.unseen)
	disruptions := slices.Clone(c.disruptions)
	c.mu.Unlock()
	sort.SliceStable(events, func(i, j int) bool { return events[i].rv() < events[j].rv() })

	var out []string
	seen := map[string]bool{}
	violate := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if !seen[msg] {
			seen[msg] = true
			out = append(out, msg)
		}
	}
	vas := map[string]*storagev1.VolumeAttachment{}
	nodes := map[string]*v1.Node{}
	// gone holds the last version of each node deleted and not re-created.
	gone := map[string]*v1.Node{}
	detachStart := func(va *storagev1.VolumeAttachment, rv uint64) {
		vol, ok := volumes[pvOf(va)]
		if !ok || others[va.UID] {
			return
		}
		if slices.ContainsFunc(gaps, func(g unseen) bool { return g.from < rv && rv <= g.to }) {
			unjudged++
			return
		}
		n, deleted := nodes[va.Spec.NodeName], false
		if n == nil {
			n, deleted = gone[va.Spec.NodeName], true
		}
		if n == nil {
			return
		}
		attached, inUse := invariants.NodeLists(n)
		mounted := invariants.DetachMounted(vol, inUse, invariants.OutOfServiceTaint(n))
		held := false
		if i := slices.IndexFunc(disruptions, func(d disruption) bool {
			return d.from < rv && rv < d.to && slices.Contains(d.nodes, n.Name)
		}); i >= 0 && mounted {
			held = true
			state := "NotReady"
			switch {
			case deleted:
				state = "deleted"
			case invariants.Ready(n):
				state = "Ready"
			}
			violate("I10: detach of %s from %s (%s, in volumesInUse) started (resourceVersion %d) while zone %s is disrupted: a forced detach by timeout must be held",
				vol.PV, n.Name, state, rv, disruptions[i].zone)
		}
		if deleted {
			// Its status went with it: I2 and I3 judge nodes that exist.
			return
		}
		if invariants.DetachListed(vol, attached) {
			violate("I3: detach of %s from %s started (resourceVersion %d) while node.status.volumesAttached lists it (node resourceVersion %s)",
				vol.PV, n.Name, rv, n.ResourceVersion)
		}
		if mounted && !held {
			violate("I2: detach of %s from %s started (resourceVersion %d) while it is in volumesInUse of the node (ready=%v, node resourceVersion %s)",
				vol.PV, n.Name, rv, invariants.Ready(n), n.ResourceVersion)
		}
	}
	for _, e := range events {
		switch {
		case e.Node != nil:
			if e.Type == watch.Deleted || e.Tombstone {
				delete(nodes, e.Node.Name)
				gone[e.Node.Name] = e.Node
			} else {
				nodes[e.Node.Name] = e.Node
				delete(gone, e.Node.Name)
			}
		case e.VA != nil && e.Tombstone:
			// When it went, and who started its detach, is unknown.
			if cur := vas[e.VA.Name]; cur != nil && cur.UID == e.VA.UID {
				delete(vas, e.VA.Name)
			}
		case e.VA != nil:
			va := e.VA
			prev := vas[va.Name]
			starting := va.DeletionTimestamp != nil && (prev == nil || prev.DeletionTimestamp == nil)
			if e.Type == watch.Deleted {
				// Deleted with no deletion timestamp seen: no finalizer held it.
				starting = prev != nil && prev.DeletionTimestamp == nil
				delete(vas, va.Name)
			} else {
				vas[va.Name] = va
			}
			if starting {
				detachStart(va, e.rv())
			}
			if vol, ok := volumes[pvOf(va)]; ok && vol.SingleNode && e.Type != watch.Deleted {
				var on, who []string
				for _, o := range vas {
					if pvOf(o) == vol.PV && !slices.Contains(on, o.Spec.NodeName) {
						on = append(on, o.Spec.NodeName)
						who = append(who, o.Spec.NodeName+" by "+creator(o))
					}
				}
				if nodes, bad := invariants.SingleNode(vol, on); bad {
					slices.Sort(who)
					violate("I1: single-node volume %s has VolumeAttachments on nodes %s (resourceVersion %d; created on %s)",
						vol.PV, nodes, e.rv(), strings.Join(who, ", "))
				}
			}
		}
	}
	return out, unjudged
}

// creator is the field manager that wrote the VolumeAttachment's spec.
func creator(va *storagev1.VolumeAttachment) string {
	for _, m := range va.ManagedFields {
		if m.Subresource == "" && m.FieldsV1 != nil && strings.Contains(m.FieldsV1.GetRawString(), `"f:spec"`) {
			return m.Manager
		}
	}
	return "?"
}

func pvOf(va *storagev1.VolumeAttachment) string {
	if p := va.Spec.Source.PersistentVolumeName; p != nil {
		return *p
	}
	return ""
}
