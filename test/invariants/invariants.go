// Package invariants holds the safety rules that the simulation (test/sim)
// and the chaos run (test/chaos) both judge, on what the API holds, never
// on what the controller believes:
//
//	I1 a single-node volume is attached (a VolumeAttachment in any state,
//	   or an in-tree attachment) to one node at most;
//	I2 no detach starts for a volume in volumesInUse of a node without the
//	   out-of-service taint (the simulation adds the max wait for unmount
//	   on an unhealthy node, and the pods it knows to be alive);
//	I3 no detach starts while node.status.volumesAttached lists the volume.
//
// Each checker finds the moments (a detach starting, an attachment
// created) in its own world and asks these functions for the verdict.
package invariants

import (
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// OutOfService is the taint that allows a detach of a mounted volume.
const OutOfService = "node.kubernetes.io/out-of-service"

// Volume is a volume as the invariants see it.
type Volume struct {
	PV         string
	SingleNode bool
	// Names are every unique name a node's status may list it under (its
	// CSI name and, for a migrated in-tree volume, its in-tree name).
	Names []string
}

// ListedIn reports whether names holds one of the volume's names.
func (v Volume) ListedIn(names []string) bool {
	return slices.ContainsFunc(names, func(x string) bool { return slices.Contains(v.Names, x) })
}

// NodeLists returns the names in node.status.volumesAttached and
// node.status.volumesInUse.
func NodeLists(n *v1.Node) (attached, inUse []string) {
	for _, a := range n.Status.VolumesAttached {
		attached = append(attached, string(a.Name))
	}
	for _, u := range n.Status.VolumesInUse {
		inUse = append(inUse, string(u))
	}
	return attached, inUse
}

// Ready reports whether the node's Ready condition is True.
func Ready(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// OutOfServiceTaint reports whether the node has the out-of-service taint.
func OutOfServiceTaint(n *v1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t v1.Taint) bool { return t.Key == OutOfService })
}

// SingleNode is I1: it returns the nodes, sorted and joined, when a
// single-node volume is attached to more than one of them.
func SingleNode(v Volume, nodes []string) (string, bool) {
	if !v.SingleNode || len(nodes) < 2 {
		return "", false
	}
	nodes = slices.Compact(slices.Sorted(slices.Values(nodes)))
	return strings.Join(nodes, ", "), len(nodes) > 1
}

// DetachListed is I3: a detach of v starting while attached, the node's
// volumesAttached, lists it.
func DetachListed(v Volume, attached []string) bool { return v.ListedIn(attached) }

// DetachMounted is I2 at its simplest: a detach of v starting while inUse,
// the node's volumesInUse, lists it, on a node without the out-of-service
// taint.
func DetachMounted(v Volume, inUse []string, outOfService bool) bool {
	return v.ListedIn(inUse) && !outOfService
}
