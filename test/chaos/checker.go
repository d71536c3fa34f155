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
package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// outOfService is the taint under which a mounted volume may be detached.
const outOfService = "node.kubernetes.io/out-of-service"

// Volume is what the checker knows of a PV: whether it may be attached to
// one node only, and the names node status may list it under.
type Volume struct {
	PV         string
	SingleNode bool
	Names      []string
}

// Event is one watch event of a VolumeAttachment or a Node.
type Event struct {
	Type watch.EventType
	VA   *storagev1.VolumeAttachment
	Node *v1.Node
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

// Checker records events and evaluates the invariants:
//
//	I1 a single-node volume has VolumeAttachments (in any state) on one node
//	   at most;
//	I2 no detach starts for a volume in volumesInUse of a node without the
//	   out-of-service taint (the harness keeps nodes NotReady for less than
//	   the max wait for unmount);
//	I3 no detach starts while node.status.volumesAttached lists the volume.
type Checker struct {
	mu      sync.Mutex
	volumes map[string]Volume
	events  []Event
}

// NewChecker returns a Checker of the given volumes; VolumeAttachments of
// other PVs are ignored.
func NewChecker(volumes ...Volume) *Checker {
	c := &Checker{volumes: map[string]Volume{}}
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

// Events returns how many events were recorded.
func (c *Checker) Events() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

// Violations replays the recorded events in etcd's order and returns every
// broken invariant.
func (c *Checker) Violations() []string {
	c.mu.Lock()
	events := slices.Clone(c.events)
	volumes := c.volumes
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
	detachStart := func(va *storagev1.VolumeAttachment, rv uint64) {
		vol, ok := volumes[pvOf(va)]
		if !ok {
			return
		}
		n := nodes[va.Spec.NodeName]
		if n == nil {
			return
		}
		listed := func(names []string) bool {
			return slices.ContainsFunc(names, func(x string) bool { return slices.Contains(vol.Names, x) })
		}
		var attached, inUse []string
		for _, a := range n.Status.VolumesAttached {
			attached = append(attached, string(a.Name))
		}
		for _, u := range n.Status.VolumesInUse {
			inUse = append(inUse, string(u))
		}
		if listed(attached) {
			violate("I3: detach of %s from %s started (resourceVersion %d) while node.status.volumesAttached lists it (node resourceVersion %s)",
				vol.PV, n.Name, rv, n.ResourceVersion)
		}
		if listed(inUse) && !tainted(n) {
			violate("I2: detach of %s from %s started (resourceVersion %d) while it is in volumesInUse of the node (ready=%v, node resourceVersion %s)",
				vol.PV, n.Name, rv, ready(n), n.ResourceVersion)
		}
	}
	for _, e := range events {
		switch {
		case e.Node != nil:
			if e.Type == watch.Deleted {
				delete(nodes, e.Node.Name)
			} else {
				nodes[e.Node.Name] = e.Node
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
				if len(on) > 1 {
					slices.Sort(on)
					slices.Sort(who)
					violate("I1: single-node volume %s has VolumeAttachments on nodes %s (resourceVersion %d; created on %s)",
						vol.PV, strings.Join(on, ", "), e.rv(), strings.Join(who, ", "))
				}
			}
		}
	}
	return out
}

// creator is the field manager that wrote the VolumeAttachment's spec.
func creator(va *storagev1.VolumeAttachment) string {
	for _, m := range va.ManagedFields {
		if m.Subresource == "" && m.FieldsV1 != nil && strings.Contains(string(m.FieldsV1.Raw), `"f:spec"`) {
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

func ready(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func tainted(n *v1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == outOfService })
}
