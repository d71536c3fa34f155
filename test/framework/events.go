package framework

import (
	"fmt"
	"strings"
)

// The warning (reason FailedAttachVolume) a pod gets while the single-node
// volume it wants is attached to another node, worded as
// kube-controller-manager v1.37 words it
// (pkg/controller/volume/attachdetach/reconciler). The tests hold this
// controller's events and kube-controller-manager's to the same text.

// WaitingForDetachExclusive is the warning when no pod on the other node
// wants the volume any more.
func WaitingForDetachExclusive(pv string) string {
	return fmt.Sprintf("Waiting for detach for volume %q Volume is already exclusively attached to one node, "+
		"waiting on detach before it can be attached to another node", pv)
}

// WaitingForDetachUsedBy is the warning when pods of the told pod's
// namespace use the volume on the other node.
func WaitingForDetachUsedBy(pv string, pods ...string) string {
	return fmt.Sprintf("Waiting for detach for volume %q Volume is already used by pod(s) %s", pv, strings.Join(pods, ", "))
}
