package shadow

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kube-attach/attach-detach-controller/pkg/cache"
	"github.com/kube-attach/attach-detach-controller/pkg/reconciler"
)

// Kind is the kind of a disagreement; empty: we agree with the cluster.
type Kind string

const (
	// WouldAttach: a pod wants the volume there, the cluster has not
	// attached it, we would.
	WouldAttach Kind = "would-attach"
	// WouldDetach: no pod wants it, it is safe to detach, the cluster keeps
	// it attached.
	WouldDetach Kind = "would-detach"
	// WouldNotAttach: the cluster attached (or is attaching) a volume we
	// would not attach: undecided mechanism, or a single-node volume
	// already held by another node.
	WouldNotAttach Kind = "would-not-attach"
	// WouldWaitForUnmount: the cluster detaches (or detached) a volume we
	// would keep attached: mounted, or our max wait for unmount not over.
	WouldWaitForUnmount Kind = "would-wait-for-unmount"
)

// Kinds lists every kind, in the order reports list them.
func Kinds() []Kind { return []Kind{WouldAttach, WouldDetach, WouldNotAttach, WouldWaitForUnmount} }

// ClusterState is where the cluster stands with a volume on a node.
type ClusterState string

const (
	// NotAttached: no VolumeAttachment, not in node.status.volumesAttached.
	NotAttached ClusterState = "not attached"
	// Attaching: a VolumeAttachment not attached yet (or a CSI volume listed
	// in node.status with no VolumeAttachment).
	Attaching ClusterState = "attaching"
	// Attached: a VolumeAttachment attached, or an in-tree volume listed in
	// node.status.volumesAttached.
	Attached ClusterState = "attached"
	// Detaching: a VolumeAttachment being deleted.
	Detaching ClusterState = "detaching"
)

// Cluster is what the cluster shows for one volume on one node.
type Cluster struct {
	State ClusterState
	// Name is the name it is attached under, when not the key's (a
	// migrated volume's CSI name).
	Name string
	// Reported: listed in node.status.volumesAttached.
	Reported bool
}

func (c Cluster) String() string {
	s := string(c.State)
	if c.Name != "" {
		s += " as " + c.Name
	}
	if c.State != NotAttached {
		if c.Reported {
			s += ", in node.status.volumesAttached"
		} else {
			s += ", not in node.status.volumesAttached"
		}
	}
	return s
}

// present: the cluster holds the volume there, or is getting it there.
func (c Cluster) present() bool { return c.State == Attached || c.State == Attaching }

// Verdict is the outcome of one comparison.
type Verdict struct {
	Kind Kind
	// Ours says what we would do, and why.
	Ours string
	// Cluster says what the cluster shows.
	Cluster string
}

// Agree reports whether there is nothing to report.
func (v Verdict) Agree() bool { return v.Kind == "" }

// Compare compares our observation o (taken on the cluster's state) with
// what the cluster shows. held is the kind of the disagreement already
// pending or open on the key, so that a volume the cluster detached while we
// would still wait stays reported until we would have detached it too.
func Compare(o Observation, c Cluster, held Kind) Verdict {
	d, wait := o.Decision, o.Wait
	v := Verdict{Ours: d.String(), Cluster: c.String()}
	switch {
	case d.Desired && c.present() && d.Spec != nil && d.Spec.Pending != "":
		v.Kind = WouldNotAttach
		v.Ours = fmt.Sprintf("%s: %s", reconciler.Blocked, d.Spec.Pending)
	case d.Desired && c.present() && len(o.HeldElsewhere) > 0:
		v.Kind = WouldNotAttach
		v.Ours = fmt.Sprintf("%s: volume is already exclusively attached to node %s, waiting on detach before it can be attached to another node",
			reconciler.Blocked, nodesOf(o.HeldElsewhere))
	case d.Desired && c.State == NotAttached && d.Action == reconciler.Attach:
		v.Kind = WouldAttach
	case !d.Desired && c.present() && (d.Action == reconciler.Withdraw || d.Action == reconciler.Detach):
		v.Kind = WouldDetach
		if d.Force != "" {
			v.Ours += fmt.Sprintf(" (forced: %s)", d.Force)
		}
	case !d.Desired && wait != "" && (c.State == Detaching || (c.State == NotAttached && held == WouldWaitForUnmount)):
		v.Kind = WouldWaitForUnmount
		v.Ours = fmt.Sprintf("%s: %s", reconciler.Wait, wait)
	}
	return v
}

func nodesOf(keys []cache.Key) string {
	nodes := make([]string, 0, len(keys))
	for _, k := range keys {
		if !slices.Contains(nodes, k.Node) {
			nodes = append(nodes, k.Node)
		}
	}
	slices.Sort(nodes)
	return strings.Join(nodes, ", ")
}
