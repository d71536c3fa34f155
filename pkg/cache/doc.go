// Package cache holds the controller's two views of the world, as plain
// thread-safe data with no API calls:
//
//   - DesiredState: which volume must be attached to which node, and for which
//     pods. It is filled from scheduled pods by pkg/controller.
//   - ActualState: what is attached (or maybe attached) where, what each node
//     has mounted, and the bookkeeping of a detach in progress (when it was
//     first wanted, whether the volume was withdrawn from node.status).
//
// Every mutation returns the keys it touched, so the caller can enqueue
// exactly the work the change makes necessary and nothing else.
package cache

import (
	"github.com/kube-attach/attach-detach-controller/pkg/volume"
)

// Key names one volume on one node: the unit of reconciliation.
type Key struct {
	Volume volume.Name
	Node   string
}

func (k Key) String() string { return string(k.Volume) + "@" + k.Node }

// PodRef identifies a pod that wants a volume; it is enough to post events.
type PodRef struct {
	Namespace string
	Name      string
	UID       string
}

// String returns "namespace/name", the pod's queue key.
func (p PodRef) String() string { return p.Namespace + "/" + p.Name }
